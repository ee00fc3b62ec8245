// quantized_linear_test.cpp — Linear under every quantized recipe (ModuleContext::recipe):
//   * each of the three products reads the operands and copies the reference reads —
//     fwd x·Wᵀ on x rowwise (role input) and W rowwise, dgrad dy·W on dy rowwise (role
//     grad_output) and W columnwise, wgrad dyᵀ·x on both columnwise — checked against the
//     same product of the dequantized copies computed here in f64 (src/quant is checked
//     bit for bit against numpy and ml_dtypes in tests/python/test_quant_conformance.py);
//   * the result differs from the unquantized product by about the format's rounding (so
//     quantization happened) and the ledger records the recipe's class and formats;
//   * the weight shard's sizes are checked at construction, naming the multiple.
#include <gtest/gtest.h>

#include <cmath>

#include "layers/layer_test_support.h"
#include "tpcheck/error.h"
#include "tpcheck/layers/linear.h"
#include "tpcheck/quant.h"

namespace tpcheck::testing {
namespace {

// [T, in] x [out, in]: every dimension a multiple of 128, so every recipe's blocks fit
// (block scaling's weights take 128 x 128 blocks, its columnwise copies 128 x 1).
constexpr std::int64_t kTokens = 128, kIn = 128, kOut = 256;

// C = op(A) · op(B) in f64 over row-major matrices.
std::vector<double> product(const std::vector<double>& a, bool ta, std::int64_t ar,
                            std::int64_t ac, const std::vector<double>& b, bool tb,
                            std::int64_t br, std::int64_t bc) {
  const std::int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  EXPECT_EQ(k, tb ? bc : br);
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        const double x = ta ? a[l * ac + i] : a[i * ac + l];
        const double y = tb ? b[j * bc + l] : b[l * bc + j];
        s += x * y;
      }
      c[i * n + j] = s;
    }
  return c;
}

// ‖x − y‖ / ‖y‖.
double norm_rel(const std::vector<double>& x, const std::vector<double>& y) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / den);
}

// The dequantized copy of t as the GEMM reads it, back in t's [rows, cols] layout.
std::vector<double> dequantized(const Tensor& t, Recipe recipe, QuantRole role, bool columnwise) {
  QuantizeOptions o;
  o.recipe = recipe;
  o.role = role;
  o.usage = QuantUsage{!columnwise, columnwise};
  return dequantize(*quantize(t, o), columnwise).to_f64();
}

struct LinearRun {
  Tensor x, w, dy, y, dx, dw;
  std::vector<GemmRecord> gemms;
};

LinearRun run_linear(Recipe recipe) {
  LinearRun r;
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  ctx.recipe = recipe;
  Linear layer("", Linear::Options::from_json({{"in_features", kIn},
                                               {"out_features", kOut},
                                               {"bias", false},
                                               {"params_dtype", "f32"}}),
               ctx);
  r.x = generate(FillSpec::normal(0.0, 1.0), kSeed, "x", {kTokens, kIn}, DType::kF32);
  r.dy = generate(FillSpec::normal(0.0, 1.0), kSeed, "dy", {kTokens, kOut}, DType::kF32);
  Linear::Saved saved;
  r.y = layer.forward(r.x, saved).output;
  r.dx = layer.backward(OutputGrads{r.dy, Tensor(), Tensor()}, saved);
  Parameter* w = layer.parameters().front();
  r.w = w->value;
  r.dw = w->grad;
  r.gemms = backend->ledger().records();
  return r;
}

const Recipe kRecipes[] = {Recipe::kFp8Delayed, Recipe::kFp8Current, Recipe::kFp8Block,
                           Recipe::kMxfp8, Recipe::kNvfp4};

TEST(QuantizedLinear, EachProductReadsTheReferenceOperands) {
  for (Recipe recipe : kRecipes) {
    SCOPED_TRACE(std::string(recipe_name(recipe)));
    const LinearRun r = run_linear(recipe);
    const auto in = QuantRole::kInput, wt = QuantRole::kWeight, go = QuantRole::kGradOutput;
    const std::vector<double> y_ref =
        product(dequantized(r.x, recipe, in, false), false, kTokens, kIn,
                dequantized(r.w, recipe, wt, false), true, kOut, kIn);
    const std::vector<double> dx_ref =
        product(dequantized(r.dy, recipe, go, false), false, kTokens, kOut,
                dequantized(r.w, recipe, wt, true), false, kOut, kIn);
    const std::vector<double> dw_ref =
        product(dequantized(r.dy, recipe, go, true), true, kTokens, kOut,
                dequantized(r.x, recipe, in, true), false, kTokens, kIn);
    // f32 accumulation over K ≤ 256 (and NVFP4's alpha and 1/S_enc, each one f32
    // rounding): measured ≤ 2e-7; a wrong copy or role moves it to the format's rounding
    // (≥ 1e-2 below).
    EXPECT_LT(norm_rel(r.y.to_f64(), y_ref), 1e-5) << "fwd";
    EXPECT_LT(norm_rel(r.dx.to_f64(), dx_ref), 1e-5) << "dgrad";
    EXPECT_LT(norm_rel(r.dw.to_f64(), dw_ref), 1e-5) << "wgrad";

    // Quantization happened: the unquantized product is a format's rounding away.
    const std::vector<double> y_exact =
        product(r.x.to_f64(), false, kTokens, kIn, r.w.to_f64(), true, kOut, kIn);
    EXPECT_GT(norm_rel(r.y.to_f64(), y_exact), 1e-3);

    ASSERT_EQ(r.gemms.size(), 3u);
    const char* sites[] = {"linear/fwd", "linear/dgrad", "linear/wgrad"};
    const DType a_format[] = {quant_data_dtype(recipe, in), quant_data_dtype(recipe, go),
                              quant_data_dtype(recipe, go)};
    const DType b_format[] = {quant_data_dtype(recipe, wt), quant_data_dtype(recipe, wt),
                              quant_data_dtype(recipe, in)};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(r.gemms[i].site, sites[i]);
      EXPECT_EQ(r.gemms[i].math_class, quant_math_class(recipe)) << sites[i];
      EXPECT_EQ(r.gemms[i].a_dtype, a_format[i]) << sites[i];
      EXPECT_EQ(r.gemms[i].b_dtype, b_format[i]) << sites[i];
    }
  }
  // HYBRID FP8: gradients in E5M2, the rest E4M3.
  EXPECT_EQ(quant_data_dtype(Recipe::kFp8Current, QuantRole::kGradOutput), DType::kF8E5M2);
}

TEST(QuantizedLinear, WeightShardThatDoesNotFitTheBlocksIsRejectedAtConstruction) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone, true};
  ctx.recipe = Recipe::kMxfp8;
  try {
    Linear layer("", Linear::Options::from_json({{"in_features", 48}, {"out_features", 64}}), ctx);
    FAIL() << "expected an input error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    const std::string what = e.what();
    EXPECT_NE(what.find("weight"), std::string::npos) << what;
    EXPECT_NE(what.find("48"), std::string::npos) << what;
    EXPECT_NE(what.find("multiple of 32"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace tpcheck::testing

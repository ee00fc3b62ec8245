// gemm_quantized_test — Backend::gemm_quantized's contract: the copy each operand reads,
// the ledger record (class, formats, alpha), and clear errors. The numbers themselves are
// checked against numpy in tests/python/test_quant_conformance.py.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {
namespace {

template <typename F>
void expect_input_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
  }
}

Tensor quantized(Shape shape, Recipe recipe, QuantRole role, double fill, QuantUsage usage = {}) {
  Tensor t = Tensor::full(std::move(shape), DType::kF32, fill);
  QuantizeOptions o;
  o.recipe = recipe;
  o.role = role;
  o.usage = usage;
  t.set_quantized(quantize(t, o));
  return t;
}

TEST(GemmQuantized, FpropDgradWgradAreRecordedWithTheRecipesClass) {
  auto backend = make_cpu_backend();
  const Tensor x = quantized({32, 64}, Recipe::kFp8Current, QuantRole::kInput, 3.5);
  const Tensor w = quantized({48, 64}, Recipe::kFp8Current, QuantRole::kWeight, 0.875);
  const Tensor dy = quantized({32, 48}, Recipe::kFp8Current, QuantRole::kGradOutput, 7.0);
  Tensor y({32, 48}, DType::kF32), dx({32, 64}, DType::kF32), dw({48, 64}, DType::kF32);
  backend->gemm_quantized("fc/fwd", x, false, w, true, y, false);
  backend->gemm_quantized("fc/dgrad", dy, false, w, false, dx, false);
  backend->gemm_quantized("fc/wgrad", dy, true, x, false, dw, false);
  // Constant tensors whose scales fmax / amax are powers of two (448 / 3.5 = 128,
  // 448 / 0.875 = 512, 57344 / 7 = 8192): every step is exact.
  EXPECT_EQ(y.at(0), 64 * 3.5 * 0.875);
  EXPECT_EQ(dx.at(0), 48 * 7.0 * 0.875);
  EXPECT_EQ(dw.at(0), 32 * 7.0 * 3.5);
  const auto& r = backend->ledger().records();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].math_class, MathClass::kFp8);
  EXPECT_EQ(r[0].a_dtype, DType::kF8E4M3);
  EXPECT_EQ(r[1].a_dtype, DType::kF8E5M2);  // HYBRID: the gradient in E5M2
  EXPECT_EQ(r[2].k, 32);
  EXPECT_EQ(math_class_name(r[0].math_class), "fp8");
  EXPECT_NE(r[0].implementation.find("f32 accumulation"), std::string::npos);
}

// Under every recipe, a fused bias with an f32 output is rounded to bf16 first (the
// reference's rule: cuBLASLt's FP8 GEMM takes a bf16 bias there); an f16 output keeps it.
TEST(GemmQuantized, AFusedF32BiasIsRoundedToBf16WithAnF32Output) {
  for (Recipe recipe : {Recipe::kFp8Delayed, Recipe::kFp8Current, Recipe::kFp8Block,
                        Recipe::kMxfp8, Recipe::kNvfp4}) {
    auto backend = make_cpu_backend();
    const Tensor x = quantized({128, 128}, recipe, QuantRole::kInput, 0.0);
    const Tensor w = quantized({128, 128}, recipe, QuantRole::kWeight, 0.0);
    // 1 + 2⁻¹⁰ is not a bf16 (8 significant bits): it rounds to 1.
    const Tensor bias = Tensor::full({128}, DType::kF32, 1.0 + std::ldexp(1.0, -10));
    GemmEpilogue e;
    e.bias = &bias;
    Tensor y({128, 128}, DType::kF32);
    backend->gemm_quantized("fc/fwd", x, false, w, true, y, false, e);
    EXPECT_EQ(y.at(5), 1.0) << recipe_name(recipe);
    Tensor y16({128, 128}, DType::kF16);
    backend->gemm_quantized("fc/fwd", x, false, w, true, y16, false, e);
    EXPECT_EQ(y16.at(5), 1.0 + std::ldexp(1.0, -10)) << recipe_name(recipe) << ": f16 keeps it";
  }
}

TEST(GemmQuantized, FastAccumulationIsRecordedAndDoesNotChangeTheCpuResult) {
  auto backend = make_cpu_backend();
  const Tensor x = quantized({32, 64}, Recipe::kFp8Current, QuantRole::kInput, 3.5);
  const Tensor w = quantized({48, 64}, Recipe::kFp8Current, QuantRole::kWeight, 0.875);
  Tensor split({32, 48}, DType::kF32), fast({32, 48}, DType::kF32);
  backend->gemm_quantized("fc/fwd", x, false, w, true, split, false, {}, false);
  backend->gemm_quantized("fc/fwd", x, false, w, true, fast, false, {}, true);
  EXPECT_TRUE(bitwise_equal(split, fast));
  EXPECT_EQ(backend->ledger().records()[0].implementation.find("fast accumulation"),
            std::string::npos);
  EXPECT_NE(backend->ledger().records()[1].implementation.find("fast accumulation asked for"),
            std::string::npos);
}

TEST(GemmQuantized, MissingCopiesMixedRecipesAndPlainOperandsAreInputErrors) {
  auto backend = make_cpu_backend();
  const Tensor x_row = quantized({32, 64}, Recipe::kMxfp8, QuantRole::kInput, 1.0, {true, false});
  const Tensor w = quantized({32, 64}, Recipe::kMxfp8, QuantRole::kWeight, 1.0);
  const Tensor w_nv = quantized({32, 64}, Recipe::kNvfp4, QuantRole::kWeight, 1.0);
  Tensor c({64, 64}, DType::kF32), y({32, 32}, DType::kF32);
  // wgrad-like use of x needs its columnwise copy, which was not made.
  expect_input_error([&] { backend->gemm_quantized("t/wgrad", x_row, true, w, false, c, false); },
                     {"t/wgrad", "operand A", "columnwise"});
  expect_input_error([&] { backend->gemm_quantized("t/fwd", x_row, false, w_nv, true, y, false); },
                     {"different recipes", "mxfp8", "nvfp4"});
  const Tensor plain = Tensor::zeros({32, 64}, DType::kF32);
  expect_input_error([&] { backend->gemm_quantized("t/fwd", plain, false, w, true, y, false); },
                     {"carries no quantized data"});
  // Quantized data in the plain GEMM: pointed to gemm_quantized.
  expect_input_error(
      [&] { backend->gemm("t/fwd", x_row.quantized()->rowwise_data, false, w, true, y, false); },
      {"gemm_quantized"});
  EXPECT_TRUE(backend->ledger().records().empty());
}

}  // namespace
}  // namespace tpcheck

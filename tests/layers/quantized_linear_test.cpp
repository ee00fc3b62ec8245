// quantized_linear_test.cpp — Linear under every quantized recipe (ModuleContext::recipe):
//   * each of the three products reads the operands and copies the reference reads —
//     fwd x·Wᵀ on x rowwise (role input) and W rowwise, dgrad dy·W on dy rowwise (role
//     grad_output) and W columnwise, wgrad dyᵀ·x on both columnwise — checked against the
//     same product of the dequantized copies computed here in f64 (src/quant is checked
//     bit for bit against numpy and ml_dtypes in tests/python/test_quant_conformance.py);
//   * the result differs from the unquantized product by about the format's rounding (so
//     quantization happened) and the ledger records the recipe's class and formats;
//   * the weight shard's sizes are checked at construction, naming the multiple;
//   * the reference's two special checks, in tpcheck's terms: a gathered tensor's
//     per-tensor scale_inv is single's, an outlier on the last rank included (current
//     scaling); quantizing every shard with the group's amax and concatenating gives
//     the bytes and scales of quantizing the gathered tensor (what the reference's
//     quantized all-gather must produce, and what tpcheck's gather-then-quantize is).
//   * each tensor is quantized once per step into both its copies (three quantizations:
//     x, W, dy), not once per product operand.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>

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

// Records every quantization a layer asks of its backend: what, and which copies.
class QuantizeRecorder : public BackendWrapper {
 public:
  explicit QuantizeRecorder(Backend& target) : BackendWrapper(target) {}
  struct Call {
    std::string what;
    QuantRole role;
    QuantUsage usage;
  };
  std::vector<Call> calls;
  std::shared_ptr<QuantizedData> quantize(const Tensor& x, const QuantizeOptions& options,
                                          std::string_view what) override {
    calls.push_back(Call{std::string(what), options.role, options.usage});
    return BackendWrapper::quantize(x, options, what);
  }
};

// Each tensor is quantized once per step, into both the copies its two products read (the
// reference's quantizers do the same): x and W in forward, dy before dgrad — three calls,
// not one per product operand (six). With delay_wgrad_compute the kept dy is reused too.
TEST(QuantizedLinear, EachTensorIsQuantizedOncePerStepIntoBothCopies) {
  for (Recipe recipe : kRecipes) {
    for (bool delay_wgrad : {false, true}) {
      SCOPED_TRACE(std::string(recipe_name(recipe)) + (delay_wgrad ? " delay_wgrad" : ""));
      std::unique_ptr<Communicator> comm = make_single_communicator();
      std::unique_ptr<Backend> cpu = make_cpu_backend();
      QuantizeRecorder backend(*cpu);
      ModuleContext ctx{&backend, comm.get(), kSeed, Mutation::kNone};
      ctx.recipe = recipe;
      Linear layer("", Linear::Options::from_json({{"in_features", kIn},
                                                   {"out_features", kOut},
                                                   {"params_dtype", "f32"},
                                                   {"delay_wgrad_compute", delay_wgrad}}),
                   ctx);
      const Tensor x = generate(FillSpec::normal(0.0, 1.0), kSeed, "x", {kTokens, kIn}, DType::kF32);
      const Tensor dy = generate(FillSpec::normal(0.0, 1.0), kSeed, "dy", {kTokens, kOut}, DType::kF32);
      Linear::Saved saved;
      layer.forward(x, saved);
      layer.backward(OutputGrads{dy, Tensor(), Tensor()}, saved);
      layer.backward_dw(saved);
      ASSERT_EQ(backend.calls.size(), 3u);
      const QuantRole roles[] = {QuantRole::kInput, QuantRole::kWeight, QuantRole::kGradOutput};
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(backend.calls[i].role, roles[i]) << backend.calls[i].what;
        EXPECT_TRUE(backend.calls[i].usage.rowwise && backend.calls[i].usage.columnwise)
            << backend.calls[i].what;
      }
      EXPECT_EQ(cpu->ledger().records().size(), 3u);  // fwd, dgrad, wgrad
    }
  }
}

TEST(QuantizedLinear, WeightShardThatDoesNotFitTheBlocksIsRejectedAtConstruction) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone, true};
  ctx.recipe = Recipe::kMxfp8;
  expect_input_error(
      [&] { Linear("", Linear::Options::from_json({{"in_features", 48}, {"out_features", 64}}), ctx); },
      {"weight", "48", "multiple of 32"});
}

// Keeps the scale_inv of operand A of every quantized GEMM, by site (one rank).
class ScaleRecorder : public BackendWrapper {
 public:
  explicit ScaleRecorder(Backend& target) : BackendWrapper(target) {}
  std::map<std::string, std::vector<double>> a_scale_inv;

 protected:
  void run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord& record) override {
    const Tensor& s = p.a_columnwise ? p.a->columnwise_scale_inv : p.a->rowwise_scale_inv;
    a_scale_inv[std::string(p.site)] = s.to_f64();
    BackendWrapper::run_gemm_quantized(p, record);
  }
};

// A Linear under fp8_cs at `tp` ranks with SP; the scale_inv operand A had at `site` on
// each rank. x and dy carry one outlier (1e4) in the last rank's last row.
std::vector<std::vector<double>> scale_inv_per_rank(const std::string& mode, int tp,
                                                    const std::string& site) {
  constexpr std::int64_t kT = 64, kH = 64;
  std::vector<std::vector<double>> per_rank(tp);
  std::mutex mu;
  auto body = [&](Communicator& comm) {
    std::unique_ptr<Backend> cpu = make_cpu_backend();
    ScaleRecorder backend(*cpu);
    ModuleContext ctx{&backend, &comm, kSeed, Mutation::kNone};
    ctx.recipe = Recipe::kFp8Current;
    Linear layer("", Linear::Options::from_json({{"in_features", kH},
                                                 {"out_features", kH},
                                                 {"parallel_mode", mode},
                                                 {"sequence_parallel", tp > 1},
                                                 {"params_dtype", "f32"}}),
                 ctx);
    const int r = comm.rank(), n = comm.size();
    auto with_outlier = [&](const char* name, const ShardSpec& spec) {
      Tensor t = generate(FillSpec::normal(0.0, 1.0), kSeed, name, {kT, kH}, DType::kF32, spec, r, n);
      if (r == n - 1) {
        std::vector<double> v = t.to_f64();
        v.back() = 1e4;
        t = Tensor::from_f64(v, t.shape(), DType::kF32);
      }
      return t;
    };
    const Tensor x = with_outlier("x", layer.input_layout());
    const Tensor dy = with_outlier("dy", layer.output_layout().output);
    Linear::Saved saved;
    layer.forward(x, saved);
    layer.backward(OutputGrads{dy, Tensor(), Tensor()}, saved);
    std::lock_guard<std::mutex> lock(mu);
    per_rank[r] = backend.a_scale_inv.at(site);
  };
  if (tp == 1) {
    body(*make_single_communicator());
  } else {
    run_thread_group(tp, body);
  }
  return per_rank;
}

// The reference checks that its current-scaling quantizer's scale_inv is the same in the
// sharded and the single run, with one 1e4 outlier in the input. Here: the column-parallel
// input under SP and the row-parallel output gradient under SP are gathered, then
// quantized, so every rank's scale_inv equals single's, the outlier's rank or not. (The
// outlier's last row on the last rank is the last row of the global tensor, so single
// sees it too.)
TEST(QuantizedLinear, CurrentScalingScaleOfGatheredTensorsIsSingles) {
  for (const auto& [mode, site] : {std::pair<std::string, std::string>{"column", "linear/fwd"},
                                   {"row", "linear/dgrad"}}) {
    SCOPED_TRACE(mode + " " + site);
    const std::vector<double> single = scale_inv_per_rank(mode, 1, site).at(0);
    ASSERT_EQ(single.size(), 1u);
    // The outlier sets the scale: E4M3 448 / 1e4, E5M2 57344 / 1e4 — scale_inv ≈ 1e4 / fmax.
    EXPECT_GT(single[0], 1e4 / 57344.0 * 0.99);
    for (int tp : {2, 4}) {
      const auto ranks = scale_inv_per_rank(mode, tp, site);
      for (int r = 0; r < tp; ++r) EXPECT_EQ(ranks[r], single) << "tp " << tp << " rank " << r;
    }
  }
  // The check has teeth: a shard quantized on its own (rank 0 of 2, without the outlier)
  // gets another scale.
  QuantizeOptions o;
  o.recipe = Recipe::kFp8Current;
  o.usage = QuantUsage{true, false};
  const Tensor x0 = generate(FillSpec::normal(0.0, 1.0), kSeed, "x", {64, 64}, DType::kF32,
                             ShardSpec::along(0), 0, 2);
  const std::vector<double> own = quantize(x0, o)->rowwise_scale_inv.to_f64();
  EXPECT_LT(own[0], scale_inv_per_rank("column", 1, "linear/fwd").at(0)[0] / 100);
}

// The reference checks that NVFP4's quantized all-gather gives the data and scales of
// quantizing the gathered tensor. tpcheck gathers in high precision and quantizes after,
// which is the same exactly when quantizing each shard with the group's amax and
// concatenating gives those bytes: checked here for every recipe that reduces the amax
// (per-tensor FP8 current scaling, NVFP4) and for the block recipes (no amax), rowwise and
// columnwise copies, shards of 64 rows (a multiple of every block height).
TEST(QuantizedLinear, QuantizingShardsWithTheGroupAmaxEqualsQuantizingTheGatheredTensor) {
  constexpr int kRanks = 4;
  constexpr std::int64_t kRowsPerRank = 128, kCols = 256;
  Tensor full = generate(FillSpec::normal(0.0, 1.0), kSeed, "activation",
                         {kRanks * kRowsPerRank, kCols}, DType::kF32);
  {
    std::vector<double> v = full.to_f64();
    v[v.size() - 1] = 1e4;  // the outlier on the last rank
    full = Tensor::from_f64(v, full.shape(), DType::kF32);
  }
  for (Recipe recipe : {Recipe::kFp8Current, Recipe::kNvfp4, Recipe::kMxfp8, Recipe::kFp8Block}) {
    SCOPED_TRACE(std::string(recipe_name(recipe)));
    QuantizeOptions o;
    o.recipe = recipe;
    o.role = QuantRole::kInput;
    o.usage = QuantUsage{true, true};
    const std::shared_ptr<QuantizedData> whole = quantize(full, o);
    std::vector<std::shared_ptr<QuantizedData>> shards;
    o.amax = whole->amax.to_f64()[0];  // the max-reduction of the shards' amaxes
    float reduced = 0;
    for (int r = 0; r < kRanks; ++r) {
      shards.push_back(quantize(full.slice(0, r * kRowsPerRank, kRowsPerRank), o));
      reduced = std::max(reduced, static_cast<float>(shards.back()->amax.to_f64()[0]));
    }
    EXPECT_EQ(reduced, whole->amax.to_f64()[0]) << "the reduction of the shards' amaxes";
    if (recipe == Recipe::kFp8Current || recipe == Recipe::kNvfp4) {
      // Teeth: without the reduction, rank 0's scales differ from the gathered tensor's.
      QuantizeOptions own = o;
      own.amax.reset();
      const auto q0 = quantize(full.slice(0, 0, kRowsPerRank), own);
      EXPECT_FALSE(bitwise_equal(q0->rowwise_scale_inv,
                                 whole->block.empty()
                                     ? whole->rowwise_scale_inv
                                     : whole->rowwise_scale_inv.slice(0, 0, kRowsPerRank)));
    }
    std::vector<Tensor> data, scales, col_data, col_scales;
    for (const auto& q : shards) {
      data.push_back(q->rowwise_data);
      scales.push_back(q->rowwise_scale_inv);
      col_data.push_back(q->columnwise_data);
      col_scales.push_back(q->columnwise_scale_inv);
    }
    EXPECT_TRUE(bitwise_equal(Tensor::cat(data, 0), whole->rowwise_data));
    EXPECT_TRUE(bitwise_equal(Tensor::cat(col_data, 1), whole->columnwise_data));
    const bool per_tensor = whole->block.empty();
    if (per_tensor) {
      for (const auto& q : shards) {
        EXPECT_TRUE(bitwise_equal(q->rowwise_scale_inv, whole->rowwise_scale_inv));
        EXPECT_TRUE(bitwise_equal(q->columnwise_scale_inv, whole->columnwise_scale_inv));
      }
    } else {
      EXPECT_TRUE(bitwise_equal(Tensor::cat(scales, 0), whole->rowwise_scale_inv));
      EXPECT_TRUE(bitwise_equal(Tensor::cat(col_scales, 1), whole->columnwise_scale_inv));
    }
  }
}

}  // namespace
}  // namespace tpcheck::testing

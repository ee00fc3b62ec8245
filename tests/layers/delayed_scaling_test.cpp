// tests/layers/delayed_scaling_test.cpp — training steps in the layers: FP8 delayed
// scaling's scales over steps and the SGD update between them.
//   * the scale sequence of a Linear's three histories (input, weight, output gradient)
//     over five steps, against the formula computed here from the tensors' own amaxes
//     (scale = fmax / max(amaxes of the steps before), 1 at the first step) — not by
//     DelayedScaling; and each step's products read operands quantized with exactly
//     those scales;
//   * at TP 2 (column-parallel, sequence parallel) the amax reduction gives every rank
//     single's scales; with amax-not-reduced each rank's scales follow its own shard;
//     with amax-history-not-updated they stay 1;
//   * with an outlier in one rank's tokens (the reference's own amax-reduction test)
//     amax-not-reduced mis-scales the FP8 all-gather at step 2 far beyond FP8 rounding,
//     while the reduced run equals single's;
//   * the SGD update (sgd_update) of a column- and a row-parallel Linear's shards equals
//     the unsharded update of the same elements bit for bit (f32, and bf16 with an f32
//     main_grad), and follows its formula.
// Cost: well under a second.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "layers/tp_ops.h"
#include "tpcheck/comm.h"
#include "tpcheck/layers/linear.h"
#include "tpcheck/quant.h"

namespace tpcheck::testing {
namespace {

constexpr std::uint64_t kSeed = 77;
constexpr std::int64_t kTokens = 64, kIn = 32, kOut = 64;
constexpr int kSteps = 5;
constexpr double kLr = 1.0;  // the runner's kSgdLearningRate

// The formula, written out: fmax / max(history) in f32, 1 until an amax was seen; a zero
// or non-finite maximum keeps the previous scale; an overflowing quotient gives FLT_MAX.
float formula_scale(const std::vector<float>& history, float fmax, float previous) {
  float m = 0.0f;
  for (float a : history) {
    if (!std::isfinite(a)) return previous;
    m = std::max(m, a);
  }
  if (!(m > 0.0f)) return previous;
  const float s = fmax / m;
  return std::isinf(s) ? FLT_MAX : s;
}

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (float v : t.to_f32()) m = std::max(m, std::fabs(v));
  return m;
}

// x [m, k] · op(w) with both operands dequantized as the recipe's GEMM reads them,
// quantized with the given per-tensor scales; in f64.
std::vector<double> dequantized(const Tensor& t, QuantRole role, bool columnwise, float scale) {
  QuantizeOptions o;
  o.recipe = Recipe::kFp8Delayed;
  o.role = role;
  o.usage = QuantUsage{!columnwise, columnwise};
  o.scale = scale;
  return dequantize(*quantize(t, o), columnwise).to_f64();
}

double norm_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// y = x wᵀ from dequantized operands, [kTokens, kOut].
std::vector<double> forward_reference(const Tensor& x, float sx, const Tensor& w, float sw) {
  const std::vector<double> a = dequantized(x, QuantRole::kInput, false, sx);
  const std::vector<double> b = dequantized(w, QuantRole::kWeight, false, sw);
  std::vector<double> y(kTokens * kOut, 0.0);
  for (std::int64_t i = 0; i < kTokens; ++i)
    for (std::int64_t j = 0; j < kOut; ++j)
      for (std::int64_t k = 0; k < kIn; ++k) y[i * kOut + j] += a[i * kIn + k] * b[j * kIn + k];
  return y;
}

Linear::Options linear_options(const std::string& mode, bool sp) {
  return Linear::Options::from_json({{"in_features", kIn},
                                     {"out_features", kOut},
                                     {"bias", false},
                                     {"parallel_mode", mode},
                                     {"sequence_parallel", sp},
                                     {"params_dtype", "f32"}});
}

// One unsharded rank under FP8 delayed scaling: its communicator, backend, scaling set
// and the context a Linear reads them from (which points into this object: not movable).
struct SingleRankFp8 {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  DelayedScalingSet set;
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  SingleRankFp8() {
    ctx.recipe = Recipe::kFp8Delayed;
    ctx.delayed_scaling = &set;
  }
  SingleRankFp8(const SingleRankFp8&) = delete;
  SingleRankFp8& operator=(const SingleRankFp8&) = delete;
};

// The global input and output gradient of the two-step tests.
Tensor global_x() {
  return generate(FillSpec::normal(0.0, 1.0), kSeed, "x", {kTokens, kIn}, DType::kF32);
}
Tensor global_dy() {
  return generate(FillSpec::normal(0.0, 1e-3), kSeed, "dy", {kTokens, kOut}, DType::kF32);
}

TEST(DelayedScalingInALinear, ScalesFollowTheFormulaStepByStep) {
  SingleRankFp8 rank;
  ModuleContext& ctx = rank.ctx;
  DelayedScalingSet& set = rank.set;
  Linear layer("", linear_options("none", false), ctx);
  ASSERT_EQ(set.size(), 3u);  // input, weight, output gradient
  const Tensor x = global_x();
  const Tensor dy = global_dy();
  const float fmax[3] = {448.0f, 448.0f, 57344.0f};  // E4M3, E4M3, E5M2 (HYBRID)
  std::vector<float> history[3];
  float expected[3] = {1.0f, 1.0f, 1.0f};
  Parameter& w = layer.weight();
  for (int step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(step);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(set[r].scale(), expected[r]) << "role " << r;
    const Tensor w_now = w.value.clone();
    Linear::Saved saved;
    const Tensor y = layer.forward(x, saved).output;
    layer.backward(OutputGrads{dy, Tensor(), Tensor()}, saved);
    // The product used this step's scales: the reference with them agrees to f32
    // accumulation, and from step 2 on (scales far from 1) the one with scale 1 does not.
    const std::vector<double> y_ref = forward_reference(x, expected[0], w_now, expected[1]);
    EXPECT_LT(norm_rel(y.to_f64(), y_ref), 1e-5);
    if (step > 1) {
      EXPECT_GT(norm_rel(y.to_f64(), forward_reference(x, 1.0f, w_now, 1.0f)), 1e-5);
    }
    history[0].push_back(max_abs(x));
    history[1].push_back(max_abs(w_now));
    history[2].push_back(max_abs(dy));
    sgd_update(*rank.backend, w, kLr);
    zero_gradients(w);
    update_delayed_scaling(ctx, set);
    for (int r = 0; r < 3; ++r) expected[r] = formula_scale(history[r], fmax[r], expected[r]);
  }
  // The weight moved (SGD), so its scale changed between steps; the others stayed.
  EXPECT_NE(history[1].front(), history[1].back());
  EXPECT_GT(expected[2], 1e6f);  // dy ~ 1e-3: E5M2's range used, not its subnormals
}

// One TP-2 column-parallel SP Linear trained kSteps steps; each rank's scales after the
// last update.
std::vector<std::vector<float>> sharded_scales(Mutation mutation) {
  std::vector<std::vector<float>> scales(2);
  std::mutex mu;
  run_thread_group(2, [&](Communicator& comm) {
    std::unique_ptr<Backend> backend = make_cpu_backend();
    DelayedScalingSet set;
    ModuleContext ctx{backend.get(), &comm, kSeed, mutation};
    ctx.recipe = Recipe::kFp8Delayed;
    ctx.delayed_scaling = &set;
    Linear layer("", linear_options("column", true), ctx);
    const int r = comm.rank();
    const Tensor x = generate(FillSpec::normal(0.0, 1.0), kSeed, "x", {kTokens, kIn},
                              DType::kF32, ShardSpec::along(0), r, 2);
    const Tensor dy = generate(FillSpec::normal(0.0, 1e-3), kSeed, "dy", {kTokens, kOut},
                               DType::kF32, ShardSpec::along(1), r, 2);
    for (int step = 1; step <= 2; ++step) {
      Linear::Saved saved;
      layer.forward(x, saved);
      layer.backward(OutputGrads{dy, Tensor(), Tensor()}, saved);
      sgd_update(*backend, layer.weight(), kLr);
      zero_gradients(layer.weight());
      update_delayed_scaling(ctx, set);
    }
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = 0; i < set.size(); ++i) scales[r].push_back(set[i].scale());
  });
  return scales;
}

TEST(DelayedScalingInALinear, AmaxReductionGivesEveryRankSinglesScales) {
  // Single's scales after the same two steps (the same global x, dy and weight).
  SingleRankFp8 rank;
  ModuleContext& ctx = rank.ctx;
  DelayedScalingSet& set = rank.set;
  Linear single("", linear_options("none", false), ctx);
  const Tensor x = global_x();
  const Tensor dy = global_dy();
  for (int step = 1; step <= 2; ++step) {
    Linear::Saved saved;
    single.forward(x, saved);
    single.backward(OutputGrads{dy, Tensor(), Tensor()}, saved);
    sgd_update(*rank.backend, single.weight(), kLr);
    zero_gradients(single.weight());
    update_delayed_scaling(ctx, set);
  }
  const std::vector<std::vector<float>> reduced = sharded_scales(Mutation::kNone);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(reduced[r].size(), 3u);
    // x and dy are the same every step: the group's max of the shards' amaxes is the
    // whole tensor's, bit for bit. The weight is the SGD-updated one, equal to single's up
    // to the last bits of the gradient GEMM (a different shape).
    EXPECT_EQ(reduced[r][0], set[0].scale()) << "rank " << r << " input";
    EXPECT_NEAR(reduced[r][1], set[1].scale(), 1e-5 * set[1].scale()) << "rank " << r;
    EXPECT_EQ(reduced[r][2], set[2].scale()) << "rank " << r << " output gradient";
    for (float s : reduced[r]) EXPECT_NE(s, 1.0f);
  }
  // Without the reduction each rank's scale is its own shard's: the ranks disagree on the
  // input (token slices) and the output gradient (feature slices), and a shard's amax is
  // at most the whole tensor's.
  const std::vector<std::vector<float>> local = sharded_scales(Mutation::kAmaxNotReduced);
  for (int i : {0, 2}) {
    EXPECT_NE(local[0][i], local[1][i]) << "entry " << i;
    EXPECT_EQ(std::min(local[0][i], local[1][i]), set[i].scale()) << "entry " << i;
  }
  const std::vector<std::vector<float>> stuck = sharded_scales(Mutation::kAmaxHistoryNotUpdated);
  for (int r = 0; r < 2; ++r) {
    for (float s : stuck[r]) EXPECT_EQ(s, 1.0f);
  }
}

// The output of step 2 of a Linear trained on an input whose one outlier (1e3, as the
// reference's amax-reduction test plants 1e4) lies in the last rank's tokens:
// unsharded (tp 1) or column-parallel SP, reassembled.
Tensor second_step_output(int tp, Mutation mutation) {
  Tensor x = generate(FillSpec::normal(0.0, 1.0), kSeed, "x", {kTokens, kIn}, DType::kF32);
  x.set((kTokens - 1) * kIn + kIn - 1, 1e3);
  const Tensor dy =
      generate(FillSpec::normal(0.0, 1e-3), kSeed, "dy", {kTokens, kOut}, DType::kF32);
  std::vector<Tensor> outputs(tp);
  run_thread_group(tp, [&](Communicator& comm) {
    std::unique_ptr<Backend> backend = make_cpu_backend();
    DelayedScalingSet set;
    ModuleContext ctx{backend.get(), &comm, kSeed, mutation};
    ctx.recipe = Recipe::kFp8Delayed;
    ctx.delayed_scaling = &set;
    Linear layer("", linear_options(tp == 1 ? "none" : "column", tp > 1), ctx);
    const int r = comm.rank();
    const Tensor x_local = tp == 1 ? x : take_shard(x, ShardSpec::along(0), r, tp);
    const Tensor dy_local = tp == 1 ? dy : take_shard(dy, ShardSpec::along(1), r, tp);
    for (int step = 1; step <= 2; ++step) {
      Linear::Saved saved;
      const Tensor y = layer.forward(x_local, saved).output;
      if (step == 2) {
        outputs[r] = y;
        break;
      }
      layer.backward(OutputGrads{dy_local, Tensor(), Tensor()}, saved);
      sgd_update(*backend, layer.weight(), kLr);
      zero_gradients(layer.weight());
      update_delayed_scaling(ctx, set);
    }
  });
  return tp == 1 ? outputs[0] : Tensor::cat(outputs, 1);
}

TEST(DelayedScalingInALinear, AmaxNotReducedMisScalesTheFp8AllGather) {
  const Tensor single = second_step_output(1, Mutation::kNone);
  // Reduced: every rank quantizes with the outlier's scale, as single does — the same
  // FP8 bytes, so the products agree to f32 accumulation.
  const Tensor reduced = second_step_output(2, Mutation::kNone);
  EXPECT_LT(norm_rel(reduced.to_f64(), single.to_f64()), 1e-5);
  // Not reduced: rank 0 quantizes its rows with a scale ~300× the outlier rank's, and
  // each rank reads the other's gathered bytes with its own: off by that factor.
  const Tensor local = second_step_output(2, Mutation::kAmaxNotReduced);
  EXPECT_GT(norm_rel(local.to_f64(), single.to_f64()), 0.5);
}

// The SGD update of every rank's shard equals the unsharded update of those elements.
void expect_sgd_matches_single(const std::string& mode, const std::string& dtype, bool fuse) {
  SCOPED_TRACE(mode + " " + dtype + (fuse ? " main_grad" : ""));
  const nlohmann::json options = {{"in_features", kIn},   {"out_features", kOut},
                                  {"parallel_mode", mode}, {"params_dtype", dtype},
                                  {"fuse_wgrad_accumulation", fuse}};
  // Gradients: a global tensor per parameter, generated from global indices (so every
  // shard is a slice of it), in the gradient buffer's dtype.
  auto fill_grads = [&](std::vector<Parameter*> ps, int rank, int world) {
    for (Parameter* p : ps) {
      Tensor& g = p->main_grad.defined() ? p->main_grad : p->grad;
      g.copy_from(generate(FillSpec::normal(0.0, 0.01), kSeed, p->name + "/grad", p->global_shape,
                           g.dtype(), p->shard, rank, world));
    }
  };
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  nlohmann::json unsharded = options;
  unsharded["parallel_mode"] = "none";
  Linear single("", Linear::Options::from_json(unsharded), ctx);
  fill_grads(single.parameters(), 0, 1);
  std::vector<Tensor> before;
  for (Parameter* p : single.parameters()) before.push_back(p->value.clone());
  for (Parameter* p : single.parameters()) sgd_update(*backend, *p, kLr);
  // The formula on the unsharded weight: value + fl32(−lr · g), rounded once.
  {
    Parameter& w = single.weight();
    const std::vector<float> g = w.gradient().to_f32();
    const std::vector<float> v0 = before[0].to_f32();
    const Tensor expected = Tensor::from_f32(
        [&] {
          std::vector<float> e(v0.size());
          for (std::size_t i = 0; i < e.size(); ++i) e[i] = v0[i] + static_cast<float>(-kLr) * g[i];
          return e;
        }(),
        w.value.shape(), w.value.dtype());
    EXPECT_TRUE(bitwise_equal(w.value, expected));
    EXPECT_FALSE(bitwise_equal(w.value, before[0])) << "the update moved nothing";
  }
  std::vector<std::vector<Tensor>> shards(2);
  std::vector<ShardSpec> specs;
  std::mutex mu;
  run_thread_group(2, [&](Communicator& group) {
    std::unique_ptr<Backend> be = make_cpu_backend();
    ModuleContext rank_ctx{be.get(), &group, kSeed, Mutation::kNone};
    Linear sharded("", Linear::Options::from_json(options), rank_ctx);
    fill_grads(sharded.parameters(), group.rank(), 2);
    std::vector<Tensor> values;
    for (Parameter* p : sharded.parameters()) {
      sgd_update(*be, *p, kLr);
      values.push_back(p->value);
    }
    std::lock_guard<std::mutex> lock(mu);
    shards[group.rank()] = values;
    if (group.rank() == 0)
      for (Parameter* p : sharded.parameters()) specs.push_back(p->shard);
  });
  const std::vector<Parameter*> ps = single.parameters();
  ASSERT_EQ(specs.size(), ps.size());
  for (std::size_t i = 0; i < ps.size(); ++i) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(bitwise_equal(shards[r][i], take_shard(ps[i]->value, specs[i], r, 2)))
          << ps[i]->name << " rank " << r;
    }
  }
}

TEST(Sgd, ShardedUpdateEqualsTheUnshardedOne) {
  for (const char* mode : {"column", "row"}) {
    expect_sgd_matches_single(mode, "f32", false);
    expect_sgd_matches_single(mode, "bf16", true);
  }
}

}  // namespace
}  // namespace tpcheck::testing

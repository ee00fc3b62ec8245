// tests/layers/attention_harness.h — shared checks for the [s, b, hidden] layers
// (MultiheadAttention, TransformerLayer): finite-difference gradients and TP equivalence.
//
// The loss is L = Σ wy ⊙ output + Σ wb ⊙ bias + Σ wl ⊙ layernorm_output (the last two
// when returned), with fixed random weights, so dL/d(output) = wy etc.
//   * check_gradients: f64, one rank; every parameter is overwritten with N(0, 0.5) values
//     first (the default 0.023 init makes attention nearly uniform and the key gradients
//     tiny, which would test little), then the input gradient and every parameter
//     gradient are compared with central finite differences.
//   * run_tp: runs the layer on N thread ranks with the generated (shard-consistent)
//     parameters, each rank given its piece of x and of the loss weights, and reassembles
//     outputs and gradients into global tensors for comparison with the N = 1 run.
// Thread safety: test code; run_tp's body runs on N threads writing distinct slots.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/finite_diff.h"
#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/layers/module.h"
#include "tpcheck/shard.h"

namespace tpcheck::testing {

inline constexpr std::uint64_t kHarnessSeed = 20240611;

// The key bias's gradient is zero in exact arithmetic: adding b to every key shifts a
// query's scores by the same q·b, and softmax is shift-invariant. What backward computes
// is rounding noise (~1e-17), so relative comparisons are meaningless for it; it is
// checked to be that small instead.
inline bool has_zero_gradient(const std::string& name) {
  return name.size() >= 8 && name.compare(name.size() - 8, 8, "key_bias") == 0;
}
inline double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}
// Absolute bound for such a gradient: measured ~1e-16 analytic; the finite difference of
// a flat direction is rounding of the loss (~1e-16 · |L| / h ≈ 1e-9).
inline constexpr double kZeroGradientBound = 1e-7;

// Norm-wise relative difference of two tensors of the same shape.
inline double rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(shape_str(a.shape()), shape_str(b.shape()));
  return relative_error(a.to_f64(), b.to_f64());
}

template <class Layer>
void check_gradients(const typename Layer::Options& options, const Shape& x_shape,
                     double tolerance) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Communicator> comm = make_single_communicator();
  ModuleContext ctx{backend.get(), comm.get(), kHarnessSeed, Mutation::kNone};
  Layer layer("", options, ctx);
  for (Parameter* p : layer.parameters()) {
    ASSERT_EQ(p->value.dtype(), DType::kF64) << p->name;
    p->value.copy_from(random_f64(p->value.shape(), "fd." + p->name, 0.5));
  }
  Tensor x = random_f64(x_shape, "fd.x");

  typename Layer::Saved saved;
  const LayerOutputs first = layer.forward(x, saved);
  const Tensor wy = random_f64(first.output.shape(), "fd.wy");
  const Tensor wb = first.bias.defined() ? random_f64(first.bias.shape(), "fd.wb") : Tensor();
  const Tensor wl = first.layernorm_output.defined()
                        ? random_f64(first.layernorm_output.shape(), "fd.wl")
                        : Tensor();
  auto loss = [&]() {
    typename Layer::Saved s;
    const LayerOutputs o = layer.forward(x, s);
    double l = weighted_sum(o.output, wy);
    if (wb.defined()) l += weighted_sum(o.bias, wb);
    if (wl.defined()) l += weighted_sum(o.layernorm_output, wl);
    return l;
  };

  OutputGrads grads;
  grads.output = wy;
  grads.bias = wb;
  grads.layernorm_output = wl;
  const Tensor dx = layer.backward(grads, saved);
  EXPECT_LE(checked_gradient_error(dx.to_f64(), numeric_gradient(loss, x)), tolerance) << "input x";
  for (Parameter* p : layer.parameters()) {
    const std::vector<double> numeric = numeric_gradient(loss, p->value);
    if (has_zero_gradient(p->name)) {
      EXPECT_LE(norm2(p->gradient().to_f64()), kZeroGradientBound) << p->name;
      EXPECT_LE(norm2(numeric), kZeroGradientBound) << p->name;
      continue;
    }
    EXPECT_LE(checked_gradient_error(p->gradient().to_f64(), numeric), tolerance) << p->name;
  }
}

struct TpRun {
  Tensor output, bias, layernorm_output, dx;
  std::map<std::string, Tensor> grads;  // by parameter name, reassembled
};

// Runs forward and backward at TP = world with `mutation`; every tensor reassembled.
template <class Layer>
TpRun run_tp(const typename Layer::Options& options, int world, Mutation mutation,
             const Tensor& x_full) {
  struct RankResult {
    Tensor output, bias, ln, dx;
    std::vector<Tensor> grads;
  };
  std::vector<RankResult> ranks(world);
  std::vector<std::string> names;
  std::vector<ShardSpec> shards;
  OutputLayout layout;
  ShardSpec in_layout;
  run_thread_group(world, [&](Communicator& comm) {
    std::unique_ptr<Backend> backend = make_cpu_backend();
    ModuleContext ctx{backend.get(), &comm, kHarnessSeed, mutation};
    Layer layer("", options, ctx);
    const int r = comm.rank();
    const ShardSpec in = layer.input_layout();
    const OutputLayout out_layout = layer.output_layout();
    typename Layer::Saved saved;
    const LayerOutputs out = layer.forward(take_shard(x_full, in, r, world), saved);

    // The loss weights are global tensors; each rank gets its piece.
    Shape out_shape = out.output.shape();
    if (!out_layout.output.is_replicated()) out_shape[out_layout.output.dim] *= world;
    OutputGrads grads;
    grads.output = take_shard(random_f64(out_shape, "tp.wy"), out_layout.output, r, world);
    if (out.bias.defined()) grads.bias = random_f64(out.bias.shape(), "tp.wb");
    if (out.layernorm_output.defined()) {
      Shape ln_shape = out.layernorm_output.shape();
      if (!out_layout.layernorm_output.is_replicated()) {
        ln_shape[out_layout.layernorm_output.dim] *= world;
      }
      grads.layernorm_output =
          take_shard(random_f64(ln_shape, "tp.wl"), out_layout.layernorm_output, r, world);
    }
    RankResult& mine = ranks[r];
    mine.dx = layer.backward(grads, saved);
    mine.output = out.output;
    mine.bias = out.bias;
    mine.ln = out.layernorm_output;
    for (Parameter* p : layer.parameters()) mine.grads.push_back(p->gradient().clone());
    if (r == 0) {
      for (Parameter* p : layer.parameters()) {
        names.push_back(p->name);
        shards.push_back(p->shard);
      }
      layout = out_layout;
      in_layout = in;
    }
  });

  auto gather = [&](auto member, const ShardSpec& spec) {
    std::vector<Tensor> parts;
    for (const RankResult& rr : ranks) parts.push_back(rr.*member);
    if (!parts[0].defined()) return Tensor();
    return assemble_shards(parts, spec);
  };
  TpRun run;
  run.output = gather(&RankResult::output, layout.output);
  run.bias = gather(&RankResult::bias, layout.bias);
  run.layernorm_output = gather(&RankResult::ln, layout.layernorm_output);
  run.dx = gather(&RankResult::dx, in_layout);
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::vector<Tensor> parts;
    for (const RankResult& rr : ranks) parts.push_back(rr.grads[i]);
    run.grads[names[i]] = assemble_shards(parts, shards[i]);
  }
  return run;
}

// The largest norm-wise relative difference between two runs over every tensor; `what`
// receives the name of the worst one.
inline double max_rel_diff(const TpRun& a, const TpRun& b, std::string* what) {
  double worst = 0;
  auto consider = [&](const Tensor& x, const Tensor& y, const std::string& name) {
    EXPECT_EQ(x.defined(), y.defined()) << name;
    if (!x.defined() || !y.defined()) return;
    if (has_zero_gradient(name)) {
      EXPECT_LE(norm2(x.to_f64()), kZeroGradientBound) << name;
      EXPECT_LE(norm2(y.to_f64()), kZeroGradientBound) << name;
      return;
    }
    const double d = rel_diff(x, y);
    if (d >= worst) {
      worst = d;
      *what = name;
    }
  };
  consider(a.output, b.output, "output");
  consider(a.bias, b.bias, "bias");
  consider(a.layernorm_output, b.layernorm_output, "layernorm_output");
  consider(a.dx, b.dx, "dx");
  EXPECT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    auto it = b.grads.find(name);
    EXPECT_TRUE(it != b.grads.end()) << name;
    if (it != b.grads.end()) consider(g, it->second, name);
  }
  return worst;
}

}  // namespace tpcheck::testing

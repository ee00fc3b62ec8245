// tp_ops.cpp — TP communication steps and their mutations (see tp_ops.h).
#include "layers/tp_ops.h"

#include <vector>

#include "tpcheck/error.h"

namespace tpcheck {

Tensor local_token_slice(const ModuleContext& ctx, const Tensor& full) {
  const int n = ctx.tp_size();
  TPCHECK_CHECK(full.dim(0) % n == 0, "token slice: {} tokens do not split {} ways", full.dim(0),
                n);
  const std::int64_t rows = full.dim(0) / n;
  return full.slice(0, ctx.rank() * rows, rows);
}

Tensor gather_tokens(const ModuleContext& ctx, const Tensor& local) {
  Tensor full = ctx.comm->all_gather(local, 0);
  if (ctx.mutated(Mutation::kReversedGather)) {
    // The bug: the pieces land in reverse rank order.
    const int n = ctx.tp_size();
    const std::int64_t rows = local.dim(0);
    std::vector<Tensor> parts;
    for (int r = n - 1; r >= 0; --r) parts.push_back(full.slice(0, r * rows, rows));
    full = Tensor::cat(parts, 0);
  }
  return full;
}

Tensor gather_tokens_fp8(const ModuleContext& ctx, const Tensor& local, DelayedScaling& scaling,
                         QuantRole role, std::string_view what) {
  // Rows of the [tokens, features] view: gathering them along dim 0 is gathering `local`
  // along its dim 0 (the leading dimensions are the tokens, the outermost first).
  const std::int64_t cols = local.dim(-1);
  QuantizeOptions q;
  q.recipe = Recipe::kFp8Delayed;
  q.role = role;
  q.usage = QuantUsage{true, false};  // the bytes that travel; the transpose is made after
  q.scale = scaling.scale();
  const std::shared_ptr<QuantizedData> mine =
      ctx.backend->quantize(local.reshape({local.numel() / cols, cols}), q, what);
  const float own_amax = mine->amax.at(0);
  scaling.record(own_amax);
  // The bytes travel in the tensor's own shape, as the high-precision gather's would.
  const Tensor bytes = gather_tokens(ctx, mine->rowwise_data.reshape(local.shape()));
  Shape full_shape = local.shape();
  full_shape[0] *= ctx.tp_size();
  std::shared_ptr<QuantizedData> gathered =
      fp8_gathered(bytes.reshape({bytes.numel() / cols, cols}), scaling.scale(), own_amax);
  // The values the layer keeps next to the FP8 copy (its high-precision view), made on
  // the host from the gathered bytes and placed with the local tensor.
  Tensor values =
      dequantize(*gathered).to(local.dtype()).reshape(full_shape).to_device(local.device());
  values.set_quantized(std::move(gathered));
  return values;
}

void update_delayed_scaling(const ModuleContext& ctx, DelayedScalingSet& set) {
  if (set.size() == 0) return;
  // TE's global amax buffer: this step's amax of every tensor, 0 where none was recorded.
  std::vector<float> amax(set.size(), 0.0f);
  for (std::size_t i = 0; i < set.size(); ++i) amax[i] = set[i].pending().value_or(0.0f);
  if (ctx.tp_size() > 1 && !ctx.mutated(Mutation::kAmaxNotReduced)) {
    // On the backend's device: the communicator reduces tensors where the ranks compute.
    Tensor buffer = Tensor::from_f32(amax, {static_cast<std::int64_t>(amax.size())}, DType::kF32)
                        .to_device(ctx.backend->device());
    ctx.comm->all_reduce(buffer, ReduceOp::kMax);
    amax = buffer.to_f32();
  }
  // The bug kAmaxNotReduced (above): each rank keeps its own amax, so ranks whose shards
  // differ get different scales, and a gathered FP8 tensor is read with the wrong one.
  // The bug kAmaxHistoryNotUpdated: nothing moves, every scale stays the initial 1.
  if (ctx.mutated(Mutation::kAmaxHistoryNotUpdated)) return;
  for (std::size_t i = 0; i < set.size(); ++i) {
    // The reduced value (at least this rank's own; 0 for a tensor no rank quantized this
    // step, which leaves the history's max, as the reference's zero row does).
    set[i].record(amax[i]);
    set[i].update();
  }
}

Tensor reduce_row_output(const ModuleContext& ctx, Tensor partial, bool sequence_parallel) {
  if (ctx.mutated(Mutation::kNoRowAllReduce)) {
    // The bug: the partial sum is used as if it were the output.
    return sequence_parallel ? local_token_slice(ctx, partial) : partial;
  }
  if (ctx.mutated(Mutation::kDoubleAllReduce)) {
    // The bug: a second all-reduce of the already-summed output (N times the sum).
    ctx.comm->all_reduce(partial);
  }
  if (sequence_parallel) return ctx.comm->reduce_scatter(partial, 0);
  ctx.comm->all_reduce(partial);
  return partial;
}

Tensor reduce_column_dgrad(const ModuleContext& ctx, Tensor partial, bool sequence_parallel) {
  if (ctx.mutated(Mutation::kNoDgradAllReduce)) {
    // The bug: each rank keeps its own partial input gradient.
    return sequence_parallel ? local_token_slice(ctx, partial) : partial;
  }
  Tensor dx;
  if (sequence_parallel) {
    dx = ctx.comm->reduce_scatter(partial, 0);
  } else {
    ctx.comm->all_reduce(partial);
    dx = partial;
  }
  if (ctx.mutated(Mutation::kDgradAveraged)) {
    // The bug: a mean across ranks instead of a sum.
    dx = ctx.backend->scale(dx, 1.0 / ctx.tp_size());
  }
  return dx;
}

void reduce_replicated_grad(const ModuleContext& ctx, Tensor& grad, ReplicatedGrad which) {
  if (which == ReplicatedGrad::kNorm && ctx.mutated(Mutation::kNormGradNotReduced)) return;
  if (which == ReplicatedGrad::kRowBias && ctx.mutated(Mutation::kRowBiasGradNotReduced)) return;
  ctx.comm->all_reduce(grad);
}

}  // namespace tpcheck

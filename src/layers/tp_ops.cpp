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

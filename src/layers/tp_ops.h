// tp_ops.h — the tensor-parallel communication steps layers use, each with its bugs.
//
// Every collective a layer performs goes through one of these functions, and every
// communication Mutation (mutation.h) lives in exactly one of them, so a mutated run
// differs from a correct one in one place. A mutation is active only when
// ctx.mutated(m), i.e. in a group of more than one rank.
//
//   step                          correct                               mutations here
//   gather_tokens                 all-gather along dim 0, rank order    kReversedGather
//   reduce_row_output             all-reduce / SP: reduce-scatter dim 0 kNoRowAllReduce,
//                                                                       kDoubleAllReduce
//   reduce_column_dgrad           all-reduce / SP: reduce-scatter dim 0 kDgradAveraged,
//                                                                       kNoDgradAllReduce
//   reduce_replicated_grad        all-reduce (SP partial gradients)     kNormGradNotReduced,
//                                                                       kRowBiasGradNotReduced
//   gather_tokens_fp8             FP8 all-gather (delayed scaling)      kReversedGather
//   update_delayed_scaling        amax all-reduce (max), history update kAmaxNotReduced,
//                                                                       kAmaxHistoryNotUpdated
//   make_parameter_from_rank      (used for kShardOffByOne, kColumnBiasNotSharded,
//                                 kGatedFc1OneBlock and kQkvOneBlock)
// kRowBiasBeforeReduce lives in Linear's row forward (linear.cpp); kResidualBeforeReduce
// in TransformerLayer (transformer_layer.cpp), written twice: in `combine` (the sequential
// residual joins) and in `forward`'s parallel attention-MLP branch; kGqaWrongGroup and
// kWindowOffset in MultiheadAttention (multihead_attention.cpp).
// Thread safety: called by one rank's thread with that rank's context.
#pragma once

#include <optional>
#include <string_view>

#include "tpcheck/layers/module.h"

namespace tpcheck {

// Rank r's slice [r·T/N, (r+1)·T/N) along dim 0 of a full tensor (no communication).
Tensor local_token_slice(const ModuleContext& ctx, const Tensor& full);

// SP: all-gather a token slice along dim 0 into the full tensor.
Tensor gather_tokens(const ModuleContext& ctx, const Tensor& local);

// SP under FP8 delayed scaling: the reference's quantized all-gather. This rank quantizes
// its token slice with its own scale (`scaling`, role `role`), records the slice's amax
// there, and all-gathers the FP8 bytes; the gathered tensor carries them (rowwise, and the
// transpose as the columnwise copy, quant.h fp8_gathered) read with this rank's scale_inv,
// and holds their dequantized values. Right only when every rank quantized with the same
// scale, which update_delayed_scaling's amax reduction makes so. `what` names the tensor.
Tensor gather_tokens_fp8(const ModuleContext& ctx, const Tensor& local, DelayedScaling& scaling,
                         QuantRole role, std::string_view what);

// After a training step, FP8 delayed scaling as the reference does it at the end of its
// autocast: every amax recorded this step, one per entry of `set`, max-reduced across the
// group in one all-reduce (skipped for a group of one), then each history updated, so the
// next step quantizes with fmax / max(history). Nothing (no collective) for an empty set.
void update_delayed_scaling(const ModuleContext& ctx, DelayedScalingSet& set);

// Row-parallel output: sum the ranks' partial outputs (all-reduce), or under SP
// reduce-scatter along dim 0 (each rank gets its token slice of the sum).
Tensor reduce_row_output(const ModuleContext& ctx, Tensor partial, bool sequence_parallel);

// Column-parallel input gradient: sum the ranks' partial dx (all-reduce), or under SP
// reduce-scatter along dim 0.
Tensor reduce_column_dgrad(const ModuleContext& ctx, Tensor partial, bool sequence_parallel);

// SP: a replicated parameter's gradient computed from a token slice is a partial sum;
// all-reduce it in place.
enum class ReplicatedGrad { kNorm, kRowBias };
void reduce_replicated_grad(const ModuleContext& ctx, Tensor& grad, ReplicatedGrad which);

// make_parameter, but the values of rank `source_rank`'s shard (make_parameter uses
// ctx.rank()) of layout `values_from` (default: `shard`). The mutated parameter bugs use
// this; `shard` still says where the parameter *should* come from, so the checker
// reassembles it as the correct layout.
Parameter make_parameter_from_rank(const ModuleContext& ctx, std::string name, Shape global_shape,
                                   ShardSpec shard, const FillSpec& fill, DType dtype,
                                   bool fuse_wgrad_accumulation, int source_rank,
                                   const std::optional<ShardSpec>& values_from = std::nullopt);

}  // namespace tpcheck

// tpcheck/mutation.h — deliberate tensor-parallel bugs the layers can be built with.
//
// A checker that never fails proves nothing. Each Mutation is a real TP bug (the kind
// that ships); `tpcheck run --mutate NAME` builds the sharded run's layers with it, and
// tests assert that the default policy fails at least one suite case for every mutation
// at TP 2, 4 and 8. Single and truth runs are never mutated.
// Two mutations act on FP8 delayed scaling only (MutationInfo::recipe): they change
// nothing at one step, when every scale is the initial 1, and show from the second step
// on (`--recipe fp8 --steps 2`).
// Thread safety: values.
#pragma once

#include <span>
#include <string_view>

#include "tpcheck/quant.h"

namespace tpcheck {

enum class Mutation {
  kNone,
  kNoRowAllReduce,        // row-parallel output not reduced (partial sums used as the output)
  kDoubleAllReduce,       // row-parallel output all-reduced twice
  kShardOffByOne,         // rank r holds weight shard (r + 1) mod N of column-parallel weights
  kColumnBiasNotSharded,  // every rank adds shard 0 of a column-parallel bias
  kReversedGather,        // sequence-parallel all-gather concatenates in reverse rank order
  kNormGradNotReduced,    // SP: norm weight/bias gradients not all-reduced across the group
  kAttentionScaleLocal,   // softmax scale from the local head count: 1/sqrt(hidden / (heads/N))
  kDgradAveraged,         // column-parallel input gradient all-reduce divides by N (mean, not sum)
  kResidualBeforeReduce,  // residual added on every rank before the row-parallel reduction
  kNoDgradAllReduce,      // column-parallel input gradient not all-reduced (no SP)
  kRowBiasBeforeReduce,   // row-parallel bias added on every rank before the reduction
  kRowBiasGradNotReduced, // SP: row-parallel bias gradient not all-reduced across the group
  // Paths only the `full` suite reaches (the `te` matrix cannot see these):
  kGatedFc1OneBlock,      // gated fc1 [a; b] sharded as one block, not per half
  kQkvOneBlock,           // fused QKV, not interleaved ([Q; K; V]), sharded as one block
  kGqaWrongGroup,         // GQA: local query head i uses group i mod g_local (repeat order)
  kWindowOffset,          // sliding-window mask shifted one token on ranks other than 0
  // FP8 delayed scaling over steps (--recipe fp8; visible from --steps 2):
  kAmaxNotReduced,        // amaxes not max-reduced across the group before the history update
  kAmaxHistoryNotUpdated, // amax history never updated: every scale stays the initial 1
};

struct MutationInfo {
  Mutation mutation;
  std::string_view name;         // CLI name, kebab-case: "no-row-allreduce"
  std::string_view description;  // one line for `tpcheck mutations`
  // The recipe the bug lives in (kNone: every run), and the first step at which it can
  // change a result.
  Recipe recipe = Recipe::kNone;
  int first_step = 1;
};

// Every mutation except kNone, in a stable order (the recipe-only ones last).
std::span<const MutationInfo> all_mutations();
const MutationInfo& mutation_info(Mutation m);  // REQUIRES: m != kNone
std::string_view mutation_name(Mutation m);  // "none" for kNone
// Throws Error(kInput) naming the text and listing the accepted names.
Mutation parse_mutation(std::string_view name);

}  // namespace tpcheck

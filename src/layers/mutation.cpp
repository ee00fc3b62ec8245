// mutation.cpp — the names and descriptions of the built-in TP bugs (mutation.h).
#include "tpcheck/mutation.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>

#include "tpcheck/error.h"

namespace tpcheck {

std::span<const MutationInfo> all_mutations() {
  // constexpr: no construction at run time, nothing to guard.
  static constexpr std::array<MutationInfo, 18> kAll = {{
      {Mutation::kNoRowAllReduce, "no-row-allreduce",
       "row-parallel output not reduced: each rank keeps its partial sum"},
      {Mutation::kDoubleAllReduce, "double-allreduce", "row-parallel output all-reduced twice"},
      {Mutation::kShardOffByOne, "shard-off-by-one",
       "rank r holds shard (r + 1) mod N of column-parallel weights"},
      {Mutation::kColumnBiasNotSharded, "column-bias-not-sharded",
       "every rank adds shard 0 of a column-parallel bias"},
      {Mutation::kReversedGather, "reversed-gather",
       "sequence-parallel all-gather concatenates in reverse rank order"},
      {Mutation::kNormGradNotReduced, "norm-grad-not-reduced",
       "sequence parallel: norm weight/bias gradients not all-reduced"},
      {Mutation::kAttentionScaleLocal, "attention-scale-local",
       "softmax scale from the local head count: 1/sqrt(hidden / (heads/N))"},
      {Mutation::kDgradAveraged, "dgrad-averaged",
       "column-parallel input gradient reduction divides by N (mean, not sum)"},
      {Mutation::kResidualBeforeReduce, "residual-before-reduce",
       "residual added on every rank before the row-parallel reduction"},
      {Mutation::kNoDgradAllReduce, "no-dgrad-allreduce",
       "column-parallel input gradient not reduced across the group"},
      {Mutation::kRowBiasBeforeReduce, "row-bias-before-reduce",
       "row-parallel bias added on every rank before the reduction"},
      {Mutation::kRowBiasGradNotReduced, "row-bias-grad-not-reduced",
       "sequence parallel: row-parallel bias gradient not all-reduced"},
      {Mutation::kGatedFc1OneBlock, "gated-fc1-one-block",
       "gated fc1 [a; b] (geglu, swiglu) sharded as one block: a rank gets rows of one half"},
      {Mutation::kQkvOneBlock, "qkv-one-block",
       "fused QKV not interleaved ([Q; K; V]) sharded as one block, not per Q, K and V"},
      {Mutation::kGqaWrongGroup, "gqa-wrong-group",
       "GQA: local query head i uses key/value group i mod groups (repeat, not repeat_interleave)"},
      {Mutation::kWindowOffset, "window-offset",
       "sliding-window mask (no_mask with bounds) shifted one token on ranks other than 0"},
      {Mutation::kAmaxNotReduced, "amax-not-reduced",
       "FP8 delayed scaling: amaxes not max-reduced across the group before the history update",
       Recipe::kFp8Delayed, 2},
      {Mutation::kAmaxHistoryNotUpdated, "amax-history-not-updated",
       "FP8 delayed scaling: the amax history is never updated, so every scale stays 1",
       Recipe::kFp8Delayed, 2},
  }};
  return kAll;
}

const MutationInfo& mutation_info(Mutation m) {
  const std::span<const MutationInfo> all = all_mutations();
  const auto it = std::find_if(all.begin(), all.end(),
                               [m](const MutationInfo& info) { return info.mutation == m; });
  TPCHECK_CHECK(it != all.end(), "mutation_info: no entry for mutation {}", static_cast<int>(m));
  return *it;
}

std::string_view mutation_name(Mutation m) {
  for (const MutationInfo& info : all_mutations()) {
    if (info.mutation == m) return info.name;
  }
  return "none";
}

Mutation parse_mutation(std::string_view name) {
  if (name == "none") return Mutation::kNone;
  std::string accepted = "none";
  for (const MutationInfo& info : all_mutations()) {
    if (info.name == name) return info.mutation;
    accepted += ", ";
    accepted += info.name;
  }
  TPCHECK_CHECK_INPUT(false, "unknown mutation '{}'; expected one of: {}", name, accepted);
  return Mutation::kNone;  // unreachable
}

}  // namespace tpcheck

// tpcheck/shard.h — how a global tensor is split across the ranks of a TP group.
//
// A ShardSpec says which dimension is split and how. The dimension is a sequence of
// consecutive blocks (one block by default); every block is split evenly across the
// ranks and rank r holds the r-th piece of each block, in block order. One block is the
// usual contiguous split (a column-parallel weight's rows, a sequence-parallel slice);
// several blocks describe fused tensors whose parts are sharded separately, e.g. a gated
// fc1 weight [2·ffn, hidden] = blocks {ffn, ffn}, or a non-interleaved fused QKV weight =
// blocks {heads·d, groups·d, groups·d}.
// Everything that shards or reassembles tensors goes through these functions, so
// parameters, inputs, outputs and gradients share one definition.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "tpcheck/tensor.h"

namespace tpcheck {

struct ShardSpec {
  int dim = -1;                      // -1: replicated (every rank holds the whole tensor)
  std::vector<std::int64_t> blocks;  // block sizes along `dim`; empty: one block

  static ShardSpec replicated() { return {}; }
  static ShardSpec along(int dim, std::vector<std::int64_t> blocks = {}) {
    return ShardSpec{dim, std::move(blocks)};
  }
  bool is_replicated() const { return dim < 0; }
  bool operator==(const ShardSpec&) const = default;
};

// Throws Error(kInput) naming the size when `global` cannot be split `world` ways
// (a block not divisible by world, blocks not summing to the dimension). `what` names
// the tensor in the message ("fc1_weight").
void check_shardable(const Shape& global, const ShardSpec& spec, int world, std::string_view what);

// Shape of one rank's shard.
Shape local_shape(const Shape& global, const ShardSpec& spec, int world);

// Global row-major flat index of element `local_flat` of rank `rank`'s shard.
std::int64_t global_flat_index(const Shape& global, const ShardSpec& spec, int rank, int world,
                               std::int64_t local_flat);

// Rank `rank`'s shard of a global tensor (a copy).
Tensor take_shard(const Tensor& global, const ShardSpec& spec, int rank, int world);

// Inverse of take_shard: reassembles the global tensor from all ranks' shards (rank
// order). For a replicated spec returns a copy of shards[0].
Tensor assemble_shards(const std::vector<Tensor>& shards, const ShardSpec& spec);

}  // namespace tpcheck

// ShardSpec semantics: which piece of a global tensor each rank of a TP group holds.
//
// The sharded dimension is a sequence of consecutive blocks (one block, the whole
// dimension, when spec.blocks is empty). Every block is split into `world` equal pieces
// and rank r holds piece r of every block, in block order. So with blocks {b0, b1} and
// world W, rank r's local dimension is [b0/W rows of block 0 | b1/W rows of block 1] and
// local row l of block j is global row start_j + r·(b_j/W) + l.
// take_shard and assemble_shards are exact inverses (pure copies, no arithmetic).
// Thread safety: pure functions.
#include "tpcheck/shard.h"

#include "tpcheck/error.h"

namespace tpcheck {

namespace {

// The blocks of the sharded dimension as the spec gives them, or the whole dimension.
std::vector<std::int64_t> blocks_of(const Shape& global, const ShardSpec& spec) {
  if (!spec.blocks.empty()) return spec.blocks;
  return {global[spec.dim]};
}

// Where each block starts along the global dimension, and its piece size per rank.
struct BlockLayout {
  std::vector<std::int64_t> global_start;  // block j starts at this global row
  std::vector<std::int64_t> piece;         // rows of block j each rank holds
  std::vector<std::int64_t> local_start;   // block j's piece starts at this local row
  std::int64_t local_dim = 0;
};

// REQUIRES: check_shardable(global, spec, world) passed, spec not replicated.
BlockLayout layout_of(const Shape& global, const ShardSpec& spec, int world) {
  BlockLayout layout;
  std::int64_t g = 0;
  for (std::int64_t b : blocks_of(global, spec)) {
    layout.global_start.push_back(g);
    layout.piece.push_back(b / world);
    layout.local_start.push_back(layout.local_dim);
    g += b;
    layout.local_dim += b / world;
  }
  return layout;
}

std::string blocks_str(const std::vector<std::int64_t>& blocks) {
  return fmt::format("{{{}}}", fmt::join(blocks, ", "));
}

}  // namespace

void check_shardable(const Shape& global, const ShardSpec& spec, int world, std::string_view what) {
  TPCHECK_CHECK_INPUT(world >= 1, "{}: tp={} is not a valid group size (expected tp >= 1)", what,
                      world);
  if (spec.is_replicated()) return;
  int rank = static_cast<int>(global.size());
  TPCHECK_CHECK_INPUT(spec.dim < rank,
                      "{}: cannot shard dimension {} of a rank-{} tensor of shape {}", what,
                      spec.dim, rank, shape_str(global));
  std::int64_t size = global[spec.dim];
  if (spec.blocks.empty()) {
    TPCHECK_CHECK_INPUT(size % world == 0, "{}: dimension {} of size {} is not divisible by tp={}",
                        what, spec.dim, size, world);
    return;
  }
  std::int64_t sum = 0;
  for (std::size_t j = 0; j < spec.blocks.size(); ++j) {
    std::int64_t b = spec.blocks[j];
    TPCHECK_CHECK_INPUT(b >= 0, "{}: block {} of dimension {} has negative size {}", what, j,
                        spec.dim, b);
    TPCHECK_CHECK_INPUT(b % world == 0,
                        "{}: dimension {} of size {} (block {} of size {}) is not divisible by "
                        "tp={}",
                        what, spec.dim, size, j, b, world);
    sum += b;
  }
  TPCHECK_CHECK_INPUT(sum == size,
                      "{}: blocks {} of dimension {} sum to {}, but the dimension has size {}",
                      what, blocks_str(spec.blocks), spec.dim, sum, size);
}

Shape local_shape(const Shape& global, const ShardSpec& spec, int world) {
  check_shardable(global, spec, world, "tensor");
  if (spec.is_replicated()) return global;
  Shape local = global;
  local[spec.dim] = layout_of(global, spec, world).local_dim;
  return local;
}

std::int64_t global_flat_index(const Shape& global, const ShardSpec& spec, int rank, int world,
                               std::int64_t local_flat) {
  if (spec.is_replicated()) return local_flat;
  check_shardable(global, spec, world, "tensor");
  TPCHECK_CHECK(rank >= 0 && rank < world, "global_flat_index: rank {} outside world {}", rank,
                world);
  TPCHECK_CHECK(local_flat >= 0 && local_flat < shape_numel(local_shape(global, spec, world)),
                "global_flat_index: local index {} outside rank {}'s shard of {}", local_flat, rank,
                shape_str(global));
  BlockLayout layout = layout_of(global, spec, world);
  // Row-major: flat = (outer · dim + row) · inner + col, with `row` the sharded index.
  std::int64_t inner = 1;
  for (std::size_t i = spec.dim + 1; i < global.size(); ++i) inner *= global[i];
  std::int64_t col = local_flat % inner;
  std::int64_t rest = local_flat / inner;
  std::int64_t local_row = rest % layout.local_dim;
  std::int64_t outer = rest / layout.local_dim;
  std::size_t j = layout.piece.size() - 1;
  while (local_row < layout.local_start[j] || layout.piece[j] == 0) --j;  // last block holding it
  std::int64_t global_row =
      layout.global_start[j] + rank * layout.piece[j] + (local_row - layout.local_start[j]);
  return (outer * global[spec.dim] + global_row) * inner + col;
}

Tensor take_shard(const Tensor& global, const ShardSpec& spec, int rank, int world) {
  check_shardable(global.shape(), spec, world, global.describe());
  TPCHECK_CHECK(rank >= 0 && rank < world, "take_shard: rank {} outside world {}", rank, world);
  if (spec.is_replicated()) return global.clone();
  BlockLayout layout = layout_of(global.shape(), spec, world);
  Shape shape = global.shape();
  shape[spec.dim] = layout.local_dim;
  Tensor local(shape, global.dtype(), global.device());  // where the global tensor is
  for (std::size_t j = 0; j < layout.piece.size(); ++j) {
    if (layout.piece[j] == 0) continue;
    local.write_slice(
        spec.dim, layout.local_start[j],
        global.slice(spec.dim, layout.global_start[j] + rank * layout.piece[j], layout.piece[j]));
  }
  return local;
}

Tensor assemble_shards(const std::vector<Tensor>& shards, const ShardSpec& spec) {
  TPCHECK_CHECK(!shards.empty(), "assemble_shards: no shards");
  if (spec.is_replicated()) return shards[0].clone();
  int world = static_cast<int>(shards.size());
  const Tensor& first = shards[0];
  for (int r = 1; r < world; ++r) {
    TPCHECK_CHECK(shards[r].shape() == first.shape() && shards[r].dtype() == first.dtype(),
                  "assemble_shards: rank {} holds {} but rank 0 holds {}", r, shards[r].describe(),
                  first.describe());
  }
  TPCHECK_CHECK(spec.dim < first.rank(), "assemble_shards: dimension {} of a shard {}", spec.dim,
                first.describe());
  Shape global_shape = first.shape();
  if (spec.blocks.empty()) {
    global_shape[spec.dim] = first.dim(spec.dim) * world;
  } else {
    std::int64_t sum = 0;
    for (std::int64_t b : spec.blocks) sum += b;
    global_shape[spec.dim] = sum;
  }
  check_shardable(global_shape, spec, world, "assemble_shards");
  BlockLayout layout = layout_of(global_shape, spec, world);
  TPCHECK_CHECK(layout.local_dim == first.dim(spec.dim),
                "assemble_shards: shard {} does not match blocks {} split {} ways",
                first.describe(), blocks_str(spec.blocks), world);
  Tensor global(global_shape, first.dtype(), first.device());  // where the shards are
  for (int r = 0; r < world; ++r) {
    for (std::size_t j = 0; j < layout.piece.size(); ++j) {
      if (layout.piece[j] == 0) continue;
      global.write_slice(spec.dim, layout.global_start[j] + r * layout.piece[j],
                         shards[r].slice(spec.dim, layout.local_start[j], layout.piece[j]));
    }
  }
  return global;
}

}  // namespace tpcheck

// Counter-based random numbers: Philox-4x32-10 keyed by (seed, tensor name, global index).
//
// Philox-4x32-10 is implemented exactly as in Salmon, Moraes, Dror, Shaw, "Parallel random
// numbers: as easy as 1, 2, 3" (SC'11) and the Random123 reference code: multipliers
// 0xD2511F53 and 0xCD9E8D57, Weyl key increments 0x9E3779B9 and 0xBB67AE85, 10 rounds
// with the key bumped between rounds.
//
// How (seed, name, index) becomes one Philox input. Philox-4x32 has a 64-bit key and a
// 128-bit counter; we have 64 bits of seed, 64 bits of name hash (FNV-1a) and 64 bits of
// index, so the name hash rides in the counter's upper half:
//   key     = (low32(seed), high32(seed))
//   counter = (low32(index), high32(index), low32(h), high32(h)),  h = fnv1a64(name)
// This map is injective in (seed, h, index): distinct triples never share a Philox input
// for any index < 2^64, so streams of different tensors (or seeds) never overlap. Two
// names collide only if their 64-bit FNV-1a hashes do. (rng.h describes the key as
// "(seed, hash)"; putting the hash in the counter instead is what keeps every 64-bit
// seed and every 64-bit index available. Philox is a keyed bijection of the counter, so
// this costs nothing in quality.)
//
// From one block of four 32-bit words w0..w3:
//   uniform01: k = the top 53 bits of (w0 << 32 | w1); u = (k + 1/2) · 2^-53, the middle
//     of the k-th of 2^53 equal cells of [0, 1). For k < 2^52 this is exact. For larger k
//     the midpoint needs 54 significant bits, and it is rounded *down* to k · 2^-53 (a
//     shift of 2^-54, far below anything tpcheck measures) so u never reaches 1.
//     Either way u ∈ (0, 1): never 0, never 1.
//   normal: Box–Muller on two uniforms of the same block, u1 from (w0, w1) and u2 from
//     (w2, w3): z = sqrt(-2 ln u1) · cos(2π u2). One normal per index (the sine half is
//     dropped) so every element depends only on its own counter.
// The value of an element is computed in f64 and rounded to the storage dtype once.
// log and cos come from the C library; on one machine the results are deterministic,
// which is all the shard-equals-slice property needs (both sides run the same code).
// Thread safety: pure functions.
#include "tpcheck/rng.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/device_runtime.h"
#include "core/random_math.h"
#include "tpcheck/error.h"

namespace tpcheck {

namespace {

namespace rm = random_math;

std::array<std::uint32_t, 4> to_array(const rm::Words& b) { return {b.w[0], b.w[1], b.w[2], b.w[3]}; }

std::array<std::uint32_t, 4> philox_block(std::uint64_t seed, std::string_view name,
                                          std::uint64_t index) {
  return to_array(rm::philox_block(seed, fnv1a64(name), index));
}

rm::FillKind fill_kind(const FillSpec& fill) {
  switch (fill.kind) {
    case FillSpec::Kind::kNormal: return rm::FillKind::kNormal;
    case FillSpec::Kind::kUniform: return rm::FillKind::kUniform;
    case FillSpec::Kind::kConstant: return rm::FillKind::kConstant;
  }
  TPCHECK_CHECK(false, "unknown FillSpec kind {}", static_cast<int>(fill.kind));
  return rm::FillKind::kConstant;
}

}  // namespace

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key) {
  return to_array(rm::philox4x32_10(rm::Words{{counter[0], counter[1], counter[2], counter[3]}},
                                    key[0], key[1]));
}

std::uint64_t fnv1a64(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64-bit offset basis
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;  // FNV 64-bit prime
  }
  return h;
}

double rng_uniform01(std::uint64_t seed, std::string_view name, std::uint64_t index) {
  std::array<std::uint32_t, 4> w = philox_block(seed, name, index);
  return rm::to_open01(w[0], w[1]);
}

double rng_normal(std::uint64_t seed, std::string_view name, std::uint64_t index) {
  return rm::normal_from_block(rm::philox_block(seed, fnv1a64(name), index));
}

double fill_value(const FillSpec& fill, std::uint64_t seed, std::string_view name,
                  std::uint64_t global_index) {
  return rm::fill_value(fill_kind(fill), fill.a, fill.b, seed, fnv1a64(name), global_index);
}

Tensor generate(const FillSpec& fill, std::uint64_t seed, std::string_view name,
                const Shape& global_shape, DType dtype, const ShardSpec& spec, int rank,
                int world, Device device) {
  check_shardable(global_shape, spec, world, name);
  TPCHECK_CHECK(rank >= 0 && rank < world, "generate({}): rank {} outside world {}", name, rank,
                world);
  const Shape shape = local_shape(global_shape, spec, world);
  const std::uint64_t name_hash = fnv1a64(name);  // once per tensor, not per element
  const rm::FillKind kind = fill_kind(fill);
  if (device != Device::kCpu) {
    // On the device: the kernel maps each local element to its global index through the
    // sharded dimension's row map (local row → global row), computed here once per row.
    GlobalIndexMap map;
    if (!spec.is_replicated()) {
      for (std::size_t i = spec.dim + 1; i < global_shape.size(); ++i) map.inner *= global_shape[i];
      map.global_rows = global_shape[spec.dim];
      map.row_map.resize(shape[spec.dim]);
      for (std::int64_t r = 0; r < shape[spec.dim]; ++r)
        map.row_map[r] = global_flat_index(global_shape, spec, rank, world, r * map.inner) / map.inner;
    }
    Tensor out(shape, dtype, device);
    device_runtime(device).generate(out.raw(), dtype, out.numel(), static_cast<int>(kind),
                                    fill.a, fill.b, seed, name_hash, map);
    return out;
  }
  Tensor out(shape, dtype);
  // Elements after the sharded dimension are contiguous in both the shard and the global
  // tensor, so one global_flat_index call per run of `inner` elements is enough.
  std::int64_t inner = 1;
  if (!spec.is_replicated()) {
    for (std::size_t i = spec.dim + 1; i < global_shape.size(); ++i) inner *= global_shape[i];
  } else {
    inner = std::max<std::int64_t>(out.numel(), 1);
  }
  for (std::int64_t run = 0; run < out.numel(); run += inner) {
    std::int64_t g = global_flat_index(global_shape, spec, rank, world, run);
    for (std::int64_t c = 0; c < inner; ++c) {
      out.set(run + c, rm::fill_value(kind, fill.a, fill.b, seed, name_hash,
                                      static_cast<std::uint64_t>(g + c)));
    }
  }
  return out;
}

}  // namespace tpcheck

// tpcheck/rng.h — counter-based random numbers keyed by (seed, name, global index).
//
// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
// The key is the 64-bit seed; the 128-bit counter is (the element's *global* row-major
// flat index, the 64-bit FNV-1a hash of the tensor name). So the value of an element depends only on
// (seed, name, global index): a shard generated from its global indices equals the same
// slice of the full tensor bit for bit, with no copying and no communication.
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "tpcheck/shard.h"
#include "tpcheck/tensor.h"

namespace tpcheck {

// One Philox-4x32-10 block: 4 random 32-bit words for (key, counter).
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key);

std::uint64_t fnv1a64(std::string_view text);

// Uniform in the open interval (0, 1), with 53 random bits.
double rng_uniform01(std::uint64_t seed, std::string_view name, std::uint64_t index);
// Standard normal (Box–Muller on the block's words).
double rng_normal(std::uint64_t seed, std::string_view name, std::uint64_t index);

struct FillSpec {
  enum class Kind { kNormal, kUniform, kConstant };
  Kind kind = Kind::kNormal;
  double a = 0.0;  // normal: mean; uniform: low; constant: the value
  double b = 1.0;  // normal: std; uniform: high

  static FillSpec normal(double mean, double std) { return {Kind::kNormal, mean, std}; }
  static FillSpec uniform(double low, double high) { return {Kind::kUniform, low, high}; }
  static FillSpec constant(double value) { return {Kind::kConstant, value, 0.0}; }
};

double fill_value(const FillSpec& fill, std::uint64_t seed, std::string_view name,
                  std::uint64_t global_index);

// Rank `rank`'s shard of the global tensor `name` filled by `fill`, rounded to `dtype`.
// With world == 1 (or a replicated spec) this is the whole tensor. On a device other than
// the CPU the values are computed there by the device runtime with the same formulas
// (src/core/random_math.h; f64 values may differ from the host's in the last bit, as
// the device's log and cos are not the C library's).
Tensor generate(const FillSpec& fill, std::uint64_t seed, std::string_view name,
                const Shape& global_shape, DType dtype, const ShardSpec& spec = {}, int rank = 0,
                int world = 1, Device device = Device::kCpu);

}  // namespace tpcheck

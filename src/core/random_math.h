// random_math.h — the arithmetic of tpcheck's random streams, shared by the host (rng.cpp,
// the rounding probe on CPU tensors) and the CUDA kernels (src/backend/cuda/random.cu), so the GPU
// generates with the same Philox words and the same formulas as the host.
//
// Philox-4x32-10 and the (seed, name hash, index) → counter map are described in
// rng.cpp. The GPU's log and cos are not glibc's: a generated f64 value can differ in its
// last bit between host and device (CUDA documents ≤ 1 ulp for log, ≤ 2 ulp for cos);
// after rounding to f32/f16/bf16 the values almost always agree. Every run of one case
// generates on one device, so single, sharded and truth always see the same values.
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TPCHECK_HOST_DEVICE __host__ __device__
#else
#define TPCHECK_HOST_DEVICE
#endif

namespace tpcheck::random_math {

// a · b + c with two roundings, as the host computes it: nvcc would otherwise contract
// it into one fused multiply-add and the device's value could differ in the last bit.
TPCHECK_HOST_DEVICE inline double mul_add_two_roundings(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(__dmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

struct Words {
  std::uint32_t w[4];
};

TPCHECK_HOST_DEVICE inline Words philox4x32_10(Words x, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u;  // golden ratio
  constexpr std::uint32_t kW1 = 0xBB67AE85u;  // sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * x.w[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * x.w[2];
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    x = Words{{hi1 ^ x.w[1] ^ k0, lo1, hi0 ^ x.w[3] ^ k1, lo0}};
  }
  return x;
}

// The block of element `index` of the tensor whose name hashes to `h` (rng.cpp).
TPCHECK_HOST_DEVICE inline Words philox_block(std::uint64_t seed, std::uint64_t h,
                                              std::uint64_t index) {
  return philox4x32_10(Words{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                              static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(h >> 32)}},
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// (k + 1/2) · 2^-53 for the top 53 bits k of (hi << 32 | lo), in (0, 1); see rng.cpp.
TPCHECK_HOST_DEVICE inline double to_open01(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t k = ((static_cast<std::uint64_t>(hi) << 32) | lo) >> 11;
  constexpr std::uint64_t kExactBelow = std::uint64_t{1} << 52;
  if (k < kExactBelow) return (static_cast<double>(k) + 0.5) * 0x1p-53;
  return static_cast<double>(k) * 0x1p-53;
}

// Box–Muller on one block: one standard normal.
TPCHECK_HOST_DEVICE inline double normal_from_block(const Words& b) {
  constexpr double kPi = 3.141592653589793238462643383279502884;  // std::numbers::pi
  const double u1 = to_open01(b.w[0], b.w[1]);
  const double u2 = to_open01(b.w[2], b.w[3]);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * kPi * u2);
}

// The fill kinds of FillSpec (rng.h), as plain numbers so kernels can take them.
enum class FillKind : int { kNormal = 0, kUniform = 1, kConstant = 2 };

TPCHECK_HOST_DEVICE inline double fill_value(FillKind kind, double a, double b, std::uint64_t seed,
                                             std::uint64_t h, std::uint64_t index) {
  switch (kind) {
    case FillKind::kNormal:
      return mul_add_two_roundings(b, normal_from_block(philox_block(seed, h, index)), a);
    case FillKind::kUniform: {
      const Words w = philox_block(seed, h, index);
      return mul_add_two_roundings(b - a, to_open01(w.w[0], w.w[1]), a);
    }
    case FillKind::kConstant:
      return a;
  }
  return a;
}

// The rounding probe's factor for stream position `counter` (≥ 1): 1 + u·r with r
// uniform in [-1, 1) from splitmix64(seed + golden · counter).
TPCHECK_HOST_DEVICE inline double probe_factor(double u, std::uint64_t seed, std::uint64_t counter) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * counter;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double r = static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
  return mul_add_two_roundings(u, r, 1.0);
}

}  // namespace tpcheck::random_math

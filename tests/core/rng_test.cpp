// Tests for the counter-based RNG: Philox-4x32-10 against the published known-answer
// vectors, the documented (seed, name, index) → (key, counter) scheme, the distributions,
// and the property the whole design rests on: a shard generated from its global indices
// equals the same slice of the full tensor, bit for bit.
#include "tpcheck/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "tpcheck/error.h"
#include "tpcheck/shard.h"

namespace tpcheck {
namespace {

using Words = std::array<std::uint32_t, 4>;

// Known-answer vectors from the Random123 distribution (tests/kat_vectors, "philox4x32 10"
// lines: counter words, key words, expected output). These are the published reference;
// no Python package exposes Philox-4x32 (numpy's Philox is the 4x64 variant and JAX uses
// Threefry), so the KAT is the independent check.
TEST(Philox, KnownAnswerZeros) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(Philox, KnownAnswerOnes) {
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, KnownAnswerPiDigits) {
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// FNV-1a 64 test vectors from the FNV reference (Noll's test suite).
TEST(Fnv1a64, ReferenceVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

// The scheme documented in rng.cpp, restated independently: key = seed, counter =
// (index, hash of name); u = (top 53 bits + 1/2) · 2^-53, rounded down when inexact.
TEST(Rng, UniformFollowsTheDocumentedScheme) {
  std::mt19937_64 gen(7);
  for (int i = 0; i < 1000; ++i) {
    std::uint64_t seed = gen(), index = gen();
    std::string name = "param" + std::to_string(i % 17);
    std::uint64_t h = fnv1a64(name);
    Words w = philox4x32_10({std::uint32_t(index), std::uint32_t(index >> 32), std::uint32_t(h),
                             std::uint32_t(h >> 32)},
                            {std::uint32_t(seed), std::uint32_t(seed >> 32)});
    std::uint64_t k = ((std::uint64_t(w[0]) << 32) | w[1]) >> 11;
    // Exact reference in long double (64-bit mantissa holds k + 1/2 for every k < 2^53),
    // then rounded toward zero to double.
    long double exact = (static_cast<long double>(k) + 0.5L) * 0x1p-53L;
    double expected = static_cast<double>(exact);
    if (static_cast<long double>(expected) > exact) expected = std::nextafter(expected, 0.0);
    ASSERT_EQ(rng_uniform01(seed, name, index), expected) << "seed " << seed << " index " << index;
  }
}

TEST(Rng, UniformIsInOpenInterval) {
  for (std::uint64_t i = 0; i < 200000; ++i) {
    double u = rng_uniform01(1, "u", i);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

// Every input of the triple changes the value, and swapping roles does not collide.
TEST(Rng, DependsOnSeedNameAndIndex) {
  double base = rng_uniform01(1, "w", 2);
  EXPECT_NE(base, rng_uniform01(2, "w", 2));
  EXPECT_NE(base, rng_uniform01(1, "v", 2));
  EXPECT_NE(base, rng_uniform01(1, "w", 3));
  EXPECT_NE(rng_uniform01(0, "w", 1), rng_uniform01(1, "w", 0));
  EXPECT_NE(rng_uniform01(0, "w", std::uint64_t{1} << 32), rng_uniform01(0, "w", 1));
  // 10^5 values of distinct (name, index) pairs: no repeats (2^53 cells, so a repeat by
  // chance has probability ~ 10^10 / 2^54 ≈ 6e-7).
  std::set<double> seen;
  for (int n = 0; n < 10; ++n) {
    for (std::uint64_t i = 0; i < 10000; ++i)
      seen.insert(rng_uniform01(5, "p" + std::to_string(n), i));
  }
  EXPECT_EQ(seen.size(), 100000u);
}

// Moments of 4·10^5 draws against the exact ones. Bounds are 5 standard errors of the
// estimator (probability of a false failure < 1e-6 per check).
TEST(Rng, UniformMoments) {
  const int n = 400000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    double u = rng_uniform01(11, "moments", i);
    sum += u;
    sum2 += (u - 0.5) * (u - 0.5);
  }
  double mean = sum / n, var = sum2 / n;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  // Var of (u - 1/2)^2 is 1/80 - 1/144.
  EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt((1.0 / 80 - 1.0 / 144) / n));
}

TEST(Rng, NormalMomentsAndTail) {
  const int n = 400000;
  double sum = 0, sum2 = 0, sum4 = 0;
  int below_one = 0;
  for (int i = 0; i < n; ++i) {
    double z = rng_normal(3, "normal", i);
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    below_one += z < 1.0;
  }
  // Standard errors: mean 1/sqrt(n); E z^2 has variance 2; E z^4 has variance 105 - 9 = 96.
  EXPECT_NEAR(sum / n, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(sum2 / n, 1.0, 5 * std::sqrt(2.0 / n));
  EXPECT_NEAR(sum4 / n, 3.0, 5 * std::sqrt(96.0 / n));
  double p = 0.5 * std::erfc(-1.0 / std::sqrt(2.0));  // Phi(1)
  EXPECT_NEAR(double(below_one) / n, p, 5 * std::sqrt(p * (1 - p) / n));
}

TEST(Rng, FillValue) {
  EXPECT_EQ(fill_value(FillSpec::constant(0.05), 1, "c", 123), 0.05);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(fill_value(FillSpec::normal(0.5, 0.023), 9, "n", i),
              0.5 + 0.023 * rng_normal(9, "n", i));
    double u = fill_value(FillSpec::uniform(-2.0, 3.0), 9, "u", i);
    EXPECT_EQ(u, -2.0 + 5.0 * rng_uniform01(9, "u", i));
    EXPECT_GT(u, -2.0);
    EXPECT_LT(u, 3.0);
  }
}

// generate rounds each f64 value to the dtype exactly once (no detour through f32).
TEST(Rng, GenerateRoundsOnceFromF64) {
  Shape shape{7, 9};
  FillSpec fill = FillSpec::normal(0.0, 3.0);
  Tensor f16 = generate(fill, 4, "x", shape, DType::kF16);
  Tensor bf16 = generate(fill, 4, "x", shape, DType::kBF16);
  Tensor f64 = generate(fill, 4, "x", shape, DType::kF64);
  Tensor f32 = generate(fill, 4, "x", shape, DType::kF32);
  for (std::int64_t i = 0; i < shape_numel(shape); ++i) {
    double v = fill_value(fill, 4, "x", i);
    EXPECT_EQ(f64.data<double>()[i], v);
    EXPECT_EQ(f32.data<float>()[i], static_cast<float>(v));
    EXPECT_EQ(f16.data<std::uint16_t>()[i], f64_to_f16_bits(v));
    EXPECT_EQ(bf16.data<std::uint16_t>()[i], f64_to_bf16_bits(v));
  }
}

// The design's central property: for every fill, dtype, world size, rank, tensor rank,
// sharded dimension and block structure, the shard generated from global indices is
// bitwise the slice take_shard cuts from the full tensor.
TEST(Rng, ShardGeneratedEqualsSliceOfFull) {
  std::mt19937 gen(2024);
  const FillSpec fills[] = {FillSpec::normal(0.0, 0.023), FillSpec::uniform(-1.0, 2.0),
                            FillSpec::constant(0.05)};
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};
  int checked = 0;
  for (int world = 1; world <= 8; ++world) {
    for (int rank_of_tensor = 2; rank_of_tensor <= 4; ++rank_of_tensor) {
      for (bool last : {false, true}) {
        for (int nblocks = 1; nblocks <= 3; ++nblocks) {
          int dim = last ? rank_of_tensor - 1 : 0;
          Shape shape(rank_of_tensor);
          for (auto& d : shape) d = 1 + gen() % 3;
          std::vector<std::int64_t> blocks;
          std::int64_t total = 0;
          for (int b = 0; b < nblocks; ++b) {
            blocks.push_back(world * (1 + gen() % 3));
            total += blocks.back();
          }
          shape[dim] = total;
          ShardSpec spec =
              ShardSpec::along(dim, nblocks == 1 ? std::vector<std::int64_t>{} : blocks);
          const FillSpec& fill = fills[gen() % 3];
          DType dtype = dtypes[gen() % 4];
          std::uint64_t seed = gen();
          Tensor full = generate(fill, seed, "layer.weight", shape, dtype);
          for (int r = 0; r < world; ++r) {
            Tensor shard = generate(fill, seed, "layer.weight", shape, dtype, spec, r, world);
            ASSERT_TRUE(bitwise_equal(shard, take_shard(full, spec, r, world)))
                << "world " << world << " rank " << r << " shape " << shape_str(shape) << " dim "
                << dim << " blocks " << nblocks << " dtype " << dtype_name(dtype);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 2 * 3 * (8 * 9 / 2));
}

TEST(Rng, GenerateReplicatedIsTheWholeTensorOnEveryRank) {
  Shape shape{4, 6};
  Tensor full = generate(FillSpec::normal(0, 1), 1, "g", shape, DType::kF32);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(bitwise_equal(
        generate(FillSpec::normal(0, 1), 1, "g", shape, DType::kF32, ShardSpec::replicated(), r, 3),
        full));
  }
}

TEST(Rng, GenerateRejectsUnshardableShape) {
  try {
    generate(FillSpec::normal(0, 1), 1, "fc1_weight", {96, 8}, DType::kF32, ShardSpec::along(0), 0,
             5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("fc1_weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("96"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpcheck

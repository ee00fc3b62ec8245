// cuda_quantize_test — quantize_on_gpu (src/quant/cuda/quantize.cu) against the CPU's
// quantize (src/quant), bit for bit: data and scale_inv of both copies, the amax and the
// scale, for every recipe and role, f32 / bf16 / f16 inputs, with the edge cases of the
// conformance test (an all-zero block, a tiny block next to a large amax — NVFP4's block
// scale rounds to 0 —, exact powers of two, ±inf, values that saturate) and a given
// (group-reduced) amax. The CPU side is itself checked against an independent numpy
// implementation (tests/python/test_quant_conformance.py).
//
// Needs a GPU: without one every test is skipped with the reason (CI has none). On the
// GPU machine: `ctest -L gpu` or build/tests/cuda_quantize_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {
namespace {

// REQUIRES: rows >= 7, cols >= 16 (the 32-wide patterns are cut to the row's width).
Tensor edge_matrix(std::int64_t rows, std::int64_t cols, DType dtype, std::uint64_t seed,
                   bool with_inf, bool with_nan = false) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const int row = static_cast<int>(i / cols);
    v[i] = static_cast<float>(std::ldexp(rng_normal(seed, "q", i), row % 13 - 6));
  }
  const int pattern_width = static_cast<int>(std::min<std::int64_t>(32, cols));
  for (int c = 0; c < pattern_width; ++c) v[c] = 0.0f;                      // all-zero block
  for (int c = 0; c < 16; ++c) v[cols + c] = 1e-6f;                         // tiny block
  v[2 * cols] = 1e4f;                                                       // large amax
  // powers of two
  for (int c = 0; c < pattern_width; ++c) v[3 * cols + c] = std::ldexp(1.0f, c - 10);
  v[4 * cols + 1] = 6e4f;                                                   // saturates E4M3
  if (with_inf) v[5 * cols + 3] = -std::numeric_limits<float>::infinity();
  if (with_nan) {  // a positive quiet NaN in the first tile and in the last (maybe partial) one
    v[6 * cols + 9] = std::numeric_limits<float>::quiet_NaN();
    v[(rows - 1) * cols + cols - 3] = std::numeric_limits<float>::quiet_NaN();
  }
  return Tensor::from_f32(v, {rows, cols}, dtype);
}

void expect_same(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  const Tensor g = gpu.to_host();
  ASSERT_EQ(g.shape(), cpu.shape()) << what;
  ASSERT_EQ(g.dtype(), cpu.dtype()) << what;
  if (bitwise_equal(g, cpu)) return;
  const auto* a = static_cast<const unsigned char*>(g.raw());
  const auto* b = static_cast<const unsigned char*>(cpu.raw());
  for (std::size_t i = 0; i < cpu.nbytes(); ++i) {
    if (a[i] != b[i]) {
      ADD_FAILURE() << what << ": first differing byte " << i << ": gpu " << int(a[i]) << ", cpu "
                    << int(b[i]);
      return;
    }
  }
}

// The tensor's amax: bit for bit, except that a NaN need only be a NaN (the CPU returns
// the first NaN element as it is; the GPU max-reduces |x|, and widening an f16 NaN on the
// GPU may change its payload — no formula looks at it).
void expect_same_amax(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  if (std::isnan(static_cast<float>(cpu.at(0)))) {
    EXPECT_TRUE(std::isnan(static_cast<float>(gpu.at(0)))) << what << ": gpu " << gpu.at(0);
    return;
  }
  expect_same(gpu, cpu, what);
}

// Data and scale_inv of both copies, and the scale, bit for bit (amax: each test's rule).
void expect_same_copies(const QuantizedData& gpu, const QuantizedData& cpu,
                        const std::string& what) {
  expect_same(gpu.rowwise_data, cpu.rowwise_data, what + " rowwise data");
  expect_same(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, what + " rowwise scale_inv");
  expect_same(gpu.columnwise_data, cpu.columnwise_data, what + " columnwise data");
  expect_same(gpu.columnwise_scale_inv, cpu.columnwise_scale_inv, what + " columnwise scale_inv");
  expect_same(gpu.scale, cpu.scale, what + " scale");
}

struct Case {
  Recipe recipe;
  QuantRole role;
};

TEST(CudaQuantize, EveryRecipeMatchesTheCpuBitForBit) {
  TPCHECK_REQUIRE_GPU();
  auto backend = make_cuda_backend();  // registers the GPU runtime
  const Case cases[] = {
      {Recipe::kFp8Delayed, QuantRole::kInput},      {Recipe::kFp8Current, QuantRole::kInput},
      {Recipe::kFp8Current, QuantRole::kGradOutput}, {Recipe::kFp8Block, QuantRole::kInput},
      {Recipe::kFp8Block, QuantRole::kWeight},       {Recipe::kMxfp8, QuantRole::kInput},
      {Recipe::kNvfp4, QuantRole::kInput},
  };
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      for (bool with_inf : {false, true}) {
        for (bool given_amax : {false, true}) {
          const Tensor x = edge_matrix(256, 384, dtype, 11, with_inf);
          QuantizeOptions o;
          o.recipe = c.recipe;
          o.role = c.role;
          o.scale = 0.75f;                             // delayed scaling's scale of this step
          if (given_amax) o.amax = 2.0f * amax_of(x);  // as after a reduction
          const std::string what = std::string(recipe_name(c.recipe)) + "/" +
                                   std::string(quant_role_name(c.role)) + " " +
                                   std::string(dtype_name(dtype)) + (with_inf ? " inf" : "") +
                                   (given_amax ? " given amax" : "");
          const auto cpu = quantize(x, o);
          const auto gpu = quantize_on_gpu(x.to_device(Device::kCuda), o);
          expect_same_copies(*gpu, *cpu, what);
          expect_same(gpu->amax, cpu->amax, what + " amax");
          EXPECT_EQ(gpu->block, cpu->block) << what;
        }
      }
    }
  }
}

// The block kernel's paths: tiles cut by the tensor's edge (rows and columns that are not
// multiples of 128, as far as each recipe and role allows), a NaN in a block (and so in
// the tensor's amax), and each copy alone as well as both. FP8 block scaling's inputs
// need cols % 128 (and rows % 128 for the columnwise copy), its weights both; MXFP8
// cols % 32, NVFP4 cols % 16, and the columnwise copy rows likewise (check_quantizable).
// Per-tensor FP8 is left out of the NaN cases: its kernels are not the block kernel, and
// the E5M2 NaN pattern the GPU's cast writes is not established against the CPU's.
TEST(CudaQuantize, BlockRecipesMatchTheCpuOnEdgeTilesNanAndEachCopy) {
  TPCHECK_REQUIRE_GPU();
  auto backend = make_cuda_backend();
  struct ShapeCase {
    Recipe recipe;
    QuantRole role;
    std::int64_t rows, cols;
    bool columnwise_allowed;  // rows a multiple of what the columnwise copy needs
  };
  const ShapeCase cases[] = {
      {Recipe::kFp8Block, QuantRole::kInput, 256, 384, true},
      {Recipe::kFp8Block, QuantRole::kInput, 272, 384, false},  // a row tile of 16
      {Recipe::kFp8Block, QuantRole::kWeight, 384, 256, true},
      {Recipe::kMxfp8, QuantRole::kInput, 160, 224, true},   // tiles of 32 rows, 96 columns
      {Recipe::kMxfp8, QuantRole::kInput, 272, 352, false},  // 16 rows, 96 columns
      {Recipe::kNvfp4, QuantRole::kInput, 272, 336, true},   // 16 rows, 80 columns
      {Recipe::kNvfp4, QuantRole::kInput, 37, 208, false},   // 37 rows, 80 columns
      // The narrowest shards the suite makes (NVFP4 at TP 8: ffn 128 / 8 = 16 columns of
      // fc1's output and fc2's weight; tensors of 16 rows): a tile of 16 columns or rows.
      {Recipe::kNvfp4, QuantRole::kInput, 256, 16, true},
      {Recipe::kNvfp4, QuantRole::kInput, 16, 128, true},
      {Recipe::kNvfp4, QuantRole::kInput, 144, 16, true},
  };
  const QuantUsage usages[] = {{true, true}, {true, false}, {false, true}};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const ShapeCase& c : cases) {
      for (const QuantUsage& usage : usages) {
        if (usage.columnwise && !c.columnwise_allowed) continue;
        for (bool with_nan : {false, true}) {
          // NVFP4 also with a finite given amax, so that a NaN block meets an ordinary S_enc.
          for (bool given_amax : {false, true}) {
            if (given_amax && c.recipe != Recipe::kNvfp4) continue;
            const Tensor x = edge_matrix(c.rows, c.cols, dtype, 12, /*with_inf=*/true, with_nan);
            QuantizeOptions o;
            o.recipe = c.recipe;
            o.role = c.role;
            o.usage = usage;
            if (given_amax) o.amax = 1e5f;
            const std::string what =
                std::string(recipe_name(c.recipe)) + "/" + std::string(quant_role_name(c.role)) +
                " " + std::string(dtype_name(dtype)) + " [" + std::to_string(c.rows) + ", " +
                std::to_string(c.cols) + "]" + (usage.rowwise ? " rowwise" : "") +
                (usage.columnwise ? " columnwise" : "") + (with_nan ? " nan" : "") +
                (given_amax ? " given amax" : "");
            const auto cpu = quantize(x, o);
            const auto gpu = quantize_on_gpu(x.to_device(Device::kCuda), o);
            expect_same_copies(*gpu, *cpu, what);
            expect_same_amax(gpu->amax, cpu->amax, what + " amax");
          }
        }
      }
    }
  }
}

// The device element casts the quantization kernels use, against the CPU's cast_satfinite
// (itself checked against ml_dtypes, tests/python/test_quant_conformance.py): E2M1 on
// every one of the 2^32 f32 patterns — its FP32-pipe path on every value that is not NaN,
// sat_e2m1 on every NaN (cast_satfinite_kernel) —, E4M3 and E5M2 on every 251st pattern
// (their hardware conversion; a NaN need only stay a NaN, see the test above).
TEST(CudaQuantize, ElementCastsMatchTheCpuOnEveryF32Pattern) {
  TPCHECK_REQUIRE_GPU();
  auto backend = make_cuda_backend();
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  // Runs fn(begin, end) over [0, n) split across the host's cores.
  const auto parallel = [&](std::size_t n, const auto& fn) {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] { fn(n * t / threads, n * (t + 1) / threads); });
    }
    for (auto& th : pool) th.join();
  };
  struct FormatCase {
    DType format;
    std::uint64_t stride;  // patterns 0, stride, 2·stride, ... below 2^32
  };
  constexpr std::uint64_t kPatterns = std::uint64_t{1} << 32;
  constexpr std::size_t kChunk = std::size_t{1} << 26;
  for (const FormatCase fc : {FormatCase{DType::kF4E2M1, 1}, FormatCase{DType::kF8E4M3, 251},
                              FormatCase{DType::kF8E5M2, 251}}) {
    const std::uint64_t count = (kPatterns + fc.stride - 1) / fc.stride;
    std::atomic<std::uint64_t> mismatches{0}, first_bad{kPatterns};
    for (std::uint64_t begin = 0; begin < count; begin += kChunk) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, count - begin));
      std::vector<float> values(n);
      parallel(n, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) {
          values[i] = std::bit_cast<float>(static_cast<std::uint32_t>((begin + i) * fc.stride));
        }
      });
      const Tensor x = Tensor::from_f32(values, {static_cast<std::int64_t>(n)}, DType::kF32);
      const Tensor gpu = cast_satfinite_on_gpu(x.to_device(Device::kCuda), fc.format).to_host();
      const auto* bytes = static_cast<const std::uint8_t*>(gpu.raw());
      parallel(n, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) {
          const std::uint8_t cpu = cast_satfinite(fc.format, values[i]);
          const bool same = std::isnan(values[i]) && fc.format != DType::kF4E2M1
                                ? std::isnan(fc.format == DType::kF8E4M3
                                                 ? f8e4m3_bits_to_f32(bytes[i])
                                                 : f8e5m2_bits_to_f32(bytes[i]))
                                : bytes[i] == cpu;
          if (!same) {
            ++mismatches;
            std::uint64_t pattern = (begin + i) * fc.stride, seen = first_bad.load();
            while (pattern < seen && !first_bad.compare_exchange_weak(seen, pattern)) {
            }
          }
        }
      });
    }
    EXPECT_EQ(mismatches.load(), 0u)
        << dtype_name(fc.format) << ": " << mismatches.load() << " of " << count
        << " patterns differ; the first 0x" << std::hex << first_bad.load() << std::dec;
  }
}

TEST(CudaQuantize, RejectsWhatTheCpuRejects) {
  TPCHECK_REQUIRE_GPU();
  auto backend = make_cuda_backend();
  QuantizeOptions o;
  o.recipe = Recipe::kMxfp8;
  const Tensor x = Tensor::zeros({64, 40}, DType::kF32).to_device(Device::kCuda);
  try {
    quantize_on_gpu(x, o, "fc1 input");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpcheck

// cuda_quantize_test — quantize_on_gpu (src/backend/cuda/quantize.cu) against the CPU's
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

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {
namespace {

Tensor edge_matrix(std::int64_t rows, std::int64_t cols, DType dtype, std::uint64_t seed,
                   bool with_inf) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const int row = static_cast<int>(i / cols);
    v[i] = static_cast<float>(std::ldexp(rng_normal(seed, "q", i), row % 13 - 6));
  }
  for (int c = 0; c < 32; ++c) v[c] = 0.0f;                                 // all-zero block
  for (int c = 0; c < 16; ++c) v[cols + c] = 1e-6f;                         // tiny block
  v[2 * cols] = 1e4f;                                                       // large amax
  for (int c = 0; c < 32; ++c) v[3 * cols + c] = std::ldexp(1.0f, c - 10);  // powers of two
  v[4 * cols + 1] = 6e4f;                                                   // saturates E4M3
  if (with_inf) v[5 * cols + 3] = -std::numeric_limits<float>::infinity();
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
          expect_same(gpu->rowwise_data, cpu->rowwise_data, what + " rowwise data");
          expect_same(gpu->rowwise_scale_inv, cpu->rowwise_scale_inv, what + " rowwise scale_inv");
          expect_same(gpu->columnwise_data, cpu->columnwise_data, what + " columnwise data");
          expect_same(gpu->columnwise_scale_inv, cpu->columnwise_scale_inv,
                      what + " columnwise scale_inv");
          expect_same(gpu->amax, cpu->amax, what + " amax");
          expect_same(gpu->scale, cpu->scale, what + " scale");
          EXPECT_EQ(gpu->block, cpu->block) << what;
        }
      }
    }
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

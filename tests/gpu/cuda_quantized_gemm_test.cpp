// cuda_quantized_gemm_test — the CUDA backend's quantized GEMMs (src/backend/cuda/gemm.cu:
// cuBLASLt's FP8 GEMM for per-tensor FP8, the decoded-operand emulation for the block
// recipes) against the CPU backend's (exact products, f32 accumulation), and what the
// ledger records for them.
//
// The reference for each output element is the CPU's result; the bound comes from how
// both accumulate. The products of quantized values are exact in f32, and the CPU sums
// them in f32. With S = |alpha| · Σ_k |a_k| |b_k| + |bias| (a bias is one more term):
//   * the emulated recipes (decoded operands, CUBLAS_COMPUTE_32F) also sum in f32: the two
//     differ by at most 2 · (k + 1) · u · S, u = 2⁻²⁴ (Higham's γ bound for each);
//   * cuBLASLt's FP8 GEMM sums in the tensor core, whose running sum keeps about 14 bits
//     (DeepSeek-V3's report, arXiv 2412.19437, §3.3.2: u_tc = 2⁻¹⁴). With fast
//     accumulation every one of the k additions is such a narrow one; with the split
//     accumulator only those inside one FP8 MMA instruction (k = 32 on Hopper) are, and
//     the sum is promoted to f32 between them. So the difference is at most 2 · (t · u_tc
//     + (k + 1) · u) · S with t = k (fast) or min(k, 32) (split).
// Measured on the H200 (2026-12-01; k = 128 and 512, seeds 101, 102, 7, 9; the test runs
// other seeds): split ≈ 2⁻¹³ · S at both k (independent of k, as the model says); fast
// 3 · 10⁻⁴ · S at k = 512; the emulated recipes 10⁻³ of their bound.
// Each test prints the largest measured error / unit, the unit being half the bound.
//
// Needs a GPU: without one every test is skipped with the reason (CI has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "tpcheck/backend.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/quant.h"

namespace tpcheck {
namespace {

using gpu_test::random_host;

bool recipe_per_tensor(Recipe r) { return r == Recipe::kFp8Delayed || r == Recipe::kFp8Current; }

// The bound's unit above, per S: t · u_tc + (k + 1) · u.
double unit_per_s(Recipe r, bool fast, std::int64_t k) {
  const double u = std::ldexp(1.0, -24), u_tc = std::ldexp(1.0, -14);
  const double narrow = !recipe_per_tensor(r) ? 0.0 : fast ? static_cast<double>(k)
                                                           : static_cast<double>(std::min<std::int64_t>(k, 32));
  return narrow * u_tc + static_cast<double>(k + 1) * u;
}

// `t` on `be`'s device carrying `be`'s quantization of it (the copy `columnwise` asks for).
Tensor quantized_on(Backend& be, const Tensor& t, Recipe recipe, QuantRole role, bool columnwise) {
  QuantizeOptions o;
  o.recipe = recipe;
  o.role = role;
  o.usage = QuantUsage{!columnwise, columnwise};
  o.scale = 0.5f;  // delayed scaling's scale this step (any power of two keeps it simple)
  Tensor out = t.to_device(be.device());
  out.set_quantized(be.quantize(out, o, "operand"));
  return out;
}

// One product as a Linear runs it: fwd Y = X Wᵀ, dgrad dX = dY W, wgrad dW = dYᵀ X.
struct Product {
  const char* name;
  bool trans_a, trans_b;
  QuantRole a_role, b_role;
  bool fast;  // the per-tensor FP8 recipes' fast accumulation (fwd only)
};

constexpr Product kProducts[] = {
    {"fwd", false, true, QuantRole::kInput, QuantRole::kWeight, true},
    {"dgrad", false, false, QuantRole::kGradOutput, QuantRole::kWeight, false},
    {"wgrad", true, false, QuantRole::kGradOutput, QuantRole::kInput, false},
};

struct Measured {
  double worst_ratio = 0;  // max |gpu − cpu| / unit (half the bound)
  GemmRecord record;
};

// Runs one product on both backends and checks every element against the bound of the
// file comment (2 · unit; a 16-bit output adds its own rounding on each side).
Measured compare_product(Backend& cpu, Backend& gpu, Recipe recipe, const Product& p,
                         std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t seed,
                         bool with_bias, DType out_dtype = DType::kF32, bool accumulate = false) {
  // Stored shapes: A is [m, k] or [k, m], B is [k, n] or [n, k].
  const Shape a_shape = p.trans_a ? Shape{k, m} : Shape{m, k};
  const Shape b_shape = p.trans_b ? Shape{n, k} : Shape{k, n};
  const Tensor a = random_host(seed, "a", a_shape, DType::kF32);
  const Tensor b = random_host(seed, "b", b_shape, DType::kF32, 0.05);
  const Tensor bias = random_host(seed, "bias", {n}, DType::kF32);
  GemmEpilogue epilogue;
  if (with_bias) epilogue.bias = &bias;

  Measured out;
  // Accumulating: C starts from the same random values on both backends.
  const Tensor c0 = random_host(seed, "c0", {m, n}, out_dtype);
  Tensor c_cpu = accumulate ? c0.clone() : Tensor({m, n}, out_dtype);
  {
    const Tensor qa = quantized_on(cpu, a, recipe, p.a_role, p.trans_a);
    const Tensor qb = quantized_on(cpu, b, recipe, p.b_role, !p.trans_b);
    cpu.gemm_quantized("test", qa, p.trans_a, qb, p.trans_b, c_cpu, accumulate, epilogue, p.fast);
  }
  Tensor c_gpu = accumulate ? c0.to_device(Device::kCuda) : Tensor({m, n}, out_dtype, Device::kCuda);
  const Tensor bias_gpu = bias.to_device(Device::kCuda);
  GemmEpilogue gpu_epilogue;
  if (with_bias) gpu_epilogue.bias = &bias_gpu;
  const Tensor qa = quantized_on(gpu, a, recipe, p.a_role, p.trans_a);
  const Tensor qb = quantized_on(gpu, b, recipe, p.b_role, !p.trans_b);
  gpu.gemm_quantized("test", qa, p.trans_a, qb, p.trans_b, c_gpu, accumulate, gpu_epilogue, p.fast);
  out.record = gpu.ledger().records().back();

  // S from the values the GEMM multiplies (the CPU's decoding; bit-equal to the GPU's, see
  // DecodedValuesMatchTheCpu): A' [m, k] and B' [n, k].
  const QuantizedValues av = quantized_values(*qa.quantized(), p.trans_a);
  const QuantizedValues bv = quantized_values(*qb.quantized(), !p.trans_b);
  const std::vector<double> x = av.values.to_f64(), y = bv.values.to_f64();
  const double alpha = std::fabs(out.record.alpha);
  const double unit_s = unit_per_s(recipe, p.fast, k);
  const std::vector<double> bias_used = bias.to(DType::kBF16).to_f64();  // as both rounded it
  const std::vector<double> got = c_gpu.to_f64(), want = c_cpu.to_f64(), c_start = c0.to_f64();
  const double u_out = out_dtype == DType::kBF16 ? std::ldexp(1.0, -8)
                       : out_dtype == DType::kF16 ? std::ldexp(1.0, -11)
                                                  : 0.0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) s += std::fabs(x[i * k + l] * y[j * k + l]);
      s *= alpha;
      if (with_bias) s += std::fabs(bias_used[j]);
      if (accumulate) s += std::fabs(c_start[i * n + j]);
      const double err = std::fabs(got[i * n + j] - want[i * n + j]);
      // A 16-bit output: each side rounds its f32 result once more (u_out relative).
      const double unit = unit_s * s + u_out * std::fabs(want[i * n + j]);
      if (unit > 0) out.worst_ratio = std::max(out.worst_ratio, err / unit);
      if (!(err <= 2 * unit)) {
        ADD_FAILURE() << recipe_name(recipe) << " " << p.name << " (" << i << ", " << j
                      << "): gpu " << got[i * n + j] << ", cpu " << want[i * n + j]
                      << ", bound " << 2 * unit;
        return out;
      }
    }
  }
  return out;
}

constexpr Recipe kRecipes[] = {Recipe::kFp8Delayed, Recipe::kFp8Current, Recipe::kFp8Block,
                               Recipe::kMxfp8, Recipe::kNvfp4};

TEST(CudaQuantizedGemm, DecodedValuesMatchTheCpu) {
  TPCHECK_REQUIRE_GPU();
  auto gpu = make_cuda_backend();
  for (Recipe recipe : kRecipes) {
    for (QuantRole role : {QuantRole::kInput, QuantRole::kWeight, QuantRole::kGradOutput}) {
      for (bool columnwise : {false, true}) {
        const Tensor x = random_host(3, "x", {256, 384}, DType::kBF16);
        const Tensor q = quantized_on(*gpu, x, recipe, role, columnwise);
        const QuantizedValues on_gpu = quantized_values_on_gpu(*q.quantized(), columnwise);
        const QuantizedValues on_cpu = quantized_values(*q.quantized(), columnwise);
        const std::string what = std::string(recipe_name(recipe)) + "/" +
                                 std::string(quant_role_name(role)) +
                                 (columnwise ? " columnwise" : " rowwise");
        EXPECT_EQ(on_gpu.values.device(), Device::kCuda) << what;
        EXPECT_TRUE(bitwise_equal(on_gpu.values.to_host(), on_cpu.values)) << what;
        EXPECT_EQ(on_gpu.tensor_factor, on_cpu.tensor_factor) << what;
      }
    }
  }
}

TEST(CudaQuantizedGemm, EveryRecipeAndProductMatchesTheCpuWithinItsAccumulationBound) {
  TPCHECK_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  // Multiples of 128 (FP8 block scaling's weight blocks) in every dimension.
  const std::int64_t m = 256, n = 384, k = 512;
  for (Recipe recipe : kRecipes) {
    for (const Product& p : kProducts) {
      const bool fast = p.fast && recipe_per_tensor(recipe);
      const Product used{p.name, p.trans_a, p.trans_b, p.a_role, p.b_role, fast};
      for (std::uint64_t seed : {201u, 202u}) {  // calibrated on 101, 102
        const Measured r = compare_product(*cpu, *gpu, recipe, used, m, n, k, seed, false);
        std::printf("%-18s %-5s seed %llu: max |gpu - cpu| / unit = %.3g (bound 2)  %s\n",
                    std::string(recipe_name(recipe)).c_str(), p.name,
                    static_cast<unsigned long long>(seed), r.worst_ratio,
                    r.record.implementation.c_str());
      }
    }
  }
}

TEST(CudaQuantizedGemm, RecordsTheFp8GemmAndItsAccumulation) {
  TPCHECK_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  for (const Product& p : kProducts) {
    const Measured r =
        compare_product(*cpu, *gpu, Recipe::kFp8Current, p, 128, 128, 128, 17, false);
    ASSERT_TRUE(r.record.cublaslt.has_value()) << p.name;
    EXPECT_EQ(r.record.math_class, MathClass::kFp8) << p.name;
    EXPECT_EQ(r.record.cublaslt->scale_mode, "per-tensor scale_inv pointers") << p.name;
    EXPECT_EQ(r.record.cublaslt->fast_accumulation, p.fast) << p.name;
    EXPECT_NE(r.record.implementation.find("cublasLt FP8"), std::string::npos)
        << r.record.implementation;
    // Forward: E4M3 x E4M3; dgrad and wgrad: E5M2 gradients.
    EXPECT_EQ(r.record.a_dtype, p.a_role == QuantRole::kGradOutput ? DType::kF8E5M2
                                                                   : DType::kF8E4M3);
  }
  const Measured block =
      compare_product(*cpu, *gpu, Recipe::kMxfp8, kProducts[0], 128, 128, 128, 17, false);
  EXPECT_EQ(block.record.math_class, MathClass::kMxfp8);
  EXPECT_NE(block.record.implementation.find("emulated mxfp8"), std::string::npos)
      << block.record.implementation;
}

// A 16-bit output, accumulating into it (the emulated recipes keep an f32 copy and round
// once; cuBLASLt's FP8 GEMM writes bf16 itself).
TEST(CudaQuantizedGemm, Bf16OutputsAccumulateAsOnTheCpu) {
  TPCHECK_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  for (Recipe recipe : kRecipes) {
    for (bool accumulate : {false, true}) {
      const Measured r = compare_product(*cpu, *gpu, recipe, kProducts[2], 128, 256, 128, 23,
                                         false, DType::kBF16, accumulate);
      std::printf("%-18s wgrad bf16%s: max |gpu - cpu| / unit = %.3g (bound 2)\n",
                  std::string(recipe_name(recipe)).c_str(), accumulate ? " accumulate" : "",
                  r.worst_ratio);
    }
  }
}

// The reference rounds a GEMM-fused bias to bf16 under a recipe when the output is f32
// (cuBLASLt's FP8 GEMM takes no f32 bias); the CPU does the same, so both agree and the
// output carries the rounded bias.
TEST(CudaQuantizedGemm, AnF32BiasIsRoundedToBf16OnBothBackends) {
  TPCHECK_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  for (Recipe recipe : kRecipes) {  // checked element by element inside
    const Measured r =
        compare_product(*cpu, *gpu, recipe, kProducts[1], 128, 128, 128, 19, true);
    std::printf("%-18s dgrad + bias: max |gpu - cpu| / unit = %.3g (bound 2)\n",
                std::string(recipe_name(recipe)).c_str(), r.worst_ratio);
  }
  // Zero operands: the output is the bias itself, as each backend rounded it.
  const std::int64_t n = 128;
  std::vector<float> bias_values(n);
  for (std::int64_t j = 0; j < n; ++j) bias_values[j] = 1.0f + std::ldexp(1.0f, -10) * (j + 1);
  const Tensor bias = Tensor::from_f32(bias_values, {n}, DType::kF32);
  const Tensor zeros = Tensor::zeros({128, 128}, DType::kF32);
  for (Backend* be : {cpu.get(), gpu.get()}) {
    const Tensor a = quantized_on(*be, zeros, Recipe::kFp8Current, QuantRole::kInput, false);
    const Tensor b = quantized_on(*be, zeros, Recipe::kFp8Current, QuantRole::kWeight, false);
    const Tensor bias_here = bias.to_device(be->device());
    GemmEpilogue e;
    e.bias = &bias_here;
    Tensor c({128, n}, DType::kF32, be->device());
    be->gemm_quantized("bias", a, false, b, true, c, false, e, true);
    const std::vector<float> got = c.to_f32();
    const std::vector<float> rounded = bias.to(DType::kBF16).to_f32();
    for (std::int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(got[j], rounded[j]) << be->name() << " column " << j;
      ASSERT_EQ(got[n + j], rounded[j]) << be->name() << " row 1, column " << j;
    }
  }
}

}  // namespace
}  // namespace tpcheck

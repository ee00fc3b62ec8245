// The CUDA GEMM engine against the CPU backend's fp64 product: every storage dtype, both
// transposes, accumulate, epilogues (bias, gelu aux, dgelu), strided batches; the ledger
// record (cuBLASLt part filled, class decoded); --gemm-impl masks; Tensor on the device.
// Every test skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "gpu/gpu_test_support.h"
#include "tpcheck/backend.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using gpu_test::norm_rel;
using gpu_test::random_host;

struct GemmCase {
  DType dtype;
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  // Norm-wise bound against the fp64 product, from the input rounding of the class:
  // inputs rounded to 11 (f16, TF32) or 8 (bf16) significant bits give a relative error
  // per product near u = 2^-11 / 2^-8 with random signs, so ‖err‖/‖C‖ stays below a few u;
  // f32 (no TF32) and f64 are far below their bounds. The operands are generated in the
  // storage dtype, so the fp64 reference sees the same (already rounded) inputs: only
  // TF32's input rounding and the accumulation remain.
  double bound;
};

Shape a_shape(const GemmCase& c) { return c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}; }
Shape b_shape(const GemmCase& c) { return c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}; }

// C = op(A)·op(B) in fp64 on the CPU backend, from the same stored values.
Tensor reference_product(const GemmCase& c, const Tensor& a, const Tensor& b) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  Tensor c64({c.m, c.n}, DType::kF64);
  cpu->gemm("ref", a.to(DType::kF64), c.trans_a, b.to(DType::kF64), c.trans_b, c64, false);
  return c64;
}

class CudaGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CudaGemm, MatchesFp64AndRecordsWhatRan) {
  TPCHECK_REQUIRE_GPU();
  const GemmCase c = GetParam();
  for (std::uint64_t seed : {11u, 12u}) {
    std::unique_ptr<Backend> gpu = make_cuda_backend();
    gpu->set_gemm_rule(GemmClassRule{GemmClassRule::Mode::kAsStored, MathClass::kFp32});
    const Tensor a = random_host(seed, "a", a_shape(c), c.dtype);
    const Tensor b = random_host(seed, "b", b_shape(c), c.dtype);
    Tensor out({c.m, c.n}, c.dtype, Device::kCuda);
    gpu->gemm("t/fwd", a.to_device(Device::kCuda), c.trans_a, b.to_device(Device::kCuda),
              c.trans_b, out, false);
    const double err = norm_rel(out, reference_product(c, a, b));
    EXPECT_LT(err, c.bound) << dtype_name(c.dtype) << " m=" << c.m << " n=" << c.n << " k=" << c.k;
    ASSERT_EQ(gpu->ledger().records().size(), 1u);
    const GemmRecord& r = gpu->ledger().records()[0];
    EXPECT_EQ(r.site, "t/fwd");
    EXPECT_EQ(r.m, c.m);
    EXPECT_EQ(r.n, c.n);
    EXPECT_EQ(r.k, c.k);
    ASSERT_TRUE(r.cublaslt.has_value());
    EXPECT_GE(r.cublaslt->algo_id, 0);
    EXPECT_FALSE(r.cublaslt->numerical_impl.empty());
    EXPECT_EQ(r.cublaslt->workspace_limit, std::uint64_t{32} << 20);
    if (c.dtype == DType::kF64) {
      EXPECT_EQ(r.math_class, MathClass::kFp64);
      EXPECT_EQ(r.cublaslt->compute_type, "64F");
    }
    if (c.dtype == DType::kF32) {
      // TF32 not allowed by this rule: the compute type says so, and the class is fp32.
      EXPECT_EQ(r.cublaslt->compute_type, "32F");
      EXPECT_EQ(r.math_class, MathClass::kFp32);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaGemm,
    ::testing::Values(GemmCase{DType::kF64, 37, 53, 29, false, true, 1e-14},
                      GemmCase{DType::kF64, 64, 128, 256, true, false, 1e-14},
                      GemmCase{DType::kF32, 37, 53, 29, false, true, 1e-6},
                      GemmCase{DType::kF32, 1024, 64, 8, false, false, 1e-6},
                      GemmCase{DType::kF32, 256, 256, 512, true, true, 1e-6},
                      // f16/bf16 outputs are rounded once more to the storage type.
                      GemmCase{DType::kF16, 37, 53, 29, false, true, 2e-3},
                      GemmCase{DType::kF16, 512, 256, 1024, false, false, 2e-3},
                      GemmCase{DType::kBF16, 37, 53, 29, true, false, 1.5e-2},
                      GemmCase{DType::kBF16, 512, 256, 1024, false, true, 1.5e-2}));

// TF32 allowed: the record's class is whatever the algorithm's flags say ran, and the
// result is within TF32 input rounding (inputs rounded to 11 bits: ‖err‖/‖C‖ ≲ 2^-11).
TEST(CudaGemmTf32, ClassComesFromTheAlgorithm) {
  TPCHECK_REQUIRE_GPU();
  for (std::int64_t k : {8, 32, 1024}) {
    std::unique_ptr<Backend> gpu = make_cuda_backend();
    gpu->set_gemm_rule(GemmClassRule{GemmClassRule::Mode::kAsStored, MathClass::kTf32});
    const GemmCase c{DType::kF32, 1024, 64, k, false, false, 0};
    const Tensor a = random_host(5, "a", a_shape(c), c.dtype);
    const Tensor b = random_host(5, "b", b_shape(c), c.dtype);
    Tensor out({c.m, c.n}, c.dtype, Device::kCuda);
    gpu->gemm("t/fwd", a.to_device(Device::kCuda), false, b.to_device(Device::kCuda), false, out,
              false);
    const GemmRecord& r = gpu->ledger().records()[0];
    EXPECT_EQ(r.cublaslt->compute_type, "32F_FAST_TF32");
    EXPECT_TRUE(r.math_class == MathClass::kTf32 || r.math_class == MathClass::kFp32)
        << r.implementation;
    EXPECT_LT(norm_rel(out, reference_product(c, a, b)), 2e-3) << r.implementation;
    std::cout << "[ tf32 k=" << k << " ] " << math_class_name(r.math_class) << ": "
              << r.implementation << "\n";
  }
}

// Accumulate (beta = 1), the bias and gelu epilogues, dgelu, against the CPU engine's
// definition of the same epilogue (same fp64 math).
TEST(CudaGemmEpilogue, BiasGeluDgeluAccumulate) {
  TPCHECK_REQUIRE_GPU();
  const std::int64_t m = 96, n = 80, k = 48;
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    std::unique_ptr<Backend> gpu = make_cuda_backend();
    gpu->set_gemm_rule(GemmClassRule{GemmClassRule::Mode::kAsStored, MathClass::kFp32});
    const Tensor a = random_host(3, "a", {m, k}, dt);
    const Tensor w = random_host(3, "w", {n, k}, dt);
    const Tensor bias = random_host(3, "bias", {n}, dt);
    const Tensor c0 = random_host(3, "c0", {m, n}, dt);
    const double bound = dt == DType::kF64 ? 1e-13 : dt == DType::kF32 ? 1e-5 : 2e-2;
    auto run = [&](Backend& be, Device dev, GemmEpilogue::Activation act, bool with_bias,
                   bool accumulate, Tensor* aux_out) {
      Tensor out = accumulate ? c0.to_device(dev).clone() : Tensor({m, n}, dt, dev);
      Tensor aux = act == GemmEpilogue::Activation::kDgelu ? c0.to_device(dev).clone()
                                                           : Tensor({m, n}, dt, dev);
      const Tensor bias_d = bias.to_device(dev);
      GemmEpilogue e;
      e.bias = with_bias ? &bias_d : nullptr;
      e.activation = act;
      e.aux = act == GemmEpilogue::Activation::kNone ? nullptr : &aux;
      be.gemm("t/fwd", a.to_device(dev), false, w.to_device(dev), true, out, accumulate, e);
      if (aux_out) *aux_out = aux;
      return out;
    };
    struct Variant {
      GemmEpilogue::Activation act;
      bool bias, accumulate;
    };
    for (Variant v : {Variant{GemmEpilogue::Activation::kNone, true, false},
                      Variant{GemmEpilogue::Activation::kNone, false, true},
                      Variant{GemmEpilogue::Activation::kGelu, true, false},
                      Variant{GemmEpilogue::Activation::kGelu, false, false},
                      Variant{GemmEpilogue::Activation::kDgelu, false, false}}) {
      // The CPU reference computes the same epilogue in f64 on f64 copies of the inputs.
      std::unique_ptr<Backend> cpu64 = make_cpu_backend();
      Tensor aux_gpu, aux_cpu;
      const Tensor got = run(*gpu, Device::kCuda, v.act, v.bias, v.accumulate, &aux_gpu);
      const Tensor want = [&] {
        Tensor out = v.accumulate ? c0.to(DType::kF64) : Tensor({m, n}, DType::kF64);
        Tensor aux = v.act == GemmEpilogue::Activation::kDgelu ? c0.to(DType::kF64)
                                                               : Tensor({m, n}, DType::kF64);
        const Tensor b64 = bias.to(DType::kF64);
        GemmEpilogue e;
        e.bias = v.bias ? &b64 : nullptr;
        e.activation = v.act;
        e.aux = v.act == GemmEpilogue::Activation::kNone ? nullptr : &aux;
        cpu64->gemm("ref", a.to(DType::kF64), false, w.to(DType::kF64), true, out, v.accumulate,
                    e);
        aux_cpu = aux;
        return out;
      }();
      EXPECT_LT(norm_rel(got, want), bound)
          << dtype_name(dt) << " epilogue " << static_cast<int>(v.act) << " bias " << v.bias
          << " accumulate " << v.accumulate;
      if (v.act == GemmEpilogue::Activation::kGelu) {
        EXPECT_LT(norm_rel(aux_gpu, aux_cpu), bound) << "gelu aux (pre-activation)";
      }
    }
  }
}

TEST(CudaGemmBatched, StridedBatchesWithAlpha) {
  TPCHECK_REQUIRE_GPU();
  std::unique_ptr<Backend> gpu = make_cuda_backend();
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  gpu->set_gemm_rule(GemmClassRule{GemmClassRule::Mode::kAsStored, MathClass::kFp32});
  const Tensor a = random_host(9, "a", {6, 17, 8}, DType::kF32);
  const Tensor b = random_host(9, "b", {6, 19, 8}, DType::kF32);
  Tensor got({6, 17, 19}, DType::kF32, Device::kCuda);
  gpu->gemm_batched("attn/scores", a.to_device(Device::kCuda), false, b.to_device(Device::kCuda),
                    true, got, 0.125);
  Tensor want({6, 17, 19}, DType::kF64);
  cpu->gemm_batched("ref", a.to(DType::kF64), false, b.to(DType::kF64), true, want, 0.125);
  EXPECT_LT(norm_rel(got, want), 1e-6);
  EXPECT_EQ(gpu->ledger().records()[0].batch, 6);
}

TEST(CudaGemmErrors, ClearMessages) {
  TPCHECK_REQUIRE_GPU();
  std::unique_ptr<Backend> gpu = make_cuda_backend();
  const Tensor host({4, 4}, DType::kF32);
  Tensor dev({4, 4}, DType::kF32, Device::kCuda);
  try {
    gpu->gemm("x/fwd", host, false, dev, false, dev, false);
    FAIL() << "a CPU operand was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("on the CPU"), std::string::npos) << e.what();
  }
  // An FMA-only mask on an f16 GEMM finds either an FMA kernel (the record's flags say
  // FMA) or none (a clear input error naming the site); both are correct answers.
  CudaBackendOptions o;
  o.impl_mask = GemmImplMask::kFma;
  std::unique_ptr<Backend> fma = make_cuda_backend(o);
  Tensor a = random_host(1, "a", {64, 64}, DType::kF16).to_device(Device::kCuda);
  Tensor c({64, 64}, DType::kF16, Device::kCuda);
  try {
    fma->gemm("mlp.fc1/fwd", a, false, a, true, c, false);
    const GemmRecord& r = fma->ledger().records()[0];
    EXPECT_NE(r.cublaslt->numerical_impl.find("FMA"), std::string::npos) << r.implementation;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("mlp.fc1/fwd"), std::string::npos) << e.what();
  }
}

TEST(CudaTensor, DeviceMethodsMatchHost) {
  TPCHECK_REQUIRE_GPU();
  std::unique_ptr<Backend> gpu = make_cuda_backend();  // registers the runtime, sets stream
  const Tensor h = random_host(2, "t", {6, 5, 7}, DType::kF32);
  const Tensor d = h.to_device(Device::kCuda);
  EXPECT_TRUE(bitwise_equal(d.slice(1, 1, 3), h.slice(1, 1, 3)));
  EXPECT_TRUE(bitwise_equal(Tensor::cat({d.slice(2, 0, 2), d.slice(2, 2, 5)}, 2), h));
  for (DType t : {DType::kF16, DType::kBF16, DType::kF64, DType::kF8E4M3, DType::kF8E5M2}) {
    EXPECT_TRUE(bitwise_equal(d.to(t), h.to(t))) << dtype_name(t);
    EXPECT_TRUE(bitwise_equal(d.to(t, CastMode::kSaturate), h.to(t, CastMode::kSaturate)))
        << dtype_name(t) << " saturating";
  }
  Tensor w = Tensor::zeros_like(d);
  w.write_slice(0, 2, d.slice(0, 2, 3));
  Tensor hw = Tensor::zeros_like(h);
  hw.write_slice(0, 2, h.slice(0, 2, 3));
  EXPECT_TRUE(bitwise_equal(w, hw));
  EXPECT_DOUBLE_EQ(d.at(17), h.at(17));
  Tensor c = d.clone();
  c.fill_zero();
  EXPECT_EQ(c.to_f64()[5], 0.0);
  Tensor f16({6, 5, 7}, DType::kF16, Device::kCuda);
  f16.copy_from(h);
  EXPECT_TRUE(bitwise_equal(f16, h.to(DType::kF16)));
}

}  // namespace
}  // namespace tpcheck

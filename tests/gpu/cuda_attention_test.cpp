// cuda_attention_test.cpp — attention on the CUDA backend against the CPU backend: the
// same composition (src/backend/composed_attention.cpp) over different primitives (attention.cu
// vs cpu/attention.cpp) and GEMM engines (cuBLASLt vs OpenBLAS), forward (out, probs)
// and backward (dq, dk, dv), for f64, f32, f16, bf16; masks (none, causal, causal with a
// left window, sliding windows), GQA and MQA, odd sizes (s, d not multiples of 8, one
// head, s = 1), s_k above one softmax block (s = 300 > 256 threads; 2100, held in
// registers 16 keys a thread; 4200, streamed), the ledger records
// on both, and the primitives' input checks. Every test skips when no GPU is present.
//
// Bounds (norm-wise relative difference, CUDA vs CPU, same GEMM class on both: the f32
// class is fp32 on both sides, TF32 off):
//   f64   1e-12: reductions of length ≤ 300 in a different order (≤ ~k·2^-53 ≈ 3e-14)
//         and CUDA's exp within 1 ulp.
//   f32   2e-5: the same in f32 (k·2^-24 ≈ 2e-5 worst case for k = 300, typically
//         √k·2^-24 ≈ 1e-6), expf within 2 ulp, FMA contraction in the softmax backward;
//         the backward's dP − rowsum(dP ⊙ P) cancels, which a norm-wise bound absorbs.
//   f16, bf16 (u = 2^-11, 2^-8): S, P, dP, dS and the per-head products are rounded to
//         the dtype (the documented rounding points) from f32 values that differ between
//         the two engines in the last bits; a value that lies that close to a rounding
//         boundary rounds the other way, one ulp of the dtype (2u relative). Such flips
//         are rare, so the norm-wise difference stays well below 2u; bounds 2u for the
//         forward and the probabilities, 4u for the gradients (the softmax backward's
//         cancellation magnifies a flipped dP).
// Thread safety: test code, one thread, one CUDA backend alive at a time (a CudaBackend
// makes its stream the constructing thread's current stream, where Tensor operations run).
#include <gtest/gtest.h>

#include "gpu/gpu_test_support.h"

#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "support/finite_diff.h"
#include "tpcheck/backend.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using testing::random_f64;
using testing::relative_error;


AttentionMask make_mask(AttentionMask::Type type, std::int64_t left, std::int64_t right) {
  AttentionMask m;
  m.type = type;
  m.window_left = left;
  m.window_right = right;
  return m;
}

struct Case {
  std::string name;
  std::int64_t s, b, h, g, d;
  AttentionMask mask;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  using T = AttentionMask::Type;
  return {
      {"no_mask_s16_d8", 16, 2, 4, 4, 8, make_mask(T::kNoMask, -1, -1)},
      {"causal_s33_d7", 33, 2, 4, 4, 7, make_mask(T::kCausal, -1, -1)},
      {"causal_left3_s20_d5", 20, 3, 2, 2, 5, make_mask(T::kCausal, 3, -1)},
      {"sliding_2_2_s17_d9", 17, 2, 4, 4, 9, make_mask(T::kSlidingWindow, 2, 2)},
      {"sliding_1_unbounded_s13_d4", 13, 1, 3, 3, 4, make_mask(T::kSlidingWindow, 1, -1)},
      {"gqa_h6_g2_causal_s19_d11", 19, 2, 6, 2, 11, make_mask(T::kCausal, -1, -1)},
      {"mqa_h5_g1_sliding_s23_d6", 23, 2, 5, 1, 6, make_mask(T::kSlidingWindow, 4, 1)},
      {"one_head_s1_d3", 1, 3, 1, 1, 3, make_mask(T::kCausal, -1, -1)},
      {"long_row_s300_d16_gqa", 300, 1, 4, 2, 16, make_mask(T::kCausal, -1, -1)},
      // Rows held in registers, 16 keys a thread (2048 < s ≤ 4096), and rows streamed
      // (s > 16 · 256): both softmax kernel families.
      {"cached_row_s2100_d8", 2100, 1, 1, 1, 8, make_mask(T::kNoMask, -1, -1)},
      {"streamed_row_s4200_d8", 4200, 1, 1, 1, 8, make_mask(T::kCausal, -1, -1)},
  };
}

struct Result {
  AttentionForward fwd;
  AttentionGrads grads;
  std::vector<GemmRecord> records;
};

// Forward and backward on `be`; inputs and results on the host.
Result run(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
        const AttentionMask& mask, double scale) {
  const Device dev = be.device();
  const Tensor qd = q.to_device(dev), kd = k.to_device(dev), vd = v.to_device(dev),
               dd = dout.to_device(dev);
  be.ledger().clear();
  const AttentionForward f = be.attention_forward(qd, kd, vd, mask, scale);
  const AttentionGrads g = be.attention_backward(dd, qd, kd, vd, f, mask, scale);
  be.synchronize();
  return {{f.out.to_host(), f.probs.to_host()},
          {g.dq.to_host(), g.dk.to_host(), g.dv.to_host()},
          be.ledger().records()};
}

std::unique_ptr<Backend> cuda_backend_fp32() {
  CudaBackendOptions o;
  o.allow_tf32 = false;
  std::unique_ptr<Backend> be = make_cuda_backend(o);
  GemmClassRule rule;  // f32 GEMMs in the fp32 class, as on the CPU
  be->set_gemm_rule(rule);
  return be;
}

double bound_forward(DType t) {
  switch (t) {
    case DType::kF64: return 1e-12;
    case DType::kF32: return 2e-5;
    default: return 2 * dtype_unit_roundoff(t);
  }
}
double bound_backward(DType t) {
  switch (t) {
    case DType::kF64: return 1e-12;
    case DType::kF32: return 2e-5;
    default: return 4 * dtype_unit_roundoff(t);
  }
}

class CudaAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttention, MatchesCpu) {
  TPCHECK_REQUIRE_GPU();
  const Case& c = GetParam();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  auto cpu = make_cpu_backend();
  auto gpu = cuda_backend_fp32();
  for (DType t : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const Tensor q = random_f64({c.s, c.b, c.h, c.d}, "q", 1.0, 21).to(t);
    const Tensor k = random_f64({c.s, c.b, c.g, c.d}, "k", 1.0, 22).to(t);
    const Tensor v = random_f64({c.s, c.b, c.g, c.d}, "v", 1.0, 23).to(t);
    const Tensor dout = random_f64({c.s, c.b, c.h, c.d}, "dout", 1.0, 24).to(t);
    const Result ref = run(*cpu, q, k, v, dout, c.mask, scale);
    const Result got = run(*gpu, q, k, v, dout, c.mask, scale);

    ASSERT_EQ(got.fwd.out.dtype(), t);
    ASSERT_EQ(got.fwd.out.shape(), q.shape());
    ASSERT_EQ(got.fwd.probs.dtype(), t == DType::kF64 ? DType::kF64 : DType::kF32);
    ASSERT_EQ(got.fwd.probs.shape(), (Shape{c.b, c.h, c.s, c.s}));
    ASSERT_EQ(got.grads.dk.shape(), k.shape());
    ASSERT_EQ(got.grads.dv.shape(), v.shape());
    const double bf = bound_forward(t), bb = bound_backward(t);
    EXPECT_LE(relative_error(got.fwd.out.to_f64(), ref.fwd.out.to_f64()), bf) << "out";
    EXPECT_LE(relative_error(got.fwd.probs.to_f64(), ref.fwd.probs.to_f64()), bf) << "probs";
    EXPECT_LE(relative_error(got.grads.dq.to_f64(), ref.grads.dq.to_f64()), bb) << "dq";
    EXPECT_LE(relative_error(got.grads.dk.to_f64(), ref.grads.dk.to_f64()), bb) << "dk";
    EXPECT_LE(relative_error(got.grads.dv.to_f64(), ref.grads.dv.to_f64()), bb) << "dv";

    // Masked probabilities are exactly 0 on the GPU too.
    for (std::int64_t bh = 0; bh < c.b * c.h; ++bh) {
      for (std::int64_t i = 0; i < c.s; ++i) {
        for (std::int64_t j = 0; j < c.s; ++j) {
          if (!c.mask.allows(i, j)) {
            ASSERT_EQ(got.fwd.probs.at((bh * c.s + i) * c.s + j), 0.0) << bh << " " << i << " " << j;
          }
        }
      }
    }
    // The same six products, in the same order, with the same shapes and classes.
    ASSERT_EQ(got.records.size(), 6u);
    ASSERT_EQ(ref.records.size(), 6u);
    for (std::size_t i = 0; i < 6; ++i) {
      SCOPED_TRACE(ref.records[i].site);
      EXPECT_EQ(got.records[i].site, ref.records[i].site);
      EXPECT_EQ(got.records[i].batch, c.b * c.h);
      EXPECT_EQ(got.records[i].m, ref.records[i].m);
      EXPECT_EQ(got.records[i].n, ref.records[i].n);
      EXPECT_EQ(got.records[i].k, ref.records[i].k);
      EXPECT_EQ(got.records[i].math_class, ref.records[i].math_class);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Large scores (|S| ~ 1e3 in f32) stay finite: the kernels subtract the row maximum.
TEST(CudaAttentionNumerics, LargeScoresStayFinite) {
  TPCHECK_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = cuda_backend_fp32();
  const Tensor q = random_f64({9, 2, 2, 5}, "q", 1.0, 31).to(DType::kF32);
  const Tensor k = random_f64({9, 2, 2, 5}, "k", 1.0, 32).to(DType::kF32);
  const Tensor v = random_f64({9, 2, 2, 5}, "v", 1.0, 33).to(DType::kF32);
  const AttentionMask mask;
  const Result ref = run(*cpu, q, k, v, q, mask, 300.0);
  const Result got = run(*gpu, q, k, v, q, mask, 300.0);
  for (std::int64_t i = 0; i < got.fwd.out.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(got.fwd.out.at(i))) << i;
  }
  // Scores ~1e3 carry absolute errors ~1e-4 in f32 on either side; CPU and GPU round
  // differently, so their probabilities differ by as much relatively (cf. the CPU test).
  EXPECT_LE(relative_error(got.fwd.out.to_f64(), ref.fwd.out.to_f64()), 1e-4);
}

// With TF32 allowed and the rule asking for it, the products ask cuBLASLt for TF32
// compute; the record holds what ran (the algorithm's flags: tf32, or fp32 when the
// heuristic picks a full-FP32 FMA kernel, the effect tpcheck exists for), and at least
// the long products run tf32 here; the results stay within TF32's error of the fp32 ones.
TEST(CudaAttentionNumerics, Tf32RuleReachesTheProducts) {
  TPCHECK_REQUIRE_GPU();
  const Tensor q = random_f64({64, 2, 4, 32}, "q", 1.0, 41).to(DType::kF32);
  const Tensor k = random_f64({64, 2, 4, 32}, "k", 1.0, 42).to(DType::kF32);
  const Tensor v = random_f64({64, 2, 4, 32}, "v", 1.0, 43).to(DType::kF32);
  const AttentionMask mask;
  const double scale = 1.0 / std::sqrt(32.0);
  // One CUDA backend at a time: each makes its stream the thread's current one.
  Result tf;
  {
    CudaBackendOptions o;
    o.allow_tf32 = true;
    auto gpu = make_cuda_backend(o);
    GemmClassRule rule;
    rule.f32_class = MathClass::kTf32;
    gpu->set_gemm_rule(rule);
    tf = run(*gpu, q, k, v, q, mask, scale);
  }
  Result f32;
  {
    auto gpu32 = cuda_backend_fp32();
    f32 = run(*gpu32, q, k, v, q, mask, scale);
  }
  ASSERT_EQ(tf.records.size(), 6u);
  int tf32_products = 0;
  for (const GemmRecord& r : tf.records) {
    EXPECT_TRUE(r.math_class == MathClass::kTf32 || r.math_class == MathClass::kFp32) << r.site;
    tf32_products += r.math_class == MathClass::kTf32;
  }
  EXPECT_GE(tf32_products, 1);
  for (const GemmRecord& r : f32.records) EXPECT_EQ(r.math_class, MathClass::kFp32) << r.site;
  const double tf32_u = std::ldexp(1.0, -11);
  EXPECT_LE(relative_error(tf.fwd.out.to_f64(), f32.fwd.out.to_f64()), 8 * tf32_u);
  EXPECT_LE(relative_error(tf.grads.dq.to_f64(), f32.grads.dq.to_f64()), 8 * tf32_u);
}

// The primitives check their inputs before launching anything.
TEST(CudaAttentionErrors, HostTensorsAndBadShapes) {
  TPCHECK_REQUIRE_GPU();
  auto gpu = cuda_backend_fp32();
  const Tensor q = random_f64({4, 1, 4, 2}, "q").to(DType::kF32);
  const Tensor k = random_f64({4, 1, 3, 2}, "k").to(DType::kF32);
  const AttentionMask mask;
  // Host tensors given to the GPU backend.
  EXPECT_THROW(gpu->attention_forward(q, q, q, mask, 1.0), Error);
  // Groups that do not divide the heads, on the device.
  const Tensor qd = q.to_device(Device::kCuda), kd = k.to_device(Device::kCuda);
  try {
    gpu->attention_forward(qd, kd, kd, mask, 1.0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("groups 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpcheck

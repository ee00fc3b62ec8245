// attention.cpp — CpuBackend::attention_forward / attention_backward: scaled dot-product
// attention with masks and grouped-query attention (GQA), on the host.
//
// Buffers (s = sequence, b = batch, h = query heads, g = key/value groups, d = head dim):
//   q, dq      [s, b, h, d]   storage dtype
//   k, v, dk, dv [s, b, g, d] storage dtype; query head i reads group i / (h / g)
//   out, dout  [s, b, h, d]   storage dtype
//   probs      [b, h, s, s]   softmax probabilities P, f32 (f64 for f64 inputs)
//
// Forward, per (batch, head):  S = scale · Q Kᵀ,  P = softmax_rows(S + mask),  O = P V.
// Backward, with P saved:      dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),
//                              dQ = scale · dS K,  dK = scale · dSᵀ Q,  dV = Pᵀ dO,
// where dK, dV of a group are summed over the group's h / g query heads (in Real, before
// the one rounding to the storage dtype).
//
// Math in Real = f32 (f64 for f64 inputs). Per-head slices are copied into contiguous
// [s, d] buffers and multiplied with OpenBLAS (cblas_sgemm / cblas_dgemm); the softmax
// subtracts the row maximum before exp. A query row whose keys are all masked gets
// P = 0 and hence an output of 0 (and zero gradients), rather than NaN; no mask of
// AttentionMask can produce such a row when queries and keys share one sequence (the
// diagonal is always allowed), so this is a guard, not a modelled behaviour.
//
// These products are NOT recorded in the GEMM ledger and are not rounded to the backend's
// GEMM math class: the ledger holds the layers' GEMMs (Backend::gemm) only, as fused GPU
// attention kernels are not cuBLASLt calls either.
// They do run under the same OpenBLAS thread count (set_cpu_gemm_threads), so their bits
// are as reproducible as the layer GEMMs'.
// Thread safety: pure functions of their arguments (see cpu_backend.h).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

struct Dims {
  std::int64_t s, b, h, g, d;
};

std::string describe_or_undefined(const Tensor& t) {
  return t.defined() ? t.describe() : std::string("an undefined tensor");
}

// Checks q [s, b, h, d], k and v [s, b, g, d] with g dividing h, one dtype; returns the
// sizes. `op` names the caller in messages.
Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  TPCHECK_CHECK_INPUT(q.defined() && q.rank() == 4, "{}: q must be [s, b, h, d], got {}", op,
                      describe_or_undefined(q));
  TPCHECK_CHECK_INPUT(k.defined() && k.rank() == 4, "{}: k must be [s, b, g, d], got {}", op,
                      describe_or_undefined(k));
  TPCHECK_CHECK_INPUT(v.defined() && v.shape() == k.shape(), "{}: v must have k's shape {}, got {}",
                      op, shape_str(k.shape()), describe_or_undefined(v));
  const Dims dims{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  TPCHECK_CHECK_INPUT(k.dim(0) == dims.s,
                      "{}: q and k must share the sequence length, got q {} and k {}", op,
                      shape_str(q.shape()), shape_str(k.shape()));
  TPCHECK_CHECK_INPUT(k.dim(1) == dims.b, "{}: q and k must share the batch, got q {} and k {}", op,
                      shape_str(q.shape()), shape_str(k.shape()));
  TPCHECK_CHECK_INPUT(k.dim(3) == dims.d,
                      "{}: q and k must share the head dimension, got q {} and k {}", op,
                      shape_str(q.shape()), shape_str(k.shape()));
  TPCHECK_CHECK_INPUT(dims.g >= 1 && dims.h % dims.g == 0,
                      "{}: the number of key/value groups must divide the number of heads, got "
                      "heads {} and groups {}",
                      op, dims.h, dims.g);
  TPCHECK_CHECK_INPUT(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
                      "{}: q, k, v must share one dtype, got {}, {}, {}", op, q.describe(),
                      k.describe(), v.describe());
  // cblas takes int sizes; s·s is a leading-dimension product we never form in an int.
  TPCHECK_CHECK_INPUT(
      dims.s <= std::numeric_limits<int>::max() && dims.d <= std::numeric_limits<int>::max(),
      "{}: sequence {} or head dim {} too large for BLAS", op, dims.s, dims.d);
  return dims;
}

// allowed[i * s + j] = mask.allows(i, j), computed once per call and shared by every head.
std::vector<std::uint8_t> mask_table(const AttentionMask& mask, std::int64_t s) {
  std::vector<std::uint8_t> allowed(static_cast<std::size_t>(s * s));
  for (std::int64_t i = 0; i < s; ++i) {
    for (std::int64_t j = 0; j < s; ++j) allowed[i * s + j] = mask.allows(i, j) ? 1 : 0;
  }
  return allowed;
}

// Row-major C = alpha · op(A) op(B) + beta · C, C [m, n], reduction length k.
void gemm_rm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
             const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
             float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}
void gemm_rm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
             const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
             double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// Copies head `head` of batch `batch` out of x [s, b, heads, d] into dst [s, d], and back.
template <typename Real>
void gather_head(const std::vector<Real>& x, const Dims& dm, std::int64_t heads, std::int64_t batch,
                 std::int64_t head, Real* dst) {
  for (std::int64_t i = 0; i < dm.s; ++i) {
    const Real* src = x.data() + ((i * dm.b + batch) * heads + head) * dm.d;
    std::copy(src, src + dm.d, dst + i * dm.d);
  }
}
template <typename Real>
void scatter_head(const Real* src, const Dims& dm, std::int64_t heads, std::int64_t batch,
                  std::int64_t head, std::vector<Real>& x) {
  for (std::int64_t i = 0; i < dm.s; ++i) {
    std::copy(src + i * dm.d, src + (i + 1) * dm.d,
              x.data() + ((i * dm.b + batch) * heads + head) * dm.d);
  }
}

// In place: row i of p [s, s] holds scores; becomes softmax over the allowed keys (with
// the row maximum subtracted first), 0 at masked keys, all 0 if no key is allowed.
template <typename Real>
void masked_softmax_rows(Real* p, const std::vector<std::uint8_t>& allowed, std::int64_t s) {
  for (std::int64_t i = 0; i < s; ++i) {
    Real* row = p + i * s;
    const std::uint8_t* ok = allowed.data() + i * s;
    Real max = -std::numeric_limits<Real>::infinity();
    for (std::int64_t j = 0; j < s; ++j) {
      if (ok[j]) max = std::max(max, row[j]);
    }
    if (max == -std::numeric_limits<Real>::infinity()) {  // fully masked row
      std::fill(row, row + s, Real(0));
      continue;
    }
    Real sum = 0;
    for (std::int64_t j = 0; j < s; ++j) {
      row[j] = ok[j] ? std::exp(row[j] - max) : Real(0);
      sum += row[j];
    }
    for (std::int64_t j = 0; j < s; ++j) row[j] /= sum;
  }
}

template <typename Real>
constexpr DType real_dtype() {
  return sizeof(Real) == sizeof(double) ? DType::kF64 : DType::kF32;
}

template <typename Real>
AttentionForward forward(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionMask& mask, Real scale, const Dims& dm) {
  const std::vector<Real> qv = cpu::load<Real>(q), kv = cpu::load<Real>(k), vv = cpu::load<Real>(v);
  const std::vector<std::uint8_t> allowed = mask_table(mask, dm.s);
  std::vector<Real> out(qv.size());
  Tensor probs({dm.b, dm.h, dm.s, dm.s}, real_dtype<Real>());
  Real* p_all = probs.data<Real>();

  const std::int64_t sd = dm.s * dm.d, ss = dm.s * dm.s, heads_per_group = dm.h / dm.g;
  std::vector<Real> qh(sd), kh(sd), vh(sd), oh(sd);
  for (std::int64_t bb = 0; bb < dm.b; ++bb) {
    for (std::int64_t gg = 0; gg < dm.g; ++gg) {
      gather_head(kv, dm, dm.g, bb, gg, kh.data());
      gather_head(vv, dm, dm.g, bb, gg, vh.data());
      for (std::int64_t hh = gg * heads_per_group; hh < (gg + 1) * heads_per_group; ++hh) {
        gather_head(qv, dm, dm.h, bb, hh, qh.data());
        Real* p = p_all + (bb * dm.h + hh) * ss;
        gemm_rm(false, true, dm.s, dm.s, dm.d, scale, qh.data(), dm.d, kh.data(), dm.d, Real(0), p,
                dm.s);  // S = scale · Q Kᵀ
        masked_softmax_rows(p, allowed, dm.s);
        gemm_rm(false, false, dm.s, dm.d, dm.s, Real(1), p, dm.s, vh.data(), dm.d, Real(0),
                oh.data(), dm.d);  // O = P V
        scatter_head(oh.data(), dm, dm.h, bb, hh, out);
      }
    }
  }
  return {cpu::make(out, q.shape(), q.dtype()), probs};
}

template <typename Real>
AttentionGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, Real scale, const Dims& dm) {
  const std::vector<Real> dov = cpu::load<Real>(dout), qv = cpu::load<Real>(q),
                          kv = cpu::load<Real>(k), vv = cpu::load<Real>(v);
  const Real* p_all = probs.data<Real>();
  std::vector<Real> dq(qv.size()), dk(kv.size()), dv(vv.size());

  const std::int64_t sd = dm.s * dm.d, ss = dm.s * dm.s, heads_per_group = dm.h / dm.g;
  std::vector<Real> qh(sd), kh(sd), vh(sd), doh(sd), dqh(sd), dkh(sd), dvh(sd), ds(ss);
  for (std::int64_t bb = 0; bb < dm.b; ++bb) {
    for (std::int64_t gg = 0; gg < dm.g; ++gg) {
      gather_head(kv, dm, dm.g, bb, gg, kh.data());
      gather_head(vv, dm, dm.g, bb, gg, vh.data());
      std::fill(dkh.begin(), dkh.end(), Real(0));
      std::fill(dvh.begin(), dvh.end(), Real(0));
      for (std::int64_t hh = gg * heads_per_group; hh < (gg + 1) * heads_per_group; ++hh) {
        gather_head(qv, dm, dm.h, bb, hh, qh.data());
        gather_head(dov, dm, dm.h, bb, hh, doh.data());
        const Real* p = p_all + (bb * dm.h + hh) * ss;
        gemm_rm(false, true, dm.s, dm.s, dm.d, Real(1), doh.data(), dm.d, vh.data(), dm.d, Real(0),
                ds.data(), dm.s);  // dP = dO Vᵀ
        // dS = P ⊙ (dP − rowsum(dP ⊙ P)), the softmax Jacobian applied row by row. Masked
        // entries have P = 0, so dS is 0 there without consulting the mask again.
        for (std::int64_t i = 0; i < dm.s; ++i) {
          const Real* p_row = p + i * dm.s;
          Real* ds_row = ds.data() + i * dm.s;
          Real dot = 0;
          for (std::int64_t j = 0; j < dm.s; ++j) dot += ds_row[j] * p_row[j];
          for (std::int64_t j = 0; j < dm.s; ++j) ds_row[j] = p_row[j] * (ds_row[j] - dot);
        }
        gemm_rm(false, false, dm.s, dm.d, dm.s, scale, ds.data(), dm.s, kh.data(), dm.d, Real(0),
                dqh.data(), dm.d);  // dQ = scale · dS K
        gemm_rm(true, false, dm.s, dm.d, dm.s, scale, ds.data(), dm.s, qh.data(), dm.d, Real(1),
                dkh.data(), dm.d);  // dK += scale · dSᵀ Q   (summed over the group)
        gemm_rm(true, false, dm.s, dm.d, dm.s, Real(1), p, dm.s, doh.data(), dm.d, Real(1),
                dvh.data(), dm.d);  // dV += Pᵀ dO   (summed over the group)
        scatter_head(dqh.data(), dm, dm.h, bb, hh, dq);
      }
      scatter_head(dkh.data(), dm, dm.g, bb, gg, dk);
      scatter_head(dvh.data(), dm, dm.g, bb, gg, dv);
    }
  }
  return {cpu::make(dq, q.shape(), q.dtype()), cpu::make(dk, k.shape(), k.dtype()),
          cpu::make(dv, v.shape(), v.dtype())};
}

}  // namespace

AttentionForward CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const AttentionMask& mask, double scale) {
  const Dims dm = check_qkv("attention_forward", q, k, v);
  if (cpu::is_f64(q)) return forward<double>(q, k, v, mask, scale, dm);
  return forward<float>(q, k, v, mask, static_cast<float>(scale), dm);
}

// `mask` is not needed here: the saved probabilities are exactly 0 at masked keys.
AttentionGrads CpuBackend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                              const Tensor& v, const AttentionForward& saved,
                                              const AttentionMask& mask, double scale) {
  const Dims dm = check_qkv("attention_backward", q, k, v);
  TPCHECK_CHECK_INPUT(dout.defined() && dout.shape() == q.shape(),
                      "attention_backward: dout must have q's shape {}, got {}",
                      shape_str(q.shape()), describe_or_undefined(dout));
  const DType probs_dtype = cpu::is_f64(q) ? DType::kF64 : DType::kF32;
  const Shape probs_shape{dm.b, dm.h, dm.s, dm.s};
  TPCHECK_CHECK_INPUT(saved.probs.defined() && saved.probs.shape() == probs_shape &&
                          saved.probs.dtype() == probs_dtype,
                      "attention_backward: saved probs must be {}{}, got {}",
                      dtype_name(probs_dtype), shape_str(probs_shape),
                      describe_or_undefined(saved.probs));
  if (cpu::is_f64(q)) return backward<double>(dout, q, k, v, saved.probs, scale, dm);
  return backward<float>(dout, q, k, v, saved.probs, static_cast<float>(scale), dm);
}

}  // namespace tpcheck

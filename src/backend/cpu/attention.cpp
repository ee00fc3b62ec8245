// attention.cpp — the CPU attention primitives: layout changes between the layers'
// [s, b, n, d] and the heads-major [b·h, s, d] the batched GEMMs take (expanding GQA
// groups on the way in, summing them on the way back), and the masked softmax with its
// backward. Backend::attention_forward / attention_backward (src/backend/composed_attention.cpp)
// compose them with the GEMM front end, so attention's products are ledger GEMMs (the
// CPU GEMM engine, gemm.cpp, under the backend's class rule) and nothing here multiplies
// matrices.
//
// Buffers (R = f32, f64 for f64 tensors):
//   heads_in    x [s, b, n, d] T        → [b·h, s, d] T         copy, head i ← x head i/(h/n)
//   heads_out   x [b·h, s, d] T         → [s, b, groups, d] T   Σ over h/groups heads in R
//   softmax     scores [b·h, s_q, s_k] T → probs, same shape, R
//   softmax bwd dP [b·h, s_q, s_k] T, probs R → dS, dP's shape, T
// Math in R; one rounding (nearest even) to T where a result is stored. The softmax
// subtracts the row maximum before exp and divides by the row sum (summed left to right);
// masked keys get exactly 0; a row with no allowed key gets all 0 (a guard: every
// AttentionMask allows the diagonal when s_q = s_k).
// Thread safety: pure functions of their arguments (see cpu_backend.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

void check_cpu(const char* op, const Tensor& t, int rank) {
  TPCHECK_CHECK_INPUT(t.defined() && t.rank() == rank && t.device() == Device::kCpu,
                      "{}: expected a rank-{} CPU tensor, got {}", op, rank,
                      t.defined() ? t.describe() : std::string("an undefined tensor"));
}

template <typename Real>
Tensor heads_out(const Tensor& x, std::int64_t batch, std::int64_t groups) {
  const std::int64_t bh = x.dim(0), s = x.dim(1), d = x.dim(2), h = bh / batch;
  const std::int64_t per_group = h / groups;
  const std::vector<Real> xv = cpu::load<Real>(x);
  std::vector<Real> out(static_cast<std::size_t>(s * batch * groups * d));
  for (std::int64_t i = 0; i < s; ++i) {
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t g = 0; g < groups; ++g) {
        Real* dst = out.data() + ((i * batch + b) * groups + g) * d;
        for (std::int64_t e = 0; e < d; ++e) {
          Real sum = 0;
          for (std::int64_t r = 0; r < per_group; ++r) {
            sum += xv[((b * h + g * per_group + r) * s + i) * d + e];
          }
          dst[e] = sum;
        }
      }
    }
  }
  return cpu::make(out, {s, batch, groups, d}, x.dtype());
}

template <typename Real>
Tensor softmax_forward(const Tensor& scores, const AttentionMask& mask) {
  const std::int64_t rows = scores.dim(0) * scores.dim(1), sq = scores.dim(1), sk = scores.dim(2);
  std::vector<Real> p = cpu::load<Real>(scores);
  // allowed[i * sk + j] = mask.allows(i, j), shared by every (batch, head).
  std::vector<std::uint8_t> allowed(static_cast<std::size_t>(sq * sk));
  for (std::int64_t i = 0; i < sq; ++i) {
    for (std::int64_t j = 0; j < sk; ++j) allowed[i * sk + j] = mask.allows(i, j) ? 1 : 0;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    Real* row = p.data() + r * sk;
    const std::uint8_t* ok = allowed.data() + (r % sq) * sk;
    Real max = -std::numeric_limits<Real>::infinity();
    for (std::int64_t j = 0; j < sk; ++j) {
      if (ok[j]) max = std::max(max, row[j]);
    }
    if (max == -std::numeric_limits<Real>::infinity()) {  // no key allowed
      std::fill(row, row + sk, Real(0));
      continue;
    }
    Real sum = 0;
    for (std::int64_t j = 0; j < sk; ++j) {
      row[j] = ok[j] ? std::exp(row[j] - max) : Real(0);
      sum += row[j];
    }
    for (std::int64_t j = 0; j < sk; ++j) row[j] /= sum;
  }
  return cpu::make(p, scores.shape(), sizeof(Real) == sizeof(double) ? DType::kF64 : DType::kF32);
}

template <typename Real>
Tensor softmax_backward(const Tensor& dprobs, const Tensor& probs) {
  const std::int64_t sk = dprobs.dim(2), rows = dprobs.numel() / std::max<std::int64_t>(sk, 1);
  std::vector<Real> ds = cpu::load<Real>(dprobs);
  const Real* p = probs.data<Real>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const Real* p_row = p + r * sk;
    Real* row = ds.data() + r * sk;
    Real dot = 0;
    for (std::int64_t j = 0; j < sk; ++j) dot += row[j] * p_row[j];
    for (std::int64_t j = 0; j < sk; ++j) row[j] = p_row[j] * (row[j] - dot);
  }
  return cpu::make(ds, dprobs.shape(), dprobs.dtype());
}

}  // namespace

Tensor CpuBackend::attention_heads_in(const Tensor& x, std::int64_t heads) {
  check_cpu("attention_heads_in", x, 4);
  const std::int64_t s = x.dim(0), b = x.dim(1), n = x.dim(2), d = x.dim(3);
  TPCHECK_CHECK_INPUT(n >= 1 && heads >= n && heads % n == 0,
                      "attention_heads_in: {} heads cannot be expanded to {} heads", n, heads);
  Tensor out({b * heads, s, d}, x.dtype());
  const std::size_t row_bytes = static_cast<std::size_t>(d) * dtype_size(x.dtype());
  const auto* src = static_cast<const std::byte*>(x.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  const std::int64_t per_group = heads / n;
  for (std::int64_t bb = 0; bb < b; ++bb) {
    for (std::int64_t hh = 0; hh < heads; ++hh) {
      for (std::int64_t i = 0; i < s; ++i) {
        std::memcpy(dst + ((bb * heads + hh) * s + i) * row_bytes,
                    src + ((i * b + bb) * n + hh / per_group) * row_bytes, row_bytes);
      }
    }
  }
  return out;
}

Tensor CpuBackend::attention_heads_out(const Tensor& x, std::int64_t batch, std::int64_t groups) {
  check_cpu("attention_heads_out", x, 3);
  TPCHECK_CHECK_INPUT(batch >= 1 && x.dim(0) % batch == 0 && groups >= 1 &&
                          (x.dim(0) / batch) % groups == 0,
                      "attention_heads_out: {} is not [batch {} · heads, s, d] with heads a "
                      "multiple of {} groups",
                      x.describe(), batch, groups);
  if (cpu::is_f64(x)) return heads_out<double>(x, batch, groups);
  return heads_out<float>(x, batch, groups);
}

Tensor CpuBackend::attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) {
  check_cpu("attention_softmax_forward", scores, 3);
  if (cpu::is_f64(scores)) return softmax_forward<double>(scores, mask);
  return softmax_forward<float>(scores, mask);
}

Tensor CpuBackend::attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) {
  check_cpu("attention_softmax_backward", dprobs, 3);
  const DType pt = cpu::is_f64(dprobs) ? DType::kF64 : DType::kF32;
  TPCHECK_CHECK_INPUT(probs.defined() && probs.device() == Device::kCpu &&
                          probs.numel() == dprobs.numel() && probs.dtype() == pt,
                      "attention_softmax_backward: probs must be {} with {} values on the CPU "
                      "(dprobs {}), got {}",
                      dtype_name(pt), dprobs.numel(), dprobs.describe(),
                      probs.defined() ? probs.describe() : std::string("an undefined tensor"));
  if (pt == DType::kF64) return softmax_backward<double>(dprobs, probs);
  return softmax_backward<float>(dprobs, probs);
}

}  // namespace tpcheck

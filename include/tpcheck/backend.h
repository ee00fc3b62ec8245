// tpcheck/backend.h — the operations layers are written against.
//
// A Backend computes; layers never know which one. The CPU backend (src/backend/cpu) is
// the reference and runs in CI; a CUDA backend implements the same interface.
//
// Conventions:
//   * Row-major. Tensors of rank > 2 are viewed as 2-D [rows, last dim] where an op works
//     on matrices.
//   * Precision: an op's math is in f64 when its inputs are f64 (truth runs) and in f32
//     otherwise; results are rounded to the storage dtype of the input, where a GPU
//     kernel would store them. Saved statistics (norm mean/rstd, attention
//     probabilities) are kept in f32 (f64 for f64 inputs).
//   * Forward returns what backward needs. Backward *writes* activation gradients
//     (returned tensors) and *accumulates* (+=) parameter gradients into tensors passed
//     by reference, in their own dtype.
// Thread safety: a Backend object is used by one rank (thread) at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "tpcheck/gemm_record.h"
#include "tpcheck/tensor.h"

namespace tpcheck {

// ---- GEMM class rule -------------------------------------------------------------
// How the backend picks the numerical class of each GEMM.
//   kAsStored: from the input dtype: f64 → fp64, f32 → `f32_class`, f16 → fp16, bf16 → bf16.
//   kAuto:     like kAsStored, but f32 GEMMs with a short reduction (k < auto_min_k)
//              run as fp32 (FMA kernels) and longer ones as tf32 (tensor cores),
//              modelled on what cuBLASLt's heuristic does for fp32 with TF32 allowed.
struct GemmClassRule {
  enum class Mode { kAsStored, kAuto };
  Mode mode = Mode::kAsStored;
  MathClass f32_class = MathClass::kFp32;
  std::int64_t auto_min_k = 16;
};

// ---- op enums ----------------------------------------------------------------------
enum class NormKind { kLayerNorm, kRMSNorm };
std::string_view norm_kind_name(NormKind k);       // "LayerNorm", "RMSNorm"
NormKind parse_norm_kind(std::string_view name);   // throws Error(kInput)

// gelu: tanh approximation. srelu: relu(x)². qgelu: x·sigmoid(1.702x).
// Gated (geglu, swiglu): input [.., 2n] = [a | b] (a first), output [.., n] = act(a) · b
// with act = gelu (tanh) for geglu and silu for swiglu.
enum class Activation { kGelu, kRelu, kSrelu, kQgelu, kGeglu, kSwiglu };
std::string_view activation_name(Activation a);     // "gelu", "relu", ...
Activation parse_activation(std::string_view name); // throws Error(kInput)
bool is_gated(Activation a);

// Which keys a query may attend to. For query i and key j (positions in the sequence):
//   kNoMask:  all j;
//   kCausal:  j <= i, and j >= i - window_left when window_left >= 0;
//   kSlidingWindow: i - window_left <= j <= i + window_right (a negative bound is
//             unbounded on that side).
struct AttentionMask {
  enum class Type { kNoMask, kCausal, kSlidingWindow };
  Type type = Type::kCausal;
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  bool allows(std::int64_t query, std::int64_t key) const;
};

// ---- saved state -------------------------------------------------------------------
struct NormForward {
  Tensor y;     // normalized output, input dtype
  Tensor mean;  // [rows] (undefined for RMSNorm)
  Tensor rstd;  // [rows] 1/sqrt(var + eps) (RMSNorm: 1/sqrt(mean(x²) + eps))
};

struct AttentionForward {
  Tensor out;    // [s, b, h, d], input dtype
  Tensor probs;  // [b, h, s_q, s_k] softmax probabilities, f32 (f64 for f64 inputs)
};

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// ---- the interface -----------------------------------------------------------------
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // C = op(A) · op(B)  (accumulate: C += op(A) · op(B)); op(X) = Xᵀ when trans_x.
  // A is [m, k] ([k, m] if trans_a), B is [k, n] ([n, k] if trans_b), C is [m, n] and
  // must be allocated by the caller, in any dtype (its dtype is the output dtype).
  // Records a GemmRecord under `site`.
  virtual void gemm(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                    bool trans_b, Tensor& c, bool accumulate) = 0;

  // y[.., n] += bias[n] (in place).
  virtual void add_bias(Tensor& y, const Tensor& bias) = 0;
  // dbias[n] += Σ_rows dy[.., n].
  virtual void accumulate_bias_grad(const Tensor& dy, Tensor& dbias) = 0;

  // Normalizes over the last dimension. gamma/beta are [hidden]; beta undefined for RMSNorm.
  // zero_centered_gamma: the scale is (1 + gamma).
  virtual NormForward norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps, bool zero_centered_gamma) = 0;
  // Returns dx; dgamma += ..., dbeta += ... (dbeta ignored for RMSNorm; may be undefined).
  virtual Tensor norm_backward(NormKind kind, const Tensor& dy, const Tensor& x,
                               const Tensor& gamma, const NormForward& saved,
                               bool zero_centered_gamma, Tensor& dgamma, Tensor& dbeta) = 0;

  virtual Tensor activation_forward(Activation act, const Tensor& x) = 0;
  virtual Tensor activation_backward(Activation act, const Tensor& dy, const Tensor& x) = 0;

  // Scaled dot-product attention. q [s, b, h, d]; k, v [s, b, g, d] with g dividing h;
  // query head i uses key/value group i / (h / g). out = softmax(scale · q kᵀ + mask) v.
  virtual AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionMask& mask, double scale) = 0;
  virtual AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const AttentionForward& saved,
                                            const AttentionMask& mask, double scale) = 0;

  // a + b (same shape), rounded to a's dtype.
  virtual Tensor add(const Tensor& a, const Tensor& b) = 0;
  // into += x (same shape), rounded to into's dtype.
  virtual void accumulate(Tensor& into, const Tensor& x) = 0;
  // x · s
  virtual Tensor scale(const Tensor& x, double s) = 0;
  // mean((y - target)²) computed in f64; and its gradient 2 (y - target) / numel, in y's dtype.
  virtual double mse_loss(const Tensor& y, const Tensor& target) = 0;
  virtual Tensor mse_loss_backward(const Tensor& y, const Tensor& target) = 0;

  void set_gemm_rule(const GemmClassRule& rule) { gemm_rule_ = rule; }
  const GemmClassRule& gemm_rule() const { return gemm_rule_; }
  GemmLedger& ledger() { return ledger_; }
  const GemmLedger& ledger() const { return ledger_; }

 protected:
  // The class `gemm_rule()` gives a GEMM with these input dtypes and reduction length.
  MathClass choose_math_class(DType a, DType b, std::int64_t k) const;

  GemmClassRule gemm_rule_;
  GemmLedger ledger_;
};

std::unique_ptr<Backend> make_cpu_backend();

// Threads OpenBLAS uses for one CPU GEMM. Results differ in the last bits between thread
// counts (measured: 1 vs 2 threads on a 300×200×500 sgemm), so runs that compare bits
// fix it; the thread-rank runner uses 1 (the ranks are the parallelism).
void set_cpu_gemm_threads(int threads);
int cpu_gemm_threads();
// The CPU GEMM library and its build ("OpenBLAS 0.3.21 ..."), for reports.
std::string cpu_gemm_library();

namespace cpu {
struct RoundingProbeState;
}

// A rounding probe (Monte-Carlo arithmetic) for the truth policy's cancellation floor
// (docs/POLICIES.md): while one lives on this thread, the CPU backend multiplies every
// f64 value an op stores by (1 + u·r), r uniform in [-1, 1) from a fixed stream keyed by
// `seed`. An f64 run under the probe, minus the plain f64 run, divided by u, is to first
// order the error that one rounding of every stored intermediate causes — it follows the
// size of what was summed, so it stays non-zero where the result cancels to zero (the
// attention key-bias gradient). Only f64 stores are perturbed; collectives are not.
// REQUIRES: 0 < u < 1; no other probe alive on this thread (probes do not nest).
// Thread safety: affects the constructing thread only.
class ScopedRoundingProbe {
 public:
  ScopedRoundingProbe(double u, std::uint64_t seed);
  ~ScopedRoundingProbe();
  ScopedRoundingProbe(const ScopedRoundingProbe&) = delete;
  ScopedRoundingProbe& operator=(const ScopedRoundingProbe&) = delete;

 private:
  std::unique_ptr<cpu::RoundingProbeState> state_;
};

}  // namespace tpcheck

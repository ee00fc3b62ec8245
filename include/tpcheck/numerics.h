// tpcheck/numerics.h — comparing a sharded run with its single-device twin (and both with
// the fp64 truth run), and the policies that turn those statistics into verdicts.
//
// Data flow: compare_tensors() measures (no judgement); evaluate() applies one Policy to
// the measurements and returns a Verdict with a reason a human reads. Policies are plain
// data, so the suite can judge the same comparison under every policy.
//
// Global rules, applied by evaluate() before any policy:
//   * a NaN or Inf in sharded, single or truth never passes;
//   * sharded all zeros where single is not fails (a lost all-reduce looks like this);
//   * both all zeros passes with a warning (nothing was really checked).
// Thread safety: all functions are pure; the structs are plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/tensor.h"

namespace tpcheck {

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

// The reference suite's table (TransformerEngine run_numerics.py, unquantized, with the
// loosened fp32 atol this project starts from): f32 (TF32 GEMMs) rtol 1e-3 atol 5e-5,
// f16 rtol 1e-3 atol 1e-5, bf16 rtol 1.6e-2 atol 1e-5. Other dtypes have no entry, as in
// the reference (it raises): nullopt.
std::optional<Tolerance> reference_tolerance(DType dtype);

struct CompareOptions {
  // Override the table (the CLI's --rtol / --atol). An override applies to every dtype.
  std::optional<double> rtol;
  std::optional<double> atol;
};

// Errors of one run against the fp64 truth: e_i = x_i - truth_i in f64.
struct TruthError {
  double max_abs = 0;        // max_i |e_i|
  std::int64_t argmax = -1;  // its flat index (first maximum)
  double rms = 0;            // sqrt(mean_i e_i^2)
};

struct TensorComparison {
  Shape shape;
  DType dtype = DType::kF32;  // single's dtype: it selects the tolerance, as in the reference
  std::int64_t numel = 0;

  // Tolerance the te/allclose statistics use (table or override); `has_tolerance` false
  // when the dtype has no table entry and nothing was overridden.
  bool has_tolerance = false;
  Tolerance tolerance;

  // ---- sharded vs single, the reference suite's statistics ----
  // The reference takes d_i = |sharded_i - single_i| computed in the tensors' dtype (so
  // rounded to it), flattens, and judges at argmax d (the first maximum; NaN counts as the
  // maximum, as torch.argmax does). -1 when the tensor is empty.
  std::int64_t argmax = -1;
  std::vector<std::int64_t> argmax_index;  // the same position as a multi-index
  double sharded_value = 0;                // sharded[argmax] (exact)
  double single_value = 0;                 // single[argmax] (exact)
  double max_abs_diff = 0;                 // d[argmax]
  double rel_at_max = 0;                   // max_abs_diff / max(|single_value|, 1e-5)
  // ‖sharded − single‖₂ / ‖single‖₂ in f64 (0 when both are 0, inf when only single is).
  double norm_rel_diff = 0;
  // Elements with |sharded − single| > atol + rtol·|single| (exact f64 arithmetic) for
  // `tolerance`; -1 when !has_tolerance.
  std::int64_t count_over_allclose = -1;
  // Elements whose bit patterns differ (same dtype required for bitwise equality).
  std::int64_t count_bits_differ = 0;
  bool bitwise_equal = false;

  std::int64_t sharded_nan = 0, sharded_inf = 0;
  std::int64_t single_nan = 0, single_inf = 0;
  bool sharded_all_zero = false;
  bool single_all_zero = false;

  // ---- both against the fp64 truth (when one was given) ----
  bool has_truth = false;
  std::int64_t truth_nonfinite = 0;
  double truth_rms = 0;      // sqrt(mean truth_i²): the magnitude the floor scales with
  double truth_max_abs = 0;  // max |truth_i|
  TruthError single_vs_truth;
  TruthError sharded_vs_truth;
  // The share of single's squared error that is one number repeated in every element,
  // (Σ e)² / (n Σ e²) for e = single − truth: 1 when the error is a common offset (one
  // sample of rounding, however many elements), about 1/n for independent errors.
  double single_error_offset_share = 0;
  // The scale test: the component of the difference d = sharded − single along the truth,
  //   scale_shift = Σ t·d / Σ t²  (= β_sharded − β_single, where β = Σ t·e / Σ t² is the
  //   part of a run's error e that is a rescaling of the truth),
  // its standard error if the residuals r = d − scale_shift·t were independent (the
  // heteroscedasticity-consistent form, as quantization errors grow with |t|),
  //   scale_shift_sigma = sqrt(Σ t²r²) / Σ t²,
  // single's own error along the truth, single_scale_error = Σ t·(single − t) / Σ t² (its
  // β: −0.95 for a gradient single lost to underflow),
  // and how much the truth varies, truth_variation = 1 − (Σ t)² / (n Σ t²) (0 for a
  // constant tensor, whose rounding is itself a rescaling; about 1 for zero-mean data).
  // All 0 when the truth is all zeros.
  double scale_shift = 0;
  double scale_shift_sigma = 0;
  double single_scale_error = 0;
  double truth_variation = 0;

  // ---- the rounding probe (when one was given) ----
  // Statistics of the probe's noise tensor n (f64): n_i is what one rounding of every
  // stored intermediate moves element i by, per unit roundoff (make_rounding_probe_backend). It
  // follows the size of what was summed, so it stays non-zero where the truth cancels to
  // (nearly) zero.
  bool has_rounding_noise = false;
  double rounding_noise_rms = 0;      // sqrt(mean n_i²)
  double rounding_noise_max_abs = 0;  // max |n_i|
};

// Measures `sharded` against `single` (and both against `truth` when not null; the
// rounding probe's noise tensor when `rounding_noise` is not null).
// REQUIRES (Error(kInput) otherwise): same shape for all; truth and rounding_noise, when
// given, of dtype f64; rounding_noise only together with truth.
TensorComparison compare_tensors(const Tensor& sharded, const Tensor& single, const Tensor* truth,
                                 const CompareOptions& options = {},
                                 const Tensor* rounding_noise = nullptr);

enum class PolicyKind { kTe, kAllclose, kTruth, kBitwise };

// Parameters of the `truth` policy. Sharded passes when, against the fp64 truth,
//   sharded.rms     <= m · sqrt(N) · single.rms     + f · u · sqrt(K) · (truth_rms + noise_rms)
//   sharded.max_abs <= m · sqrt(N) · single.max_abs + f · u · sqrt(K) · (truth_max_abs
//                                                                       + noise_max_abs),
// with m = multiplier, f = floor_factor, N the TP size, noise the rounding probe's
// statistics (0 without a probe). The error model:
//   * u is the unit roundoff of the arithmetic that produced the tensor: the larger of
//     the storage dtype's and the coarsest GEMM class's (2^-24 for fp32 GEMMs, 2^-11 for
//     TF32 inputs); K is the longest GEMM reduction of the case. A length-K dot product
//     whose rounding errors have random signs has a relative error of about u·sqrt(K):
//     the floor, so a sharded error still at rounding level for the longest reduction
//     passes even when the single run happened to be more accurate.
//   * noise: the floor term sqrt(K)·|truth| scales with the result, so it vanishes where
//     a sum cancels to zero in exact arithmetic (the attention key-bias gradient: softmax
//     ignores a shift) although the rounding errors scale with the summed terms. The
//     probe measures those: one rounding of every stored intermediate, propagated.
//   * sqrt(N): where the single run rounds a reduction once, the sharded run rounds N
//     partial results to the storage dtype before summing them across ranks (a column-
//     parallel dgrad, a sequence-parallel norm-weight gradient); independent rounding
//     errors grow like sqrt(N).
//   * m: two correct implementations that differ only in reduction order, blocking and
//     GEMM class have errors of the same order, so a ratio test is scale free.
//   * one sample: a ratio of two errors that are mostly one number repeated (single's
//     offset share >= one_sample_share) is a ratio of two samples, unbounded (it passes
//     4·sqrt(2) in about one pair of ten). Under a quantized recipe (format_unit_roundoff
//     > 0, the coarsest element format of the case's GEMMs) such a tensor's floor adds
//     one rounding to that format, format_unit_roundoff · |truth| (measured: an fc2
//     bias gradient of a constant-initialized case, 1.7e-3 of the tensor off under fp8_cs
//     where single was 8e-5).
// Then the scale test (TensorComparison::scale_shift): sharded also fails when
//   |scale_shift| > max(scale_min_shift, m · sqrt(N) · |single_scale_error|)
//   and |scale_shift| > scale_z · scale_shift_sigma
// in a tensor whose truth varies (truth_variation >= scale_min_variation) and which
// single resolves (|single_scale_error| < scale_max_single: not a gradient single lost to
// underflow, nor a sum that cancels to f64 noise such as the attention key-bias
// gradient, where "along the truth" means nothing). The bounds
// above scale with single's error, which a coarse format (NVFP4: 10-20 % of a tensor)
// makes wide enough to hide a bug that rescales a tensor by 1/sqrt(N) or 1/N; rounding
// spreads its error over every direction, such a bug puts it along the truth. Where
// single's own error is itself a rescaling (f16 gradients lost to underflow), a correct
// sharded run may be rescaled m·sqrt(N) times as much, as its error may be that much
// larger (the second term; measured: 2.6× single's at TP 2, f16 norm-bias gradients).
// scale_z = 0 turns the test off.
// The defaults are calibrated in docs/POLICIES.md from measured error ratios (the scale
// test's in docs/QUANTIZATION.md, "Judging quantized runs").
struct TruthPolicyParams {
  double multiplier = 4.0;
  double floor_factor = 1.0;
  std::optional<double> unit_roundoff;  // u; default dtype_unit_roundoff(dtype)
  std::int64_t reduction_length = 1;    // K
  int tp_size = 1;                      // N
  double scale_z = 20.0;
  double scale_min_shift = 0.1;
  double scale_min_variation = 0.1;
  double scale_max_single = 0.5;
  double format_unit_roundoff = 0;  // set per case by the suite's judge
  double one_sample_share = 0.5;
};

struct Policy {
  PolicyKind kind = PolicyKind::kTruth;
  TruthPolicyParams truth;  // used by kTruth only
};

// "te", "allclose", "truth", "bitwise".
std::string_view policy_name(PolicyKind kind);
// All accepted names, in the order above.
const std::vector<std::string>& policy_names();
// Inverse of policy_name with default parameters; throws Error(kInput) naming the bad
// name and the accepted ones.
Policy parse_policy(std::string_view name);

enum class VerdictStatus { kPass, kWarning, kFail };
// "pass", "warning", "fail".
std::string_view verdict_status_name(VerdictStatus status);

struct Verdict {
  VerdictStatus status = VerdictStatus::kFail;
  std::string reason;  // one line a human reads, with the figures that decided
  bool passed() const { return status != VerdictStatus::kFail; }
};

// Applies the global rules (non-finite values fail; sharded all zeros where single is not
// fails — under truth only when the truth bound also fails, else a warning; both all zeros
// warns), then the policy:
//   te:       judged at argmax only; fails iff rel_at_max > rtol AND max_abs_diff > atol;
//   allclose: fails iff any element has |sharded − single| > atol + rtol·|single|;
//   truth:    see TruthPolicyParams (fails with a reason when no truth was compared);
//   bitwise:  fails iff any bit pattern differs (or the dtypes differ).
// te/allclose on a comparison without a tolerance fail with a reason asking for one.
Verdict evaluate(const Policy& policy, const TensorComparison& comparison);

// The reference suite's failure line, formatted as its Python f-string prints it
// (floats as Python repr: shortest round-trip digits, exponent form below 1e-4 and from
// 1e16, a ".0" on integral values):
// "NUMERICAL CHECK FAILED: <name> not close enough at index <i> with <sharded> vs <single>
//  | rel. error = <r> (tol = <rtol>) | abs. error = <e> (tol = <atol>)" (one line).
// REQUIRES: comparison.has_tolerance and numel > 0.
std::string format_te_failure(std::string_view name, const TensorComparison& comparison);

// A double as Python's repr() prints it (used above; exposed for reports and tests).
std::string python_float_repr(double value);

}  // namespace tpcheck

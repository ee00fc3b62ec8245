// Policies: turn a TensorComparison into a Verdict (pass / warning / fail + reason), and
// the reference suite's failure line. Reasons quote the deciding figures with 3
// significant digits; the reference line uses Python repr, as the reference prints it.
#include <cmath>
#include <limits>

#include "tpcheck/error.h"
#include "tpcheck/numerics.h"

namespace tpcheck {
namespace {

std::string g3(double v) { return fmt::format("{:.3g}", v); }

std::string where(const TensorComparison& c) {
  return fmt::format("index {} {}", c.argmax, shape_str(c.argmax_index));
}

Verdict pass(std::string reason) { return {VerdictStatus::kPass, std::move(reason)}; }
Verdict fail(std::string reason) { return {VerdictStatus::kFail, std::move(reason)}; }

// NaN/Inf never pass; sharded all zeros where single is not fails; both zero warns.
std::optional<Verdict> global_rules(const TensorComparison& c) {
  if (c.sharded_nan + c.sharded_inf + c.single_nan + c.single_inf > 0 || c.truth_nonfinite > 0) {
    std::string r = fmt::format(
        "non-finite values never pass: sharded has {} NaN and {} Inf, single has {} NaN and {} Inf",
        c.sharded_nan, c.sharded_inf, c.single_nan, c.single_inf);
    if (c.truth_nonfinite > 0) r += fmt::format(", truth has {} non-finite", c.truth_nonfinite);
    return fail(r);
  }
  if (c.sharded_all_zero && !c.single_all_zero) {
    return fail(fmt::format("sharded is all zeros but single is not (single has {} at {})",
                            python_float_repr(c.single_value), where(c)));
  }
  if (c.sharded_all_zero && c.single_all_zero) {
    return Verdict{VerdictStatus::kWarning,
                   fmt::format("both sharded and single are all zeros ({} elements): nothing to "
                               "compare",
                               c.numel)};
  }
  return std::nullopt;
}

Verdict no_tolerance(const TensorComparison& c) {
  return fail(fmt::format("no reference tolerance for dtype {}: give rtol and atol explicitly",
                          dtype_name(c.dtype)));
}

Verdict evaluate_te(const TensorComparison& c) {
  if (!c.has_tolerance) return no_tolerance(c);
  const Tolerance& t = c.tolerance;
  const bool rel_over = c.rel_at_max > t.rtol;
  const bool abs_over = c.max_abs_diff > t.atol;
  std::string figures = fmt::format(
      "at {} ({} vs {}): rel. error {} {} rtol {}, abs. error {} {} atol {}", where(c),
      g3(c.sharded_value), g3(c.single_value), g3(c.rel_at_max), rel_over ? ">" : "<=", g3(t.rtol),
      g3(c.max_abs_diff), abs_over ? ">" : "<=", g3(t.atol));
  if (rel_over && abs_over) return fail("max abs diff " + figures);
  return pass("max abs diff " + figures);
}

Verdict evaluate_allclose(const TensorComparison& c) {
  if (!c.has_tolerance) return no_tolerance(c);
  const Tolerance& t = c.tolerance;
  std::string bound = fmt::format("|sharded - single| <= {} + {}·|single|", g3(t.atol), g3(t.rtol));
  if (c.count_over_allclose == 0) {
    return pass(fmt::format("all {} elements satisfy {} (max abs diff {} at {})", c.numel, bound,
                            g3(c.max_abs_diff), where(c)));
  }
  return fail(fmt::format("{} of {} elements violate {} (max abs diff {} at {}, rel. {})",
                          c.count_over_allclose, c.numel, bound, g3(c.max_abs_diff), where(c),
                          g3(c.rel_at_max)));
}

Verdict evaluate_truth(const TruthPolicyParams& p, const TensorComparison& c) {
  if (!c.has_truth) return fail("no fp64 truth run was compared; the truth policy needs one");
  const double u = p.unit_roundoff ? *p.unit_roundoff : dtype_unit_roundoff(c.dtype);
  const double k = static_cast<double>(std::max<std::int64_t>(p.reduction_length, 1));
  const double scale = p.floor_factor * u * std::sqrt(k);
  const double multiplier = p.multiplier * std::sqrt(static_cast<double>(std::max(p.tp_size, 1)));
  // The floor follows the result (|truth|) and what was summed (the probe's noise, which
  // stays non-zero where the result cancels to zero).
  double floor_max = scale * (c.truth_max_abs + c.rounding_noise_max_abs);
  double floor_rms = scale * (c.truth_rms + c.rounding_noise_rms);
  // One sample (numerics.h): single's error is mostly one number repeated; under a recipe
  // the floor allows one rounding to the case's coarsest format.
  const bool one_sample =
      p.format_unit_roundoff > 0 && c.single_error_offset_share >= p.one_sample_share;
  if (one_sample) {
    floor_max += p.format_unit_roundoff * c.truth_max_abs;
    floor_rms += p.format_unit_roundoff * c.truth_rms;
  }
  const double limit_max = multiplier * c.single_vs_truth.max_abs + floor_max;
  const double limit_rms = multiplier * c.single_vs_truth.rms + floor_rms;
  const bool max_ok = c.sharded_vs_truth.max_abs <= limit_max;
  const bool rms_ok = c.sharded_vs_truth.rms <= limit_rms;
  std::string reason = fmt::format(
      "against truth: sharded max error {} vs single {} (limit {}×+floor {} = {}{}), RMS error {} "
      "vs single {} (limit {}×+floor {} = {}{})",
      g3(c.sharded_vs_truth.max_abs), g3(c.single_vs_truth.max_abs), g3(multiplier),
      g3(floor_max), g3(limit_max), max_ok ? "" : ", EXCEEDED", g3(c.sharded_vs_truth.rms),
      g3(c.single_vs_truth.rms), g3(multiplier), g3(floor_rms), g3(limit_rms),
      rms_ok ? "" : ", EXCEEDED");
  if (one_sample) {
    reason += fmt::format("; single's error is mostly one number repeated ({} of its square a "
                          "common offset), so the floor adds one rounding to the format (u {})",
                          g3(c.single_error_offset_share), g3(p.format_unit_roundoff));
  }
  if (!max_ok || !rms_ok) return fail(reason);
  if (p.scale_z <= 0 || c.truth_rms == 0) return pass(reason);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double z = c.scale_shift_sigma > 0 ? std::fabs(c.scale_shift) / c.scale_shift_sigma
                                           : (c.scale_shift != 0 ? kInf : 0.0);
  const bool varies = c.truth_variation >= p.scale_min_variation;
  const bool resolved = std::fabs(c.single_scale_error) < p.scale_max_single;
  // A rescaled single (underflow) allows a sharded run rescaled as many times more as its
  // error may be larger (numerics.h).
  const double min_shift =
      std::max(p.scale_min_shift, multiplier * std::fabs(c.single_scale_error));
  const bool rescaled =
      varies && resolved && std::fabs(c.scale_shift) > min_shift && z > p.scale_z;
  const std::string shift = fmt::format(
      "scale shift along truth {} ({} standard errors{})", g3(c.scale_shift), g3(z),
      !varies    ? fmt::format("; not tested: truth varies {} < {}", g3(c.truth_variation),
                                   g3(p.scale_min_variation))
      : !resolved ? fmt::format("; not tested: single's own shift {} is not under {}",
                                g3(c.single_scale_error), g3(p.scale_max_single))
                  : "");
  if (rescaled) {
    return fail(fmt::format("sharded is single rescaled along the truth: {}, over the limits {} "
                            "and {} standard errors; {}",
                            shift, g3(min_shift), g3(p.scale_z), reason));
  }
  return pass(reason + "; " + shift);
}

Verdict evaluate_bitwise(const TensorComparison& c) {
  if (c.bitwise_equal) return pass(fmt::format("bit-identical ({} elements)", c.numel));
  return fail(fmt::format("{} of {} elements differ in bits (max abs diff {} at {})",
                          c.count_bits_differ, c.numel, g3(c.max_abs_diff), where(c)));
}

}  // namespace

std::string_view policy_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kTe:
      return "te";
    case PolicyKind::kAllclose:
      return "allclose";
    case PolicyKind::kTruth:
      return "truth";
    case PolicyKind::kBitwise:
      return "bitwise";
  }
  return "?";
}

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = {"te", "allclose", "truth", "bitwise"};
  return names;
}

Policy parse_policy(std::string_view name) {
  for (PolicyKind k :
       {PolicyKind::kTe, PolicyKind::kAllclose, PolicyKind::kTruth, PolicyKind::kBitwise}) {
    if (policy_name(k) == name) return Policy{k, {}};
  }
  TPCHECK_CHECK_INPUT(false, "unknown policy '{}'; expected one of: {}", name,
                      fmt::join(policy_names(), ", "));
  return {};
}

std::string_view verdict_status_name(VerdictStatus status) {
  switch (status) {
    case VerdictStatus::kPass:
      return "pass";
    case VerdictStatus::kWarning:
      return "warning";
    case VerdictStatus::kFail:
      return "fail";
  }
  return "?";
}

Verdict evaluate(const Policy& policy, const TensorComparison& comparison) {
  const TensorComparison& c = comparison;
  const bool finite = c.sharded_nan + c.sharded_inf + c.single_nan + c.single_inf == 0 &&
                      c.truth_nonfinite == 0;
  if (policy.kind == PolicyKind::kTruth && c.has_truth && finite && c.sharded_all_zero &&
      !c.single_all_zero) {
    // Under truth the zero rule asks the error model: an all-zero sharded tensor is as far
    // from truth as |truth|, and that is a bug only when single came closer than rounding
    // explains. Where single's own error is as large — a gradient both runs lost to
    // underflow (f16 under a recipe, measured on the H200: single kept 5 % of it) — it is
    // rounding, reported as a warning.
    const Verdict v = evaluate_truth(policy.truth, c);
    const std::string head = fmt::format("sharded is all zeros but single is not (single has {} "
                                         "at {})",
                                         python_float_repr(c.single_value), where(c));
    if (!v.passed()) return fail(head + "; " + v.reason);
    return Verdict{VerdictStatus::kWarning,
                   head + ", but single's own error is as large, so both lost it to rounding; " +
                       v.reason};
  }
  if (std::optional<Verdict> v = global_rules(comparison)) return *v;
  switch (policy.kind) {
    case PolicyKind::kTe:
      return evaluate_te(comparison);
    case PolicyKind::kAllclose:
      return evaluate_allclose(comparison);
    case PolicyKind::kTruth:
      return evaluate_truth(policy.truth, comparison);
    case PolicyKind::kBitwise:
      return evaluate_bitwise(comparison);
  }
  return fail("unknown policy");
}

std::string python_float_repr(double value) {
  // fmt's shortest round-trip form uses Python's thresholds (exponent below 1e-4 and from
  // 1e16, two-digit exponents); Python adds ".0" to integral values, fmt does not.
  std::string s = fmt::format("{}", value);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string format_te_failure(std::string_view name, const TensorComparison& c) {
  TPCHECK_CHECK(c.has_tolerance && c.numel > 0,
                "format_te_failure({}) needs a non-empty comparison with a tolerance", name);
  // The reference reports a zero tensor before comparing values (its _compare_tensors).
  if (c.sharded_all_zero && !c.single_all_zero) {
    return fmt::format("NUMERICAL CHECK FAILED: {} is a zero-tensor but does not match reference!",
                       name);
  }
  return fmt::format(
      "NUMERICAL CHECK FAILED: {} not close enough at index {} with {} vs {} | rel. error = {} "
      "(tol = {}) | abs. error = {} (tol = {})",
      name, c.argmax, python_float_repr(c.sharded_value), python_float_repr(c.single_value),
      python_float_repr(c.rel_at_max), python_float_repr(c.tolerance.rtol),
      python_float_repr(c.max_abs_diff), python_float_repr(c.tolerance.atol));
}

}  // namespace tpcheck

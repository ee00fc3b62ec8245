// compare_tensors: the statistics of one sharded-vs-single (and vs truth) comparison.
// Measures only; policy.cpp judges. All arithmetic is in f64 on the exactly widened
// values, except the reference suite's per-element difference, which the reference takes
// in the tensors' own dtype (see diff_in_dtype).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "tpcheck/error.h"
#include "tpcheck/numerics.h"

namespace tpcheck {
namespace {

// The reference computes |test - ref| with torch in the tensors' (promoted) dtype, so the
// difference is rounded once to it; f64 keeps it exact. Mixed dtypes promote as torch
// does for float types: to the wider one.
DType diff_dtype(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kF64 || b == DType::kF64) return DType::kF64;
  return DType::kF32;
}

}  // namespace

std::optional<Tolerance> reference_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return Tolerance{1e-3, 5e-5};
    case DType::kF16:
      return Tolerance{1e-3, 1e-5};
    case DType::kBF16:
      return Tolerance{1.6e-2, 1e-5};
    default:
      return std::nullopt;
  }
}

TensorComparison compare_tensors(const Tensor& sharded, const Tensor& single, const Tensor* truth,
                                 const CompareOptions& options, const Tensor* rounding_noise) {
  TPCHECK_CHECK_INPUT(sharded.defined() && single.defined(),
                      "compare_tensors: sharded ({}) and single ({}) must both be defined",
                      sharded.describe(), single.describe());
  TPCHECK_CHECK_INPUT(sharded.shape() == single.shape(),
                      "compare_tensors: sharded {} and single {} must have the same shape",
                      sharded.describe(), single.describe());
  if (rounding_noise != nullptr) {
    TPCHECK_CHECK_INPUT(truth != nullptr && rounding_noise->defined() &&
                            rounding_noise->dtype() == DType::kF64 &&
                            rounding_noise->shape() == single.shape(),
                        "compare_tensors: rounding noise {} must be f64 with the shape of single {} "
                        "and come with a truth",
                        rounding_noise->describe(), single.describe());
  }
  if (truth != nullptr) {
    TPCHECK_CHECK_INPUT(
        truth->defined() && truth->dtype() == DType::kF64 && truth->shape() == single.shape(),
        "compare_tensors: truth {} must be f64 with the shape of single {}", truth->describe(),
        single.describe());
  }

  TensorComparison c;
  c.shape = single.shape();
  c.dtype = single.dtype();
  c.numel = single.numel();

  std::optional<Tolerance> table = reference_tolerance(c.dtype);
  if ((options.rtol || table) && (options.atol || table)) {
    c.has_tolerance = true;
    c.tolerance.rtol = options.rtol ? *options.rtol : table->rtol;
    c.tolerance.atol = options.atol ? *options.atol : table->atol;
    c.count_over_allclose = 0;
  }

  const std::vector<double> a = sharded.to_f64();
  const std::vector<double> b = single.to_f64();
  const DType ddt = diff_dtype(sharded.dtype(), single.dtype());
  const bool same_dtype = sharded.dtype() == single.dtype();
  const std::size_t es = dtype_size(single.dtype());
  const auto* abytes = static_cast<const unsigned char*>(sharded.raw());
  const auto* bbytes = static_cast<const unsigned char*>(single.raw());

  double best = -1;  // the reference's argmax: first maximum, NaN beats everything
  bool best_nan = false;
  double sq_diff = 0, sq_single = 0;
  c.sharded_all_zero = true;
  c.single_all_zero = true;
  for (std::int64_t i = 0; i < c.numel; ++i) {
    const double x = a[i], y = b[i];
    if (std::isnan(x)) ++c.sharded_nan;
    if (std::isinf(x)) ++c.sharded_inf;
    if (std::isnan(y)) ++c.single_nan;
    if (std::isinf(y)) ++c.single_inf;
    if (x != 0) c.sharded_all_zero = false;
    if (y != 0) c.single_all_zero = false;

    const double exact = std::fabs(x - y);
    const double d = ddt == DType::kF64 ? exact : round_to(ddt, exact);
    if (!best_nan && (std::isnan(d) || d > best)) {
      best = d;
      best_nan = std::isnan(d);
      c.argmax = i;
    }
    sq_diff += (x - y) * (x - y);
    sq_single += y * y;
    if (c.has_tolerance && !(exact <= c.tolerance.atol + c.tolerance.rtol * std::fabs(y))) {
      ++c.count_over_allclose;
    }
    if (!same_dtype || std::memcmp(abytes + i * es, bbytes + i * es, es) != 0)
      ++c.count_bits_differ;
  }
  c.bitwise_equal = same_dtype && c.count_bits_differ == 0;

  if (c.argmax >= 0) {
    std::int64_t rest = c.argmax;
    c.argmax_index.assign(c.shape.size(), 0);
    for (int d = static_cast<int>(c.shape.size()) - 1; d >= 0; --d) {
      c.argmax_index[d] = rest % c.shape[d];
      rest /= c.shape[d];
    }
    c.sharded_value = a[c.argmax];
    c.single_value = b[c.argmax];
    c.max_abs_diff = best;
    c.rel_at_max = best / std::max(std::fabs(c.single_value), 1e-5);  // the reference's rule
  }
  if (sq_single > 0) {
    c.norm_rel_diff = std::sqrt(sq_diff) / std::sqrt(sq_single);
  } else {
    c.norm_rel_diff = sq_diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }

  if (truth != nullptr) {
    c.has_truth = true;
    const std::vector<double> t = truth->to_f64();
    double sq_truth = 0, sq_single_err = 0, sq_sharded_err = 0;
    for (std::int64_t i = 0; i < c.numel; ++i) {
      if (!std::isfinite(t[i])) ++c.truth_nonfinite;
      sq_truth += t[i] * t[i];
      c.truth_max_abs = std::max(c.truth_max_abs, std::fabs(t[i]));
      const double es1 = b[i] - t[i], es2 = a[i] - t[i];
      sq_single_err += es1 * es1;
      sq_sharded_err += es2 * es2;
      if (std::fabs(es1) > c.single_vs_truth.max_abs || c.single_vs_truth.argmax < 0) {
        c.single_vs_truth.max_abs = std::fabs(es1);
        c.single_vs_truth.argmax = i;
      }
      if (std::fabs(es2) > c.sharded_vs_truth.max_abs || c.sharded_vs_truth.argmax < 0) {
        c.sharded_vs_truth.max_abs = std::fabs(es2);
        c.sharded_vs_truth.argmax = i;
      }
    }
    if (c.numel > 0) {
      const double n = static_cast<double>(c.numel);
      c.truth_rms = std::sqrt(sq_truth / n);
      c.single_vs_truth.rms = std::sqrt(sq_single_err / n);
      c.sharded_vs_truth.rms = std::sqrt(sq_sharded_err / n);
    }
  }
  if (rounding_noise != nullptr && c.numel > 0) {
    c.has_rounding_noise = true;
    const std::vector<double> noise = rounding_noise->to_f64();
    double sq = 0;
    for (double v : noise) {
      sq += v * v;
      c.rounding_noise_max_abs = std::max(c.rounding_noise_max_abs, std::fabs(v));
    }
    c.rounding_noise_rms = std::sqrt(sq / static_cast<double>(c.numel));
  }
  return c;
}

}  // namespace tpcheck

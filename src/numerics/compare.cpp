// compare_tensors: the statistics of one sharded-vs-single (and vs truth) comparison.
// Measures only; policy.cpp judges. All arithmetic is in f64 on the exactly widened
// values, except the reference suite's per-element difference, which the reference takes
// in the tensors' own dtype (see diff_dtype).
//
// One pass, streamed: blocks of kCompareBlock elements are widened chunk by chunk (no
// f64 copy of whole tensors), accumulated in element order and merged in block order
// (compare_sums.h), on up to hardware_concurrency threads — the result does not depend on
// the thread count. Device tensors are measured on their device by the reduction the
// CUDA library registers.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "numerics/compare_sums.h"
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

// Elements widened per step of the host loop (fits in L1/L2 together with its twins).
constexpr std::int64_t kChunk = 2048;

// dst[j] = element (start + j) of `t` widened exactly to f64, for j < n.
void widen(const Tensor& t, std::int64_t start, std::int64_t n, double* dst) {
  const void* raw = t.raw();
  switch (t.dtype()) {
    case DType::kF64: {
      const double* p = static_cast<const double*>(raw) + start;
      std::copy(p, p + n, dst);
      return;
    }
    case DType::kF32: {
      const float* p = static_cast<const float*>(raw) + start;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = p[j];
      return;
    }
    case DType::kF16: {
      const auto* p = static_cast<const std::uint16_t*>(raw) + start;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = f16_bits_to_f32(p[j]);
      return;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const std::uint16_t*>(raw) + start;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = bf16_bits_to_f32(p[j]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* p = static_cast<const std::uint8_t*>(raw) + start;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = f8e4m3_bits_to_f32(p[j]);
      return;
    }
    case DType::kF8E5M2: {
      const auto* p = static_cast<const std::uint8_t*>(raw) + start;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = f8e5m2_bits_to_f32(p[j]);
      return;
    }
    case DType::kF4E2M1: {
      const auto* p = static_cast<const std::uint8_t*>(raw) + start;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = f4e2m1_bits_to_f32(p[j]);
      return;
    }
    case DType::kF8E8M0: {
      const auto* p = static_cast<const std::uint8_t*>(raw) + start;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = f8e8m0_bits_to_f32(p[j]);
      return;
    }
  }
}

// Elements of [start, start + n) whose bit patterns differ (same dtype).
template <typename Bits>
std::int64_t count_differing(const void* a, const void* b, std::int64_t start, std::int64_t n) {
  const Bits* x = static_cast<const Bits*>(a) + start;
  const Bits* y = static_cast<const Bits*>(b) + start;
  std::int64_t count = 0;
  for (std::int64_t j = 0; j < n; ++j) count += x[j] != y[j];
  return count;
}

std::int64_t bits_differ(const Tensor& a, const Tensor& b, std::int64_t start, std::int64_t n) {
  if (a.dtype() != b.dtype()) return n;
  switch (dtype_size(a.dtype())) {
    case 8: return count_differing<std::uint64_t>(a.raw(), b.raw(), start, n);
    case 4: return count_differing<std::uint32_t>(a.raw(), b.raw(), start, n);
    case 2: return count_differing<std::uint16_t>(a.raw(), b.raw(), start, n);
    default: return count_differing<std::uint8_t>(a.raw(), b.raw(), start, n);
  }
}

struct HostInputs {
  const Tensor& sharded;
  const Tensor& single;
  const Tensor* truth;
  const Tensor* noise;
  const Tolerance* tolerance;
  DType diff_dtype;
};

// One block [begin, end), in element order.
CompareSums accumulate_block(const HostInputs& in, std::int64_t begin, std::int64_t end) {
  CompareSums s;
  double a[kChunk], b[kChunk], t[kChunk];
  for (std::int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const std::int64_t n = std::min(kChunk, end - c0);
    widen(in.sharded, c0, n, a);
    widen(in.single, c0, n, b);
    s.bits_differ += bits_differ(in.sharded, in.single, c0, n);
    for (std::int64_t j = 0; j < n; ++j) {
      const double x = a[j], y = b[j];
      s.sharded_nan += std::isnan(x);
      s.sharded_inf += std::isinf(x);
      s.single_nan += std::isnan(y);
      s.single_inf += std::isinf(y);
      s.sharded_nonzero += x != 0;
      s.single_nonzero += y != 0;
      const double exact = std::fabs(x - y);
      // f32 inline (a plain cast rounds to nearest even, as round_to does): the common case.
      const double d = in.diff_dtype == DType::kF64   ? exact
                       : in.diff_dtype == DType::kF32 ? static_cast<double>(static_cast<float>(exact))
                                                      : round_to(in.diff_dtype, exact);
      const MaxAt here{d, c0 + j, std::isnan(d)};
      if (beats_reference_argmax(here, s.diff)) s.diff = here;
      s.sq_diff += (x - y) * (x - y);
      s.sq_single += y * y;
      if (in.tolerance != nullptr &&
          !(exact <= in.tolerance->atol + in.tolerance->rtol * std::fabs(y))) {
        ++s.over_allclose;
      }
    }
    if (in.truth != nullptr) {
      widen(*in.truth, c0, n, t);
      for (std::int64_t j = 0; j < n; ++j) {
        s.truth_nonfinite += !std::isfinite(t[j]);
        s.sq_truth += t[j] * t[j];
        s.truth_max_abs = std::max(s.truth_max_abs, std::fabs(t[j]));
        const double e1 = b[j] - t[j], e2 = a[j] - t[j];
        s.sq_single_err += e1 * e1;
        s.sq_sharded_err += e2 * e2;
        const MaxAt m1{std::fabs(e1), c0 + j, false}, m2{std::fabs(e2), c0 + j, false};
        if (beats_first_max(m1, s.single_err)) s.single_err = m1;
        if (beats_first_max(m2, s.sharded_err)) s.sharded_err = m2;
        accumulate_scale(s, t[j], a[j] - b[j], e1);
      }
    }
    if (in.noise != nullptr) {
      widen(*in.noise, c0, n, t);
      for (std::int64_t j = 0; j < n; ++j) {
        s.noise_sq += t[j] * t[j];
        s.noise_max_abs = std::max(s.noise_max_abs, std::fabs(t[j]));
      }
    }
  }
  return s;
}

CompareSums accumulate_host(const HostInputs& in, std::int64_t numel) {
  const std::int64_t blocks = std::max<std::int64_t>(1, (numel + kCompareBlock - 1) / kCompareBlock);
  std::vector<CompareSums> partial(static_cast<std::size_t>(blocks));
  auto run_block = [&](std::int64_t k) {
    partial[k] = accumulate_block(in, k * kCompareBlock, std::min(numel, (k + 1) * kCompareBlock));
  };
  const std::int64_t threads =
      std::min<std::int64_t>(blocks, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (std::int64_t k = 0; k < blocks; ++k) run_block(k);
  } else {
    std::atomic<std::int64_t> next{0};
    auto worker = [&] {
      for (std::int64_t k = next++; k < blocks; k = next++) run_block(k);
    };
    std::vector<std::thread> pool;
    for (std::int64_t i = 1; i < threads; ++i) pool.emplace_back(worker);
    worker();
    for (std::thread& th : pool) th.join();
  }
  CompareSums total = partial[0];
  for (std::int64_t k = 1; k < blocks; ++k) merge_sums(total, partial[k]);
  return total;
}

DeviceCompareFn g_device_compare = nullptr;

}  // namespace

void register_device_compare(DeviceCompareFn fn) { g_device_compare = fn; }

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

namespace {

// compare_tensors' REQUIRES, checked: both defined and of one shape; truth and the noise
// f64 of that shape (the noise only with a truth); all on single's device.
void check_compare_inputs(const Tensor& sharded, const Tensor& single, const Tensor* truth,
                          const Tensor* rounding_noise) {
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
  const Device device = single.device();
  for (const Tensor* t : {&sharded, truth, rounding_noise}) {
    TPCHECK_CHECK_INPUT(t == nullptr || t->device() == device,
                        "compare_tensors: {} and single {} must be on the same device",
                        t == nullptr ? "" : t->describe(), single.describe());
  }
}

// The sums over every element (c's tolerance counts what allclose rejects), reduced where
// the tensors are: threads on the host, the registered reduction on a device.
CompareSums reduce_all(const Tensor& sharded, const Tensor& single, const Tensor* truth,
                       const Tensor* rounding_noise, const TensorComparison& c) {
  CompareSums s;
  if (c.numel == 0) return s;
  const Tolerance* tol = c.has_tolerance ? &c.tolerance : nullptr;
  if (single.device() == Device::kCpu) {
    return accumulate_host(
        {sharded, single, truth, rounding_noise, tol, diff_dtype(sharded.dtype(), single.dtype())},
        c.numel);
  }
  TPCHECK_CHECK_INPUT(g_device_compare != nullptr,
                      "compare_tensors: {} is a device tensor but this build has no device "
                      "reduction (built without CUDA)",
                      single.describe());
  return g_device_compare(sharded, single, truth, tol, rounding_noise);
}

// The sharded-vs-single half of c: counts, the largest difference and where it is, and
// the norm-wise relative difference.
void set_difference(const CompareSums& s, const Tensor& sharded, const Tensor& single,
                    TensorComparison& c) {
  c.count_over_allclose = c.has_tolerance ? s.over_allclose : -1;
  c.count_bits_differ = s.bits_differ;
  c.bitwise_equal = sharded.dtype() == single.dtype() && s.bits_differ == 0;
  c.sharded_nan = s.sharded_nan;
  c.sharded_inf = s.sharded_inf;
  c.single_nan = s.single_nan;
  c.single_inf = s.single_inf;
  c.sharded_all_zero = s.sharded_nonzero == 0;
  c.single_all_zero = s.single_nonzero == 0;

  c.argmax = s.diff.index;
  if (c.argmax >= 0) {
    std::int64_t rest = c.argmax;
    c.argmax_index.assign(c.shape.size(), 0);
    for (int d = static_cast<int>(c.shape.size()) - 1; d >= 0; --d) {
      c.argmax_index[d] = rest % c.shape[d];
      rest /= c.shape[d];
    }
    c.sharded_value = sharded.at(c.argmax);  // one element (a copy from a device tensor)
    c.single_value = single.at(c.argmax);
    c.max_abs_diff = s.diff.value;
    c.rel_at_max = s.diff.value / std::max(std::fabs(c.single_value), 1e-5);  // the reference's rule
  }
  if (s.sq_single > 0) {
    c.norm_rel_diff = std::sqrt(s.sq_diff) / std::sqrt(s.sq_single);
  } else {
    c.norm_rel_diff = s.sq_diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
}

// The against-truth half of c: each run's error, the truth's size and the scale shift.
void set_truth(const CompareSums& s, TensorComparison& c) {
  const double n = static_cast<double>(std::max<std::int64_t>(c.numel, 1));
  c.has_truth = true;
  c.truth_nonfinite = s.truth_nonfinite;
  c.truth_max_abs = s.truth_max_abs;
  c.single_vs_truth = {s.single_err.index >= 0 ? s.single_err.value : 0, s.single_err.index,
                       c.numel > 0 ? std::sqrt(s.sq_single_err / n) : 0};
  c.sharded_vs_truth = {s.sharded_err.index >= 0 ? s.sharded_err.value : 0, s.sharded_err.index,
                        c.numel > 0 ? std::sqrt(s.sq_sharded_err / n) : 0};
  if (c.numel > 0) c.truth_rms = std::sqrt(s.sq_truth / n);
  if (s.sq_single_err > 0) {
    c.single_error_offset_share =
        std::min(1.0, s.sum_single_err * s.sum_single_err / (n * s.sq_single_err));
  }
  if (s.sq_truth > 0) {
    const double shift = s.sum_truth_diff / s.sq_truth;
    // Σ t²(d − shift·t)², expanded; it cancels to rounding (or below 0) only when d is a
    // rescaling of t almost exactly — then sigma is ~0 and any shift stands out.
    const double residual = s.sum_t2_d2 - 2 * shift * s.sum_t3_d + shift * shift * s.sum_t4;
    c.scale_shift = shift;
    c.scale_shift_sigma = std::sqrt(std::max(residual, 0.0)) / s.sq_truth;
    c.single_scale_error = s.sum_truth_single_err / s.sq_truth;
    c.truth_variation = std::max(0.0, 1 - s.sum_truth * s.sum_truth / (n * s.sq_truth));
  }
}

}  // namespace

TensorComparison compare_tensors(const Tensor& sharded, const Tensor& single, const Tensor* truth,
                                 const CompareOptions& options, const Tensor* rounding_noise) {
  check_compare_inputs(sharded, single, truth, rounding_noise);
  TensorComparison c;
  c.shape = single.shape();
  c.dtype = single.dtype();
  c.numel = single.numel();

  std::optional<Tolerance> table = reference_tolerance(c.dtype);
  if ((options.rtol || table) && (options.atol || table)) {
    c.has_tolerance = true;
    c.tolerance.rtol = options.rtol ? *options.rtol : table->rtol;
    c.tolerance.atol = options.atol ? *options.atol : table->atol;
  }

  const CompareSums s = reduce_all(sharded, single, truth, rounding_noise, c);
  set_difference(s, sharded, single, c);
  if (truth != nullptr) set_truth(s, c);
  if (rounding_noise != nullptr && c.numel > 0) {
    const double n = static_cast<double>(std::max<std::int64_t>(c.numel, 1));
    c.has_rounding_noise = true;
    c.rounding_noise_rms = std::sqrt(s.noise_sq / n);
    c.rounding_noise_max_abs = s.noise_max_abs;
  }
  return c;
}

}  // namespace tpcheck

// compare_sums.h — the one-pass accumulators behind compare_tensors (private to tpcheck).
//
// compare_tensors measures in one pass over the elements: counts, sums of squares (f64)
// and maxima with their positions. The pass is cut into blocks of kCompareBlock
// elements; each block is accumulated in element order and the blocks are merged in
// block order, so the f64 sums are the same however many threads (or GPU blocks) did the
// work. The host loop (compare.cpp) and the GPU reduction (src/backend/cuda/
// compare_stats.cu, which reduces its partials in a different order: its sums may differ
// in the last bits) fill the same struct; finish_comparison turns it into the
// TensorComparison.
// Thread safety: plain values.
#pragma once

#include <math.h>

#include <cstdint>

#include "tpcheck/numerics.h"

// The merge runs on the host and in the GPU reduction's kernel.
#ifdef __CUDACC__
#define TPCHECK_HOST_DEVICE __host__ __device__
#else
#define TPCHECK_HOST_DEVICE
#endif

namespace tpcheck {

inline constexpr std::int64_t kCompareBlock = std::int64_t{1} << 20;

// A maximum and where it is. `index` -1: nothing seen yet.
struct MaxAt {
  double value = 0;
  std::int64_t index = -1;
  bool nan = false;  // the reference's argmax only: a NaN beats every number
};

// The reference suite's argmax over d_i (torch.argmax): the first NaN, else the first
// maximum. Associative and commutative as a total order on (nan, value, -index).
TPCHECK_HOST_DEVICE inline bool beats_reference_argmax(const MaxAt& a, const MaxAt& b) {
  if (a.index < 0) return false;
  if (b.index < 0) return true;
  if (a.nan != b.nan) return a.nan;
  if (!a.nan && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}
// max |e_i| against the truth: the first maximum (NaN never wins after the first element
// seen; a NaN anywhere fails the comparison by the global rules anyway).
TPCHECK_HOST_DEVICE inline bool beats_first_max(const MaxAt& a, const MaxAt& b) {
  if (a.index < 0) return false;
  if (b.index < 0) return true;
  if (a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

struct CompareSums {
  std::int64_t sharded_nan = 0, sharded_inf = 0, single_nan = 0, single_inf = 0;
  std::int64_t sharded_nonzero = 0, single_nonzero = 0;
  MaxAt diff;                      // d_i in the diff dtype (the reference's rule)
  double sq_diff = 0, sq_single = 0;
  std::int64_t over_allclose = 0;  // counted only when the comparison has a tolerance
  std::int64_t bits_differ = 0;
  // against the truth
  std::int64_t truth_nonfinite = 0;
  double sq_truth = 0, truth_max_abs = 0, sq_single_err = 0, sq_sharded_err = 0;
  MaxAt single_err, sharded_err;
  // the scale test (d = sharded − single, exact in f64; t = truth)
  double sum_truth = 0, sum_truth_diff = 0;          // Σ t, Σ t·d
  double sum_truth_single_err = 0;                    // Σ t·(single − t)
  double sum_single_err = 0;                          // Σ (single − t): its common offset
  double sum_t2_d2 = 0, sum_t3_d = 0, sum_t4 = 0;    // Σ t²d², Σ t³d, Σ t⁴
  // the rounding probe
  double noise_sq = 0, noise_max_abs = 0;
};

// The scale test's sums for one element: t its truth, d = sharded − single.
TPCHECK_HOST_DEVICE inline void accumulate_scale(CompareSums& s, double t, double d,
                                                 double single_err) {
  const double t2 = t * t;
  s.sum_truth += t;
  s.sum_truth_single_err += t * single_err;
  s.sum_single_err += single_err;
  s.sum_truth_diff += t * d;
  s.sum_t2_d2 += t2 * d * d;
  s.sum_t3_d += t2 * t * d;
  s.sum_t4 += t2 * t2;
}

// Adds `b` (a later block) into `a`.
TPCHECK_HOST_DEVICE inline void merge_sums(CompareSums& a, const CompareSums& b) {
  a.sharded_nan += b.sharded_nan;
  a.sharded_inf += b.sharded_inf;
  a.single_nan += b.single_nan;
  a.single_inf += b.single_inf;
  a.sharded_nonzero += b.sharded_nonzero;
  a.single_nonzero += b.single_nonzero;
  if (beats_reference_argmax(b.diff, a.diff)) a.diff = b.diff;
  a.sq_diff += b.sq_diff;
  a.sq_single += b.sq_single;
  a.over_allclose += b.over_allclose;
  a.bits_differ += b.bits_differ;
  a.truth_nonfinite += b.truth_nonfinite;
  a.sq_truth += b.sq_truth;
  a.truth_max_abs = ::fmax(a.truth_max_abs, b.truth_max_abs);
  a.sq_single_err += b.sq_single_err;
  a.sq_sharded_err += b.sq_sharded_err;
  if (beats_first_max(b.single_err, a.single_err)) a.single_err = b.single_err;
  if (beats_first_max(b.sharded_err, a.sharded_err)) a.sharded_err = b.sharded_err;
  a.sum_truth += b.sum_truth;
  a.sum_truth_diff += b.sum_truth_diff;
  a.sum_truth_single_err += b.sum_truth_single_err;
  a.sum_single_err += b.sum_single_err;
  a.sum_t2_d2 += b.sum_t2_d2;
  a.sum_t3_d += b.sum_t3_d;
  a.sum_t4 += b.sum_t4;
  a.noise_sq += b.noise_sq;
  a.noise_max_abs = ::fmax(a.noise_max_abs, b.noise_max_abs);
}

// The GPU reduction, provided by the CUDA library when it is linked (registered with
// register_device_compare); compare_tensors calls it for device tensors. The tensors
// are validated (shapes, dtypes, same device) before the call; `tolerance` is null when
// the comparison has none.
using DeviceCompareFn = CompareSums (*)(const Tensor& sharded, const Tensor& single,
                                         const Tensor* truth, const Tolerance* tolerance,
                                         const Tensor* rounding_noise);
void register_device_compare(DeviceCompareFn fn);

}  // namespace tpcheck

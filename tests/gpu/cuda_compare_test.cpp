// cuda_compare_test.cpp — compare_tensors on GPU tensors (compare_stats.cu: the generic
// kernel and the f32 fast path) against the host loop on the same values: counts, maxima
// and their positions exactly; square sums (added in another order) to 1e-12 relative.
// Covers the fast path's edges: sizes that are not multiples of 4 (the tail), a
// misaligned start (falls back to the generic kernel), NaN / Inf / -0 planted, equal
// maxima at two positions (the first must win), with and without truth and noise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_support.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/numerics.h"

namespace tpcheck {
namespace {

using gpu_test::random_host;

void expect_same(const TensorComparison& g, const TensorComparison& c, const std::string& what) {
  SCOPED_TRACE(what);
  auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  EXPECT_EQ(g.argmax, c.argmax);
  EXPECT_EQ(g.argmax_index, c.argmax_index);
  EXPECT_TRUE(same(g.max_abs_diff, c.max_abs_diff)) << g.max_abs_diff << " vs " << c.max_abs_diff;
  EXPECT_TRUE(same(g.sharded_value, c.sharded_value));
  EXPECT_TRUE(same(g.single_value, c.single_value));
  EXPECT_EQ(g.count_over_allclose, c.count_over_allclose);
  EXPECT_EQ(g.count_bits_differ, c.count_bits_differ);
  EXPECT_EQ(g.bitwise_equal, c.bitwise_equal);
  EXPECT_EQ(g.sharded_nan, c.sharded_nan);
  EXPECT_EQ(g.sharded_inf, c.sharded_inf);
  EXPECT_EQ(g.single_nan, c.single_nan);
  EXPECT_EQ(g.single_inf, c.single_inf);
  EXPECT_EQ(g.sharded_all_zero, c.sharded_all_zero);
  EXPECT_EQ(g.single_all_zero, c.single_all_zero);
  // Square sums of non-negative terms, added in different orders: each is within
  // (n - 1)·u of the exact sum (recursive summation, u = 2^-53), so the two within
  // 2·n·u of each other (the square roots within half that). Measured: 2.4e-12 relative
  // for n = 2^20 + 3 with two planted large errors among a million tiny ones (the host's
  // single accumulator loses the tiny ones' last bits); 1e-12 held for unplanted data.
  const double tolerance = 2.0 * static_cast<double>(c.numel) * 0x1p-53;
  auto close = [&](double a, double b, const char* name) {
    if (std::isnan(b) || std::isinf(b)) {
      EXPECT_TRUE(same(a, b)) << name;
    } else {
      EXPECT_NEAR(a, b, tolerance * std::fabs(b)) << name;
    }
  };
  close(g.norm_rel_diff, c.norm_rel_diff, "norm_rel_diff");
  EXPECT_EQ(g.has_truth, c.has_truth);
  EXPECT_EQ(g.truth_nonfinite, c.truth_nonfinite);
  EXPECT_EQ(g.truth_max_abs, c.truth_max_abs);
  close(g.truth_rms, c.truth_rms, "truth_rms");
  for (auto [gt, ct] : {std::pair{g.single_vs_truth, c.single_vs_truth},
                        std::pair{g.sharded_vs_truth, c.sharded_vs_truth}}) {
    EXPECT_TRUE(same(gt.max_abs, ct.max_abs));
    EXPECT_EQ(gt.argmax, ct.argmax);
    close(gt.rms, ct.rms, "truth error rms");
  }
  // The scale test's sums have terms of both signs: each within n·u of the sum of the
  // terms' magnitudes, and Cauchy–Schwarz bounds Σ|t·d| by ‖t‖·‖d‖ ≤ √n·truth_rms ·
  // √n·(sharded's + single's error RMS), so the shift (Σ t·d / Σ t²) within
  // 2·n·u·(error RMSs)/truth_rms; sigma's terms are positive but it is a difference, of
  // residuals as large as d here (no rescaling planted), so relative, twice the sums'.
  if (c.has_truth && std::isfinite(c.scale_shift) && c.truth_rms > 0) {
    const double shift_tolerance = tolerance * (c.single_vs_truth.rms + c.sharded_vs_truth.rms) /
                                   c.truth_rms;
    EXPECT_NEAR(g.scale_shift, c.scale_shift, shift_tolerance) << "scale_shift";
    EXPECT_NEAR(g.scale_shift_sigma, c.scale_shift_sigma, 2 * tolerance * c.scale_shift_sigma)
        << "scale_shift_sigma";
    EXPECT_NEAR(g.truth_variation, c.truth_variation, 2 * tolerance) << "truth_variation";
    EXPECT_NEAR(g.single_error_offset_share, c.single_error_offset_share, 2 * tolerance)
        << "single_error_offset_share";
  } else {
    EXPECT_TRUE(same(g.scale_shift, c.scale_shift)) << "scale_shift";
  }
  EXPECT_EQ(g.has_rounding_noise, c.has_rounding_noise);
  EXPECT_EQ(g.rounding_noise_max_abs, c.rounding_noise_max_abs);
  close(g.rounding_noise_rms, c.rounding_noise_rms, "rounding_noise_rms");
}

// single = N(0,1); sharded = single · (1 + 1e-3 · noise) rounded to `dtype`; truth = the
// f64 values single was rounded from; plants (when n allows) a NaN, an Inf, -0 against +0
// and two equal largest differences.
struct Case {
  Tensor single, sharded, truth, noise;
};
Case make_case(std::int64_t n, DType sharded_dtype, DType single_dtype, bool plant, std::uint64_t seed) {
  std::vector<double> base = random_host(seed, "base", {n}, DType::kF64).to_f64();
  std::vector<double> jitter = random_host(seed, "jitter", {n}, DType::kF64).to_f64();
  std::vector<double> noise = random_host(seed, "noise", {n}, DType::kF64).to_f64();
  std::vector<double> sh(n), si(base);
  for (std::int64_t i = 0; i < n; ++i) sh[i] = base[i] * (1 + 1e-3 * jitter[i]);
  if (plant && n >= 40) {
    si[3] = 0.0, sh[3] = -0.0;                                     // bits differ, values equal
    sh[n - 2] = std::numeric_limits<double>::infinity();           // in the tail when n % 4
    si[7] = 2.0, sh[7] = 10.0, si[n / 2] = 2.0, sh[n / 2] = 10.0;  // equal maxima: 7 wins
    if (n > 100) sh[n - 30] = std::numeric_limits<double>::quiet_NaN();
  }
  Case c;
  c.single = Tensor::from_f64(si, {n}, single_dtype);
  c.sharded = Tensor::from_f64(sh, {n}, sharded_dtype);
  c.truth = Tensor::from_f64(base, {n}, DType::kF64);
  c.noise = Tensor::from_f64(noise, {n}, DType::kF64);
  return c;
}

TEST(CudaCompare, MatchesTheHostLoop) {
  TPCHECK_REQUIRE_GPU();
  const int previous = use_external_cuda_device(0);  // installs the runtime and the GPU compare
  struct Pair {
    DType sharded, single;
  };
  for (Pair p : {Pair{DType::kF32, DType::kF32}, Pair{DType::kF16, DType::kF16},
                 Pair{DType::kBF16, DType::kF32}}) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{3}, std::int64_t{4}, std::int64_t{41},
                           std::int64_t{1000}, (std::int64_t{1} << 20) + 3}) {
      for (bool plant : {false, true}) {
        const Case c = make_case(n, p.sharded, p.single, plant, 17 + n);
        const CompareOptions tol{1e-3, 1e-5};
        for (int extras = 0; extras < 3; ++extras) {  // none, truth, truth + noise
          const Tensor* truth = extras >= 1 ? &c.truth : nullptr;
          const Tensor* noise = extras >= 2 ? &c.noise : nullptr;
          const Tensor ds = c.sharded.to_device(Device::kCuda), dg = c.single.to_device(Device::kCuda);
          const Tensor dt = c.truth.to_device(Device::kCuda), dn = c.noise.to_device(Device::kCuda);
          const TensorComparison host = compare_tensors(c.sharded, c.single, truth, tol, noise);
          const TensorComparison gpu = compare_tensors(ds, dg, truth ? &dt : nullptr, tol,
                                                       noise ? &dn : nullptr);
          const std::string what = std::string(dtype_name(p.sharded)) + "/" +
                                   std::string(dtype_name(p.single)) + " n=" + std::to_string(n) +
                                   (plant ? " planted" : "") + " extras=" + std::to_string(extras);
          expect_same(gpu, host, what);
          if (plant && n >= 40) {
            EXPECT_GT(host.count_bits_differ, 0) << what;
            if (n > 100) {
              EXPECT_EQ(host.sharded_nan, 1) << what;
              EXPECT_EQ(host.argmax, n - 30) << what;  // a NaN difference wins argmax
            } else {
              EXPECT_EQ(host.argmax, n - 2) << what;  // the Inf difference
            }
          }
        }
        // A misaligned start (a view one element in, as a DLPack array with an offset can
        // be): the generic kernel, the same results.
        if (n > 8) {
          const TensorComparison host =
              compare_tensors(c.sharded.slice(0, 1, n - 1), c.single.slice(0, 1, n - 1), nullptr, tol);
          auto view = [n](const Tensor& t) {
            Tensor d = t.to_device(Device::kCuda);
            auto keep = std::make_shared<Tensor>(d);
            return Tensor::wrap(static_cast<std::byte*>(d.raw()) + dtype_size(d.dtype()), {n - 1},
                                d.dtype(), Device::kCuda, keep);
          };
          const TensorComparison gpu = compare_tensors(view(c.sharded), view(c.single), nullptr, tol);
          expect_same(gpu, host, "misaligned n=" + std::to_string(n));
        }
      }
    }
  }
  restore_cuda_device(previous);
}

}  // namespace
}  // namespace tpcheck

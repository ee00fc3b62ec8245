// Tests of tpcheck/numerics.h: the comparison statistics against formulas evaluated here,
// each policy on hand-built cases (near-zero element, NaN, zero tensors, perturbations of
// a known size against a truth), and the reference suite's failure line.
#include "tpcheck/numerics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

const Policy kAll[] = {Policy{PolicyKind::kTe, {}}, Policy{PolicyKind::kAllclose, {}},
                       Policy{PolicyKind::kTruth, {}}, Policy{PolicyKind::kBitwise, {}}};

// Deterministic pseudo-random in [-1, 1].
double noise(std::uint64_t seed, std::int64_t i) {
  std::uint64_t h =
      seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return static_cast<double>(h % 200001) / 100000.0 - 1.0;
}

std::vector<double> values(std::int64_t n, std::uint64_t seed) {
  std::vector<double> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = 1.0 + noise(seed, i);  // in [0, 2]
  return v;
}

TEST(ReferenceTolerance, TableOfTheReferenceSuite) {
  EXPECT_EQ(reference_tolerance(DType::kF32)->rtol, 1e-3);
  EXPECT_EQ(reference_tolerance(DType::kF32)->atol, 5e-5);
  EXPECT_EQ(reference_tolerance(DType::kF16)->rtol, 1e-3);
  EXPECT_EQ(reference_tolerance(DType::kF16)->atol, 1e-5);
  EXPECT_EQ(reference_tolerance(DType::kBF16)->rtol, 1.6e-2);
  EXPECT_EQ(reference_tolerance(DType::kBF16)->atol, 1e-5);
  EXPECT_FALSE(reference_tolerance(DType::kF64).has_value());
}

TEST(CompareTensors, StatisticsMatchFormulas) {
  const Shape shape = {3, 4, 5};
  const std::int64_t n = shape_numel(shape);
  std::vector<double> b = values(n, 1);
  std::vector<double> a = b;
  for (std::int64_t i = 0; i < n; ++i) a[i] += 2e-3 * noise(2, i);
  Tensor sharded = Tensor::from_f64(a, shape, DType::kF32);
  Tensor single = Tensor::from_f64(b, shape, DType::kF32);
  TensorComparison c = compare_tensors(sharded, single, nullptr);

  // Independent evaluation of each statistic.
  std::int64_t arg = 0;
  float best = -1;
  double sq_d = 0, sq_b = 0;
  std::int64_t over = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double x = sharded.at(i), y = single.at(i);
    float d = std::fabs(static_cast<float>(x) - static_cast<float>(y));  // f32, as torch
    if (d > best) best = d, arg = i;
    sq_d += (x - y) * (x - y);
    sq_b += y * y;
    if (std::fabs(x - y) > 5e-5 + 1e-3 * std::fabs(y)) ++over;
  }
  EXPECT_EQ(c.argmax, arg);
  EXPECT_EQ(c.argmax_index, (std::vector<std::int64_t>{arg / 20, arg / 5 % 4, arg % 5}));
  EXPECT_EQ(c.max_abs_diff, static_cast<double>(best));
  EXPECT_EQ(c.sharded_value, sharded.at(arg));
  EXPECT_EQ(c.single_value, single.at(arg));
  EXPECT_EQ(c.rel_at_max, best / std::max(std::fabs(single.at(arg)), 1e-5));
  EXPECT_DOUBLE_EQ(c.norm_rel_diff, std::sqrt(sq_d) / std::sqrt(sq_b));
  EXPECT_EQ(c.count_over_allclose, over);
  EXPECT_GT(over,
            0);  // 2e-3 noise vs bounds 5e-5..2e-3: some over, some not: the count is exercised
  EXPECT_LT(over, n);
  EXPECT_FALSE(c.bitwise_equal);
  EXPECT_EQ(c.sharded_nan + c.sharded_inf + c.single_nan + c.single_inf, 0);
  EXPECT_FALSE(c.has_truth);
}

TEST(CompareTensors, FirstMaximumWinsAsTorchArgmax) {
  Tensor single = Tensor::from_f64(std::vector<double>{1, 2, 3, 4}, {4}, DType::kF32);
  Tensor sharded = Tensor::from_f64(std::vector<double>{1, 2.5, 3.5, 4}, {4}, DType::kF32);
  EXPECT_EQ(compare_tensors(sharded, single, nullptr).argmax, 1);
}

// rel = abs / max(|ref|, 1e-5): a zero reference divides by 1e-5.
TEST(CompareTensors, RelativeErrorClampsTheReference) {
  Tensor single = Tensor::zeros({1}, DType::kF32);
  Tensor sharded = Tensor::from_f64(std::vector<double>{3e-6}, {1}, DType::kF32);
  TensorComparison c = compare_tensors(sharded, single, nullptr);
  EXPECT_EQ(c.rel_at_max, static_cast<double>(3e-6f) / 1e-5);
}

TEST(CompareTensors, TruthErrorsMatchFormulas) {
  const std::int64_t n = 50;
  std::vector<double> t = values(n, 3);
  std::vector<double> s = t, h = t;
  for (std::int64_t i = 0; i < n; ++i) s[i] += 1e-5 * noise(4, i), h[i] += 3e-5 * noise(5, i);
  Tensor truth = Tensor::from_f64(t, {n}, DType::kF64);
  Tensor single = Tensor::from_f64(s, {n}, DType::kF32);
  Tensor sharded = Tensor::from_f64(h, {n}, DType::kF32);
  TensorComparison c = compare_tensors(sharded, single, &truth);
  ASSERT_TRUE(c.has_truth);
  double sq_s = 0, sq_h = 0, sq_t = 0, mx_s = 0, mx_h = 0, mx_t = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double es = single.at(i) - t[i], eh = sharded.at(i) - t[i];
    sq_s += es * es, sq_h += eh * eh, sq_t += t[i] * t[i];
    mx_s = std::max(mx_s, std::fabs(es)), mx_h = std::max(mx_h, std::fabs(eh));
    mx_t = std::max(mx_t, std::fabs(t[i]));
  }
  EXPECT_DOUBLE_EQ(c.single_vs_truth.rms, std::sqrt(sq_s / n));
  EXPECT_DOUBLE_EQ(c.sharded_vs_truth.rms, std::sqrt(sq_h / n));
  EXPECT_EQ(c.single_vs_truth.max_abs, mx_s);
  EXPECT_EQ(c.sharded_vs_truth.max_abs, mx_h);
  EXPECT_DOUBLE_EQ(c.truth_rms, std::sqrt(sq_t / n));
  EXPECT_EQ(c.truth_max_abs, mx_t);
}

// The scale test's statistics, evaluated here from their definitions (the residuals
// formed directly, not through compare.cpp's expanded sums).
TEST(CompareTensors, ScaleShiftMatchesFormulas) {
  const std::int64_t n = 300;
  std::vector<double> t(n), s(n), h(n);
  for (std::int64_t i = 0; i < n; ++i) {
    t[i] = 0.2 + noise(30, i);  // mean 0.2: a variation of about 0.9
    s[i] = t[i] + 0.01 * noise(31, i);
    h[i] = 0.8 * t[i] + 0.01 * noise(32, i);  // rescaled by 0.8, plus other rounding
  }
  Tensor truth = Tensor::from_f64(t, {n}, DType::kF64);
  Tensor single = Tensor::from_f64(s, {n}, DType::kF64);
  Tensor sharded = Tensor::from_f64(h, {n}, DType::kF64);
  TensorComparison c = compare_tensors(sharded, single, &truth);
  double st = 0, stt = 0, std_ = 0;
  for (std::int64_t i = 0; i < n; ++i) st += t[i], stt += t[i] * t[i], std_ += t[i] * (h[i] - s[i]);
  const double shift = std_ / stt;
  double sr = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double r = (h[i] - s[i]) - shift * t[i];
    sr += t[i] * t[i] * r * r;
  }
  EXPECT_NEAR(c.scale_shift, shift, 1e-13);
  EXPECT_NEAR(shift, -0.2, 0.01);  // what was planted
  EXPECT_NEAR(c.scale_shift_sigma, std::sqrt(sr) / stt, 1e-9 * std::sqrt(sr) / stt);
  EXPECT_NEAR(c.truth_variation, 1 - st * st / (n * stt), 1e-13);
  // A constant truth has no variation; an all-zero truth has no scale.
  Tensor flat = Tensor::full({n}, DType::kF64, 0.7);
  EXPECT_NEAR(compare_tensors(single, single, &flat).truth_variation, 0.0, 1e-12);  // n·u
  Tensor zero_truth = Tensor::zeros({n}, DType::kF64);
  TensorComparison zero = compare_tensors(sharded, single, &zero_truth);
  EXPECT_EQ(zero.scale_shift, 0.0);
  EXPECT_EQ(zero.scale_shift_sigma, 0.0);
}

TEST(CompareTensors, BadInput) {
  Tensor a = Tensor::zeros({2, 3}, DType::kF32);
  Tensor b = Tensor::zeros({3, 2}, DType::kF32);
  try {
    compare_tensors(a, b, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("f32[3, 2]"), std::string::npos) << e.what();
  }
  Tensor t32 = Tensor::zeros({2, 3}, DType::kF32);
  EXPECT_THROW(compare_tensors(a, a, &t32), Error);  // truth must be f64
}

// The story in README.md, "Where it came from": a near-zero element with a large
// relative but small absolute error. The reference rule passes it at the loosened atol
// 5e-5 and fails it at 1e-5.
TEST(TePolicy, NearZeroElementLargeRelSmallAbs) {
  const std::int64_t n = 16, k = 9;
  std::vector<double> b = values(n, 7);
  b[k] = 3.7e-4;  // near zero next to values of order 1
  std::vector<double> a = b;
  a[k] += 2.27e-5;  // rel ~ 0.06, abs 2.27e-5
  Tensor sharded = Tensor::from_f64(a, {n}, DType::kF32);
  Tensor single = Tensor::from_f64(b, {n}, DType::kF32);

  TensorComparison c = compare_tensors(sharded, single, nullptr);
  const double abs = static_cast<float>(sharded.at(k) - single.at(k));
  const double rel = abs / std::max(std::fabs(single.at(k)), 1e-5);
  EXPECT_EQ(c.argmax, k);
  EXPECT_EQ(c.max_abs_diff, abs);
  EXPECT_EQ(c.rel_at_max, rel);
  ASSERT_GT(rel, 1e-3);
  ASSERT_LT(abs, 5e-5);
  EXPECT_EQ(evaluate(Policy{PolicyKind::kTe, {}}, c).status, VerdictStatus::kPass);
  // allclose: 2.27e-5 <= 5e-5 + 1e-3·3.7e-4 holds for that element too.
  EXPECT_EQ(evaluate(Policy{PolicyKind::kAllclose, {}}, c).status, VerdictStatus::kPass);

  CompareOptions strict;
  strict.atol = 1e-5;
  TensorComparison cs = compare_tensors(sharded, single, nullptr, strict);
  Verdict v = evaluate(Policy{PolicyKind::kTe, {}}, cs);
  EXPECT_EQ(v.status, VerdictStatus::kFail);
  EXPECT_NE(v.reason.find("atol 1e-05"), std::string::npos) << v.reason;
  EXPECT_EQ(evaluate(Policy{PolicyKind::kAllclose, {}}, cs).status, VerdictStatus::kFail);

  // The reference line, assembled here from the figures above.
  EXPECT_EQ(format_te_failure("7", cs),
            "NUMERICAL CHECK FAILED: 7 not close enough at index 9 with " +
                python_float_repr(sharded.at(k)) + " vs " + python_float_repr(single.at(k)) +
                " | rel. error = " + python_float_repr(rel) +
                " (tol = 0.001) | abs. error = " + python_float_repr(abs) + " (tol = 1e-05)");
}

TEST(TePolicy, FailsOnlyWhenBothRelAndAbsExceed) {
  // Large values: abs > atol but rel < rtol → pass.
  Tensor single = Tensor::from_f64(std::vector<double>{1000, 1}, {2}, DType::kF32);
  Tensor sharded = Tensor::from_f64(std::vector<double>{1000.5, 1}, {2}, DType::kF32);
  TensorComparison c = compare_tensors(sharded, single, nullptr);
  EXPECT_EQ(c.rel_at_max, 0.5 / 1000);
  EXPECT_EQ(evaluate(Policy{PolicyKind::kTe, {}}, c).status, VerdictStatus::kPass);
  // 1000 vs 1002: rel 2e-3 > 1e-3 and abs 2 > 5e-5 → fail.
  Tensor worse = Tensor::from_f64(std::vector<double>{1002, 1}, {2}, DType::kF32);
  EXPECT_EQ(evaluate(Policy{PolicyKind::kTe, {}}, compare_tensors(worse, single, nullptr)).status,
            VerdictStatus::kFail);
}

TEST(TePolicy, ReferenceLineFormatting) {
  // Exact binary fractions, so every printed digit can be checked by hand:
  // 0.5 + 2^-10 = 0.5009765625, abs = 2^-10 = 0.0009765625, rel = 2^-9 = 0.001953125.
  Tensor single = Tensor::from_f64(std::vector<double>{0.5}, {1}, DType::kF16);
  Tensor sharded = Tensor::from_f64(std::vector<double>{0.5 + 1.0 / 1024}, {1}, DType::kF16);
  TensorComparison c = compare_tensors(sharded, single, nullptr);
  EXPECT_EQ(format_te_failure("outputs", c),
            "NUMERICAL CHECK FAILED: outputs not close enough at index 0 with 0.5009765625 vs 0.5 "
            "| rel. error = 0.001953125 (tol = 0.001) | abs. error = 0.0009765625 (tol = 1e-05)");
  // The reference's own wording for a zero tensor.
  Tensor zero = Tensor::zeros({1}, DType::kF16);
  EXPECT_EQ(format_te_failure("3", compare_tensors(zero, single, nullptr)),
            "NUMERICAL CHECK FAILED: 3 is a zero-tensor but does not match reference!");
}

TEST(PythonFloatRepr, MatchesPythonRepr) {
  // Python 3: repr(1.0), repr(1e-05), repr(0.0617), repr(1e16), repr(1e15), repr(-0.0),
  // repr(float(numpy.float32(0.1))), repr(0.0001).
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(python_float_repr(0.0617), "0.0617");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(static_cast<double>(0.1f)), "0.10000000149011612");
  EXPECT_EQ(python_float_repr(1e-4), "0.0001");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "inf");
}

TEST(GlobalRules, NanAndInfFailEveryPolicy) {
  std::vector<double> b = values(8, 11);
  Tensor truth = Tensor::from_f64(b, {8}, DType::kF64);
  Tensor single = Tensor::from_f64(b, {8}, DType::kF32);
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    for (bool in_sharded : {true, false}) {
      Tensor sharded = single.clone();
      Tensor ref = single.clone();
      (in_sharded ? sharded : ref).set(5, bad);
      TensorComparison c = compare_tensors(sharded, ref, &truth);
      for (const Policy& p : kAll) {
        Verdict v = evaluate(p, c);
        EXPECT_EQ(v.status, VerdictStatus::kFail) << policy_name(p.kind) << " " << bad;
        EXPECT_NE(v.reason.find("non-finite"), std::string::npos) << v.reason;
      }
    }
  }
  // A NaN in both at the same place is bit-identical, and still fails.
  Tensor both = single.clone();
  both.set(2, std::nan(""));
  TensorComparison c = compare_tensors(both, both, &truth);
  EXPECT_TRUE(c.bitwise_equal);
  for (const Policy& p : kAll) EXPECT_EQ(evaluate(p, c).status, VerdictStatus::kFail);
}

TEST(GlobalRules, ZeroTensors) {
  std::vector<double> b = values(6, 13);
  Tensor truth = Tensor::from_f64(b, {6}, DType::kF64);
  Tensor single = Tensor::from_f64(b, {6}, DType::kF32);
  Tensor zero = Tensor::zeros({6}, DType::kF32);
  TensorComparison c = compare_tensors(zero, single, &truth);
  for (const Policy& p : kAll) {
    Verdict v = evaluate(p, c);
    EXPECT_EQ(v.status, VerdictStatus::kFail) << policy_name(p.kind);
    EXPECT_NE(v.reason.find("all zeros"), std::string::npos) << v.reason;
  }
  // te alone would pass this one (abs 1e-6 < atol); the global zero rule fails it.
  Tensor tiny = Tensor::from_f64(std::vector<double>(6, 1e-6), {6}, DType::kF32);
  EXPECT_EQ(evaluate(kAll[0], compare_tensors(zero, tiny, nullptr)).status, VerdictStatus::kFail);
  // Both zero: a warning, which is not a failure.
  Tensor zt = Tensor::zeros({6}, DType::kF64);
  TensorComparison cz = compare_tensors(zero, zero.clone(), &zt);
  for (const Policy& p : kAll) {
    Verdict v = evaluate(p, cz);
    EXPECT_EQ(v.status, VerdictStatus::kWarning) << policy_name(p.kind);
    EXPECT_TRUE(v.passed());
  }
}

// Under truth an all-zero sharded tensor fails only when single came closer to truth
// than rounding explains; where single lost the tensor too (its error as large as the
// values, as an underflowed f16 gradient), it is a warning. The other policies keep the
// reference's rule and fail.
TEST(GlobalRules, ZeroShardedTensorUnderTruthAsksTheErrorModel) {
  std::vector<double> b = values(6, 13);
  Tensor truth = Tensor::from_f64(b, {6}, DType::kF64);
  std::vector<double> lost(6);
  for (std::size_t i = 0; i < lost.size(); ++i) lost[i] = 0.05 * b[i];  // 95 % gone
  Tensor single = Tensor::from_f64(lost, {6}, DType::kF32);
  Tensor zero = Tensor::zeros({6}, DType::kF32);
  TensorComparison c = compare_tensors(zero, single, &truth);
  const Policy truth_policy = kAll[2];
  ASSERT_EQ(truth_policy.kind, PolicyKind::kTruth);
  Verdict v = evaluate(truth_policy, c);
  EXPECT_EQ(v.status, VerdictStatus::kWarning) << v.reason;
  EXPECT_NE(v.reason.find("all zeros"), std::string::npos) << v.reason;
  EXPECT_NE(v.reason.find("lost it to rounding"), std::string::npos) << v.reason;
  for (const Policy& p : kAll) {
    if (p.kind != PolicyKind::kTruth) {
      EXPECT_EQ(evaluate(p, c).status, VerdictStatus::kFail);
    }
  }
  // The same zero tensor against an accurate single fails under truth too.
  Tensor accurate = Tensor::from_f64(b, {6}, DType::kF32);
  Verdict f = evaluate(truth_policy, compare_tensors(zero, accurate, &truth));
  EXPECT_EQ(f.status, VerdictStatus::kFail) << f.reason;
  EXPECT_NE(f.reason.find("EXCEEDED"), std::string::npos) << f.reason;
}

TEST(AllclosePolicy, CountsElementsOverTheBound) {
  const std::int64_t n = 10;
  const double rtol = 1e-6, atol = 1e-9;
  std::vector<double> b = values(n, 17);
  std::vector<double> within = b, over = b;
  for (std::int64_t i = 0; i < n; ++i) within[i] += 0.5 * (atol + rtol * std::fabs(b[i]));
  over = within;
  over[3] = b[3] + 1.5 * (atol + rtol * std::fabs(b[3]));
  over[7] = b[7] - 1.5 * (atol + rtol * std::fabs(b[7]));
  Tensor single = Tensor::from_f64(b, {n}, DType::kF64);
  CompareOptions opt;
  opt.rtol = rtol;
  opt.atol = atol;
  TensorComparison ok =
      compare_tensors(Tensor::from_f64(within, {n}, DType::kF64), single, nullptr, opt);
  TensorComparison bad =
      compare_tensors(Tensor::from_f64(over, {n}, DType::kF64), single, nullptr, opt);
  EXPECT_EQ(ok.count_over_allclose, 0);
  EXPECT_EQ(bad.count_over_allclose, 2);
  EXPECT_EQ(evaluate(Policy{PolicyKind::kAllclose, {}}, ok).status, VerdictStatus::kPass);
  Verdict v = evaluate(Policy{PolicyKind::kAllclose, {}}, bad);
  EXPECT_EQ(v.status, VerdictStatus::kFail);
  EXPECT_NE(v.reason.find("2 of 10"), std::string::npos) << v.reason;
  // f64 has no reference tolerance: without overrides te/allclose say so and fail.
  TensorComparison none = compare_tensors(single, single, nullptr);
  EXPECT_FALSE(none.has_tolerance);
  Verdict vn = evaluate(Policy{PolicyKind::kTe, {}}, none);
  EXPECT_EQ(vn.status, VerdictStatus::kFail);
  EXPECT_NE(vn.reason.find("f64"), std::string::npos) << vn.reason;
}

TEST(BitwisePolicy, SignedZeroDiffersInBitsOnly) {
  Tensor single = Tensor::from_f64(std::vector<double>{1.0, 0.0, 2.0}, {3}, DType::kF32);
  Tensor sharded = Tensor::from_f64(std::vector<double>{1.0, -0.0, 2.0}, {3}, DType::kF32);
  TensorComparison c = compare_tensors(sharded, single, nullptr);
  EXPECT_EQ(c.count_bits_differ, 1);
  EXPECT_EQ(evaluate(Policy{PolicyKind::kBitwise, {}}, c).status, VerdictStatus::kFail);
  EXPECT_EQ(evaluate(Policy{PolicyKind::kTe, {}}, c).status, VerdictStatus::kPass);
  EXPECT_EQ(
      evaluate(Policy{PolicyKind::kBitwise, {}}, compare_tensors(single, single.clone(), nullptr))
          .status,
      VerdictStatus::kPass);
}

// Truth policy: single and sharded perturbed from the truth by noise of one size pass;
// sharded with 10× the noise fails. The perturbation (1e-5 relative to values of order 1)
// dominates f32 storage rounding (6e-8), so the error ratios are the constructed ones.
TEST(TruthPolicy, SameSizeErrorPassesTenTimesFails) {
  const std::int64_t n = 512;
  std::vector<double> t = values(n, 19);
  std::vector<double> s = t, h = t, bad = t;
  for (std::int64_t i = 0; i < n; ++i) {
    s[i] += 1e-5 * noise(20, i);
    h[i] += 1e-5 * noise(21, i);
    bad[i] += 1e-4 * noise(21, i);
  }
  Tensor truth = Tensor::from_f64(t, {n}, DType::kF64);
  Tensor single = Tensor::from_f64(s, {n}, DType::kF32);
  TensorComparison good = compare_tensors(Tensor::from_f64(h, {n}, DType::kF32), single, &truth);
  TensorComparison worse = compare_tensors(Tensor::from_f64(bad, {n}, DType::kF32), single, &truth);
  // The constructed ratios, measured: about 1 and about 10.
  EXPECT_NEAR(good.sharded_vs_truth.rms / good.single_vs_truth.rms, 1.0, 0.2);
  EXPECT_NEAR(worse.sharded_vs_truth.rms / worse.single_vs_truth.rms, 10.0, 2.0);
  const Policy truth_policy = parse_policy("truth");
  Verdict vg = evaluate(truth_policy, good);
  Verdict vb = evaluate(truth_policy, worse);
  EXPECT_EQ(vg.status, VerdictStatus::kPass) << vg.reason;
  EXPECT_EQ(vb.status, VerdictStatus::kFail) << vb.reason;
  EXPECT_NE(vb.reason.find("EXCEEDED"), std::string::npos) << vb.reason;
  // A larger multiplier is a parameter, not a code change.
  Policy loose = truth_policy;
  loose.truth.multiplier = 20;
  EXPECT_EQ(evaluate(loose, worse).status, VerdictStatus::kPass);
}

// The scale test: single's error 15 % of the tensor (NVFP4's size), sharded the truth
// rescaled by 0.7 (a TP bug such as a softmax scale of 1/sqrt(N) too many) plus its own
// rounding. Its error is 2.3× single's, inside the bounds' 4·sqrt(2); the shift of -0.3
// along the truth, hundreds of standard errors out, fails it.
TEST(TruthPolicy, ScaleTestCatchesARescaledTensorTheBoundsPass) {
  const std::int64_t n = 4096;
  std::vector<double> t(n), s(n), h(n), r(n);
  for (std::int64_t i = 0; i < n; ++i) {
    t[i] = noise(40, i);
    s[i] = t[i] * (1 + 0.25 * noise(41, i));
    r[i] = t[i] * (1 + 0.25 * noise(42, i));  // a correct sharded run: other rounding
    h[i] = 0.7 * r[i];
  }
  Tensor truth = Tensor::from_f64(t, {n}, DType::kF64);
  Tensor single = Tensor::from_f64(s, {n}, DType::kF32);
  Policy p = parse_policy("truth");
  p.truth.tp_size = 2;
  TensorComparison bug = compare_tensors(Tensor::from_f64(h, {n}, DType::kF32), single, &truth);
  TensorComparison ok = compare_tensors(Tensor::from_f64(r, {n}, DType::kF32), single, &truth);
  ASSERT_LT(bug.sharded_vs_truth.rms, 4 * std::sqrt(2.0) * bug.single_vs_truth.rms);
  ASSERT_LT(bug.sharded_vs_truth.max_abs, 4 * std::sqrt(2.0) * bug.single_vs_truth.max_abs);
  const Verdict vb = evaluate(p, bug);
  EXPECT_EQ(vb.status, VerdictStatus::kFail) << vb.reason;
  EXPECT_EQ(vb.reason.rfind("sharded is single rescaled along the truth: scale shift along "
                            "truth -0.3",
                            0),
            0u)
      << vb.reason;
  const Verdict vo = evaluate(p, ok);
  EXPECT_EQ(vo.status, VerdictStatus::kPass) << vo.reason;
  EXPECT_LT(std::fabs(ok.scale_shift), 3 * ok.scale_shift_sigma);  // rounding: no shift
  // scale_z = 0 turns the test off: then only the bounds judge, and they pass the bug.
  Policy off = p;
  off.truth.scale_z = 0;
  EXPECT_EQ(evaluate(off, bug).status, VerdictStatus::kPass);
  // A shift below the minimum passes however many standard errors out (the calibrated
  // floor of what rounding does to a scale, docs/QUANTIZATION.md).
  Policy wide = p;
  wide.truth.scale_min_shift = 0.35;
  EXPECT_EQ(evaluate(wide, bug).status, VerdictStatus::kPass);
}

// A constant truth (a norm bias gradient of a constant-init layer): its rounding is a
// rescaling of the one value, so the scale test does not judge it; the bounds do.
TEST(TruthPolicy, ScaleTestLeavesConstantTensorsToTheBounds) {
  const std::int64_t n = 256;
  Tensor truth = Tensor::full({n}, DType::kF64, 0.7);
  Tensor single = Tensor::full({n}, DType::kF32, 0.7 * 1.1);
  Tensor sharded = Tensor::full({n}, DType::kF32, 0.7 * 0.75);
  TensorComparison c = compare_tensors(sharded, single, &truth);
  Policy p = parse_policy("truth");
  p.truth.tp_size = 2;
  const Verdict v = evaluate(p, c);
  EXPECT_EQ(v.status, VerdictStatus::kPass) << v.reason;
  EXPECT_NE(v.reason.find("not tested: truth varies"), std::string::npos) << v.reason;
}

// A truth single does not resolve (a sum that cancels to f64 noise: single's error is
// 10⁶ times the truth): "along the truth" means nothing there, so a difference that
// happens to lie along it is left to the bounds — which pass it (same-size errors).
TEST(TruthPolicy, ScaleTestLeavesUnresolvedTensorsToTheBounds) {
  const std::int64_t n = 4096;
  std::vector<double> t(n), s(n), h(n);
  for (std::int64_t i = 0; i < n; ++i) {
    t[i] = 1e-12 * noise(50, i);
    s[i] = t[i] + 1e-6 * noise(51, i);
    h[i] = s[i] - 3 * t[i];  // exactly along the truth: infinitely many standard errors
  }
  Tensor truth = Tensor::from_f64(t, {n}, DType::kF64);
  TensorComparison c = compare_tensors(Tensor::from_f64(h, {n}, DType::kF64),
                                       Tensor::from_f64(s, {n}, DType::kF64), &truth);
  ASSERT_GT(std::fabs(c.single_scale_error), 1e3);
  Policy p = parse_policy("truth");
  const Verdict v = evaluate(p, c);
  EXPECT_EQ(v.status, VerdictStatus::kPass) << v.reason;
  EXPECT_NE(v.reason.find("not tested: single's own shift"), std::string::npos) << v.reason;
  p.truth.scale_max_single = std::numeric_limits<double>::infinity();
  p.truth.scale_min_shift = 0.1;
  EXPECT_EQ(evaluate(p, c).status, VerdictStatus::kPass)
      << "the floor m·sqrt(N)·|single's shift| still covers it";
}

// One sample: single's and sharded's errors are each one number repeated (a bias
// gradient of a constant-initialized layer under fp8_cs, measured: sharded 22× single).
// Without a recipe the ratio bound judges it; under one (format u 2^-3, E5M2) the floor
// allows one rounding to the format, and a bug-sized error (half the tensor) still fails.
TEST(TruthPolicy, OneSampleErrorsGetOneRoundingOfTheFormat) {
  const std::int64_t n = 64;
  std::vector<double> t(n), s(n), h(n), bug(n);
  for (std::int64_t i = 0; i < n; ++i) {
    t[i] = 6e-3 * (1 + 0.5 * noise(60, i));
    s[i] = t[i] + 4.8e-7;   // one number repeated
    h[i] = t[i] + 1.05e-5;  // 22× single's, 1.7e-3 of the tensor
    bug[i] = 0.5 * t[i];    // a share of a sum kept
  }
  Tensor truth = Tensor::from_f64(t, {n}, DType::kF64);
  Tensor single = Tensor::from_f64(s, {n}, DType::kF64);
  TensorComparison c = compare_tensors(Tensor::from_f64(h, {n}, DType::kF64), single, &truth);
  EXPECT_NEAR(c.single_error_offset_share, 1.0, 1e-9);
  Policy p = parse_policy("truth");
  p.truth.tp_size = 2;
  EXPECT_EQ(evaluate(p, c).status, VerdictStatus::kFail) << "no recipe: the ratio judges";
  p.truth.format_unit_roundoff = 0x1p-3;
  const Verdict v = evaluate(p, c);
  EXPECT_EQ(v.status, VerdictStatus::kPass) << v.reason;
  EXPECT_NE(v.reason.find("one number repeated"), std::string::npos) << v.reason;
  const Verdict vb =
      evaluate(p, compare_tensors(Tensor::from_f64(bug, {n}, DType::kF64), single, &truth));
  EXPECT_EQ(vb.status, VerdictStatus::kFail) << vb.reason;
  // Mostly an offset (the H200's single on that tensor: an offset of 1e-9 plus f32
  // rounding, 82 % offset) is still one sample.
  std::vector<double> mostly(n);
  for (std::int64_t i = 0; i < n; ++i) mostly[i] = t[i] + 1e-9 * (1 + 0.87 * noise(62, i));
  TensorComparison cm = compare_tensors(Tensor::from_f64(h, {n}, DType::kF64),
                                        Tensor::from_f64(mostly, {n}, DType::kF64), &truth);
  EXPECT_GT(cm.single_error_offset_share, 0.6);
  EXPECT_LT(cm.single_error_offset_share, 0.9);
  EXPECT_EQ(evaluate(p, cm).status, VerdictStatus::kPass) << evaluate(p, cm).reason;
  // Errors that vary are many samples: no such floor.
  std::vector<double> varied(n);
  for (std::int64_t i = 0; i < n; ++i) varied[i] = t[i] + 4.8e-7 * noise(61, i);
  TensorComparison cv = compare_tensors(Tensor::from_f64(h, {n}, DType::kF64),
                                        Tensor::from_f64(varied, {n}, DType::kF64), &truth);
  EXPECT_LT(cv.single_error_offset_share, 0.2);
  EXPECT_EQ(evaluate(p, cv).status, VerdictStatus::kFail);
}

// The floor: single exactly equal to the truth (error 0) and sharded one f32 rounding
// away passes thanks to floor_factor·u·|truth|, and fails without the floor.
TEST(TruthPolicy, FloorAbsorbsRoundingWhenSingleIsExact) {
  const std::int64_t n = 64;
  std::vector<double> t(n), h(n);
  for (std::int64_t i = 0; i < n; ++i) {
    t[i] = static_cast<float>(1.0 + noise(23, i));  // representable in f32: single is exact
    h[i] = t[i] * (1.0 + 0.9 * std::ldexp(1.0, -24) * noise(24, i) * 2);  // ≤ ~1.8 u away
  }
  Tensor truth = Tensor::from_f64(t, {n}, DType::kF64);
  Tensor single = Tensor::from_f64(t, {n}, DType::kF32);
  TensorComparison c = compare_tensors(Tensor::from_f64(h, {n}, DType::kF32), single, &truth);
  ASSERT_EQ(c.single_vs_truth.max_abs, 0.0);
  ASSERT_GT(c.sharded_vs_truth.max_abs, 0.0);
  // The floor is floor_factor · u · sqrt(K) · |truth|: with K = 16 it is 4u, above the
  // sharded error (1.8u before its rounding to f32, at most one ulp = 2u after).
  Policy with_floor = parse_policy("truth");
  with_floor.truth.reduction_length = 16;
  EXPECT_EQ(evaluate(with_floor, c).status, VerdictStatus::kPass);
  Policy no_floor = with_floor;
  no_floor.truth.floor_factor = 0;
  EXPECT_EQ(evaluate(no_floor, c).status, VerdictStatus::kFail);
  // A comparison without a truth run cannot be judged by it.
  EXPECT_EQ(evaluate(parse_policy("truth"), compare_tensors(single, single, nullptr)).status,
            VerdictStatus::kFail);
}

// The limit exactly, at ±ε, with N = 4 and K = 16 so that sqrt(N) = 2 ≠ N and
// sqrt(K) = 4 ≠ K: a formula with N or K in place of their roots fails one of these.
// Each term is tested alone (the others zero), for the RMS and for the max statistic.
TEST(TruthPolicy, LimitIsExactWithSqrtNAndSqrtK) {
  Policy p = parse_policy("truth");
  p.truth.tp_size = 4;
  p.truth.reduction_length = 16;
  p.truth.unit_roundoff = std::ldexp(1.0, -24);
  const double u = std::ldexp(1.0, -24);
  const double eps = 1e-9;
  auto base = [] {
    TensorComparison c;
    c.dtype = DType::kF32;
    c.numel = 16;
    c.has_truth = true;
    return c;
  };
  // sharded error (rms and max) at `ratio` × limit.
  auto judge = [&](TensorComparison c, double limit_rms, double limit_max, double ratio) {
    c.sharded_vs_truth.rms = ratio * limit_rms;
    c.sharded_vs_truth.max_abs = ratio * limit_max;
    return evaluate(p, c).status;
  };
  auto expect_limit = [&](const TensorComparison& c, double rms, double max, const char* what) {
    EXPECT_EQ(judge(c, rms, max, 1 - eps), VerdictStatus::kPass) << what;
    EXPECT_EQ(judge(c, rms, max, 1 + eps), VerdictStatus::kFail) << what;
    TensorComparison only_max = c;  // the max statistic alone decides too
    only_max.sharded_vs_truth.rms = 0;
    only_max.sharded_vs_truth.max_abs = (1 + eps) * max;
    EXPECT_EQ(evaluate(p, only_max).status, VerdictStatus::kFail) << what;
  };
  // Multiplier term: 4 · sqrt(4) = 8 times single's error.
  TensorComparison m = base();
  m.single_vs_truth.rms = 1e-6;
  m.single_vs_truth.max_abs = 3e-6;
  expect_limit(m, 8 * 1e-6, 8 * 3e-6, "m·sqrt(N)·single");
  // Floor term: u · sqrt(16) = 4u times |truth|.
  TensorComparison f = base();
  f.truth_rms = 0.5;
  f.truth_max_abs = 2.0;
  expect_limit(f, 4 * u * 0.5, 4 * u * 2.0, "u·sqrt(K)·|truth|");
  // Rounding-probe term: u · sqrt(16) times the noise, also with a zero truth.
  TensorComparison n = base();
  n.has_rounding_noise = true;
  n.rounding_noise_rms = 0.25;
  n.rounding_noise_max_abs = 1.0;
  expect_limit(n, 4 * u * 0.25, 4 * u * 1.0, "u·sqrt(K)·noise");
  // All three add.
  TensorComparison all = m;
  all.truth_rms = 0.5;
  all.truth_max_abs = 2.0;
  all.has_rounding_noise = true;
  all.rounding_noise_rms = 0.25;
  all.rounding_noise_max_abs = 1.0;
  expect_limit(all, 8e-6 + 4 * u * 0.75, 24e-6 + 4 * u * 3.0, "sum");
}

TEST(ParsePolicy, NamesRoundTripAndBadNameIsInputError) {
  for (const std::string& name : policy_names())
    EXPECT_EQ(policy_name(parse_policy(name).kind), name);
  EXPECT_EQ(parse_policy("truth").truth.multiplier, TruthPolicyParams{}.multiplier);
  try {
    parse_policy("strict");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    std::string msg = e.what();
    EXPECT_NE(msg.find("'strict'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("te, allclose, truth, bitwise"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace tpcheck

// gemm_test.cpp — CpuBackend::gemm: shapes and transposes against a naive f64 triple
// loop, math-class emulation (fp32, tf32, bf16, fp16), the kAuto rule, the ledger,
// storage rounding, and clear errors for bad operands.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/finite_diff.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using testing::random_f64;

// op(A)·op(B) in f64 by the definition, from the stored values of a and b.
std::vector<double> naive_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
  const std::int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const std::int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const std::int64_t n = trans_b ? b.dim(0) : b.dim(1);
  const std::vector<double> av = a.to_f64(), bv = b.to_f64();
  std::vector<double> c(m * n, 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = trans_a ? av[p * m + i] : av[i * k + p];
        const double y = trans_b ? bv[j * k + p] : bv[p * n + j];
        c[i * n + j] += x * y;
      }
  return c;
}

// Σ_p |op(A)[i,p]·op(B)[p,j]| for each (i, j): the scale of the rounding-error bound.
std::vector<double> abs_product(const Tensor& a, const Tensor& b) {
  Tensor aa = Tensor::zeros(a.shape(), DType::kF64), bb = Tensor::zeros(b.shape(), DType::kF64);
  for (std::int64_t i = 0; i < a.numel(); ++i) aa.set(i, std::abs(a.at(i)));
  for (std::int64_t i = 0; i < b.numel(); ++i) bb.set(i, std::abs(b.at(i)));
  return naive_gemm(aa, false, bb, false);
}

Tensor random(const Shape& shape, std::string_view name, DType dtype) {
  return random_f64(shape, name).to(dtype);
}

// The same tensor with every value rounded by `round` (kept in f64).
template <typename F>
Tensor rounded(const Tensor& t, F round) {
  Tensor out = Tensor::zeros(t.shape(), DType::kF64);
  for (std::int64_t i = 0; i < t.numel(); ++i) out.set(i, round(static_cast<float>(t.at(i))));
  return out;
}

TEST(Gemm, AllTransposesAndAccumulateMatchNaiveF64) {
  auto backend = make_cpu_backend();
  const std::int64_t m = 5, n = 7, k = 11;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool acc : {false, true}) {
        const Tensor a = random(ta ? Shape{k, m} : Shape{m, k}, "a", DType::kF64);
        const Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, "b", DType::kF64);
        Tensor c = random({m, n}, "c", DType::kF64);
        const std::vector<double> c0 = c.to_f64();
        backend->gemm("t/fwd", a, ta, b, tb, c, acc);
        std::vector<double> want = naive_gemm(a, ta, b, tb);
        if (acc) {
          for (std::size_t i = 0; i < want.size(); ++i) want[i] += c0[i];
        }
        // f64 GEMM of length 11: differences are a few ulps of f64; measured ~1e-16.
        EXPECT_LT(testing::relative_error(c.to_f64(), want), 1e-14)
            << "trans_a=" << ta << " trans_b=" << tb << " accumulate=" << acc;
      }
    }
  }
}

TEST(Gemm, HigherRankOperandsAreViewedAsRowsByLastDim) {
  // A [s, b, k] · Bᵀ with B [n, k] → C [s, b, n] (a Linear forward), and the wgrad
  // dYᵀ·X with dY [s, b, n], X [s, b, k] → [n, k].
  auto backend = make_cpu_backend();
  const Tensor x = random({3, 2, 6}, "x", DType::kF64);
  const Tensor w = random({4, 6}, "w", DType::kF64);
  Tensor y = Tensor::zeros({3, 2, 4}, DType::kF64);
  backend->gemm("lin/fwd", x, false, w, true, y, false);
  EXPECT_LT(testing::relative_error(y.to_f64(), naive_gemm(x.reshape({6, 6}), false, w, true)),
            1e-14);
  Tensor dw = Tensor::zeros({4, 6}, DType::kF64);
  backend->gemm("lin/wgrad", y, true, x, false, dw, false);
  EXPECT_LT(testing::relative_error(dw.to_f64(),
                                    naive_gemm(y.reshape({6, 4}), true, x.reshape({6, 6}), false)),
            1e-14);
}

// Checks |c − ref| ≤ γ·Σ|a||b| + |ref|·2^-24 elementwise (f32 accumulation of k terms
// plus the final rounding to f32), where ref is the f64 GEMM of the class-rounded inputs.
void expect_within_f32_accumulation(const std::vector<double>& c, const std::vector<double>& ref,
                                    const std::vector<double>& scale, std::int64_t k) {
  const double u = std::ldexp(1.0, -24);
  const double gamma = k * u / (1 - k * u);
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_LE(std::abs(c[i] - ref[i]), gamma * scale[i] + u * std::abs(ref[i])) << "element " << i;
  }
}

TEST(Gemm, Tf32ClassIsF64GemmOfTf32RoundedInputsAndDiffersFromFp32) {
  auto backend = make_cpu_backend();
  backend->set_gemm_rule({GemmClassRule::Mode::kAsStored, MathClass::kTf32, 16});
  const std::int64_t m = 16, n = 12, k = 64;
  const Tensor a = random({m, k}, "a", DType::kF32), b = random({k, n}, "b", DType::kF32);
  Tensor c_tf32 = Tensor::zeros({m, n}, DType::kF32);
  backend->gemm("t/fwd", a, false, b, false, c_tf32, false);

  const Tensor a_r = rounded(a, [](float v) { return round_tf32(v); });
  const Tensor b_r = rounded(b, [](float v) { return round_tf32(v); });
  expect_within_f32_accumulation(c_tf32.to_f64(), naive_gemm(a_r, false, b_r, false),
                                 abs_product(a_r, b_r), k);

  backend->set_gemm_rule({GemmClassRule::Mode::kAsStored, MathClass::kFp32, 16});
  Tensor c_fp32 = Tensor::zeros({m, n}, DType::kF32);
  backend->gemm("t/fwd", a, false, b, false, c_fp32, false);
  expect_within_f32_accumulation(c_fp32.to_f64(), naive_gemm(a, false, b, false), abs_product(a, b),
                                 k);
  // TF32 keeps 10 mantissa bits: on N(0,1) data the two classes differ by ~2^-11
  // relative (measured 2.9e-4 norm-wise), far above f32 accumulation noise (~1e-7).
  const double diff = testing::relative_error(c_tf32.to_f64(), c_fp32.to_f64());
  EXPECT_GT(diff, 1e-5);
  EXPECT_LT(diff, 1e-2);
}

TEST(Gemm, HalfClassesRoundInputs) {
  auto backend = make_cpu_backend();
  const std::int64_t m = 6, n = 5, k = 40;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    // A in the 16-bit dtype, B in f32: B is read at A's precision (mixed-input GEMM).
    const Tensor a = random({m, k}, "a", dt), b = random({k, n}, "b", DType::kF32);
    Tensor c = Tensor::zeros({m, n}, DType::kF32);
    backend->gemm("t/fwd", a, false, b, false, c, false);
    const Tensor b_r = rounded(b, [dt](float v) { return round_to(dt, v); });
    expect_within_f32_accumulation(c.to_f64(), naive_gemm(a, false, b_r, false),
                                   abs_product(a, b_r), k);
    EXPECT_EQ(backend->ledger().records().back().math_class,
              dt == DType::kF16 ? MathClass::kFp16 : MathClass::kBf16);
  }
}

TEST(Gemm, F16StorageIsRoundedOnceAndAccumulateAddsInF32) {
  auto backend = make_cpu_backend();
  const std::int64_t m = 8, n = 9, k = 24;
  const Tensor a = random({m, k}, "a", DType::kF16), b = random({n, k}, "b", DType::kF16);
  Tensor p = Tensor::zeros({m, n}, DType::kF32);  // the unrounded f32 product
  backend->gemm("t/fwd", a, false, b, true, p, false);

  Tensor c = Tensor::zeros({m, n}, DType::kF16);
  backend->gemm("t/fwd", a, false, b, true, c, false);
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    EXPECT_EQ(c.at(i), round_to(DType::kF16, static_cast<float>(p.at(i)))) << i;
  }
  Tensor c_acc = random({m, n}, "c", DType::kF16);
  const Tensor c_old = c_acc.clone();
  backend->gemm("t/fwd", a, false, b, true, c_acc, true);
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    const float sum = static_cast<float>(c_old.at(i)) + static_cast<float>(p.at(i));
    EXPECT_EQ(c_acc.at(i), round_to(DType::kF16, sum)) << i;
  }
}

TEST(Gemm, F32MainGradAccumulatesF16Gemm) {
  // fuse_wgrad_accumulation: f16 operands, f32 C accumulated without rounding to f16.
  auto backend = make_cpu_backend();
  const Tensor dy = random({10, 3}, "dy", DType::kF16), x = random({10, 4}, "x", DType::kF16);
  Tensor main_grad = random({3, 4}, "g", DType::kF32);
  const std::vector<double> g0 = main_grad.to_f64();
  backend->gemm("lin/wgrad", dy, true, x, false, main_grad, true);
  std::vector<double> want = naive_gemm(dy, true, x, false);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += g0[i];
  // Products of f16 values are exact in f32; only f32 additions round (~1e-7).
  EXPECT_LT(testing::relative_error(main_grad.to_f64(), want), 1e-6);
  EXPECT_EQ(backend->ledger().records().back().math_class, MathClass::kFp16);
  EXPECT_EQ(backend->ledger().records().back().c_dtype, DType::kF32);
}

TEST(Gemm, AutoRulePicksFp32ForShortKAndTf32ForLongK) {
  // The story in README.md, "Where it came from": K = 8 (sharded) ran on FMA kernels,
  // K = 32 on TF32 tensor cores.
  auto backend = make_cpu_backend();
  backend->set_gemm_rule({GemmClassRule::Mode::kAuto, MathClass::kFp32, 16});
  for (std::int64_t k : {8, 15, 16, 32}) {
    const Tensor a = random({4, k}, "a", DType::kF32), b = random({k, 3}, "b", DType::kF32);
    Tensor c = Tensor::zeros({4, 3}, DType::kF32);
    backend->gemm("mlp.fc1/wgrad", a, false, b, false, c, false);
    EXPECT_EQ(backend->ledger().records().back().math_class,
              k < 16 ? MathClass::kFp32 : MathClass::kTf32)
        << "k=" << k;
  }
  // kAuto leaves other dtypes to their own class.
  const Tensor a = random({4, 32}, "a", DType::kF64), b = random({32, 3}, "b", DType::kF64);
  Tensor c = Tensor::zeros({4, 3}, DType::kF64);
  backend->gemm("x/fwd", a, false, b, false, c, false);
  EXPECT_EQ(backend->ledger().records().back().math_class, MathClass::kFp64);
}

TEST(Gemm, LedgerRecordsEveryCall) {
  auto backend = make_cpu_backend();
  const Tensor a = random({7, 5}, "a", DType::kF32), b = random({3, 7}, "b", DType::kF32);
  Tensor c = Tensor::zeros({5, 3}, DType::kF16);
  backend->gemm("attn.proj/dgrad", a, true, b, true, c, true);
  ASSERT_EQ(backend->ledger().records().size(), 1u);
  const GemmRecord& r = backend->ledger().records()[0];
  EXPECT_EQ(r.site, "attn.proj/dgrad");
  EXPECT_EQ(r.m, 5);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.k, 7);
  EXPECT_TRUE(r.trans_a);
  EXPECT_TRUE(r.trans_b);
  EXPECT_TRUE(r.accumulate);
  EXPECT_EQ(r.a_dtype, DType::kF32);
  EXPECT_EQ(r.c_dtype, DType::kF16);
  EXPECT_EQ(r.math_class, MathClass::kFp32);
  EXPECT_NE(r.implementation.find("sgemm"), std::string::npos);
  backend->ledger().clear();
  EXPECT_TRUE(backend->ledger().records().empty());
}

TEST(Gemm, RepeatedRunsAreBitIdentical) {
  auto backend = make_cpu_backend();
  const Tensor a = random({128, 256}, "a", DType::kF32), b = random({256, 96}, "b", DType::kF32);
  Tensor c1 = Tensor::zeros({128, 96}, DType::kF32), c2 = Tensor::zeros({128, 96}, DType::kF32);
  backend->gemm("t/fwd", a, false, b, false, c1, false);
  backend->gemm("t/fwd", a, false, b, false, c2, false);
  EXPECT_TRUE(bitwise_equal(c1, c2));
}

// Runs `f`, expecting Error(kInput) whose message contains every string in `parts`.
template <typename F>
void expect_input_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
  }
}

TEST(Gemm, BadShapesAndDtypesGiveClearErrors) {
  auto backend = make_cpu_backend();
  const Tensor a = Tensor::zeros({4, 6}, DType::kF32), b = Tensor::zeros({5, 3}, DType::kF32);
  Tensor c = Tensor::zeros({4, 3}, DType::kF32);
  expect_input_error([&] { backend->gemm("mlp.fc1/fwd", a, false, b, false, c, false); },
                     {"mlp.fc1/fwd", "[4, 6]", "[5, 3]", "inner"});
  const Tensor b2 = Tensor::zeros({6, 3}, DType::kF32);
  Tensor c_bad = Tensor::zeros({4, 2}, DType::kF32);
  expect_input_error([&] { backend->gemm("mlp.fc2/fwd", a, false, b2, false, c_bad, false); },
                     {"mlp.fc2/fwd", "[4, 2]", "expected [4, 3]"});
  const Tensor v = Tensor::zeros({6}, DType::kF32);
  expect_input_error([&] { backend->gemm("x/fwd", a, false, v, false, c, false); },
                     {"x/fwd", "f32[6]", "rank >= 2"});
  const Tensor b64 = Tensor::zeros({6, 3}, DType::kF64);
  expect_input_error([&] { backend->gemm("x/fwd", a, false, b64, false, c, false); },
                     {"f32", "f64"});
  EXPECT_TRUE(backend->ledger().records().empty());  // nothing recorded for failed calls
}

TEST(MathClass, NamesRoundTripAndUnknownNameIsRejected) {
  for (MathClass c :
       {MathClass::kFp64, MathClass::kFp32, MathClass::kTf32, MathClass::kBf16, MathClass::kFp16}) {
    EXPECT_EQ(parse_math_class(math_class_name(c)), c);
  }
  EXPECT_EQ(math_class_name(MathClass::kTf32), "tf32");
  expect_input_error([] { parse_math_class("tf16"); }, {"'tf16'", "fp64, fp32, tf32, bf16, fp16"});
}

}  // namespace
}  // namespace tpcheck

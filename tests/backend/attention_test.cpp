// attention_test.cpp — scaled dot-product attention on the CPU backend (the composition of
// src/backend/composed_attention.cpp over the CPU primitives and GEMM engine): forward against a
// plainly written f64 reference (its own mask predicate, not AttentionMask::allows),
// backward against central finite differences in f64, masked keys having no influence,
// f32/f16/bf16 within the error the documented rounding points allow, the six products
// in the GEMM ledger (sites, batch, m n k, dtypes, class under the rule), and shape
// errors. Cases: no mask, causal, sliding window (2, 2), sliding window (1, unbounded
// right), causal with a left window, GQA with h=4, g=2 and g=1 (MQA).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "support/finite_diff.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using testing::numeric_gradient;
using testing::random_f64;
using testing::checked_gradient_error;
using testing::relative_error;
using testing::weighted_sum;

constexpr std::int64_t kSeq = 7, kBatch = 2, kDim = 3;
constexpr double kScale = 0.7;

struct Case {
  std::string name;
  std::int64_t heads, groups;
  AttentionMask mask;
  std::function<bool(std::int64_t query, std::int64_t key)> visible;  // the test's own rule
};

AttentionMask make_mask(AttentionMask::Type type, std::int64_t left, std::int64_t right) {
  AttentionMask m;
  m.type = type;
  m.window_left = left;
  m.window_right = right;
  return m;
}

std::vector<Case> cases() {
  using T = AttentionMask::Type;
  return {
      {"no_mask", 4, 4, make_mask(T::kNoMask, -1, -1), [](auto, auto) { return true; }},
      {"causal", 4, 4, make_mask(T::kCausal, -1, -1), [](auto i, auto j) { return j <= i; }},
      {"sliding_2_2", 4, 4, make_mask(T::kSlidingWindow, 2, 2),
       [](auto i, auto j) { return i - 2 <= j && j <= i + 2; }},
      {"sliding_1_unbounded", 4, 4, make_mask(T::kSlidingWindow, 1, -1),
       [](auto i, auto j) { return i - 1 <= j; }},
      {"causal_left_2", 4, 4, make_mask(T::kCausal, 2, -1),
       [](auto i, auto j) { return i - 2 <= j && j <= i; }},
      {"gqa_h4_g2_causal", 4, 2, make_mask(T::kCausal, -1, -1),
       [](auto i, auto j) { return j <= i; }},
      {"gqa_h4_g1_sliding_2_2", 4, 1, make_mask(T::kSlidingWindow, 2, 2),
       [](auto i, auto j) { return i - 2 <= j && j <= i + 2; }},
  };
}

// gtest prints a failing parameter with this (instead of its bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Inputs {
  Tensor q, k, v;
};

Inputs make_inputs(const Case& c) {
  return {random_f64({kSeq, kBatch, c.heads, kDim}, "q", 1.0, 11),
          random_f64({kSeq, kBatch, c.groups, kDim}, "k", 1.0, 12),
          random_f64({kSeq, kBatch, c.groups, kDim}, "v", 1.0, 13)};
}

// The definition, element by element in f64: out[i,b,h,:] = Σ_j p_ij v[j,b,grp(h),:] with
// p_i = softmax_j(scale · q[i,b,h,:]·k[j,b,grp(h),:]) over visible j.
struct Reference {
  std::vector<double> out;    // [s, b, h, d]
  std::vector<double> probs;  // [b, h, s, s]
  // [s, b, h, d]: (1 + 2·max_j |S_ij|) · Σ_j p_ij |v_j|, over visible j (see
  // LowPrecisionRoundsToStorageDtype).
  std::vector<double> sensitivity;
};

Reference reference(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::int64_t s = kSeq, nb = kBatch, h = c.heads, g = c.groups, d = kDim;
  auto qi = [&](auto i, auto b, auto hh, auto e) { return q.at(((i * nb + b) * h + hh) * d + e); };
  auto ki = [&](auto j, auto b, auto gg, auto e) { return k.at(((j * nb + b) * g + gg) * d + e); };
  auto vi = [&](auto j, auto b, auto gg, auto e) { return v.at(((j * nb + b) * g + gg) * d + e); };
  Reference r{std::vector<double>(s * nb * h * d, 0.0), std::vector<double>(nb * h * s * s, 0.0),
              std::vector<double>(s * nb * h * d, 0.0)};
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const std::int64_t grp = hh / (h / g);
      for (std::int64_t i = 0; i < s; ++i) {
        std::vector<double> score(s, -INFINITY);
        double max = -INFINITY;
        for (std::int64_t j = 0; j < s; ++j) {
          if (!c.visible(i, j)) continue;
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e) dot += qi(i, b, hh, e) * ki(j, b, grp, e);
          score[j] = kScale * dot;
          max = std::max(max, score[j]);
        }
        double sum = 0, max_abs_score = 0;
        for (std::int64_t j = 0; j < s; ++j) {
          if (!c.visible(i, j)) continue;
          sum += std::exp(score[j] - max);
          max_abs_score = std::max(max_abs_score, std::abs(score[j]));
        }
        for (std::int64_t j = 0; j < s; ++j) {
          const double p = c.visible(i, j) ? std::exp(score[j] - max) / sum : 0.0;
          r.probs[((b * h + hh) * s + i) * s + j] = p;
          for (std::int64_t e = 0; e < d; ++e) {
            r.out[((i * nb + b) * h + hh) * d + e] += p * vi(j, b, grp, e);
            r.sensitivity[((i * nb + b) * h + hh) * d + e] +=
                (1 + 2 * max_abs_score) * p * std::abs(vi(j, b, grp, e));
          }
        }
      }
    }
  }
  return r;
}

class AttentionCase : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCase, ForwardF64MatchesReference) {
  const Case& c = GetParam();
  auto be = make_cpu_backend();
  const Inputs in = make_inputs(c);
  const AttentionForward fwd = be->attention_forward(in.q, in.k, in.v, c.mask, kScale);
  ASSERT_EQ(fwd.out.dtype(), DType::kF64);
  ASSERT_EQ(fwd.out.shape(), in.q.shape());
  ASSERT_EQ(fwd.probs.dtype(), DType::kF64);
  ASSERT_EQ(fwd.probs.shape(), (Shape{kBatch, c.heads, kSeq, kSeq}));
  const Reference ref = reference(c, in.q, in.k, in.v);
  // Same math, different summation order (BLAS blocking): measured ≤ 2.5e-16 norm-wise.
  EXPECT_LE(relative_error(fwd.out.to_f64(), ref.out), 1e-14);
  EXPECT_LE(relative_error(fwd.probs.to_f64(), ref.probs), 1e-14);
  // Masked probabilities are exactly zero.
  for (std::int64_t bh = 0; bh < kBatch * c.heads; ++bh) {
    for (std::int64_t i = 0; i < kSeq; ++i) {
      for (std::int64_t j = 0; j < kSeq; ++j) {
        if (!c.visible(i, j)) {
          EXPECT_EQ(fwd.probs.at((bh * kSeq + i) * kSeq + j), 0.0);
        }
      }
    }
  }
}

TEST_P(AttentionCase, BackwardMatchesFiniteDifferences) {
  const Case& c = GetParam();
  auto be = make_cpu_backend();
  Inputs in = make_inputs(c);
  const Tensor w = random_f64(in.q.shape(), "w", 1.0, 14);
  auto loss = [&] {
    return weighted_sum(be->attention_forward(in.q, in.k, in.v, c.mask, kScale).out, w);
  };
  const AttentionForward fwd = be->attention_forward(in.q, in.k, in.v, c.mask, kScale);
  const AttentionGrads g = be->attention_backward(w, in.q, in.k, in.v, fwd, c.mask, kScale);
  ASSERT_EQ(g.dq.shape(), in.q.shape());
  ASSERT_EQ(g.dk.shape(), in.k.shape());
  ASSERT_EQ(g.dv.shape(), in.v.shape());
  // Central differences, h = 1e-6: measured ≤ 3.7e-9 norm-wise; the bound is 1e-7.
  EXPECT_LE(checked_gradient_error(g.dq.to_f64(), numeric_gradient(loss, in.q)), 1e-7) << "dq";
  EXPECT_LE(checked_gradient_error(g.dk.to_f64(), numeric_gradient(loss, in.k)), 1e-7) << "dk";
  EXPECT_LE(checked_gradient_error(g.dv.to_f64(), numeric_gradient(loss, in.v)), 1e-7) << "dv";
}

// Changing the key and value at position `key` changes exactly the query rows that may
// see it; every other output element stays bit for bit the same.
TEST_P(AttentionCase, MaskedKeysHaveNoInfluence) {
  const Case& c = GetParam();
  auto be = make_cpu_backend();
  const Inputs in = make_inputs(c);
  const Tensor base = be->attention_forward(in.q, in.k, in.v, c.mask, kScale).out;
  for (std::int64_t key : {std::int64_t{0}, std::int64_t{3}, kSeq - 1}) {
    Tensor k2 = in.k.clone(), v2 = in.v.clone();
    const std::int64_t row = kBatch * c.groups * kDim;  // one sequence position of k / v
    for (std::int64_t e = 0; e < row; ++e) {
      k2.set(key * row + e, k2.at(key * row + e) + 1.5);
      v2.set(key * row + e, v2.at(key * row + e) - 2.0);
    }
    const Tensor out = be->attention_forward(in.q, k2, v2, c.mask, kScale).out;
    const std::int64_t qrow = kBatch * c.heads * kDim;
    for (std::int64_t i = 0; i < kSeq; ++i) {
      bool changed = false;
      for (std::int64_t e = 0; e < qrow; ++e) {
        changed |= out.at(i * qrow + e) != base.at(i * qrow + e);
      }
      EXPECT_EQ(changed, c.visible(i, key)) << "query " << i << ", key " << key;
    }
  }
}

// f32/f16/bf16 in and out; softmax math in f32, probabilities saved in f32. The rounding
// points are TransformerEngine's unfused attention (docs/LAYERS.md): the scores S and
// the probabilities P are rounded to the dtype before the next product, and the output
// once more. Against the exact result on the rounded inputs, with u the dtype's unit
// roundoff: rounding S moves p_ij by at most p_ij · 2u·max_j|S_ij| (to first order),
// rounding P by u·p_ij, so the output moves by at most
//   u·(1 + 2·max_j|S_ij|)·Σ_j p_ij |v_j|   (Reference::sensitivity)
// plus u·|out| for its own rounding; ×1.1 covers second-order terms. The absolute 2e-6
// is the f32 math (measured ≤ 1.4e-7 before the intermediate roundings existed) and
// f16's subnormal probabilities (each off by ≤ 2^-25 absolute: s·2^-25·|v| ≤ 9e-7).
// Measured: the worst error is 0.42 of this bound (bf16) and 0.39 (f16), 0.07 (f32); the
// old bound u·|ref| + 1e-6 (one rounding at the end) is exceeded by up to 8e-4 (f16) and
// 4.6e-3 (bf16), which is the intermediate roundings showing.
TEST_P(AttentionCase, LowPrecisionRoundsToStorageDtype) {
  const Case& c = GetParam();
  auto be = make_cpu_backend();
  const Inputs in64 = make_inputs(c);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor q = in64.q.to(dtype), k = in64.k.to(dtype), v = in64.v.to(dtype);
    const AttentionForward fwd = be->attention_forward(q, k, v, c.mask, kScale);
    ASSERT_EQ(fwd.out.dtype(), dtype);
    ASSERT_EQ(fwd.probs.dtype(), DType::kF32);
    const Reference ref = reference(c, q, k, v);  // f64 on the rounded inputs
    const double u = dtype_unit_roundoff(dtype);
    for (std::int64_t i = 0; i < fwd.out.numel(); ++i) {
      const double y = fwd.out.at(i);
      ASSERT_EQ(round_to(dtype, y), y) << "not representable at " << i;
      const double bound = 1.1 * u * (std::abs(ref.out[i]) + ref.sensitivity[i]) + 2e-6;
      EXPECT_LE(std::abs(y - ref.out[i]), bound) << "at " << i;
    }
    const Tensor dout = random_f64(q.shape(), "w", 1.0, 14).to(dtype);
    const AttentionGrads g = be->attention_backward(dout, q, k, v, fwd, c.mask, kScale);
    EXPECT_EQ(g.dq.dtype(), dtype);
    EXPECT_EQ(g.dk.dtype(), dtype);
    EXPECT_EQ(g.dv.dtype(), dtype);
  }
}

// Scores far beyond exp's f32 range (|scale · q·k| up to ~1e3): the softmax must subtract
// the row maximum, or exp overflows to inf and the output turns into NaN.
TEST_P(AttentionCase, LargeScoresStayFinite) {
  const Case& c = GetParam();
  auto be = make_cpu_backend();
  const Inputs in = make_inputs(c);
  const double big_scale = 300.0;
  const Tensor q = in.q.to(DType::kF32), k = in.k.to(DType::kF32), v = in.v.to(DType::kF32);
  const Tensor out = be->attention_forward(q, k, v, c.mask, big_scale).out;
  const Tensor ref = be->attention_forward(in.q, in.k, in.v, c.mask, big_scale).out;  // f64
  for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.at(i))) << i;
  // f32 scores of size ~1e3 carry absolute errors up to ~1e-4 (u·|score|), which move the
  // probabilities by as much relatively: measured ≤ 2.9e-6 norm-wise; 1e-4 is that bound.
  EXPECT_LE(relative_error(out.to_f64(), ref.to_f64()), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Masks, AttentionCase, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// ---- the products in the ledger --------------------------------------------------------

struct ExpectedProduct {
  std::string site;
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  double alpha;
};

// Forward then backward: S = αQKᵀ, O = PV, dP = dO Vᵀ, dV = Pᵀ dO, dQ = α dS K, dK = α dSᵀ Q;
// each one record with batch b·h, operands and result in the storage dtype (the rounding
// points: S, P, O, dP, dS and the per-head gradients are stored in it).
TEST(AttentionLedger, RecordsTheSixProducts) {
  const std::int64_t h = 4, g = 2;  // GQA: k, v expanded to h heads before the products
  const std::vector<ExpectedProduct> expected = {
      {"attn.scores/fwd", kSeq, kSeq, kDim, false, true, kScale},
      {"attn.context/fwd", kSeq, kDim, kSeq, false, false, 1.0},
      {"attn.context/dprobs", kSeq, kSeq, kDim, false, true, 1.0},
      {"attn.context/dvalue", kSeq, kDim, kSeq, true, false, 1.0},
      {"attn.scores/dquery", kSeq, kDim, kSeq, false, false, kScale},
      {"attn.scores/dkey", kSeq, kDim, kSeq, true, false, kScale},
  };
  const std::vector<std::pair<DType, MathClass>> dtypes = {{DType::kF64, MathClass::kFp64},
                                                           {DType::kF32, MathClass::kFp32},
                                                           {DType::kF16, MathClass::kFp16},
                                                           {DType::kBF16, MathClass::kBf16}};
  for (const auto& [dtype, cls] : dtypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    auto be = make_cpu_backend();
    be->set_rank(3);
    const Tensor q = random_f64({kSeq, kBatch, h, kDim}, "q", 1.0, 11).to(dtype);
    const Tensor k = random_f64({kSeq, kBatch, g, kDim}, "k", 1.0, 12).to(dtype);
    const Tensor v = random_f64({kSeq, kBatch, g, kDim}, "v", 1.0, 13).to(dtype);
    const AttentionMask mask;  // causal
    const AttentionForward fwd = be->attention_forward(q, k, v, mask, kScale);
    ASSERT_EQ(be->ledger().records().size(), 2u);
    be->attention_backward(q, q, k, v, fwd, mask, kScale);
    const std::vector<GemmRecord>& records = be->ledger().records();
    ASSERT_EQ(records.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const GemmRecord& r = records[i];
      const ExpectedProduct& e = expected[i];
      SCOPED_TRACE(e.site);
      EXPECT_EQ(r.site, e.site);
      EXPECT_EQ(r.rank, 3);
      EXPECT_EQ(r.batch, kBatch * h);
      EXPECT_EQ(r.m, e.m);
      EXPECT_EQ(r.n, e.n);
      EXPECT_EQ(r.k, e.k);
      EXPECT_EQ(r.trans_a, e.trans_a);
      EXPECT_EQ(r.trans_b, e.trans_b);
      EXPECT_FALSE(r.accumulate);
      EXPECT_DOUBLE_EQ(r.alpha, e.alpha);
      EXPECT_EQ(r.a_dtype, dtype);
      EXPECT_EQ(r.b_dtype, dtype);
      EXPECT_EQ(r.c_dtype, dtype);
      EXPECT_EQ(r.math_class, cls);
    }
  }
}

// The class rule reaches attention's products: with f32 GEMMs run as TF32 (what
// `--cpu-gemm tf32` sets) every product is recorded as tf32 and the numbers change, by
// about TF32's unit roundoff (2^-11 ≈ 4.9e-4), not more.
TEST(AttentionLedger, Tf32RuleChangesTheProductsClass) {
  const Case c = cases()[5];  // GQA h4 g2, causal
  const Inputs in64 = make_inputs(c);
  const Tensor q = in64.q.to(DType::kF32), k = in64.k.to(DType::kF32), v = in64.v.to(DType::kF32);
  const Tensor dout = random_f64(q.shape(), "w", 1.0, 14).to(DType::kF32);

  auto run = [&](MathClass f32_class, std::vector<GemmRecord>* records) {
    auto be = make_cpu_backend();
    GemmClassRule rule;
    rule.f32_class = f32_class;
    be->set_gemm_rule(rule);
    const AttentionForward fwd = be->attention_forward(q, k, v, c.mask, kScale);
    AttentionGrads g = be->attention_backward(dout, q, k, v, fwd, c.mask, kScale);
    *records = be->ledger().records();
    return std::make_pair(fwd.out, g);
  };
  std::vector<GemmRecord> fp32_records, tf32_records;
  const auto [out32, g32] = run(MathClass::kFp32, &fp32_records);
  const auto [out_tf, g_tf] = run(MathClass::kTf32, &tf32_records);
  ASSERT_EQ(fp32_records.size(), 6u);
  ASSERT_EQ(tf32_records.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(fp32_records[i].math_class, MathClass::kFp32) << fp32_records[i].site;
    EXPECT_EQ(tf32_records[i].math_class, MathClass::kTf32) << tf32_records[i].site;
    EXPECT_EQ(tf32_records[i].site, fp32_records[i].site);
  }
  EXPECT_FALSE(bitwise_equal(out32, out_tf));
  EXPECT_FALSE(bitwise_equal(g32.dq, g_tf.dq));
  EXPECT_FALSE(bitwise_equal(g32.dk, g_tf.dk));
  EXPECT_FALSE(bitwise_equal(g32.dv, g_tf.dv));
  // Against the f64 result: fp32 to ~1e-7, tf32 to a few units of 2^-11 norm-wise.
  auto be64 = make_cpu_backend();
  const AttentionForward f64 = be64->attention_forward(in64.q, in64.k, in64.v, c.mask, kScale);
  const Tensor dout64 = dout.to(DType::kF64);
  const AttentionGrads g64 =
      be64->attention_backward(dout64, in64.q, in64.k, in64.v, f64, c.mask, kScale);
  EXPECT_LE(relative_error(out32.to_f64(), f64.out.to_f64()), 1e-6);
  const double tf32_u = std::ldexp(1.0, -11);
  EXPECT_GT(relative_error(out_tf.to_f64(), f64.out.to_f64()), 1e-6);
  EXPECT_LE(relative_error(out_tf.to_f64(), f64.out.to_f64()), 8 * tf32_u);
  EXPECT_LE(relative_error(g_tf.dq.to_f64(), g64.dq.to_f64()), 8 * tf32_u);
  EXPECT_LE(relative_error(g_tf.dk.to_f64(), g64.dk.to_f64()), 8 * tf32_u);
  EXPECT_LE(relative_error(g_tf.dv.to_f64(), g64.dv.to_f64()), 8 * tf32_u);
}

// ---- bad input ---------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

TEST(AttentionErrors, GroupsMustDivideHeads) {
  auto be = make_cpu_backend();
  const Tensor q = random_f64({4, 1, 4, 2}, "q"), kv = random_f64({4, 1, 3, 2}, "k");
  const std::string msg = error_of([&] { be->attention_forward(q, kv, kv, AttentionMask{}, 1.0); });
  EXPECT_NE(msg.find("heads 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("groups 3"), std::string::npos) << msg;
}

TEST(AttentionErrors, MismatchedShapes) {
  auto be = make_cpu_backend();
  const Tensor q = random_f64({4, 2, 4, 2}, "q");
  const AttentionMask m;
  // sequence, batch, head dim of k differ from q's; v differs from k; rank 3.
  for (const Shape& ks : {Shape{5, 2, 2, 2}, Shape{4, 1, 2, 2}, Shape{4, 2, 2, 3}}) {
    const Tensor k = random_f64(ks, "k");
    const std::string msg = error_of([&] { be->attention_forward(q, k, k, m, 1.0); });
    EXPECT_NE(msg.find(shape_str(ks)), std::string::npos) << msg;
  }
  const Tensor k = random_f64({4, 2, 2, 2}, "k");
  error_of([&] { be->attention_forward(q, k, random_f64({4, 2, 1, 2}, "v"), m, 1.0); });
  error_of([&] { be->attention_forward(random_f64({4, 2, 8}, "q"), k, k, m, 1.0); });
  error_of([&] { be->attention_forward(q, k.to(DType::kF32), k.to(DType::kF32), m, 1.0); });

  const AttentionForward fwd = be->attention_forward(q, k, k, m, 1.0);
  error_of([&] { be->attention_backward(random_f64({4, 2, 4, 3}, "d"), q, k, k, fwd, m, 1.0); });
  AttentionForward wrong = fwd;
  wrong.probs = fwd.probs.to(DType::kF32);  // f64 inputs save f64 probabilities
  error_of([&] { be->attention_backward(q, q, k, k, wrong, m, 1.0); });
}

}  // namespace
}  // namespace tpcheck

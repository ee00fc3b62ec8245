// tests/suite/truth_model_test.cpp — what judge_case feeds the truth policy, checked
// directly: the per-case error model (u, K, N) derived from the case's dtype, GEMM class
// and sizes; the input gradient among the compared tensors; and the rounding-probe floor
// on the attention key-bias gradient, which is zero in exact arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "suite/suite_run_support.h"
#include "tpcheck/suite.h"

namespace tpcheck::testing {
namespace {

const SuiteCase& find_case(const Suite& suite, const std::string& id) {
  for (const SuiteCase& c : suite.cases) {
    if (c.id == id) return c;
  }
  throw std::runtime_error("no case " + id);
}

const TensorResult& find_tensor(const CaseResult& r, const std::string& name) {
  for (const TensorResult& t : r.steps.front().tensors) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no tensor " + name + " in " + r.spec.id);
}

const TruthPolicyParams& truth_params(const CaseResult& r) {
  for (const Policy& p : r.policies) {
    if (p.kind == PolicyKind::kTruth) return p.truth;
  }
  throw std::runtime_error("no truth policy");
}

class TruthModel : public ::testing::Test {
 protected:
  void SetUp() override { set_cpu_gemm_threads(1); }
  CaseResult run(const std::string& id, int tp, GemmClassRule rule = {}) {
    const Suite suite = make_suite("te", tp, SuiteSizes{});
    RunConfig config;
    config.tp = tp;
    config.gemm_rule = rule;
    const SuiteCase& c = find_case(suite, id);
    return judge_case(c, tp, run_case(c, config), default_judge().config);
  }
};

// u from the storage dtype and the GEMM class, K the longest reduction (computed here
// from the sizes, not from the ledger), N the TP size.
TEST_F(TruthModel, PerCaseParametersFollowDtypeGemmClassAndSizes) {
  const Suite suite = make_suite("te", 4, SuiteSizes{});
  const SuiteCase& lin = find_case(suite, "Linear.column.sp0.default");
  const std::int64_t in = lin.options.at("in_features"), out = lin.options.at("out_features");
  std::int64_t tokens = 1;
  for (std::int64_t d : lin.input_shape) tokens *= d;
  tokens /= in;
  const std::int64_t k_expected = std::max({in, out, tokens});  // fwd, dgrad, wgrad

  const TruthPolicyParams fp32 = truth_params(run("Linear.column.sp0.default", 4));
  EXPECT_EQ(fp32.unit_roundoff.value(), std::ldexp(1.0, -24));
  EXPECT_EQ(fp32.reduction_length, k_expected);
  EXPECT_EQ(fp32.tp_size, 4);
  EXPECT_EQ(fp32.multiplier, 4.0);
  EXPECT_EQ(fp32.floor_factor, 1.0);

  GemmClassRule tf32;
  tf32.f32_class = MathClass::kTf32;  // --cpu-gemm tf32
  const TruthPolicyParams t = truth_params(run("Linear.column.sp0.default", 2, tf32));
  EXPECT_EQ(t.unit_roundoff.value(), std::ldexp(1.0, -11));  // TF32: 10 mantissa bits
  EXPECT_EQ(t.tp_size, 2);

  // f16 storage sets u even with fp32 GEMMs.
  for (const SuiteCase& c : suite.cases) {
    if (c.module != "Linear" || c.dtype != DType::kF16) continue;
    const TruthPolicyParams h = truth_params(run(c.id, 4));
    EXPECT_EQ(h.unit_roundoff.value(), std::ldexp(1.0, -11)) << c.id;
    break;
  }
}

// The input gradient is compared, reassembled to the global input shape (token-sharded
// under sequence parallel, replicated otherwise), and judged like every other tensor.
TEST_F(TruthModel, InputGradientIsCompared) {
  for (const std::string id : {"Linear.column.sp0.default", "Linear.row.sp1.default",
                               "LayerNormMLP.sp1.default"}) {
    const CaseResult r = run(id, 4);
    const TensorResult& t = find_tensor(r, "input");
    EXPECT_EQ(t.kind, "input_gradient");
    EXPECT_EQ(t.comparison.shape, r.spec.input_shape) << id;
    EXPECT_GT(t.comparison.truth_rms, 0.0) << id;
    EXPECT_TRUE(t.comparison.has_rounding_noise) << id;
    EXPECT_EQ(t.verdicts.size(), r.policies.size());
  }
}

// The key-bias gradient is zero in exact arithmetic (softmax ignores a shift of the
// scores), so single and sharded are rounding noise around a zero truth and a floor
// that scales with |truth| is zero. The rounding probe gives the floor the size of
// what was summed; a real bug on that tensor (here: the query-bias gradient wired into
// the key bias, a plausible mix-up) is still caught.
TEST_F(TruthModel, ZeroInExactArithmeticKeyBiasGradient) {
  CaseResult r = run("TransformerLayer.sp0.default", 2);
  const std::string key = "self_attention.layernorm_qkv.key_bias";
  const std::string query = "self_attention.layernorm_qkv.query_bias";
  const TensorResult& k = find_tensor(r, key);
  const TensorComparison& c = k.comparison;
  const TruthPolicyParams& p = truth_params(r);
  const double scale = *p.unit_roundoff * std::sqrt(static_cast<double>(p.reduction_length));
  // The truth cancels to f64 noise: the old floor is a millionth of single's error...
  EXPECT_LT(scale * c.truth_rms, 1e-6 * c.single_vs_truth.rms);
  // ...while the probe's floor is of the size of single's error (measured 2-4×).
  EXPECT_GT(scale * c.rounding_noise_rms, 0.5 * c.single_vs_truth.rms);
  EXPECT_LT(scale * c.rounding_noise_rms, 20 * c.single_vs_truth.rms);
  const std::size_t truth_index = default_judge().chosen;
  EXPECT_TRUE(k.verdicts[truth_index].passed()) << k.verdicts[truth_index].reason;

  // The bug: sharded key-bias gradient = the query-bias gradient.
  const CaseRun run_again = [&] {
    const Suite suite = make_suite("te", 2, SuiteSizes{});
    RunConfig config;
    config.tp = 2;
    return run_case(find_case(suite, "TransformerLayer.sp0.default"), config);
  }();
  CaseRun bugged = run_again;
  const ComparedTensor* q = nullptr;
  for (const ComparedTensor& t : bugged.steps.front()) {
    if (t.name == query) q = &t;
  }
  ASSERT_NE(q, nullptr);
  for (ComparedTensor& t : bugged.steps.front()) {
    if (t.name != key) continue;
    ASSERT_EQ(t.sharded.shape(), q->sharded.shape());
    t.sharded = q->sharded.clone();
  }
  const CaseResult b = judge_case(r.spec, 2, bugged, default_judge().config);
  const TensorResult& kb = find_tensor(b, key);
  EXPECT_FALSE(kb.verdicts[truth_index].passed()) << kb.verdicts[truth_index].reason;
  EXPECT_NE(kb.verdicts[truth_index].reason.find("EXCEEDED"), std::string::npos);
}

}  // namespace
}  // namespace tpcheck::testing

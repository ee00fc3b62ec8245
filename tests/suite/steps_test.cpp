// tests/suite/steps_test.cpp — `tpcheck run --steps N` end to end (run_case + judge_case,
// judged as the CLI judges: truth the default policy):
//   * step 1 of a multi-step run is the one-step run, bit for bit (every tensor of every
//     run: single, sharded, truth, rounding noise), without a recipe and under fp8; the
//     next step differs (the SGD update moved the parameters);
//   * FP8 delayed scaling's two mutations change nothing at one step — the sharded
//     tensors are bitwise those of the correct run, so no policy can see them — and are
//     caught later: amax-history-not-updated by truth at step 2 (TP 2 and 4);
//     amax-not-reduced by te (the reference's rule and fp8 tolerance) at step 2 on the
//     tensors, and by truth at step 2 on every case at TP 2, 4 and 8 through the ranks'
//     replicated quantizer state, which correct runs hold bit for bit on every rank
//     (held-out seeds); the catching case passes without the mutation;
//   * three of the four mutations `truth` misses under fp8 at one step (recipe_test's
//     known escapes: the initial scale 1 flushes the E5M2 gradients) are caught at
//     step 2;
//   * input errors: steps < 1, and a recipe's mutation without its recipe.
// Cost, measured on the 2-core machine: about 50 s.
#include <gtest/gtest.h>

#include <string>

#include "layers/layer_test_support.h"  // expect_input_error
#include "suite/suite_run_support.h"
#include "tpcheck/error.h"
#include "tpcheck/suite.h"

namespace tpcheck::testing {
namespace {

SuiteCase case_named(const Suite& suite, const std::string& id) {
  for (const SuiteCase& c : suite.cases) {
    if (c.id == id) return c;
  }
  ADD_FAILURE() << "no case " << id << " in suite " << suite.name;
  return {};
}

RunConfig config_for(int tp, Recipe recipe, Mutation m, int steps) {
  RunConfig config;
  config.tp = tp;
  config.recipe = recipe;
  config.mutation = m;
  config.steps = steps;
  return config;
}

// The judge the CLI builds (te/allclose at the recipe's reference tolerances).
DefaultJudge judge_for(Recipe recipe) {
  DefaultJudge j = default_judge();
  if (recipe != Recipe::kNone) {
    const RecipeTolerance t = reference_recipe_tolerance(recipe);
    j.config.compare = CompareOptions{t.rtol, t.atol};
  }
  return j;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || bitwise_equal(a, b));
}

class StepsTest : public ::testing::Test {
 protected:
  void SetUp() override { set_cpu_gemm_threads(1); }  // as the CLI does
};

TEST_F(StepsTest, FirstStepIsTheOneStepRunAndTheSecondMoves) {
  for (Recipe recipe : {Recipe::kNone, Recipe::kFp8Delayed}) {
    const Suite suite = make_suite("te", 2, {}, recipe);
    for (const std::string id : {"Linear.column.sp1.default", "LayerNormMLP.sp1.default"}) {
      SCOPED_TRACE(id + " recipe " + std::string(recipe_name(recipe)));
      const SuiteCase c = case_named(suite, id);
      const CaseRun one = run_case(c, config_for(2, recipe, Mutation::kNone, 1));
      const CaseRun two = run_case(c, config_for(2, recipe, Mutation::kNone, 2));
      ASSERT_EQ(one.steps.size(), 1u);
      ASSERT_EQ(two.steps.size(), 2u);
      ASSERT_EQ(two.steps[0].size(), one.steps[0].size());
      for (std::size_t i = 0; i < one.steps[0].size(); ++i) {
        const ComparedTensor& a = one.steps[0][i];
        const ComparedTensor& b = two.steps[0][i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_TRUE(same_tensor(a.single, b.single)) << a.name << " single";
        EXPECT_TRUE(same_tensor(a.sharded, b.sharded)) << a.name << " sharded";
        EXPECT_TRUE(same_tensor(a.truth, b.truth)) << a.name << " truth";
        EXPECT_TRUE(same_tensor(a.rounding_noise, b.rounding_noise)) << a.name << " noise";
      }
      // Step 2 ran on updated parameters: its output is not step 1's, in every run.
      const ComparedTensor& y1 = two.steps[0][0];
      const ComparedTensor& y2 = two.steps[1][0];
      ASSERT_EQ(y2.name, "output");
      EXPECT_FALSE(bitwise_equal(y1.single, y2.single));
      EXPECT_FALSE(bitwise_equal(y1.sharded, y2.sharded));
      EXPECT_FALSE(bitwise_equal(y1.truth, y2.truth));
      // And the correct run passes at both steps.
      const DefaultJudge judge = judge_for(recipe);
      const CaseResult r = judge_case(c, 2, two, judge.config);
      ASSERT_EQ(r.steps.size(), 2u);
      EXPECT_TRUE(r.verdicts[judge.chosen].passed()) << describe_failure(r, judge.chosen);
    }
  }
}

// The sharded tensors of a mutated run equal the correct run's, bit for bit.
bool sharded_bitwise_equal(const CaseRun& a, const CaseRun& b) {
  if (a.steps.size() != b.steps.size()) return false;
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    for (std::size_t i = 0; i < a.steps[s].size(); ++i) {
      if (!same_tensor(a.steps[s][i].sharded, b.steps[s][i].sharded)) return false;
    }
  }
  return true;
}

TEST_F(StepsTest, AmaxMutationsChangeNothingAtOneStep) {
  const Suite suite = make_suite("te", 2, {}, Recipe::kFp8Delayed);
  for (const std::string id :
       {"Linear.column.sp1.default", "Linear.row.sp1.default", "LayerNormMLP.sp1.default"}) {
    const SuiteCase c = case_named(suite, id);
    const CaseRun clean = run_case(c, config_for(2, Recipe::kFp8Delayed, Mutation::kNone, 1));
    for (Mutation m : {Mutation::kAmaxNotReduced, Mutation::kAmaxHistoryNotUpdated}) {
      SCOPED_TRACE(id + " " + std::string(mutation_name(m)));
      EXPECT_EQ(mutation_info(m).first_step, 2);
      const CaseRun one = run_case(c, config_for(2, Recipe::kFp8Delayed, m, 1));
      EXPECT_TRUE(sharded_bitwise_equal(one, clean)) << "visible at one step";
      // From step 2 on the sharded run is another computation (the scales differ).
      const CaseRun two = run_case(c, config_for(2, Recipe::kFp8Delayed, m, 2));
      const CaseRun clean_two =
          run_case(c, config_for(2, Recipe::kFp8Delayed, Mutation::kNone, 2));
      EXPECT_FALSE(sharded_bitwise_equal(two, clean_two)) << "no effect at step 2";
    }
  }
}

std::size_t policy_index(const DefaultJudge& j, PolicyKind kind) {
  for (std::size_t p = 0; p < j.config.policies.size(); ++p) {
    if (j.config.policies[p].kind == kind) return p;
  }
  ADD_FAILURE() << "no policy " << policy_name(kind);
  return 0;
}

// `m` under fp8 on case `id` at `tp`: not caught at one step, caught by `policy` at
// `steps` (the case's verdict names that step as the first failing one), and the case
// passes there without the mutation.
void expect_caught_at(const std::string& id, int tp, Mutation m, int steps,
                      PolicyKind policy = PolicyKind::kTruth) {
  SCOPED_TRACE(id + " tp " + std::to_string(tp) + " " + std::string(mutation_name(m)) + " " +
               std::string(policy_name(policy)));
  const Suite suite = make_suite("te", tp, {}, Recipe::kFp8Delayed);
  const SuiteCase c = case_named(suite, id);
  const DefaultJudge judge = judge_for(Recipe::kFp8Delayed);
  const std::size_t p = policy_index(judge, policy);
  auto judged = [&](Mutation mm, int n) {
    return judge_case(c, tp, run_case(c, config_for(tp, Recipe::kFp8Delayed, mm, n)),
                      judge.config);
  };
  const CaseResult one = judged(m, 1);
  EXPECT_TRUE(one.verdicts[p].passed()) << describe_failure(one, p);
  const CaseResult later = judged(m, steps);
  EXPECT_FALSE(later.verdicts[p].passed()) << "not caught by step " << steps;
  EXPECT_EQ(later.verdicts[p].reason.rfind("step " + std::to_string(steps) + ": ", 0), 0u)
      << later.verdicts[p].reason;
  EXPECT_EQ(deciding_step(later, p).step, steps);
  const CaseResult clean = judged(Mutation::kNone, steps);
  EXPECT_TRUE(clean.verdicts[p].passed()) << "false alarm: " << describe_failure(clean, p);
}

TEST_F(StepsTest, AmaxHistoryNotUpdatedIsCaughtAtStepTwo) {
  // Measured (te, seed 1234): every TransformerLayer case at TP 2 and 4 (34 of 114).
  expect_caught_at("TransformerLayer.sp0.default", 2, Mutation::kAmaxHistoryNotUpdated, 2);
  expect_caught_at("TransformerLayer.sp1.default", 4, Mutation::kAmaxHistoryNotUpdated, 2);
}

TEST_F(StepsTest, AmaxNotReducedIsCaughtFromStepTwo) {
  // The ranks' scales differ by their shards' amax ratio — a few per cent on the suite's
  // Gaussian data — so the FP8 all-gather reads the other ranks' rows that much off.
  // The reference's own rule at its fp8 tolerance sees it in the column-parallel SP cases
  // at step 2 (measured: te fails 15 of 114 at TP 2, 14 at TP 4; here rel. error 0.136
  // at the argmax). On the tensors alone truth's bound (4·√N × single's FP8 error) hides
  // it until the parameters drift (step 5 on TransformerLayer.sp1); the ranks' scales
  // themselves differ from step 2, and truth fails the step on them.
  expect_caught_at("Linear.column.sp1.default", 2, Mutation::kAmaxNotReduced, 2, PolicyKind::kTe);
  expect_caught_at("TransformerLayer.sp1.output_layer_init_method=constant", 2,
                   Mutation::kAmaxNotReduced, 2);
  expect_caught_at("Linear.row.sp0.default", 4, Mutation::kAmaxNotReduced, 2);
  expect_caught_at("LayerNormMLP.sp1.default", 8, Mutation::kAmaxNotReduced, 2);
}

// The seeds of this test are not the suite's default (1234) nor any calibration seed.
constexpr std::uint64_t kHeldOutSeeds[] = {20261205, 77};

TEST_F(StepsTest, ReplicatedQuantizerStateIsOneStateAcrossRanks) {
  // Correct code: every rank holds the same scales and histories at every step, at TP 2,
  // 4 and 8 (the amax max-reduction is exact, so any difference is a bug). amax-not-
  // reduced: the state differs at step 2, and the step fails truth and bitwise on it
  // while te and allclose judge the tensors alone.
  const DefaultJudge judge = judge_for(Recipe::kFp8Delayed);
  for (int tp : {2, 4, 8}) {
    const Suite suite = make_suite("te", tp, {}, Recipe::kFp8Delayed);
    for (const std::string id : {"Linear.column.sp1.default", "LayerNormMLP.sp0.default"}) {
      const SuiteCase c = case_named(suite, id);
      for (std::uint64_t seed : kHeldOutSeeds) {
        SCOPED_TRACE(id + " tp " + std::to_string(tp) + " seed " + std::to_string(seed));
        RunConfig clean_config = config_for(tp, Recipe::kFp8Delayed, Mutation::kNone, 2);
        clean_config.seed = seed;
        const CaseRun clean = run_case(c, clean_config);
        ASSERT_EQ(clean.replicated_state.size(), 2u);
        for (const ReplicatedState& s : clean.replicated_state) {
          EXPECT_GT(s.entries, 0);
          EXPECT_TRUE(s.consistent()) << s.difference;
        }
        RunConfig bug_config = clean_config;
        bug_config.mutation = Mutation::kAmaxNotReduced;
        const CaseResult bug = judge_case(c, tp, run_case(c, bug_config), judge.config);
        EXPECT_TRUE(bug.steps[0].replicated_state.consistent());  // the initial scales
        const ReplicatedState& second = bug.steps[1].replicated_state;
        EXPECT_FALSE(second.consistent());
        EXPECT_NE(second.difference.find("rank "), std::string::npos) << second.difference;
        for (PolicyKind kind : {PolicyKind::kTruth, PolicyKind::kBitwise}) {
          const Verdict& v = bug.steps[1].verdicts[policy_index(judge, kind)];
          EXPECT_FALSE(v.passed());
          EXPECT_EQ(v.reason.rfind("replicated quantizer state differs across ranks: ", 0), 0u)
              << v.reason;
        }
        EXPECT_EQ(bug.steps[1].verdicts[policy_index(judge, PolicyKind::kTe)].reason.find(
                      "replicated"),
                  std::string::npos);
      }
    }
  }
  // A recipe without state across steps has none to compare.
  const SuiteCase c = case_named(make_suite("te", 2, {}, Recipe::kFp8Current),
                                 "Linear.column.sp1.default");
  const CaseRun current = run_case(c, config_for(2, Recipe::kFp8Current, Mutation::kNone, 2));
  for (const ReplicatedState& s : current.replicated_state) {
    EXPECT_EQ(s.entries, 0);
    EXPECT_TRUE(s.consistent());
  }
}

TEST_F(StepsTest, OneStepFp8EscapesAreCaughtAtStepTwo) {
  // recipe_test's known escapes of fp8 at one step; attention-scale-local still escapes
  // (it does under fp8_cs too).
  const Suite suite = make_suite("te", 2, {}, Recipe::kFp8Delayed);
  const DefaultJudge judge = judge_for(Recipe::kFp8Delayed);
  const std::pair<const char*, const char*> kCases[] = {
      {"dgrad-averaged", "TransformerLayer.sp0.default"},
      {"no-dgrad-allreduce", "TransformerLayer.sp0.default"},
      {"norm-grad-not-reduced", "TransformerLayer.sp1.default"},
  };
  for (const auto& [name, id] : kCases) {
    SCOPED_TRACE(name);
    const SuiteCase c = case_named(suite, id);
    const Mutation m = parse_mutation(name);
    const CaseResult one = judge_case(
        c, 2, run_case(c, config_for(2, Recipe::kFp8Delayed, m, 1)), judge.config);
    EXPECT_TRUE(one.verdicts[judge.chosen].passed()) << "no longer an escape at one step";
    const CaseResult two = judge_case(
        c, 2, run_case(c, config_for(2, Recipe::kFp8Delayed, m, 2)), judge.config);
    EXPECT_FALSE(two.verdicts[judge.chosen].passed()) << "not caught at step 2";
  }
}

TEST_F(StepsTest, BadStepsAndARecipesMutationWithoutItAreInputErrors) {
  const Suite suite = make_suite("te", 2, {});
  const SuiteCase c = case_named(suite, "Linear.column.sp0.default");
  for (int steps : {0, -3}) {
    expect_input_error([&] { check_case(c, config_for(2, Recipe::kNone, Mutation::kNone, steps)); },
                       {"--steps " + std::to_string(steps), ">= 1"});
    expect_input_error([&] { run_case(c, config_for(2, Recipe::kNone, Mutation::kNone, steps)); },
                       {std::to_string(steps), "at least 1"});
  }
  expect_input_error(
      [&] { check_case(c, config_for(2, Recipe::kNone, Mutation::kAmaxNotReduced, 2)); },
      {"amax-not-reduced", "--recipe fp8", "--steps 2"});
  const Suite cs = make_suite("te", 2, {}, Recipe::kFp8Current);
  expect_input_error(
      [&] {
        check_case(case_named(cs, "Linear.column.sp0.default"),
                   config_for(2, Recipe::kFp8Current, Mutation::kAmaxHistoryNotUpdated, 2));
      },
      {"amax-history-not-updated", "recipe fp8_cs", "--recipe fp8"});
}

}  // namespace
}  // namespace tpcheck::testing

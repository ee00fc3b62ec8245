// tests/suite/recipe_test.cpp — the quantized recipes end to end (`tpcheck run --recipe`),
// judged as the CLI judges (truth the default policy, truth's run never quantized):
//   * no false alarm: every case of the `te` suite under fp8_cs, and the TransformerLayer
//     cases under fp8, mxfp8 and nvfp4, at TP 2 on a held-out seed (1001; the rule for the
//     quantized classes was set on seed 1234, docs/POLICIES.md);
//   * detection: every mutation the te suite can see is caught by `truth` under every
//     recipe, on the three TransformerLayer cases that between them reach every injected
//     site (default with SP off and on, parallel_attention_mlp for the row bias), at TP 2
//     — except the escapes measured and explained in known_escapes();
//   * the reference's blind spot: under fp8_cs the `te` policy with the reference's
//     tolerances (rtol 0.4, atol 0.25) passes every case of dgrad-averaged (measured:
//     0 of 118 fail; truth fails 90), so the recipe's tolerance hides a real TP bug;
//   * suite construction: per-recipe sizes, case changes, and shapes a recipe cannot
//     quantize rejected by check_case before any case runs.
// Block scaling runs only in the construction test: its reference sizes (seq 128, batch
// 128) give TransformerLayer tp·16384 tokens, minutes per case on the CPU
// (docs/QUANTIZATION.md, "In the layers").
// Cost, measured on the 2-core machine: about 3 minutes.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "layers/layer_test_support.h"  // expect_input_error
#include "suite/suite_run_support.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"
#include "tpcheck/suite.h"

namespace tpcheck::testing {
namespace {

constexpr int kTp = 2;

std::vector<SuiteCase> cases_matching(const Suite& suite, const std::string& prefix) {
  std::vector<SuiteCase> out;
  for (const SuiteCase& c : suite.cases) {
    if (c.id.rfind(prefix, 0) == 0) out.push_back(c);
  }
  return out;
}

// The judge the CLI builds under a recipe: every policy, te/allclose at the reference's
// tolerances for the recipe.
DefaultJudge recipe_judge(Recipe recipe) {
  DefaultJudge j = default_judge();
  const RecipeTolerance t = reference_recipe_tolerance(recipe);
  j.config.compare = CompareOptions{t.rtol, t.atol};
  return j;
}

std::size_t policy_index(const DefaultJudge& j, PolicyKind kind) {
  for (std::size_t p = 0; p < j.config.policies.size(); ++p) {
    if (j.config.policies[p].kind == kind) return p;
  }
  ADD_FAILURE() << "no policy " << policy_name(kind);
  return 0;
}

RunConfig config_for(Recipe recipe, Mutation m, std::uint64_t seed) {
  RunConfig config;
  config.tp = kTp;
  config.seed = seed;
  config.recipe = recipe;
  config.mutation = m;
  return config;
}

class RecipeNoFalseAlarm : public ::testing::TestWithParam<Recipe> {
 protected:
  void SetUp() override { set_cpu_gemm_threads(1); }
};

TEST_P(RecipeNoFalseAlarm, TruthPassesOnAHeldOutSeed) {
  const Recipe recipe = GetParam();
  const Suite suite = make_suite("te", kTp, {}, recipe);
  const std::vector<SuiteCase> cases =
      recipe == Recipe::kFp8Current ? suite.cases : cases_matching(suite, "TransformerLayer.");
  const DefaultJudge judge = recipe_judge(recipe);
  const RunConfig config = config_for(recipe, Mutation::kNone, 1001);
  for (const SuiteCase& c : cases) {
    const CaseResult r = judge_case(c, kTp, run_case(c, config), judge.config);
    EXPECT_TRUE(r.verdicts[judge.chosen].passed())
        << "false alarm: " << describe_failure(r, judge.chosen);
  }
  std::cout << "[ cases    ] " << recipe_name(recipe) << ": " << cases.size() << "\n";
}

INSTANTIATE_TEST_SUITE_P(Recipes, RecipeNoFalseAlarm,
                         ::testing::Values(Recipe::kFp8Current, Recipe::kFp8Delayed,
                                           Recipe::kMxfp8, Recipe::kNvfp4),
                         [](const auto& p) { return std::string(recipe_name(p.param)); });

class RecipeDetection : public ::testing::TestWithParam<Recipe> {
 protected:
  void SetUp() override { set_cpu_gemm_threads(1); }
};

// The mutations the te suite can see at one step (the full suite's four need its cases;
// delayed scaling's amax bugs need a second step: tests/suite/steps_test.cpp).
bool te_visible(Mutation m) {
  for (const char* full_only : {"gated-fc1-one-block", "qkv-one-block", "gqa-wrong-group",
                                "window-offset"}) {
    if (mutation_name(m) == full_only) return false;
  }
  return mutation_info(m).recipe == Recipe::kNone;
}

// Mutations `truth` does not catch on these three cases under a recipe at one step
// (measured at seed 1234, 2026-12-02, with the scale test; docs/QUANTIZATION.md "Judging"
// gives the whole-suite tables and the reasons). Everything else must be caught, so
// detection cannot quietly weaken; a mutation leaving this list is an improvement (update
// it and the doc).
//   fp8 (delayed scaling, step 1): the scale is the initial 1, so the E5M2 gradients of
//     size 1e-3..1e-5 land in E5M2's subnormals or flush to zero — single's gradient error
//     is then as large as the bugs that act on gradients, and itself a rescaling (the
//     scale test's floor follows it);
//   nvfp4: column-bias-not-sharded adds the wrong bias shard to rows whose values are
//     10–20 % rounding already — not a rescaling; the whole te suite catches it (21 cases
//     at TP 2, 42 at TP 8, on the H200).
// Before the scale test (truth's bounds alone) attention-scale-local escaped here under
// fp8_cs, fp8 and nvfp4, and nvfp4 also let norm-grad-not-reduced and dgrad-averaged by.
std::vector<std::string> known_escapes(Recipe recipe) {
  switch (recipe) {
    case Recipe::kFp8Delayed:
      return {"norm-grad-not-reduced", "dgrad-averaged", "no-dgrad-allreduce"};
    case Recipe::kNvfp4:
      return {"column-bias-not-sharded"};
    default:
      return {};
  }
}

TEST_P(RecipeDetection, TruthCatchesEveryMutationButTheMeasuredEscapes) {
  const Recipe recipe = GetParam();
  const std::vector<std::string> escapes = known_escapes(recipe);
  const Suite suite = make_suite("te", kTp, {}, recipe);
  std::vector<SuiteCase> cases;
  for (const std::string id :
       {"TransformerLayer.sp0.default", "TransformerLayer.sp1.default",
        "TransformerLayer.sp0.parallel_attention_mlp=true"}) {
    for (const SuiteCase& c : suite.cases) {
      if (c.id == id) cases.push_back(c);
    }
  }
  ASSERT_EQ(cases.size(), 3u);
  const DefaultJudge judge = recipe_judge(recipe);
  for (const MutationInfo& info : all_mutations()) {
    const Mutation m = info.mutation;
    if (!te_visible(m)) continue;
    if (std::find(escapes.begin(), escapes.end(), mutation_name(m)) != escapes.end()) continue;
    SCOPED_TRACE(std::string(mutation_name(m)));
    bool caught = false;
    for (const SuiteCase& c : cases) {
      const CaseResult r =
          judge_case(c, kTp, run_case(c, config_for(recipe, m, 1234)), judge.config);
      if (!r.verdicts[judge.chosen].passed()) {
        caught = true;
        break;
      }
    }
    EXPECT_TRUE(caught) << mutation_name(m) << " escapes truth under " << recipe_name(recipe);
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, RecipeDetection,
                         ::testing::Values(Recipe::kFp8Current, Recipe::kFp8Delayed,
                                           Recipe::kMxfp8, Recipe::kNvfp4),
                         [](const auto& p) { return std::string(recipe_name(p.param)); });

// The reference's tolerance for fp8_cs hides dgrad-averaged in every case; truth sees it.
TEST(RecipeBlindSpot, Fp8CurrentScalingToleranceHidesDgradAveraged) {
  set_cpu_gemm_threads(1);
  const Suite suite = make_suite("te", kTp, {}, Recipe::kFp8Current);
  const DefaultJudge judge = recipe_judge(Recipe::kFp8Current);
  const std::size_t te = policy_index(judge, PolicyKind::kTe);
  const RunConfig config = config_for(Recipe::kFp8Current, parse_mutation("dgrad-averaged"), 1234);
  int te_failed = 0, truth_failed = 0;
  for (const SuiteCase& c : cases_matching(suite, "LayerNormMLP.")) {
    const CaseResult r = judge_case(c, kTp, run_case(c, config), judge.config);
    te_failed += !r.verdicts[te].passed();
    truth_failed += !r.verdicts[judge.chosen].passed();
  }
  std::cout << "[ measured ] LayerNormMLP cases failed by te " << te_failed << ", by truth "
            << truth_failed << "\n";
  EXPECT_EQ(te_failed, 0) << "te at rtol 0.4 / atol 0.25 now sees dgrad-averaged";
  // Measured (seed 1234): 26 of the 26 LayerNormMLP cases (22 by the bounds alone, the fc1
  // input gradient halved; the scale test adds 4); at least 20 required.
  EXPECT_GE(truth_failed, 20);
}

TEST(RecipeSuite, SizesAndCaseChangesFollowTheReference) {
  const Suite fp8 = make_suite("te", 4, {}, Recipe::kFp8Delayed);
  const SuiteCase tl = cases_matching(fp8, "TransformerLayer.sp0.default").front();
  EXPECT_EQ(tl.input_shape, (Shape{4 * 32, 32, 128}));  // seq 32 per rank, batch 32, hidden 128
  EXPECT_EQ(tl.options["ffn_hidden_size"], 128);
  // Delayed scaling does not offer save_original_input; the reference's 118 less 4.
  EXPECT_EQ(fp8.cases.size(), 114u);
  EXPECT_TRUE(cases_matching(fp8, "Linear.column.sp0.save_original_input").empty());
  // NVFP4: the params_dtype case in bf16.
  const Suite nvfp4 = make_suite("te", 2, {}, Recipe::kNvfp4);
  EXPECT_FALSE(cases_matching(nvfp4, "Linear.row.sp1.params_dtype=bf16").empty());
  EXPECT_TRUE(cases_matching(nvfp4, "Linear.row.sp1.params_dtype=f16").empty());
  // MXFP8 at TP 8: hidden raised so each rank's weight shard is a multiple of 32.
  const Suite mx8 = make_suite("te", 8, {}, Recipe::kMxfp8);
  EXPECT_EQ(cases_matching(mx8, "TransformerLayer.sp0.default").front().input_shape.back(), 256);
}

TEST(RecipeSuite, ShapesARecipeCannotQuantizeAreRejectedBeforeRunning) {
  // --seq 24: LayerNormLinear's 24 tokens are not a multiple of MXFP8's 32.
  SuiteSizes sizes;
  sizes.seq = 24;
  const Suite suite = make_suite("te", 2, sizes, Recipe::kMxfp8);
  const SuiteCase c = cases_matching(suite, "LayerNormLinear.column.sp0.default").front();
  expect_input_error([&] { check_case(c, config_for(Recipe::kMxfp8, Mutation::kNone, 1234)); },
                     {"24", "multiple of 32"});
}

}  // namespace
}  // namespace tpcheck::testing

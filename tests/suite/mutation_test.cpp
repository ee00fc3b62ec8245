// tests/suite/mutation_test.cpp — the checker catches real TP bugs: for every mutation in
// all_mutations() and TP 2, 4 and 8, the default policy (`truth`, judged exactly as
// `tpcheck run` judges: every policy, default CompareOptions, default sizes and seed)
// fails at least one case of the `te` suite.
//
// One test per (tp, mutation). Cases run in suite order and the test stops at the first
// case the default policy fails, printing which one caught the bug (cheap Linear cases
// come first; attention-only bugs run through to the TransformerLayer cases); that case is
// then run once more without the mutation and must pass, so a false alarm is no catch.
// Measured: the whole binary (36 tests) takes a few seconds on the loaded 2-core machine.
#include "tpcheck/mutation.h"

#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <string>

#include "suite/suite_run_support.h"
#include "tpcheck/suite.h"

namespace tpcheck::testing {
namespace {

struct MutationParam {
  int tp;
  MutationInfo info;
};

std::vector<MutationParam> all_params() {
  std::vector<MutationParam> out;
  for (int tp : {2, 4, 8}) {
    for (const MutationInfo& m : all_mutations()) out.push_back({tp, m});
  }
  return out;
}

// gtest names allow [A-Za-z0-9_]: "tp4_no_row_allreduce".
std::string param_name(const ::testing::TestParamInfo<MutationParam>& p) {
  std::string name = "tp" + std::to_string(p.param.tp) + "_" + std::string(p.param.info.name);
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

// The suite is the same for every mutation at one tp: build it once per tp.
const Suite& suite_for(int tp) {
  static std::map<int, Suite> suites;
  auto it = suites.find(tp);
  if (it == suites.end()) it = suites.emplace(tp, make_suite("te", tp, SuiteSizes{})).first;
  return it->second;
}

class MutationCaught : public ::testing::TestWithParam<MutationParam> {
 protected:
  void SetUp() override { set_cpu_gemm_threads(1); }  // as the CLI does
};

TEST_P(MutationCaught, DefaultPolicyFailsSomeCase) {
  const MutationParam& param = GetParam();
  ASSERT_NE(param.info.mutation, Mutation::kNone);
  ASSERT_EQ(parse_mutation(param.info.name), param.info.mutation);  // the CLI's lookup

  const Suite& suite = suite_for(param.tp);
  ASSERT_EQ(suite.cases.size(), 118u);
  const DefaultJudge judge = default_judge();
  RunConfig config;  // the CLI's defaults: seed 1234, --cpu-gemm fp32
  config.tp = param.tp;
  config.mutation = param.info.mutation;

  int ran = 0;
  for (const SuiteCase& c : suite.cases) {
    ++ran;
    const CaseResult r = judge_case(c, param.tp, run_case(c, config), judge.config);
    if (!r.verdicts[judge.chosen].passed()) {
      std::cout << "[ caught   ] " << param.info.name << " at tp " << param.tp << " by case " << ran
                << "/" << suite.cases.size() << ": " << describe_failure(r, judge.chosen);
      RecordProperty("caught_by", c.id);
      // A catch counts only if the same case passes without the bug (not a false alarm).
      RunConfig clean = config;
      clean.mutation = Mutation::kNone;
      const CaseResult baseline = judge_case(c, param.tp, run_case(c, clean), judge.config);
      EXPECT_TRUE(baseline.verdicts[judge.chosen].passed())
          << "case " << c.id << " that caught " << param.info.name
          << " also fails without any mutation: " << describe_failure(baseline, judge.chosen);
      return;
    }
  }
  FAIL() << "mutation '" << param.info.name << "' (" << param.info.description << ") passed all "
         << ran << " cases of the te suite at tp " << param.tp
         << " under the default policy: the checker misses this bug";
}

INSTANTIATE_TEST_SUITE_P(EveryMutation, MutationCaught, ::testing::ValuesIn(all_params()),
                         param_name);

}  // namespace
}  // namespace tpcheck::testing

// tests/suite/seeds_test.cpp — no false alarms: without a mutation, the default policy
// (`truth`, judged as `tpcheck run` judges) passes every case of the `te` and the `full`
// suites for many seeds at TP 2, 4 and 8. Each seed draws new parameters, inputs and targets, so this is
// the statistical side of the truth policy's calibration (docs/POLICIES.md).
//
// One test per (tp, seed). Cost, measured with the whole suite per seed on the shared
// 2-core machine under load (~7 other builds): tp 2 ≈ 4 s, tp 4 ≈ 8 s, tp 8 ≈ 20 s per
// seed. All 20 seeds at all three sizes would be ≈ 600-700 s, over the 10-minute budget,
// so: 20 seeds at tp 2 and tp 4 (the CLI default), 8 at tp 8 — see kSeedsPerTp. Measured
// total for this binary under ctest: 270 s (tp 2 ≈ 3.4 s, tp 4 ≈ 7 s, tp 8 ≈ 17 s a seed).
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <string>

#include "suite/suite_run_support.h"
#include "tpcheck/suite.h"

namespace tpcheck::testing {
namespace {

struct SeedParam {
  std::string suite;
  int tp;
  std::uint64_t seed;
};

// Seeds kFirstSeed.. (n per tp, see the cost figures above). Held out: disjoint from the
// calibration seeds 1-20 that set the truth policy's constants and from the seeds of
// scripts/calibrate.py (2001.., sample 3001..), as docs/POLICIES.md records, so this test
// checks the constants on data they were not chosen from.
constexpr std::uint64_t kFirstSeed = 1001;
constexpr std::pair<int, int> kSeedsPerTp[] = {{2, 20}, {4, 20}, {8, 8}};
// The `full` suite (181 cases, bf16 and the paths te never reaches): fewer seeds, as it
// costs about twice the te suite per seed (tp 8: hidden 128, 32 heads).
constexpr std::pair<int, int> kFullSeedsPerTp[] = {{2, 8}, {4, 6}, {8, 3}};

std::vector<SeedParam> all_params() {
  std::vector<SeedParam> out;
  for (const auto& [tp, n] : kSeedsPerTp) {
    for (int s = 0; s < n; ++s) out.push_back({"te", tp, kFirstSeed + static_cast<std::uint64_t>(s)});
  }
  for (const auto& [tp, n] : kFullSeedsPerTp) {
    for (int s = 0; s < n; ++s) {
      out.push_back({"full", tp, kFirstSeed + static_cast<std::uint64_t>(s)});
    }
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<SeedParam>& p) {
  return p.param.suite + "_tp" + std::to_string(p.param.tp) + "_seed" +
         std::to_string(p.param.seed);
}

class NoFalseAlarm : public ::testing::TestWithParam<SeedParam> {
 protected:
  void SetUp() override { set_cpu_gemm_threads(1); }  // as the CLI does
};

TEST_P(NoFalseAlarm, DefaultPolicyPassesEveryCase) {
  const auto& [suite_name, tp, seed] = GetParam();
  const auto start = std::chrono::steady_clock::now();
  const Suite suite = make_suite(suite_name, tp, SuiteSizes{});
  const DefaultJudge judge = default_judge();
  RunConfig config;  // --cpu-gemm fp32, no mutation
  config.tp = tp;
  config.seed = seed;

  for (const SuiteCase& c : suite.cases) {
    const CaseResult r = judge_case(c, tp, run_case(c, config), judge.config);
    if (!r.verdicts[judge.chosen].passed()) {
      ADD_FAILURE() << "false alarm at seed " << seed << ": " << describe_failure(r, judge.chosen);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ seconds  ] " << suite_name << " tp " << tp << " seed " << seed << ": " << suite.cases.size()
            << " cases in " << seconds << " s\n";
}

INSTANTIATE_TEST_SUITE_P(Seeds, NoFalseAlarm, ::testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace tpcheck::testing

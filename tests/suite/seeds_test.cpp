// tests/suite/seeds_test.cpp — no false alarms: without a mutation, the default policy
// (`truth`, judged as `tpcheck run` judges) passes every case of the `te` and the `full`
// suites for many seeds at TP 2, 4 and 8. Each seed draws new parameters, inputs and
// targets, so this is the statistical side of the truth policy's calibration
// (docs/POLICIES.md).
//
// One test per (suite, tp, seed). The pool: 20 te seeds at tp 2 and tp 4 (the CLI
// default), 8 at tp 8; 8 / 6 / 3 full-suite seeds. Cost per seed on the 2-core machine:
// te tp 2 ≈ 3.4 s, tp 4 ≈ 7 s, tp 8 ≈ 17 s; the full suite about twice that — about
// 10 minutes for the pool. The quick run (scripts/test.sh) takes a block of each
// (suite, tp) pool that rotates by day (kPools; tests/support/test_depth.h),
// so consecutive days run every seed; scripts/test.sh --long runs the whole pool.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <string>

#include "suite/suite_run_support.h"
#include "support/test_depth.h"
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
struct Pool {
  const char* suite;
  int tp;
  int seeds;        // the whole pool (--long)
  int quick_seeds;  // the day's block (quick run)
};
// The `full` suite (181 cases, bf16 and the paths te never reaches) has fewer seeds, as it
// costs about twice the te suite per seed (tp 8: hidden 128, 32 heads).
constexpr Pool kPools[] = {
    {"te", 2, 20, 3}, {"te", 4, 20, 3}, {"te", 8, 8, 1},
    {"full", 2, 8, 1}, {"full", 4, 6, 1}, {"full", 8, 3, 1},
};

std::vector<SeedParam> all_params() {
  std::vector<SeedParam> out;
  std::uint64_t salt = 0;
  for (const Pool& pool : kPools) {
    std::vector<SeedParam> all;
    for (int s = 0; s < pool.seeds; ++s) {
      all.push_back({pool.suite, pool.tp, kFirstSeed + static_cast<std::uint64_t>(s)});
    }
    for (const SeedParam& p : rotating_sample(all, pool.quick_seeds, salt++)) out.push_back(p);
  }
  std::cout << "[ sample   ] " << (long_run() ? "every seed (TPCHECK_TEST_LONG=1)" : "day's block")
            << ", TPCHECK_TEST_ROTATION=" << rotation() << "\n";
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

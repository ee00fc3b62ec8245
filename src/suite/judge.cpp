// judge_case: statistics for every compared tensor, every policy's verdict, and the GEMM
// sites whose numerical class differs between the single and the sharded run.
#include "tpcheck/error.h"
#include "tpcheck/suite.h"

namespace tpcheck {

CaseResult judge_case(const SuiteCase& c, int tp, const CaseRun& run, const JudgeConfig& config) {
  CaseResult result;
  result.spec = c;
  result.tp = tp;
  result.seconds = run.seconds;
  result.gemm_count_single = run.single_gemms.size();
  result.gemm_count_sharded = run.sharded_gemms.size();
  result.gemm_class_diffs = diff_gemm_classes(run.single_gemms, run.sharded_gemms);

  for (const ComparedTensor& t : run.tensors) {
    TensorResult r{t.name, t.kind, t.index,
                   compare_tensors(t.sharded, t.single, &t.truth, config.compare), {}};
    for (const Policy& p : config.policies) r.verdicts.push_back(evaluate(p, r.comparison));
    result.tensors.push_back(std::move(r));
  }

  // A case's verdict under a policy: its worst tensor's (fail > warning > pass).
  for (std::size_t p = 0; p < config.policies.size(); ++p) {
    Verdict v{VerdictStatus::kPass, "every tensor passes"};
    for (const TensorResult& t : result.tensors) {
      const Verdict& tv = t.verdicts[p];
      if (tv.status > v.status) v = Verdict{tv.status, t.name + ": " + tv.reason};
    }
    result.verdicts.push_back(std::move(v));
  }
  return result;
}

int worst_tensor(const CaseResult& result, std::size_t p) {
  int worst = -1;
  for (std::size_t i = 0; i < result.tensors.size(); ++i) {
    const TensorResult& t = result.tensors[i];
    if (!t.verdicts[p].passed()) return static_cast<int>(i);
    if (worst < 0 || t.comparison.norm_rel_diff > result.tensors[worst].comparison.norm_rel_diff) {
      worst = static_cast<int>(i);
    }
  }
  return worst;
}

}  // namespace tpcheck

// tests/suite/suite_run_support.h — running suite cases the way `tpcheck run` does, for the
// end-to-end tests (mutation_test, seeds_test).
//
// "The default policy" means exactly what src/cli/main.cpp does without --policy: every
// policy of policy_names() is judged (so the truth policy gets its per-case u and K from
// judge_case), default CompareOptions, and the verdict that counts is the `truth` entry.
// Thread safety: run from one thread (run_case starts its own rank threads).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/numerics.h"
#include "tpcheck/suite.h"

namespace tpcheck::testing {

// The CLI's JudgeConfig and the index of its default policy ("truth") in it.
struct DefaultJudge {
  JudgeConfig config;
  std::size_t chosen = 0;
};

inline DefaultJudge default_judge() {
  DefaultJudge j;
  const Policy chosen = parse_policy("truth");  // the CLI's default --policy
  for (const std::string& name : policy_names()) j.config.policies.push_back(parse_policy(name));
  for (std::size_t p = 0; p < j.config.policies.size(); ++p) {
    if (j.config.policies[p].kind == chosen.kind) j.chosen = p;
  }
  return j;
}

// One line per tensor failing policy `p`: name, the statistics and the verdict's reason.
inline std::string describe_failure(const CaseResult& r, std::size_t p) {
  std::ostringstream out;
  out << r.spec.id << " (tp " << r.tp << "): " << r.verdicts[p].reason << "\n";
  const StepResult& step = deciding_step(r, p);
  if (r.steps.size() > 1) out << "  at step " << step.step << " of " << r.steps.size() << "\n";
  for (const TensorResult& t : step.tensors) {
    if (t.verdicts[p].passed()) continue;
    const TensorComparison& c = t.comparison;
    out << "  tensor " << t.name << " [" << t.kind << "]: max |diff| " << c.max_abs_diff << " at "
        << c.argmax << ", norm-wise " << c.norm_rel_diff << ", vs truth: sharded max "
        << c.sharded_vs_truth.max_abs << " rms " << c.sharded_vs_truth.rms << ", single max "
        << c.single_vs_truth.max_abs << " rms " << c.single_vs_truth.rms
        << "\n    why: " << t.verdicts[p].reason << "\n";
  }
  return out.str();
}

}  // namespace tpcheck::testing

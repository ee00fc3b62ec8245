// Console report: a line per case, reference-style failure lines, the closing summary.
#include <fmt/ostream.h>

#include "tpcheck/names.h"
#include "tpcheck/report.h"

namespace tpcheck {
namespace {

std::string_view status_word(VerdictStatus s) {
  switch (s) {
    case VerdictStatus::kPass: return "PASS";
    case VerdictStatus::kWarning: return "WARN";
    case VerdictStatus::kFail: return "FAIL";
  }
  return "?";
}

}  // namespace

Summary summarize(const std::vector<CaseResult>& results, std::size_t chosen_policy) {
  Summary s;
  for (const CaseResult& r : results) (r.verdicts[chosen_policy].passed() ? s.passed : s.failed)++;
  return s;
}

void print_header(std::ostream& out, const RunSettings& settings, std::size_t case_count) {
  fmt::print(out, "tpcheck: suite {} | {} case{} | backend {} | tp {} | seed {} | cpu-gemm {} | policy {}{}{}{}\n",
             settings.suite, case_count, case_count == 1 ? "" : "s", settings.backend, settings.tp, settings.seed,
             settings.cpu_gemm, policy_name(settings.policies[settings.chosen_policy].kind),
             settings.recipe == "none" ? "" : " | recipe " + settings.recipe,
             settings.steps == 1 ? "" : fmt::format(" | steps {}", settings.steps),
             settings.mutation == "none" ? "" : " | mutation " + settings.mutation);
  for (const std::string& note : settings.notes) fmt::print(out, "note: {}\n", note);
}

void print_case(std::ostream& out, const CaseResult& result, const RunSettings& settings) {
  const std::size_t chosen = settings.chosen_policy;
  std::string all;
  for (std::size_t p = 0; p < settings.policies.size(); ++p) {
    all += fmt::format(" {}={}", policy_name(settings.policies[p].kind),
                       verdict_status_name(result.verdicts[p].status));
  }
  const bool several_steps = result.steps.size() > 1;
  std::string worst = "-";
  if (int w = worst_tensor(result, chosen); w >= 0) {
    const StepResult& step = deciding_step(result, chosen);
    const TensorResult& t = step.tensors[w];
    worst = fmt::format("{}{} (max |diff| {:.3g}, norm-wise {:.3g})",
                        several_steps ? fmt::format("step {}: ", step.step) : "", t.name,
                        t.comparison.max_abs_diff, t.comparison.norm_rel_diff);
  }
  fmt::print(out, "{} {:<60} |{} | worst: {}\n", status_word(result.verdicts[chosen].status),
             result.spec.id, all, worst);
  if (!result.verdicts[chosen].passed()) {
    fmt::print(out, "     why: {}\n", result.verdicts[chosen].reason);
  }
  // The reference suite's own line for every tensor failing `te` (its param index or
  // "outputs", as it prints them), at the first step te fails.
  for (std::size_t p = 0; p < settings.policies.size(); ++p) {
    if (settings.policies[p].kind != PolicyKind::kTe) continue;
    const StepResult& step = deciding_step(result, p);
    for (const TensorResult& t : step.tensors) {
      if (t.verdicts[p].passed() || !t.comparison.has_tolerance || t.comparison.numel == 0) continue;
      const std::string label = t.kind == names::kParameterGradient ? std::to_string(t.index)
                                : t.kind == names::kInputGradient   ? "input"
                                                             : "outputs";
      fmt::print(out, "     {}{}  [{}]\n", several_steps ? fmt::format("step {}: ", step.step) : "",
                 format_te_failure(label, t.comparison), t.name);
    }
  }
  for (const GemmClassDiff& d : result.gemm_class_diffs) {
    if (d.class_differs) {
      fmt::print(out, "     gemm class differs at {}: single {} (m={} n={} k={}) vs sharded {} (m={} n={} k={})\n",
                 d.site, math_class_name(d.single.math_class), d.single.m, d.single.n, d.single.k,
                 math_class_name(d.sharded.math_class), d.sharded.m, d.sharded.n, d.sharded.k);
    }
    // The cuBLASLt algorithm (on the CPU the class is all there is), with or without a
    // class change: the single and sharded shapes ran different kernels.
    if (d.single.cublaslt && d.sharded.cublaslt && d.algorithm_differs) {
      fmt::print(out, "     gemm algorithm differs at {}: single {} (m={} n={} k={}) vs sharded {} (m={} n={} k={})\n",
                 d.site, d.single.implementation, d.single.m, d.single.n, d.single.k,
                 d.sharded.implementation, d.sharded.m, d.sharded.n, d.sharded.k);
    }
  }
}

void print_summary(std::ostream& out, const Summary& summary, const RunSettings& settings) {
  fmt::print(out, "{} passed, {} failed\n", summary.passed, summary.failed);
}

}  // namespace tpcheck

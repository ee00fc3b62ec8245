// explain_case.cpp — explain_case: the recorded run, the GEMM attribution, the counterfactual
// re-runs and the closing sentence (see tpcheck/explain.h, docs/FORENSICS.md).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "explain/recorder.h"
#include "explain/trail.h"
#include "tpcheck/error.h"
#include "tpcheck/explain.h"
#include "tpcheck/names.h"

namespace tpcheck {
namespace {

using explain::ExplainRecorders;
using explain::GemmForcing;

double norm_rel(const Tensor& x, const Tensor& ref) {
  const std::vector<double> a = x.to_f64(), b = ref.to_f64();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

bool is_forward_site(const std::string& site) {
  return site.size() >= 4 && site.compare(site.size() - 4, 4, "/fwd") == 0;
}

// "mlp.fc2" from "mlp.fc2/fwd → add_bias".
std::string module_of(const std::string& name) {
  const std::size_t slash = name.find('/');
  return slash == std::string::npos ? name : name.substr(0, slash);
}

std::string class_words(const GemmRecord& r) {
  if (r.cublaslt)
    return fmt::format("{} ({})", math_class_name(r.math_class), r.cublaslt->numerical_impl);
  return std::string(math_class_name(r.math_class));
}

std::string times(double ratio) {
  if (!std::isfinite(ratio)) return "∞×";
  if (ratio >= 100) return fmt::format("{:.1e}×", ratio);
  return fmt::format("{:.2g}×", ratio);
}

// The forcing of one direction: every site in `sites` set to the other run's record.
GemmForcing forcing_for(const std::vector<GemmClassDiff>& diffs, const std::set<std::string>& sites,
                        bool force_sharded) {
  GemmForcing f;
  for (const GemmClassDiff& d : diffs) {
    if (!sites.count(d.site) || f.sites.count(d.site)) continue;
    const GemmRecord& to = force_sharded ? d.single : d.sharded;
    f.sites[d.site] = GemmForcing::Target{to.math_class, to.cublaslt};
  }
  return f;
}

std::string forced_words(const GemmForcing& f) {
  std::string out;
  for (const auto& [site, t] : f.sites) {
    if (!out.empty()) out += ", ";
    out += std::string(math_class_name(t.math_class));
    if (t.algorithm)
      out += fmt::format(" algo {} {} {}", t.algorithm->algo_id, t.algorithm->tile_name,
                         t.algorithm->stages_name);
    if (f.sites.size() > 1) out += " at " + site;
  }
  return out;
}

// The truth policy's index in judge.policies, after checking explain_case's REQUIRES.
std::size_t check_inputs(const RunConfig& config, const JudgeConfig& judge,
                         const ExplainOptions& options) {
  TPCHECK_CHECK_INPUT(config.tp >= 2,
                      "tpcheck explain compares a sharded run: --tp must be >= 2, got {}",
                      config.tp);
  TPCHECK_CHECK_INPUT(options.chosen_policy < judge.policies.size(), "explain: no policy {}",
                      options.chosen_policy);
  // The trail lines up one forward and backward; later steps would append theirs to the
  // same recordings.
  TPCHECK_CHECK_INPUT(config.steps == 1,
                      "tpcheck explain looks at one training step; --steps {} is for tpcheck run "
                      "(the run's report names the step that fails)",
                      config.steps);
  std::size_t truth_policy = judge.policies.size();
  for (std::size_t p = 0; p < judge.policies.size(); ++p) {
    if (judge.policies[p].kind == PolicyKind::kTruth) truth_policy = p;
  }
  TPCHECK_CHECK(truth_policy < judge.policies.size(),
                "explain needs the truth policy among the judged ones");
  return truth_policy;
}

// 1. The recorded run: the case run with every op recorded, judged, and its trail (the
// sharded run's ops lined up against single's and truth's).
void record_run(const SuiteCase& c, const RunConfig& config, const JudgeConfig& judge,
                std::size_t truth_policy, CaseExplanation& out) {
  ExplainRecorders recorders(true, {}, {});
  RunConfig recorded = config;
  recorded.execution = recorders.wrap(config.execution);
  out.run = run_case(c, recorded);
  out.result = judge_case(c, config.tp, out.run, judge);
  const auto single = recorders.single();
  const auto truth = recorders.truth();
  const auto sharded = recorders.sharded();
  TPCHECK_CHECK(single && static_cast<int>(sharded.size()) == config.tp,
                "explain: the runs were not recorded (single {}, {} sharded ranks)",
                single != nullptr, sharded.size());
  out.trail =
      explain::build_trail(*single, truth.get(), sharded, out.result.policies[truth_policy].truth);
}

// The tensors to explain, as indices into the step's tensors.
struct PickedTensors {
  std::vector<int> index;
  bool failing = false;  // they fail the chosen policy (else: the worst one alone)
};

// The failing tensors, else the worst; the one the case's line names first
// (worst_tensor: the first failing one), then the rest by their difference; at most
// options.max_tensors.
PickedTensors pick_tensors(const CaseResult& result, const ExplainOptions& options) {
  const StepResult& step = result.steps.front();
  PickedTensors picked;
  for (std::size_t i = 0; i < step.tensors.size(); ++i) {
    if (!step.tensors[i].verdicts[options.chosen_policy].passed())
      picked.index.push_back(static_cast<int>(i));
  }
  picked.failing = !picked.index.empty();
  if (!picked.failing) {
    const int w = worst_tensor(result, options.chosen_policy);
    if (w >= 0) picked.index.push_back(w);
  }
  const int deciding = worst_tensor(result, options.chosen_policy);
  std::stable_sort(picked.index.begin(), picked.index.end(), [&](int a, int b) {
    if ((a == deciding) != (b == deciding)) return a == deciding;
    return step.tensors[a].comparison.norm_rel_diff > step.tensors[b].comparison.norm_rel_diff;
  });
  if (static_cast<int>(picked.index.size()) > options.max_tensors)
    picked.index.resize(options.max_tensors);
  return picked;
}

// The first trail entry that diverges (an output looks at the forward only); -1 none.
int first_divergence(const std::vector<TrailEntry>& trail, bool output) {
  for (const TrailEntry& e : trail) {
    if (output && explain::is_backward(e)) break;
    if (e.diverges) return e.order;
  }
  return -1;
}

// 2. GEMM attribution: each picked tensor's explanation with the sites upstream of it whose
// class or algorithm differs, and its first divergence on the trail. Returns every such
// site once, in the order first met (the ones to force).
std::vector<std::string> attribute(const PickedTensors& picked, CaseExplanation& out) {
  const CaseResult& result = out.result;
  const StepResult& step = result.steps.front();
  std::set<std::string> seen;
  std::vector<std::string> site_order;
  for (int i : picked.index) {
    const TensorResult& t = step.tensors[i];
    TensorExplanation x;
    x.name = t.name;
    x.kind = t.kind;
    x.failing = picked.failing;
    x.norm_rel_diff = t.comparison.norm_rel_diff;
    x.max_abs_diff = t.comparison.max_abs_diff;
    x.single_err = t.comparison.single_vs_truth.rms;
    x.sharded_err = t.comparison.sharded_vs_truth.rms;
    const bool output = t.kind == names::kOutput;
    for (const GemmClassDiff& d : result.gemm_class_diffs) {
      if (output && !is_forward_site(d.site)) continue;  // outputs depend on the forward only
      x.upstream_diffs.push_back(d);
      if (seen.insert(d.site).second) site_order.push_back(d.site);
    }
    x.first_divergence = first_divergence(out.trail, output);
    out.tensors.push_back(std::move(x));
  }
  return site_order;
}

// One counterfactual re-run: the sites in `group` forced in one direction (the sharded
// run to single's records, or single to the sharded run's), and what remains of each
// explained tensor's difference.
Counterfactual rerun_forced(const SuiteCase& c, const RunConfig& config,
                            const std::set<std::string>& group, bool force_sharded,
                            CaseExplanation& out) {
  GemmForcing forcing = forcing_for(out.result.gemm_class_diffs, group, force_sharded);
  Counterfactual cf;
  cf.site = group.size() == 1 ? *group.begin() : "all";
  cf.forced_run = force_sharded ? "sharded" : "single";
  cf.forced_to = forced_words(forcing);
  ExplainRecorders recorders(false, force_sharded ? GemmForcing{} : forcing,
                             force_sharded ? forcing : GemmForcing{});
  RunConfig forced = config;
  forced.execution = recorders.wrap(config.execution);
  forced.skip_truth = true;  // forcing changes single and sharded only
  const CaseRun rerun = run_case(c, forced);
  ++out.reruns;
  for (const TensorExplanation& x : out.tensors) {
    double remaining = NAN;
    for (const ComparedTensor& t : rerun.steps.front()) {
      if (t.name == x.name && t.kind == x.kind) remaining = norm_rel(t.sharded, t.single);
    }
    cf.remaining.push_back(remaining);
    cf.removed.push_back(x.norm_rel_diff > 0 ? 1.0 - remaining / x.norm_rel_diff : 0.0);
  }
  return cf;
}

// 3. Counterfactual re-runs: each site forced, in each direction; then all at once.
void run_counterfactuals(const SuiteCase& c, const RunConfig& config, const ExplainOptions& options,
                         std::vector<std::string> site_order, CaseExplanation& out) {
  if (!options.counterfactual || site_order.empty()) return;
  if (static_cast<int>(site_order.size()) > options.max_forced_sites)
    site_order.resize(options.max_forced_sites);
  std::vector<std::set<std::string>> groups;
  for (const std::string& s : site_order) groups.push_back({s});
  if (site_order.size() > 1)
    groups.push_back(std::set<std::string>(site_order.begin(), site_order.end()));
  for (const auto& group : groups) {
    for (const bool force_sharded : {true, false}) {
      out.counterfactuals.push_back(rerun_forced(c, config, group, force_sharded, out));
    }
  }
}

// The single-site forcing that removed the most of tensor k's difference ("all" does not
// name a site).
void pick_best_forcing(const std::vector<Counterfactual>& counterfactuals, std::size_t k,
                       TensorExplanation& x) {
  for (const Counterfactual& cf : counterfactuals) {
    if (cf.site == "all") continue;
    if (cf.removed[k] > x.best_removed) {
      x.best_removed = cf.removed[k];
      x.best_site = cf.site;
      x.best_direction = cf.forced_run;
    }
  }
}

// The "bug" sentence: where on the trail the sharded run first left single behind.
std::string bug_sentence(const TensorExplanation& x, const std::vector<TrailEntry>& trail,
                         const std::string& tensor, double ratio) {
  if (x.first_divergence < 0) {
    return fmt::format(
        "not explained by GEMM numerics: the sharded run is {} further from truth than single "
        "in {}, and no intermediate before it diverges — likely a TP bug in the last step that "
        "produces {} (its reduction across ranks).",
        times(ratio), tensor, tensor);
  }
  const TrailEntry& e = trail[x.first_divergence];
  const double r = e.single_err > 0 ? e.sharded_err / e.single_err : INFINITY;
  // The last recorded op before it that still agrees: the bug lies between the two
  // (a collective skipped or repeated, operands rearranged by the layer).
  std::string before;
  for (int i = x.first_divergence - 1; i >= 0; --i) {
    const TrailEntry& p = trail[i];
    if (p.comparable && p.has_truth && !p.diverges) {
      before = fmt::format(" (the op before it, `{}`, still agrees with single)", p.name);
      break;
    }
  }
  return fmt::format(
      "not explained by GEMM numerics: the sharded run is {} further from truth than single "
      "from `{}` on ({} at the failing {}) — likely a TP bug in `{}`{}.",
      times(r), e.name, times(ratio), tensor, module_of(e.name), before);
}

// The closing verdict of one tensor (x.cause) and its sentence; `t` is its judged result.
void close_tensor(const TensorResult& t, std::size_t truth_policy,
                  const std::vector<TrailEntry>& trail, TensorExplanation& x) {
  const double ratio =
      x.single_err > 0 ? x.sharded_err / x.single_err : (x.sharded_err > 0 ? INFINITY : 1.0);
  const bool truth_passes = t.verdicts[truth_policy].passed();
  const GemmClassDiff* best = nullptr;
  for (const GemmClassDiff& d : x.upstream_diffs) {
    if (d.site == x.best_site) best = &d;
  }
  const std::string tensor = fmt::format("`{}`{}", x.name, x.kind == names::kParameterGradient ? " gradient" : "");
  if (x.norm_rel_diff == 0 && t.comparison.max_abs_diff == 0) {
    x.cause = "identical";
    x.sentence = fmt::format("identical: the sharded run reproduces single's {} exactly.", tensor);
  } else if (best != nullptr &&
             (x.best_removed >= 0.5 && (truth_passes || x.best_removed >= 0.9))) {
    x.cause = "rounding";
    const std::string change = best->class_differs ? "numerical class change" : "algorithm change";
    x.sentence = fmt::format(
        "rounding: the {} at `{}` ({} vs {}) accounts for {:.0f}% of the difference in {}; the "
        "sharded error against truth is {} single's{} — a class change, not a TP bug.",
        change, best->site, class_words(best->single), class_words(best->sharded),
        100 * x.best_removed, tensor, times(ratio),
        truth_passes ? "" : " (beyond the truth policy's bound)");
  } else if (truth_passes) {
    x.cause = "rounding";
    if (x.upstream_diffs.empty()) {
      x.sentence = fmt::format(
          "rounding: no GEMM upstream of {} changes class or algorithm; the difference ({:.2g} "
          "norm-wise) is the order of additions (sums split across ranks); the sharded error "
          "against truth is {} single's.",
          tensor, x.norm_rel_diff, times(ratio));
    } else {
      x.sentence = fmt::format(
          "rounding: forcing the GEMM class changes removes at most {:.0f}% of the difference "
          "in {}{}; the rest is the order of additions; the sharded error against truth is {} "
          "single's.",
          100 * std::max(0.0, x.best_removed), tensor,
          x.best_site.empty() ? "" : fmt::format(" (`{}`)", x.best_site), times(ratio));
    }
  } else {
    x.cause = "bug";
    x.sentence = bug_sentence(x, trail, tensor, ratio);
  }
}

}  // namespace

CaseExplanation explain_case(const SuiteCase& c, const RunConfig& config, const JudgeConfig& judge,
                             const ExplainOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::size_t truth_policy = check_inputs(config, judge, options);
  CaseExplanation out;
  record_run(c, config, judge, truth_policy, out);
  const PickedTensors picked = pick_tensors(out.result, options);
  run_counterfactuals(c, config, options, attribute(picked, out), out);
  // The closing sentence of each tensor.
  const StepResult& step = out.result.steps.front();  // the only one (check_inputs)
  for (std::size_t k = 0; k < out.tensors.size(); ++k) {
    pick_best_forcing(out.counterfactuals, k, out.tensors[k]);
    close_tensor(step.tensors[picked.index[k]], truth_policy, out.trail, out.tensors[k]);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace tpcheck

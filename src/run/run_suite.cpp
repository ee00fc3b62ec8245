// run_suite.cpp — see tpcheck/run_suite.h.
#include "tpcheck/run_suite.h"

#include <deque>
#include <fstream>
#include <future>
#include <optional>
#include <regex>
#include <sstream>
#include <utility>

#include "run/execution.h"
#include "tpcheck/error.h"
#include "tpcheck/html_report.h"

namespace tpcheck {

GemmClassRule parse_cpu_gemm(const std::string& name) {
  GemmClassRule rule;
  if (name == "fp32") return rule;
  if (name == "tf32") {
    rule.f32_class = MathClass::kTf32;
    return rule;
  }
  if (name == "auto") {
    rule.mode = GemmClassRule::Mode::kAuto;
    return rule;
  }
  throw Error(ErrorKind::kInput,
              fmt::format("unknown --cpu-gemm '{}'; expected one of fp32, tf32, auto", name));
}

SuiteSizes suite_sizes(const RunOptions& o) {
  return SuiteSizes{o.hidden, o.ffn, o.heads, o.seq, o.batch};
}

std::vector<SuiteCase> select_cases(const Suite& suite, const std::string& pattern,
                                    std::string_view what) {
  if (pattern.empty()) return suite.cases;
  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw Error(ErrorKind::kInput,
                fmt::format("{} '{}' is not a valid regex: {}", what, pattern, e.what()));
  }
  std::vector<SuiteCase> out;
  for (const SuiteCase& c : suite.cases) {
    if (std::regex_search(c.id, re)) out.push_back(c);
  }
  if (out.empty()) {
    throw Error(
        ErrorKind::kInput,
        fmt::format("{} '{}' matches none of the {} cases of suite '{}' (see `tpcheck list`)", what,
                    pattern, suite.cases.size(), suite.name));
  }
  return out;
}

namespace {

// The settings the report shows, less the execution's (resolve_execution adds those).
RunSettings settings_for(const RunOptions& o, const Suite& suite, const Policy& chosen,
                         Mutation mutation, Recipe recipe) {
  RunSettings settings;
  settings.suite = suite.name;
  settings.tp = o.tp;
  settings.seed = o.seed;
  settings.mutation = std::string(mutation_name(mutation));
  settings.cpu_gemm = o.cpu_gemm.value_or("fp32");
  settings.recipe = std::string(recipe_name(recipe));
  settings.steps = o.steps;
  for (const std::string& name : policy_names()) settings.policies.push_back(parse_policy(name));
  for (std::size_t i = 0; i < settings.policies.size(); ++i) {
    if (settings.policies[i].kind == chosen.kind) settings.chosen_policy = i;
  }
  settings.compare = CompareOptions{o.rtol, o.atol};
  settings.notes = suite.notes;
  settings.notes.insert(settings.notes.begin(), "suite " + suite.description);
  if (recipe != Recipe::kNone && !o.rtol && !o.atol) {
    // The reference suite's tolerances for this recipe (run_numerics.py), for te and
    // allclose alike; --rtol / --atol still override them.
    const RecipeTolerance t = reference_recipe_tolerance(recipe);
    settings.compare = CompareOptions{t.rtol, t.atol};
    settings.notes.push_back(
        fmt::format("recipe {}: te and allclose use the reference's "
                    "tolerances for it, rtol {} atol {}",
                    recipe_name(recipe), t.rtol, t.atol));
  }
  return settings;
}

}  // namespace

PreparedRun prepare_run(const RunOptions& o) {
  const Policy chosen = parse_policy(o.policy);
  const Mutation mutation = parse_mutation(o.mutate);
  const GemmClassRule rule = parse_cpu_gemm(o.cpu_gemm.value_or("fp32"));
  const Recipe recipe = parse_recipe(o.recipe);
  TPCHECK_CHECK_INPUT(o.steps >= 1,
                      "--steps '{}': expected a whole number of training steps >= 1 (default 1)",
                      o.steps);
  TPCHECK_CHECK_INPUT(o.tp >= 1 && o.tp <= 64, "--tp must be between 1 and 64, got {}", o.tp);
  if (o.rtol) TPCHECK_CHECK_INPUT(*o.rtol >= 0, "--rtol must be >= 0, got {}", *o.rtol);
  if (o.atol) TPCHECK_CHECK_INPUT(*o.atol >= 0, "--atol must be >= 0, got {}", *o.atol);
  PreparedRun p;
  p.suite = make_suite(o.suite, o.tp, suite_sizes(o), recipe);
  p.settings = settings_for(o, p.suite, chosen, mutation, recipe);
  const ResolvedExecution resolved = resolve_execution(o, rule, p.settings);
  p.config = RunConfig{o.tp, o.seed, mutation, resolved.gemm_rule, resolved.execution};
  if (!o.inject_failure.empty()) inject_failure(p.config.execution, o.inject_failure, o.tp);
  p.config.recipe = recipe;
  p.config.steps = o.steps;
  check_run_config(p.config);
  p.judge = JudgeConfig{p.settings.policies, p.settings.compare};
  p.reports = resolved.reports;
  return p;
}

namespace {

// --json / --html opened before any work, so a bad path is an input error up front.
struct OutputFiles {
  std::ofstream json, html;
};
OutputFiles open_outputs(const RunOptions& o) {
  OutputFiles files;
  if (o.json) {
    files.json.open(*o.json);
    TPCHECK_CHECK_INPUT(files.json.good(), "cannot write --json file '{}'", *o.json);
  }
  if (o.html) {
    files.html.open(*o.html);
    TPCHECK_CHECK_INPUT(files.html.good(), "cannot write --html file '{}'", *o.html);
  }
  return files;
}

struct CasesDone {
  std::vector<CaseResult> results;
  std::vector<CaseRun> runs;  // kept for the HTML report's plots (keep_runs)
};

// Cases run one at a time on this thread, or (Execution::concurrent_cases) up to
// kCasesInFlight small ones at once, each on a thread of its own; either way they are
// judged, printed and reported in case order. A future of std::async waits for its case
// when destroyed, so an error leaves nothing running.
CasesDone run_cases(const std::vector<SuiteCase>& cases, const PreparedRun& prepared, bool quiet,
                    bool keep_runs, std::ostream& out) {
  struct Pending {
    std::future<std::pair<CaseRun, CaseResult>> done;
    bool small = true;
  };
  const RunConfig& config = prepared.config;
  const bool concurrent = config.execution.concurrent_cases;
  const auto is_small = [&](const SuiteCase& c) {
    return concurrent && shape_numel(c.input_shape) <= kConcurrentRunsMaxElements;
  };
  const auto start = [&](const SuiteCase& c) {
    const auto work = [&c, &config, &prepared] {
      CaseRun run = run_case(c, config);
      CaseResult result = judge_case(c, config.tp, run, prepared.judge);
      return std::pair<CaseRun, CaseResult>(std::move(run), std::move(result));
    };
    return Pending{std::async(concurrent ? std::launch::async : std::launch::deferred, work),
                   is_small(c)};
  };
  CasesDone done;
  std::deque<Pending> window;
  std::size_t started = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    // Fill the window: small cases up to kCasesInFlight; a large one only into an empty
    // window, and nothing after it until it is done.
    while (started < cases.size() && window.size() < static_cast<std::size_t>(kCasesInFlight)) {
      const bool small = is_small(cases[started]);
      if (!window.empty() && (!small || !window.back().small)) break;
      window.push_back(start(cases[started++]));
      if (!concurrent) break;
    }
    auto [run, result] = window.front().done.get();
    window.pop_front();
    done.results.push_back(std::move(result));
    if (keep_runs) done.runs.push_back(std::move(run));
    const RunSettings& settings = prepared.settings;
    if (!quiet || !done.results.back().verdicts[settings.chosen_policy].passed()) {
      print_case(out, done.results.back(), settings);
    }
    out.flush();
  }
  return done;
}

}  // namespace

RunOutcome run_suite(const RunOptions& options, std::ostream& console) {
  // Every check happens before any work starts.
  const PreparedRun prepared = prepare_run(options);
  const std::vector<SuiteCase> cases = select_cases(prepared.suite, options.filter);
  OutputFiles files = open_outputs(options);
  const RunSettings& settings = prepared.settings;

  // Ranks are the parallelism; one BLAS thread keeps results independent of the machine.
  set_cpu_gemm_threads(1);
  // Ranks 1..N-1 of an mpirun / torchrun launch run silently; rank 0 prints and writes.
  std::ostringstream discard;
  std::ostream& out = prepared.reports ? console : discard;
  if (!prepared.reports) {
    if (files.json.is_open()) files.json.close();
    if (files.html.is_open()) files.html.close();
  }
  for (const SuiteCase& c : cases) check_case(c, prepared.config);  // nothing half-run

  print_header(out, settings, cases.size());
  const CasesDone done = run_cases(cases, prepared, options.quiet, files.html.is_open(), out);
  RunOutcome outcome;
  outcome.report = run_to_json(done.results, settings);
  outcome.reports = prepared.reports;
  if (files.json.is_open()) files.json << outcome.report.dump(1) << "\n";
  if (files.html.is_open()) write_html_report(files.html, done.results, done.runs, settings, {});
  outcome.summary = summarize(done.results, settings.chosen_policy);
  print_summary(out, outcome.summary, settings);
  return outcome;
}

}  // namespace tpcheck

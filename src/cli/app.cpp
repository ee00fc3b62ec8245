// app.cpp — see app.h.
#include "cli/app.h"

#include <CLI/CLI.hpp>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/explain.h"
#include "cli/log_tools.h"
#include "cli/run_options.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"
#include "tpcheck/html_report.h"
#include "tpcheck/report.h"
#include "tpcheck/suite.h"

namespace tpcheck {
namespace {

constexpr int kExitPass = 0, kExitFail = 1, kExitUsage = 2, kExitRuntime = 3;


}  // namespace

RunOutcome run_suite(const RunArgs& args, bool cpu_gemm_given, std::ostream& console) {
  // Every check happens before any work starts.
  RunArgs a = args;
  a.cpu_gemm_given = a.cpu_gemm_given || cpu_gemm_given;
  const PreparedRun prepared = prepare_run(a);
  const std::vector<SuiteCase> cases = select_cases(prepared.suite, a.filter);
  std::ofstream json_file, html_file;
  if (!a.json_path.empty()) {
    json_file.open(a.json_path);
    TPCHECK_CHECK_INPUT(json_file.good(), "cannot write --json file '{}'", a.json_path);
  }
  if (!a.html_path.empty()) {
    html_file.open(a.html_path);
    TPCHECK_CHECK_INPUT(html_file.good(), "cannot write --html file '{}'", a.html_path);
  }
  const RunSettings& settings = prepared.settings;
  const RunConfig& config = prepared.config;

  // Ranks are the parallelism; one BLAS thread keeps results independent of the machine.
  set_cpu_gemm_threads(1);
  // Ranks 1..N-1 of an mpirun / torchrun launch run silently; rank 0 prints and writes.
  std::ostringstream discard;
  std::ostream& out = prepared.reports ? console : discard;
  if (!prepared.reports) {
    if (json_file.is_open()) json_file.close();
    if (html_file.is_open()) html_file.close();
  }
  for (const SuiteCase& c : cases) check_case(c, config);  // nothing half-run on bad input

  print_header(out, settings, cases.size());
  std::vector<CaseResult> results;
  std::vector<CaseRun> runs;  // kept for the HTML report's plots
  // Cases run one at a time on this thread, or (Execution::concurrent_cases) up to
  // kCasesInFlight small ones at once, each on a thread of its own; either way they are
  // judged, printed and reported in case order. A future of std::async waits for its
  // case when destroyed, so an error leaves nothing running.
  struct Pending {
    std::future<std::pair<CaseRun, CaseResult>> done;
    bool small = true;
  };
  const bool concurrent = config.execution.concurrent_cases;
  const auto is_small = [&](const SuiteCase& c) {
    return concurrent && shape_numel(c.input_shape) <= kConcurrentRunsMaxElements;
  };
  const auto start = [&](const SuiteCase& c) {
    const auto work = [&c, &config, &a, &prepared] {
      CaseRun run = run_case(c, config);
      CaseResult result = judge_case(c, a.tp, run, prepared.judge);
      return std::pair<CaseRun, CaseResult>(std::move(run), std::move(result));
    };
    return Pending{std::async(concurrent ? std::launch::async : std::launch::deferred, work),
                   is_small(c)};
  };
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
    results.push_back(std::move(result));
    if (html_file.is_open()) runs.push_back(std::move(run));
    if (!a.quiet || !results.back().verdicts[settings.chosen_policy].passed()) {
      print_case(out, results.back(), settings);
    }
    out.flush();
  }
  RunOutcome outcome;
  outcome.report = run_to_json(results, settings);
  outcome.reports = prepared.reports;
  if (json_file.is_open()) json_file << outcome.report.dump(1) << "\n";
  if (html_file.is_open()) write_html_report(html_file, results, runs, settings, {});
  outcome.summary = summarize(results, settings.chosen_policy);
  print_summary(out, outcome.summary, settings);
  return outcome;
}

namespace {

// "out.json" with recipe "fp8" → "out.fp8.json" (the name before the extension).
std::string per_recipe_path(const std::string& path, std::string_view recipe) {
  if (path.empty()) return path;
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return fmt::format("{}.{}", path, recipe);
  }
  return fmt::format("{}.{}{}", path.substr(0, dot), recipe, path.substr(dot));
}

// --recipe all: the suite once per recipe — none, then the five quantized ones — each a
// run of its own (the recipe's sizes, case changes and reference tolerance, its header
// and summary); --json / --html files get the recipe's name before their extension.
// Every recipe's options and cases are checked before the first run starts.
int run_all_recipes(const RunArgs& a) {
  // One process per rank (mpirun / torchrun) sets up its NCCL group once, from an id the
  // launch shares once; six runs would need six. Not tried on a multi-GPU launch: refused.
  if (const std::optional<NcclProcessLaunch> launch = nccl_process_launch_from_env()) {
    TPCHECK_CHECK_INPUT(false,
                        "--recipe all runs the suite once per recipe in one process; under "
                        "{} (one process per rank) launch once per recipe with --recipe NAME",
                        launch->launcher);
  }
  std::vector<RunArgs> runs;
  for (Recipe r : {Recipe::kNone, Recipe::kFp8Delayed, Recipe::kFp8Current, Recipe::kFp8Block,
                   Recipe::kMxfp8, Recipe::kNvfp4}) {
    RunArgs one = a;
    one.recipe = std::string(recipe_name(r));
    one.json_path = per_recipe_path(a.json_path, one.recipe);
    one.html_path = per_recipe_path(a.html_path, one.recipe);
    const PreparedRun prepared = prepare_run(one);
    for (const SuiteCase& c : select_cases(prepared.suite, one.filter)) {
      check_case(c, prepared.config);
    }
    runs.push_back(std::move(one));
  }
  std::vector<std::string> lines;
  int failed = 0;
  bool reports = true;  // false on ranks 1..N-1 of an mpirun / torchrun launch
  for (const RunArgs& one : runs) {
    const RunOutcome outcome = run_suite(one, /*cpu_gemm_given=*/false, std::cout);
    failed += outcome.summary.failed;
    reports = outcome.reports;
    lines.push_back(fmt::format("{}: {} passed, {} failed", one.recipe, outcome.summary.passed,
                                outcome.summary.failed));
    if (reports) std::cout << "\n";
  }
  if (reports) fmt::print("recipes: {}\n", fmt::join(lines, "; "));
  return failed == 0 ? kExitPass : kExitFail;
}

int run_command(const RunArgs& a) {
  if (a.recipe == "all") return run_all_recipes(a);
  const RunOutcome outcome = run_suite(a, /*cpu_gemm_given=*/false, std::cout);
  return outcome.summary.failed == 0 ? kExitPass : kExitFail;
}

int list_command(const RunArgs& a) {
  const Suite suite = make_suite(a.suite, a.tp, a.sizes);
  for (const std::string& note : suite.notes) fmt::print("note: {}\n", note);
  for (const SuiteCase& c : select_cases(suite, a.filter)) fmt::print("{}\n", c.id);
  return kExitPass;
}

int mutations_command() {
  // A mutation that lives in one recipe's code says so, in a form scripts can match:
  // "(needs --recipe NAME --steps N)".
  for (const MutationInfo& m : all_mutations()) {
    const std::string needs =
        m.recipe == Recipe::kNone
            ? ""
            : fmt::format(" (needs --recipe {} --steps {})", recipe_name(m.recipe), m.first_step);
    fmt::print("{:<28} {}{}\n", m.name, m.description, needs);
  }
  return kExitPass;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"tpcheck: does the tensor-parallel run compute what the single-device run computes?"};
  app.require_subcommand(0, 1);
  RunArgs args;

  CLI::App* run = app.add_subcommand("run", "run a suite: single, sharded and fp64 truth runs, judged");
  add_case_options(run, args);
  run->add_option("--filter", args.filter, "regex over case ids (see `tpcheck list`)");
  run->add_option("--json", args.json_path, "write the JSON report (schema tpcheck.run/1) here");
  run->add_option("--html", args.html_path, "write a self-contained HTML report with plots here");
  run->add_flag("--quiet", args.quiet, "print only failing cases and the summary");

  RunArgs explain_args;  // its own: each subcommand binds its options once
  std::string explain_case_id;
  CLI::App* explain = add_explain_command(app, explain_args, explain_case_id);

  CLI::App* list = app.add_subcommand("list", "list the case ids of a suite");
  list->add_option("--suite", args.suite, "full (default) or te");
  list->add_option("--tp", args.tp, "tensor-parallel size");
  list->add_option("--filter", args.filter, "regex over case ids");
  add_size_options(list, args);

  app.add_subcommand("mutations", "list the TP bugs --mutate can build in");

  LogdiffArgs logdiff_args;
  TraceArgs trace_args;
  DiffArgs diff_args;
  CLI::App* logdiff = add_logdiff_command(app, logdiff_args);
  CLI::App* trace = add_trace_command(app, trace_args);
  CLI::App* diff = add_diff_command(app, diff_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitPass : kExitUsage;
  }
  if (*list) return list_command(args);
  if (app.got_subcommand("mutations")) return mutations_command();
  if (*logdiff) return logdiff_command(logdiff_args);
  if (*trace) return trace_command(trace_args);
  if (*diff) return diff_command(diff_args);
  if (*explain) return explain_command(explain_args, explain_case_id);
  return run_command(args);  // `tpcheck` alone runs the default suite
}

}  // namespace

int cli_main(int argc, char** argv) {
  try {
    return main_impl(argc, argv);
  } catch (const Error& e) {
    fmt::print(stderr, "tpcheck: error: {}\n", e.what());
    if (e.kind() == ErrorKind::kInput) return kExitUsage;
    if (!e.where().empty() || e.rank() >= 0) {
      std::vector<std::string> context;
      if (!e.where().empty()) context.push_back("at " + e.where());
      if (e.rank() >= 0) context.push_back(fmt::format("rank {}", e.rank()));
      fmt::print(stderr, "  ({})\n", fmt::join(context, ", "));
    }
    return kExitRuntime;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tpcheck: error: {}\n", e.what());
    return kExitRuntime;
  }
}

}  // namespace tpcheck

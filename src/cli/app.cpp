// app.cpp — see tpcheck/cli.h.
#include "tpcheck/cli.h"

#include <CLI/CLI.hpp>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/emulate.h"
#include "cli/explain_command.h"
#include "cli/log_tools.h"
#include "cli/run_flags.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"
#include "tpcheck/report.h"
#include "tpcheck/run_suite.h"
#include "tpcheck/suite.h"

namespace tpcheck {
namespace {

constexpr int kExitPass = 0, kExitFail = 1, kExitUsage = 2, kExitRuntime = 3;

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
int run_all_recipes(const RunOptions& a) {
  // One process per rank (mpirun / torchrun) sets up its NCCL group once, from an id the
  // launch shares once; six runs would need six. Not tried on a multi-GPU launch: refused.
  if (const std::optional<NcclProcessLaunch> launch = nccl_process_launch_from_env()) {
    TPCHECK_CHECK_INPUT(false,
                        "--recipe all runs the suite once per recipe in one process; under "
                        "{} (one process per rank) launch once per recipe with --recipe NAME",
                        launch->launcher);
  }
  std::vector<RunOptions> runs;
  for (Recipe r : {Recipe::kNone, Recipe::kFp8Delayed, Recipe::kFp8Current, Recipe::kFp8Block,
                   Recipe::kMxfp8, Recipe::kNvfp4}) {
    RunOptions one = a;
    one.recipe = std::string(recipe_name(r));
    if (a.json) one.json = per_recipe_path(*a.json, one.recipe);
    if (a.html) one.html = per_recipe_path(*a.html, one.recipe);
    const PreparedRun prepared = prepare_run(one);
    for (const SuiteCase& c : select_cases(prepared.suite, one.filter)) {
      check_case(c, prepared.config);
    }
    runs.push_back(std::move(one));
  }
  std::vector<std::string> lines;
  int failed = 0;
  bool reports = true;  // false on ranks 1..N-1 of an mpirun / torchrun launch
  for (const RunOptions& one : runs) {
    const RunOutcome outcome = run_suite(one, std::cout);
    failed += outcome.summary.failed;
    reports = outcome.reports;
    lines.push_back(fmt::format("{}: {} passed, {} failed", one.recipe, outcome.summary.passed,
                                outcome.summary.failed));
    if (reports) std::cout << "\n";
  }
  if (reports) fmt::print("recipes: {}\n", fmt::join(lines, "; "));
  return failed == 0 ? kExitPass : kExitFail;
}

int run_command(const RunOptions& a) {
  if (a.recipe == "all") return run_all_recipes(a);
  const RunOutcome outcome = run_suite(a, std::cout);
  return outcome.summary.failed == 0 ? kExitPass : kExitFail;
}

int list_command(const RunOptions& a) {
  const Suite suite = make_suite(a.suite, a.tp, suite_sizes(a));
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
  // Every argument after `emulate` belongs to the launcher (and the user's command).
  if (argc >= 2 && std::string_view(argv[1]) == "emulate") emulate_command(argc, argv);
  CLI::App app{"tpcheck: does the tensor-parallel run compute what the single-device run computes?"};
  app.footer(
      "tpcheck emulate -n N [--comm-order nccl-ring|rank] [--trace DIR] -- CMD ARGS...\n"
      "  runs your torch.distributed program at TP N on one GPU or the CPU (docs/EMULATE.md)");
  app.require_subcommand(0, 1);
  RunOptions args;  // run's and list's: only one subcommand is parsed

  CLI::App* run = app.add_subcommand("run", "run a suite: single, sharded and fp64 truth runs, judged");
  add_run_flags(run, args, kForRun);

  RunOptions explain_args;
  std::string explain_case_id;
  CLI::App* explain = add_explain_command(app, explain_args, explain_case_id);

  CLI::App* list = app.add_subcommand("list", "list the case ids of a suite");
  add_run_flags(list, args, kForList);

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

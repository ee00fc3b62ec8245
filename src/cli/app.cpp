// app.cpp — see app.h.
#include "cli/app.h"

#include <CLI/CLI.hpp>
#include <fmt/ostream.h>

#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include "cli/log_tools.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"
#include "tpcheck/report.h"
#include "tpcheck/suite.h"

namespace tpcheck {
namespace {

constexpr int kExitPass = 0, kExitFail = 1, kExitUsage = 2, kExitRuntime = 3;


void add_size_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--hidden", a.sizes.hidden, "hidden size (default 64)");
  cmd->add_option("--ffn", a.sizes.ffn, "FFN hidden size (default 32)");
  cmd->add_option("--heads", a.sizes.heads, "attention heads (default 4, raised to --tp if larger)");
  cmd->add_option("--seq", a.sizes.seq, "sequence length per rank (default 16)");
  cmd->add_option("--batch", a.sizes.batch, "batch size (default 16)");
}

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

// The suite's cases matching --filter (all without one); an empty match is an input error.
std::vector<SuiteCase> select_cases(const Suite& suite, const std::string& filter) {
  if (filter.empty()) return suite.cases;
  std::regex re;
  try {
    re = std::regex(filter);
  } catch (const std::regex_error& e) {
    throw Error(ErrorKind::kInput, fmt::format("--filter '{}' is not a valid regex: {}", filter, e.what()));
  }
  std::vector<SuiteCase> out;
  for (const SuiteCase& c : suite.cases) {
    if (std::regex_search(c.id, re)) out.push_back(c);
  }
  if (out.empty()) {
    throw Error(ErrorKind::kInput,
                fmt::format("--filter '{}' matches none of the {} cases of suite '{}' (see `tpcheck list`)",
                            filter, suite.cases.size(), suite.name));
  }
  return out;
}

}  // namespace

RunOutcome run_suite(const RunArgs& a, bool cpu_gemm_given, std::ostream& console) {
  // Every check happens before any work starts.
  const Policy chosen = parse_policy(a.policy);
  const Mutation mutation = parse_mutation(a.mutate);
  const GemmClassRule rule = parse_cpu_gemm(a.cpu_gemm);
  TPCHECK_CHECK_INPUT(a.tp >= 1 && a.tp <= 64, "--tp must be between 1 and 64, got {}", a.tp);
  if (a.rtol) TPCHECK_CHECK_INPUT(*a.rtol >= 0, "--rtol must be >= 0, got {}", *a.rtol);
  if (a.atol) TPCHECK_CHECK_INPUT(*a.atol >= 0, "--atol must be >= 0, got {}", *a.atol);
  const Suite suite = make_suite(a.suite, a.tp, a.sizes);
  const std::vector<SuiteCase> cases = select_cases(suite, a.filter);
  std::ofstream json_file;
  if (!a.json_path.empty()) {
    json_file.open(a.json_path);
    TPCHECK_CHECK_INPUT(json_file.good(), "cannot write --json file '{}'", a.json_path);
  }

  RunSettings settings;
  settings.suite = suite.name;
  settings.tp = a.tp;
  settings.seed = a.seed;
  settings.mutation = std::string(mutation_name(mutation));
  settings.cpu_gemm = a.cpu_gemm;
  for (const std::string& name : policy_names()) settings.policies.push_back(parse_policy(name));
  for (std::size_t p = 0; p < settings.policies.size(); ++p) {
    if (settings.policies[p].kind == chosen.kind) settings.chosen_policy = p;
  }
  settings.compare = CompareOptions{a.rtol, a.atol};
  settings.notes = suite.notes;
  settings.notes.insert(settings.notes.begin(), "suite " + suite.description);
  const ResolvedExecution resolved =
      resolve_execution(a.execution, a.tp, rule, cpu_gemm_given, settings);

  // Ranks are the parallelism; one BLAS thread keeps results independent of the machine.
  set_cpu_gemm_threads(1);
  RunConfig config{a.tp, a.seed, mutation, resolved.gemm_rule, resolved.execution};
  // Ranks 1..N-1 of an mpirun / torchrun launch run silently; rank 0 prints and writes.
  std::ostringstream discard;
  std::ostream& out = resolved.reports ? console : discard;
  if (!resolved.reports && json_file.is_open()) json_file.close();
  for (const SuiteCase& c : cases) check_case(c, config);  // nothing half-run on bad input
  JudgeConfig judge{settings.policies, settings.compare};

  print_header(out, settings, cases.size());
  std::vector<CaseResult> results;
  for (const SuiteCase& c : cases) {
    results.push_back(judge_case(c, a.tp, run_case(c, config), judge));
    if (!a.quiet || !results.back().verdicts[settings.chosen_policy].passed()) {
      print_case(out, results.back(), settings);
    }
    out.flush();
  }
  RunOutcome outcome;
  outcome.report = run_to_json(results, settings);
  outcome.reports = resolved.reports;
  if (json_file.is_open()) json_file << outcome.report.dump(1) << "\n";
  outcome.summary = summarize(results, settings.chosen_policy);
  print_summary(out, outcome.summary, settings);
  return outcome;
}

namespace {

int run_command(const RunArgs& a, bool cpu_gemm_given) {
  const RunOutcome outcome = run_suite(a, cpu_gemm_given, std::cout);
  return outcome.summary.failed == 0 ? kExitPass : kExitFail;
}

int list_command(const RunArgs& a) {
  const Suite suite = make_suite(a.suite, a.tp, a.sizes);
  for (const std::string& note : suite.notes) fmt::print("note: {}\n", note);
  for (const SuiteCase& c : select_cases(suite, a.filter)) fmt::print("{}\n", c.id);
  return kExitPass;
}

int mutations_command() {
  for (const MutationInfo& m : all_mutations()) fmt::print("{:<28} {}\n", m.name, m.description);
  return kExitPass;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"tpcheck: does the tensor-parallel run compute what the single-device run computes?"};
  app.require_subcommand(0, 1);
  RunArgs args;

  CLI::App* run = app.add_subcommand("run", "run a suite: single, sharded and fp64 truth runs, judged");
  run->add_option("--backend", args.execution.backend,
                  "auto (default: cuda when a GPU is present, else cpu), cpu or cuda");
  run->add_option("--tf32", args.execution.tf32, "cuda: f32 GEMMs may use TF32 (on, default) or not (off)");
  run->add_option("--gemm-impl", args.execution.gemm_impl,
                  "cuda: cuBLASLt implementations allowed: any (default), tensor-core or fma");
  run->add_option("--comm", args.execution.comm,
                  "cuda: auto (default: NCCL when there is a GPU per rank, else emulated), emulated or nccl");
  run->add_option("--comm-order", args.execution.comm_order,
                  "cuda emulated collectives: nccl-ring (default: NCCL's ring order and rounding) or rank");
  run->add_option("--tp", args.tp, "tensor-parallel size (thread ranks on the CPU)");
  run->add_option("--suite", args.suite,
                  "full (default: every sharded path) or te (the reference's 118-case matrix)");
  run->add_option("--filter", args.filter, "regex over case ids (see `tpcheck list`)");
  run->add_option("--policy", args.policy, "te, allclose, truth (default) or bitwise");
  run->add_option("--seed", args.seed, "seed of parameters, inputs and targets");
  run->add_option("--mutate", args.mutate, "build the sharded layers with a TP bug (see `tpcheck mutations`)");
  CLI::Option* cpu_gemm = run->add_option("--cpu-gemm", args.cpu_gemm,
                                          "CPU GEMM class for f32: fp32, tf32 or auto (by K)");
  run->add_option("--json", args.json_path, "write the JSON report (schema tpcheck.run/1) here");
  run->add_option("--rtol", args.rtol, "override rtol of te/allclose");
  run->add_option("--atol", args.atol, "override atol of te/allclose");
  run->add_flag("--quiet", args.quiet, "print only failing cases and the summary");
  add_size_options(run, args);

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
  return run_command(args, cpu_gemm->count() > 0);  // `tpcheck` alone runs the default suite
}

}  // namespace

int cli_main(int argc, char** argv) {
  try {
    return main_impl(argc, argv);
  } catch (const Error& e) {
    fmt::print(stderr, "tpcheck: error: {}\n", e.what());
    if (e.kind() == ErrorKind::kInput) return kExitUsage;
    if (!e.where().empty()) fmt::print(stderr, "  (at {}{})\n", e.where(),
                                      e.rank() >= 0 ? fmt::format(", rank {}", e.rank()) : "");
    return kExitRuntime;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tpcheck: error: {}\n", e.what());
    return kExitRuntime;
  }
}

}  // namespace tpcheck

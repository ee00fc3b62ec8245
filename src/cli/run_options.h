// run_options.h — the options that shape a suite run, shared by `tpcheck run` and
// `tpcheck explain` (one definition of each flag, its check and its meaning).
// Thread safety: call from the main thread before any case runs.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/execution.h"
#include "tpcheck/report.h"
#include "tpcheck/suite.h"

namespace tpcheck {

struct RunArgs {
  ExecutionArgs execution;
  int tp = 4;
  std::string suite = "full";
  std::string filter;
  std::string policy = "truth";
  std::uint64_t seed = 1234;
  std::string mutate = "none";
  std::string cpu_gemm = "fp32";
  std::string recipe = "none";
  std::string steps = "1";  // as given: parse_steps checks it
  std::string json_path;
  std::string html_path;
  std::optional<double> rtol, atol;
  SuiteSizes sizes;
  bool quiet = false;
  CLI::Option* cpu_gemm_option = nullptr;  // to tell a given --cpu-gemm from the default
  bool cpu_gemm_given = false;             // the same for callers without a command line
};

// --hidden, --ffn, --heads, --seq, --batch.
void add_size_options(CLI::App* cmd, RunArgs& a);
// Every option that shapes a case and how it runs: backend options, --tp, --suite,
// --policy, --seed, --mutate, --cpu-gemm, --recipe, --steps, --rtol, --atol and the sizes.
void add_case_options(CLI::App* cmd, RunArgs& a);

GemmClassRule parse_cpu_gemm(const std::string& name);
// --steps: a whole number >= 1, written in decimal digits; Error(kInput) naming the text.
int parse_steps(const std::string& text);

// The suite's cases matching --filter (all without one); an empty match is an input error.
std::vector<SuiteCase> select_cases(const Suite& suite, const std::string& filter);

// Everything a run needs, checked (Error(kInput) on a bad value) before any work starts.
struct PreparedRun {
  Suite suite;
  RunSettings settings;
  RunConfig config;
  JudgeConfig judge;
  bool reports = true;  // false in ranks 1..N-1 of an mpirun / torchrun launch
};
PreparedRun prepare_run(const RunArgs& a);

}  // namespace tpcheck

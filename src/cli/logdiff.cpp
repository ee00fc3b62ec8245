// `tpcheck logdiff A.log B.log`: the matmul calls of two cuBLASLt logs lined up (by order,
// and by shape where one run added or dropped calls, the sharded dimension allowed to
// differ), and the calls whose algorithm, compute type or numerical class differs,
// grouped by shape. --query (GPU machine) decodes each algorithm's numerical
// implementation through cuBLASLt's capability query.
#include <fmt/format.h>

#include <fstream>

#include "cli/log_tools.h"
#include "tpcheck/cublaslt_log.h"
#include "tpcheck/error.h"
#include "tpcheck/ledger_diff.h"

namespace tpcheck {
namespace {

constexpr std::size_t kProblemsShown = 10;

void report_problems(const CublasLtLog& log) {
  for (std::size_t i = 0; i < log.problems.size() && i < kProblemsShown; ++i) {
    fmt::print(stderr, "tpcheck: warning: {}:{}: {}; line skipped\n", log.path,
               log.problems[i].line, log.problems[i].reason);
  }
  if (log.problems.size() > kProblemsShown) {
    fmt::print(stderr, "tpcheck: warning: {}: {} more malformed lines skipped\n", log.path,
               log.problems.size() - kProblemsShown);
  }
}

}  // namespace

CLI::App* add_logdiff_command(CLI::App& app, LogdiffArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "logdiff", "compare the cuBLASLt matmul calls of two logs (CUBLASLT_LOG_LEVEL=2 or 5)");
  cmd->add_option("A", args.a, "first cuBLASLt log (e.g. the single-device run)")->required();
  cmd->add_option("B", args.b, "second cuBLASLt log (e.g. the sharded run)")->required();
  cmd->add_flag("--query", args.query,
                "decode each algorithm's numerical implementation (needs the CUDA build and a GPU)");
  cmd->add_option("--json", args.json_path, "also write the comparison as JSON here");
  return cmd;
}

int logdiff_command(const LogdiffArgs& args) {
  if (args.query) {
    TPCHECK_CHECK_INPUT(cublaslt_query_available(),
                        "--query needs tpcheck built with CUDA (this build has TPCHECK_CUDA=OFF)");
  }
  CublasLtLog a = read_cublaslt_log(args.a);
  CublasLtLog b = read_cublaslt_log(args.b);
  report_problems(a);
  report_problems(b);
  // A log without matmul calls has nothing to line up: comparing it would report "the
  // same algorithm everywhere" about calls that were never logged.
  for (const CublasLtLog* log : {&a, &b}) {
    TPCHECK_CHECK_INPUT(!log->calls.empty(),
                        "{}: no cuBLASLt matmul call ([Trace][cublasLt*Matmul] line) in its {} "
                        "lines, nothing to compare; expected a log written with "
                        "CUBLASLT_LOG_LEVEL=2 or 5 by a program that ran GEMMs",
                        log->path, log->lines);
  }
  std::ofstream json_file;
  if (!args.json_path.empty()) {
    json_file.open(args.json_path);
    TPCHECK_CHECK_INPUT(json_file.good(), "cannot write --json file '{}'", args.json_path);
  }
  if (args.query) {
    query_numerical_impls(a.calls);
    query_numerical_impls(b.calls);
  }
  const CublasLtDiff diff = diff_cublaslt_calls(a.calls, b.calls);
  fmt::print("{}", format_cublaslt_diff(diff, args.a, args.b));
  if (json_file.is_open()) {
    nlohmann::json j = cublaslt_diff_to_json(diff);
    j["schema"] = "tpcheck.logdiff/1";
    j["a_log"] = {{"path", a.path}, {"lines", a.lines}, {"malformed_lines", a.problems.size()}};
    j["b_log"] = {{"path", b.path}, {"lines", b.lines}, {"malformed_lines", b.problems.size()}};
    json_file << j.dump(1) << "\n";
  }
  return diff.groups.empty() ? 0 : 1;
}

}  // namespace tpcheck

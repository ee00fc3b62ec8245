// run_suite.h — a whole suite run from its RunOptions (tpcheck/run_options.h): every option
// and case checked before any work, the cases run and judged, the console report, the
// JSON and HTML files. The library tpcheck_run (src/run); the command line (src/cli) and
// the Python module (src/python) are both built on it.
// Thread safety: call from one thread at a time (a run starts its own rank threads).
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "tpcheck/report.h"
#include "tpcheck/run_options.h"
#include "tpcheck/suite.h"

namespace tpcheck {

struct RunOutcome {
  nlohmann::json report;  // schema tpcheck.run/1, as `--json` writes it
  Summary summary;        // under the chosen policy
  bool reports = true;    // false on ranks 1..N-1 of an mpirun / torchrun launch
};

// Checks every option and case (Error(kInput) before any work), runs the selected cases,
// prints the console report to `console` (nothing on ranks 1..N-1 of a launch), writes
// the JSON and HTML files when asked. --recipe all is the command line's (src/cli).
RunOutcome run_suite(const RunOptions& options, std::ostream& console);

// Everything a run needs, checked (Error(kInput) on a bad value) before any work starts.
struct PreparedRun {
  Suite suite;
  RunSettings settings;
  RunConfig config;
  JudgeConfig judge;
  bool reports = true;  // false in ranks 1..N-1 of an mpirun / torchrun launch
};
PreparedRun prepare_run(const RunOptions& options);

// The suite's cases whose id matches the regex `pattern` (all for an empty one). `what`
// names the pattern in errors ("--filter", "case"): an invalid regex or an empty match is
// Error(kInput).
std::vector<SuiteCase> select_cases(const Suite& suite, const std::string& pattern,
                                    std::string_view what = "--filter");

// --hidden, --ffn, --heads, --seq, --batch as the suite takes them.
SuiteSizes suite_sizes(const RunOptions& options);

// --cpu-gemm's class rule (fp32, tf32, auto); Error(kInput) naming any other text.
GemmClassRule parse_cpu_gemm(const std::string& name);

}  // namespace tpcheck

// app.h — the `tpcheck` program as a library: the command line (cli_main) and the run of a
// suite it performs (run_suite), so the Python package (src/python) reuses both.
// Exit codes of cli_main: 0 every case passes the chosen policy, 1 some case failed,
// 2 usage or input error (nothing run), 3 runtime or device error.
// Thread safety: call from one thread at a time (a run starts its own rank threads).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/execution.h"
#include "cli/run_options.h"  // RunArgs
#include "tpcheck/report.h"
#include "tpcheck/suite.h"

namespace tpcheck {

struct RunOutcome {
  nlohmann::json report;  // schema tpcheck.run/1, as `--json` writes it
  Summary summary;        // under the chosen policy
  bool reports = true;    // false on ranks 1..N-1 of an mpirun / torchrun launch
};

// Checks every option and case (Error(kInput) before any work), runs the selected cases,
// prints the console report to `console` (nothing on ranks 1..N-1 of a launch), writes
// the JSON and HTML files when asked. `cpu_gemm_given`: --cpu-gemm was given explicitly.
RunOutcome run_suite(const RunArgs& args, bool cpu_gemm_given, std::ostream& console);

// The program: parses argv, runs the subcommand, maps errors to exit codes (messages on
// stderr). Never throws.
int cli_main(int argc, char** argv);

}  // namespace tpcheck

// cli.h — the `tpcheck` program as a library (cli_main; tpcheck_app, src/cli), so the
// Python package (`python -m tpcheck`, src/python) runs the same command line. A suite run itself
// is tpcheck_run's (tpcheck/run_suite.h). Exit codes of cli_main: 0 every case passes the chosen
// policy, 1 some case failed, 2 usage or input error (nothing run), 3 runtime or device error.
// Thread safety: call from one thread at a time (a run starts its own rank threads).
#pragma once

namespace tpcheck {

// The program: parses argv, runs the subcommand, maps errors to exit codes (messages on
// stderr). Never throws.
int cli_main(int argc, char** argv);

}  // namespace tpcheck

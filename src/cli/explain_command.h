// explain_command.h — the `tpcheck explain CASE` command (src/explain/ does the work).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "tpcheck/run_options.h"

namespace tpcheck {

// Registers `explain` with every option that shapes a case (run's) plus --json / --html.
CLI::App* add_explain_command(CLI::App& app, RunOptions& options, std::string& case_id);
// Exit code: 0 the case passes the chosen policy, 1 it fails (as `tpcheck run`).
int explain_command(const RunOptions& options, const std::string& case_id);

}  // namespace tpcheck

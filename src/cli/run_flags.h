// run_flags.h — the command line's flags for the run options, generated from their table
// (tpcheck/run_options.h): one CLI11 option per row that `command` takes, with the row's
// help, its default and its choices in --help, and the row's parser (so a bad value is
// Error(kInput) naming the flag, as from Python).
// Thread safety: main thread only; `options` must outlive the parse.
#pragma once

#include <CLI/CLI.hpp>

#include "tpcheck/run_options.h"

namespace tpcheck {

// `command`: kForRun, kForExplain or kForList (rows marked kHiddenOption stay out of --help).
void add_run_flags(CLI::App* cmd, RunOptions& options, unsigned command);

}  // namespace tpcheck

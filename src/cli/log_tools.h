// log_tools.h — the cuBLASLt log subcommands of `tpcheck`: logdiff (two logs), trace (run
// any program with cuBLASLt logging, write a GEMM ledger), diff (two ledgers or two run
// reports). Each adds its options to the app and runs after parsing.
// Exit codes: 0 nothing differs (trace: traced), 1 something differs, 2 usage or input
// error, 3 runtime or device error (main.cpp maps Error kinds).
// Thread safety: main thread only.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace tpcheck {

struct LogdiffArgs {
  std::string a, b;
  bool query = false;
  std::string json_path;
};
CLI::App* add_logdiff_command(CLI::App& app, LogdiffArgs& args);
int logdiff_command(const LogdiffArgs& args);

struct TraceArgs {
  std::string out = "tpcheck-trace";
  int level = 2;
  bool query = false;
  std::vector<std::string> command;
};
CLI::App* add_trace_command(CLI::App& app, TraceArgs& args);
int trace_command(const TraceArgs& args);

struct DiffArgs {
  std::string a, b;
};
CLI::App* add_diff_command(CLI::App& app, DiffArgs& args);
int diff_command(const DiffArgs& args);


}  // namespace tpcheck

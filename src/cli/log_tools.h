// log_tools.h — the cuBLASLt log subcommands of `tpcheck`: logdiff (two logs), trace (run
// any program with cuBLASLt logging, write a GEMM ledger), diff (two ledgers or two run
// reports). Each adds its options to the app and runs after parsing.
// Exit codes: 0 nothing differs (trace: traced), 1 something differs, 2 usage or input
// error, 3 runtime or device error (main.cpp maps Error kinds).
// Thread safety: main thread only.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tpcheck/names.h"

#include <string>
#include <string_view>
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

// The schema of `python -m tpcheck emulate --trace DIR`'s DIR/ledger.json.
using names::kEmulateSchema;
// diff_command's path when A or B is an emulate ledger (the other one an emulate or a
// trace ledger): GEMMs and collectives per rank (emulate_diff.cpp). 0 no change, 1 some.
int diff_emulate_ledgers(const std::string& path_a, const nlohmann::json& a,
                         const std::string& path_b, const nlohmann::json& b);


}  // namespace tpcheck

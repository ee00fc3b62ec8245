// `tpcheck diff A B`: what changed between two trace ledgers (tpcheck trace: two
// machines, two library versions, TP 1 vs TP N), two emulate ledgers (python -m tpcheck
// emulate --trace DIR: DIR/ledger.json, per rank; emulate_diff.cpp), an emulate ledger and
// a trace ledger, or two run reports (tpcheck run --json): algorithms, numerical classes,
// collectives, verdicts, environment.
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <set>

#include "cli/log_tools.h"
#include "tpcheck/error.h"
#include "tpcheck/ledger_diff.h"

namespace tpcheck {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  TPCHECK_CHECK_INPUT(in.good(), "cannot read '{}'", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInput, fmt::format("'{}' is not JSON: {}", path, e.what()));
  }
}

std::string schema_of(const nlohmann::json& j, const std::string& path) {
  const std::string schema = j.is_object() ? j.value("schema", "") : "";
  TPCHECK_CHECK_INPUT(schema == kTraceSchema || schema == kEmulateSchema ||
                          schema == names::kRunSchema,
                      "'{}' has schema '{}'; expected a trace ledger ({}), an emulate ledger ({}) "
                      "or a run report (tpcheck.run/1)",
                      path, schema, kTraceSchema, kEmulateSchema);
  return schema;
}

int diff_traces(const DiffArgs& args, const nlohmann::json& ja, const nlohmann::json& jb) {
  const TraceLedger a = trace_from_json(ja, args.a), b = trace_from_json(jb, args.b);
  bool changed = false;
  auto line = [&](const std::string& s) {
    fmt::print("{}\n", s);
    changed = true;
  };
  if (a.command != b.command) {
    line(fmt::format("command: {} → {}", fmt::join(a.command, " "), fmt::join(b.command, " ")));
  }
  if (a.exit_status != b.exit_status) {
    line(fmt::format("exit status: {} → {}", a.exit_status, b.exit_status));
  }
  // Environment, flattened one level (variables.X), the date left out.
  auto flat = [](const nlohmann::json& env) {
    std::map<std::string, std::string> m;
    for (auto it = env.begin(); it != env.end(); ++it) {
      if (it.key() == "date") continue;
      if (it.value().is_object()) {
        for (auto v = it.value().begin(); v != it.value().end(); ++v) {
          m[it.key() + "." + v.key()] = v.value().is_string() ? v.value().get<std::string>() : v.value().dump();
        }
      } else {
        m[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
      }
    }
    return m;
  };
  const auto ea = flat(a.environment), eb = flat(b.environment);
  std::set<std::string> keys;
  for (const auto& [k, v] : ea) keys.insert(k);
  for (const auto& [k, v] : eb) keys.insert(k);
  for (const std::string& k : keys) {
    const auto x = ea.find(k), y = eb.find(k);
    const std::string vx = x == ea.end() ? "(unset)" : x->second;
    const std::string vy = y == eb.end() ? "(unset)" : y->second;
    if (vx != vy) line(fmt::format("environment {}: {} → {}", k, vx, vy));
  }
  if (a.processes.size() != b.processes.size()) {
    line(fmt::format("processes: {} → {} (compared in pid order, pairwise)", a.processes.size(),
                     b.processes.size()));
  }
  const std::size_t common = std::min(a.processes.size(), b.processes.size());
  for (std::size_t p = 0; p < common; ++p) {
    const TraceProcess& pa = a.processes[p];
    const TraceProcess& pb = b.processes[p];
    const CublasLtDiff d = diff_cublaslt_calls(pa.calls, pb.calls);
    fmt::print("\nprocess {} (pid {} → {}):\n{}", p, pa.pid, pb.pid,
               format_cublaslt_diff(d, pa.log, pb.log));
    if (d.any()) changed = true;
  }
  if (!changed) fmt::print("\nno change\n");
  return changed ? 1 : 0;
}

}  // namespace

CLI::App* add_diff_command(CLI::App& app, DiffArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "diff",
      "what changed between two trace ledgers (tpcheck trace), two emulate ledgers (python -m "
      "tpcheck emulate --trace DIR: DIR/ledger.json; per rank, the GEMMs whose algorithm or "
      "numerical class changed and the collectives; one side may be a trace ledger) or two run "
      "reports (--json)");
  cmd->add_option("A", args.a, "first ledger.json or run report (e.g. the TP 1 run)")->required();
  cmd->add_option("B", args.b, "second ledger.json or run report (e.g. the TP N run)")->required();
  return cmd;
}

int diff_command(const DiffArgs& args) {
  const nlohmann::json ja = read_json(args.a), jb = read_json(args.b);
  const std::string sa = schema_of(ja, args.a), sb = schema_of(jb, args.b);
  // An emulate ledger holds one trace ledger per rank: comparable with another emulate
  // ledger or with a trace ledger (a single process, e.g. a TP 1 run under tpcheck trace).
  const bool ledgers = sa != names::kRunSchema && sb != names::kRunSchema;
  if (ledgers && (sa == kEmulateSchema || sb == kEmulateSchema)) {
    return diff_emulate_ledgers(args.a, ja, args.b, jb);
  }
  TPCHECK_CHECK_INPUT(sa == sb, "cannot compare a {} ('{}') with a {} ('{}')", sa, args.a, sb, args.b);
  if (sa == kTraceSchema) return diff_traces(args, ja, jb);
  const std::vector<std::string> changes = diff_run_reports(ja, jb);
  fmt::print("A = {}\nB = {}\n", args.a, args.b);
  for (const std::string& c : changes) fmt::print("{}\n", c);
  if (changes.empty()) fmt::print("no change\n");
  return changes.empty() ? 0 : 1;
}

}  // namespace tpcheck

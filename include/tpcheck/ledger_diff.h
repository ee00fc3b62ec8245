// tpcheck/ledger_diff.h — traced GEMM ledgers (tpcheck trace) and what changed between
// two ledgers or two run reports (tpcheck logdiff / diff).
//
// A trace ledger (schema "tpcheck.trace/1") is what `tpcheck trace -- CMD` writes: the
// command, its exit status, the environment that decides GEMM numerics, and per process
// (one cuBLASLt log each) the matmul calls parsed from its log. Each call is written with
// the key names of tpcheck's own GEMM records (`m`, `n`, `k`, `batch`, `trans_a`,
// `dtypes`, `math_class`, `cublaslt: {compute_type, algo_id, tile, stages, split_k, ...}`,
// src/report/json_report.cpp), so one reader serves both.
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/cublaslt_log.h"
#include "tpcheck/names.h"

namespace tpcheck {

using names::kTraceSchema;

nlohmann::json cublaslt_call_to_json(const CublasLtCall& call);
// Error(kInput) naming `where` and the key when the object is not a call.
CublasLtCall cublaslt_call_from_json(const nlohmann::json& j, const std::string& where);

struct TraceProcess {
  int pid = 0;
  std::string log;  // the log file
  std::vector<CublasLtCall> calls;
  std::vector<CublasLtLogProblem> problems;
};

struct TraceLedger {
  std::vector<std::string> command;
  int exit_status = 0;
  nlohmann::json environment = nlohmann::json::object();
  std::vector<TraceProcess> processes;
};

nlohmann::json trace_to_json(const TraceLedger& ledger);
TraceLedger trace_from_json(const nlohmann::json& j, const std::string& where);

// Aligned calls whose algorithm, compute type or numerical class differ, grouped by
// (shapes, kind, the two algorithms).
struct CublasLtDiffGroup {
  CublasLtCall a, b;                      // the first pair of the group
  std::size_t count = 0;
  std::vector<std::int64_t> a_lines, b_lines;  // log lines of the first few pairs
  bool shape_differs = false, algorithm_differs = false, compute_differs = false,
       class_differs = false;
};

struct CublasLtDiff {
  std::size_t a_calls = 0, b_calls = 0;
  std::size_t paired = 0, paired_shape_differs = 0, only_a = 0, only_b = 0;
  std::vector<CublasLtDiffGroup> groups;  // in order of first appearance
  bool any() const { return !groups.empty() || only_a > 0 || only_b > 0; }
};

CublasLtDiff diff_cublaslt_calls(const std::vector<CublasLtCall>& a,
                                 const std::vector<CublasLtCall>& b);
// The console form: one block per group, m n k of both sides, both algorithms, and the
// numerical implementation where it is known.
std::string format_cublaslt_diff(const CublasLtDiff& diff, std::string_view label_a,
                                 std::string_view label_b);
nlohmann::json cublaslt_diff_to_json(const CublasLtDiff& diff);

// GEMM count by shape, algorithm and numerical class (where known), most frequent first.
std::string format_call_summary(const std::vector<CublasLtCall>& calls);

// Two run reports (schema tpcheck.run/1): what changed, one line each: environment
// values, cases added or gone, verdict changes per policy, GEMM sites whose class or
// algorithm changed, the summary. Empty when nothing did. Error(kInput) on a report
// that lacks the keys it needs.
std::vector<std::string> diff_run_reports(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace tpcheck

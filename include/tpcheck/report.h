// tpcheck/report.h — turning judged cases into what a person or a program reads.
//
// Console: one line per case (verdict under the chosen policy, every policy's verdict,
// the deciding tensor), the reference suite's "NUMERICAL CHECK FAILED" line for every
// tensor failing `te`, GEMM sites whose class differs, and a last line exactly
// "N passed, M failed" for the chosen policy. With several training steps the deciding
// tensor, the reason and the reference lines name their step ("step 2: ...").
// JSON: schema "tpcheck.run/1" (documented in README.md), same names as the console; with
// several steps each case holds `steps` (each step's verdicts and tensors) in place of
// `tensors`.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tpcheck/suite.h"

namespace tpcheck {

struct RunSettings {
  std::string backend = "cpu";
  std::string suite = "te";
  int tp = 4;
  std::uint64_t seed = 1234;
  std::string mutation = "none";
  std::string cpu_gemm = "fp32";
  std::string recipe = "none";    // quant.h recipe_name
  int steps = 1;                  // training steps per run (RunConfig::steps)
  std::vector<Policy> policies;   // reported policies
  std::size_t chosen_policy = 0;  // index into policies: decides pass/fail and exit code
  CompareOptions compare;
  std::vector<std::string> notes; // what the suite adjusted
  // Backend- and device-specific environment (GPU, versions, TF32, workspace,
  // communicator), merged into the JSON environment.
  nlohmann::json environment = nlohmann::json::object();
};

struct Summary {
  int passed = 0;
  int failed = 0;
};
Summary summarize(const std::vector<CaseResult>& results, std::size_t chosen_policy);

// One case: its line, then reference-style lines and GEMM class changes.
void print_case(std::ostream& out, const CaseResult& result, const RunSettings& settings);
// Notes before the cases; the closing "N passed, M failed" line after them.
void print_header(std::ostream& out, const RunSettings& settings, std::size_t case_count);
void print_summary(std::ostream& out, const Summary& summary, const RunSettings& settings);

nlohmann::json case_to_json(const CaseResult& result, const RunSettings& settings);
nlohmann::json run_to_json(const std::vector<CaseResult>& results, const RunSettings& settings);

}  // namespace tpcheck

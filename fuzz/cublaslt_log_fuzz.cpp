// libFuzzer target: the cuBLASLt log parser and the alignment of its calls. Any input is
// either calls or problems with line numbers; a crash or sanitizer report is a bug.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tpcheck/cublaslt_log.h"
#include "tpcheck/ledger_diff.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const tpcheck::CublasLtLog log = tpcheck::parse_cublaslt_log(text);
  for (const tpcheck::CublasLtLogProblem& p : log.problems) {
    if (p.line < 1 || p.line > log.lines || p.reason.empty()) std::abort();
  }
  for (const tpcheck::CublasLtCall& c : log.calls) {
    if (c.line < 1 || c.line > log.lines || c.m < 0 || c.n < 0 || c.k < 0) std::abort();
    // The JSON form reads back.
    const tpcheck::CublasLtCall back =
        tpcheck::cublaslt_call_from_json(tpcheck::cublaslt_call_to_json(c), "fuzz");
    if (!back.same_algorithm(c) || back.m != c.m || back.a != c.a) std::abort();
  }
  // Aligning the calls with themselves shifted by one exercises the lookahead.
  std::vector<tpcheck::CublasLtCall> shifted(log.calls.begin() + (log.calls.empty() ? 0 : 1),
                                             log.calls.end());
  const tpcheck::CublasLtDiff d = tpcheck::diff_cublaslt_calls(log.calls, shifted);
  if (d.paired + d.only_a != log.calls.size() || d.paired + d.only_b != shifted.size()) std::abort();
  return 0;
}

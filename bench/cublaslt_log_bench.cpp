// How fast `tpcheck logdiff` / `trace` read cuBLASLt logs: parse_cublaslt_log over a
// synthetic 128 MiB log in memory, made as CUBLASLT_LOG_LEVEL=5 writes one: for every
// matmul an Api line, an Info line and the Trace line (varying shapes, algorithms,
// optional fields), plus program output. Goal (issue 10): >= 100 MB/s. The figure is
// bytes of log per second (Google Benchmark's bytes_per_second); alignment of the calls
// (logdiff's second step) is timed separately.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <string>

#include "tpcheck/cublaslt_log.h"
#include "tpcheck/ledger_diff.h"

namespace {

const std::string& synthetic_log() {
  static const std::string text = [] {
    std::string s;
    s.reserve(136u << 20);
    std::uint64_t i = 0;
    while (s.size() < (128u << 20)) {
      const std::int64_t m = 64 << (i % 5), n = 1024 >> (i % 3), k = 8 << (i % 4);
      const int pid = 1000 + static_cast<int>(i % 2);
      s += fmt::format(
          "[2026-11-30 10:00:00][cublasLt][{}][Api][cublasLtMatmul] lightHandle=0X55D0 "
          "computeDesc=0X55D1 alpha=0X7FFD A=0X7F00 Adesc=0X55D2 B=0X7F01 Bdesc=0X55D3 beta=0X7FFD "
          "C=0X7F02 Cdesc=0X55D4 D=0X7F02 Ddesc=0X55D4 algo=0X7FFD workSpace=0X7F03 "
          "workSpaceSizeInBytes=33554432 stream=0X0\n",
          pid);
      s += fmt::format("[2026-11-30 10:00:00][cublasLt][{}][Info][cublasLtMatmulAlgoGetHeuristic] "
                       "returnedAlgoCount=8\n", pid);
      s += fmt::format(
          "[2026-11-30 10:00:00][cublasLt][{}][Trace][cublasLtMatmul] A=0X7F0F0E000000 "
          "Adesc=[type=R_32F rows={} cols={} ld={}{}] B=0X7F0F0F000000 "
          "Bdesc=[type=R_32F rows={} cols={} ld={}] C=0X7F0F10000000 "
          "Cdesc=[type=R_32F rows={} cols={} ld={}] D=0X7F0F10000000 "
          "Ddesc=[type=R_32F rows={} cols={} ld={}] "
          "computeDesc=[computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F transa=OP_T{}] "
          "algo=[algoId={} tile=MATMUL_TILE_{} stages=MATMUL_STAGES_32x5{}{} "
          "clusterShape=CLUSTER_SHAPE_1x1x1] workSpace=0X7F0F11000000 "
          "workSpaceSizeInBytes={} beta={} outOfPlace=0 stream=0X0\n",
          pid, k, m, k, i % 7 == 0 ? " order=ORDER_COL" : "", k, n, k, m, n, m, m, n, m,
          i % 3 == 0 ? " epilogue=EPILOGUE_BIAS" : "", 6 + i % 30,
          i % 2 ? "64x64" : "128x128", i % 4 == 0 ? " numSplitsK=2 reductionScheme=REDUCTION_SCHEME_INPLACE" : "",
          i % 5 == 0 ? " ctaSwizzling=1" : "", (i % 3) << 20, i % 2);
      if (i % 10 == 0) s += "step 12 loss 0.123456 lr 1e-4\n";
      ++i;
    }
    return s;
  }();
  return text;
}

void BM_ParseCublasLtLog(benchmark::State& state) {
  const std::string& text = synthetic_log();
  std::size_t calls = 0;
  for (auto _ : state) {
    const tpcheck::CublasLtLog log = tpcheck::parse_cublaslt_log(text);
    calls = log.calls.size();
    benchmark::DoNotOptimize(calls);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["log_MiB"] = static_cast<double>(text.size()) / (1 << 20);
  state.counters["matmul_calls"] = static_cast<double>(calls);
}
BENCHMARK(BM_ParseCublasLtLog)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_DiffCublasLtCalls(benchmark::State& state) {
  const tpcheck::CublasLtLog log = tpcheck::parse_cublaslt_log(synthetic_log());
  for (auto _ : state) {
    const tpcheck::CublasLtDiff d = tpcheck::diff_cublaslt_calls(log.calls, log.calls);
    benchmark::DoNotOptimize(d.paired);
  }
  state.counters["matmul_calls"] = static_cast<double>(log.calls.size());
}
BENCHMARK(BM_DiffCublasLtCalls)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();

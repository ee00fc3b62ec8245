// transformer_layer_bench.cpp — one TransformerLayer forward + backward on the CPU
// backend (single device, f32 storage, fp32 GEMM class), next to a plain OpenBLAS sgemm
// at the layer's dominant GEMM shape, timed in the same process so the ratio of the two
// FLOP rates means something on a shared machine.
//
// Benchmarks (the last argument is always the OpenBLAS thread count, set explicitly with
// set_cpu_gemm_threads and reported as the counter `threads`):
//   BM_TransformerLayer/<hidden>/<ffn>/<heads>/<seq>/<batch>/<threads>
//   BM_OpenblasSgemm/<m>/<n>/<k>/<threads>        C = A·Bᵀ, as a layer's forward GEMM does
//   BM_BackendGemm/<m>/<n>/<k>/<threads>          the same product through Backend::gemm
//                                                 (operand copies and result store included)
// Sizes: the reference suite's (hidden 64, ffn 32, heads 4, seq 64, batch 16), the large
// one (hidden 1024, ffn 4096, heads 16, seq 512, batch 4), and hidden 512 / ffn 2048 /
// heads 8 at the same tokens and head dim, for the scaling of the non-GEMM time.
//
// Counters of BM_TransformerLayer (per iteration unless a rate):
//   gemm_flops     Σ 2·batch·m·n·k over the ledger records of one forward + backward
//   attn_flops     the part of gemm_flops that is attention's products (batched ledger
//                  GEMMs attn.scores/*, attn.context/*): 4·b·h·s²·d forward (Q·Kᵀ and
//                  P·V) and 8·b·h·s²·d backward (dP, dQ, dK, dV); the full s×s products
//                  are computed even under the causal mask
//   gemm_rate      gemm_flops / time inside Backend::gemm           [FLOP/s]
//   gemm_rate_wall gemm_flops / whole iteration time                [FLOP/s]
//   t_<op>_ms      wall time inside Backend ops of each kind (timed_backend.h)
//   t_other_ms     the rest: the layers' own code (reshapes, copies, collectives of size 1)
//   t_nongemm_ms   iteration time minus t_gemm_ms
//   t_min_ms, t_nongemm_min_ms  the same for the fastest iteration (robust to other load)
//   cpu_<op>_ms, cpu_nongemm_ms, cpu_nongemm_min_ms  the same in the calling thread's CPU
//                  time: the non-GEMM ops are single-threaded, so this is their work even
//                  while other processes share the cores (timed_backend.h)
//   n_<op>         elements handed to the ops of each kind per iteration (a work count)
// Real time is reported (OpenBLAS threads make CPU time meaningless).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "timed_backend.h"
#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/layers/any_layer.h"
#include "tpcheck/rng.h"

namespace tpcheck::bench {
namespace {

constexpr std::uint64_t kSeed = 1234;

double ledger_flops(const GemmLedger& ledger) {
  double flops = 0.0;
  for (const GemmRecord& r : ledger.records()) {
    flops += 2.0 * static_cast<double>(r.batch) * static_cast<double>(r.m) *
             static_cast<double>(r.n) * static_cast<double>(r.k);
  }
  return flops;
}

void BM_TransformerLayer(benchmark::State& state) {
  const std::int64_t hidden = state.range(0), ffn = state.range(1), heads = state.range(2);
  const std::int64_t seq = state.range(3), batch = state.range(4);
  const int threads = static_cast<int>(state.range(5));
  set_cpu_gemm_threads(threads);

  TimedBackend backend(make_cpu_backend());
  GemmClassRule rule;  // kAsStored, f32 → fp32: the fp32 GEMM class
  rule.f32_class = MathClass::kFp32;
  backend.set_rule(rule);
  std::unique_ptr<Communicator> comm = make_single_communicator();
  ModuleContext ctx;
  ctx.backend = &backend;
  ctx.comm = comm.get();
  ctx.seed = kSeed;
  nlohmann::json options = {{"hidden_size", hidden},
                            {"ffn_hidden_size", ffn},
                            {"num_attention_heads", heads},
                            {"params_dtype", "f32"}};
  std::unique_ptr<AnyLayer> layer;
  try {
    layer = make_layer(LayerSpec{"TransformerLayer", options}, ctx);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }

  // Inputs of unit scale keep every intermediate far from subnormals (which would time
  // the FPU's slow path, not the code).
  const Shape shape = {seq, batch, hidden};
  const Tensor x = generate(FillSpec::normal(0.0, 1.0), kSeed, "bench.x", shape, DType::kF32);
  OutputGrads grads;
  grads.output = generate(FillSpec::normal(0.0, 1.0), kSeed, "bench.dy", shape, DType::kF32);

  // One untimed iteration: first-touch page faults and the ledger's FLOP count.
  backend.ledger().clear();
  layer->forward(x);
  layer->backward(grads);
  const double gemm_flops = ledger_flops(backend.ledger());
  const std::int64_t head_dim = hidden / heads;
  const double attn_flops = 12.0 * static_cast<double>(batch * heads) *
                            static_cast<double>(seq * seq) * static_cast<double>(head_dim);

  backend.reset();
  double total_seconds = 0.0;
  // Minima over iterations: other work on a shared machine only ever adds time, so the
  // fastest iteration is the best estimate of the code's own cost.
  double min_seconds = 1e300, min_nongemm_seconds = 1e300;
  double total_nongemm_cpu_seconds = 0.0, min_nongemm_cpu_seconds = 1e300;
  for (auto _ : state) {
    backend.ledger().clear();  // the ledger would otherwise grow by one layer per iteration
    const double gemm_before = backend.seconds(OpKind::kGemm);
    const double gemm_cpu_before = backend.cpu_seconds(OpKind::kGemm);
    const double cpu_start = thread_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    LayerOutputs out = layer->forward(x);
    Tensor dx = layer->backward(grads);
    benchmark::DoNotOptimize(dx.raw());
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
    const double cpu = thread_cpu_seconds() - cpu_start;
    total_seconds += d.count();
    const double nongemm_cpu = cpu - (backend.cpu_seconds(OpKind::kGemm) - gemm_cpu_before);
    total_nongemm_cpu_seconds += nongemm_cpu;
    min_nongemm_cpu_seconds = std::min(min_nongemm_cpu_seconds, nongemm_cpu);
    min_seconds = std::min(min_seconds, d.count());
    min_nongemm_seconds =
        std::min(min_nongemm_seconds, d.count() - (backend.seconds(OpKind::kGemm) - gemm_before));
  }

  const double n = static_cast<double>(state.iterations());
  double op_seconds = 0.0;
  for (int i = 0; i < static_cast<int>(OpKind::kCount); ++i) {
    const double s = backend.seconds(static_cast<OpKind>(i));
    op_seconds += s;
    state.counters["t_" + std::string(kOpKindNames[i]) + "_ms"] = 1e3 * s / n;
    state.counters["cpu_" + std::string(kOpKindNames[i]) + "_ms"] =
        1e3 * backend.cpu_seconds(static_cast<OpKind>(i)) / n;
    state.counters["n_" + std::string(kOpKindNames[i])] =
        backend.elements(static_cast<OpKind>(i)) / n;
  }
  state.counters["cpu_nongemm_ms"] = 1e3 * total_nongemm_cpu_seconds / n;
  state.counters["cpu_nongemm_min_ms"] = 1e3 * min_nongemm_cpu_seconds;
  const double gemm_seconds = backend.seconds(OpKind::kGemm);
  state.counters["t_other_ms"] = 1e3 * (total_seconds - op_seconds) / n;
  state.counters["t_nongemm_ms"] = 1e3 * (total_seconds - gemm_seconds) / n;
  state.counters["t_min_ms"] = 1e3 * min_seconds;
  state.counters["t_nongemm_min_ms"] = 1e3 * min_nongemm_seconds;
  state.counters["threads"] = cpu_gemm_threads();
  state.counters["gemm_flops"] = gemm_flops;
  state.counters["attn_flops"] = attn_flops;
  state.counters["gemm_rate"] = gemm_flops * n / gemm_seconds;
  state.counters["gemm_rate_wall"] =
      benchmark::Counter(gemm_flops, benchmark::Counter::kIsIterationInvariantRate);
}

// Operands for C[m, n] = A[m, k] · B[n, k]ᵀ (B stored as a layer's weight [out, in]).
struct GemmOperands {
  std::vector<float> a, b, c;
  GemmOperands(std::int64_t m, std::int64_t n, std::int64_t k)
      : a(static_cast<std::size_t>(m * k)),
        b(static_cast<std::size_t>(n * k)),
        c(static_cast<std::size_t>(m * n)) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(rng_normal(kSeed, "a", i));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(rng_normal(kSeed, "b", i));
  }
};

void BM_OpenblasSgemm(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  set_cpu_gemm_threads(static_cast<int>(state.range(3)));
  GemmOperands op(m, n, k);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, op.a.data(), static_cast<int>(k), op.b.data(),
                static_cast<int>(k), 0.0f, op.c.data(), static_cast<int>(n));
    benchmark::DoNotOptimize(op.c.data());
  }
  state.counters["threads"] = cpu_gemm_threads();
  state.counters["flops"] = 2.0 * m * n * k;
  state.counters["rate"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_BackendGemm(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  set_cpu_gemm_threads(static_cast<int>(state.range(3)));
  std::unique_ptr<Backend> backend = make_cpu_backend();
  const Tensor a = generate(FillSpec::normal(0.0, 1.0), kSeed, "a", {m, k}, DType::kF32);
  const Tensor b = generate(FillSpec::normal(0.0, 1.0), kSeed, "b", {n, k}, DType::kF32);
  Tensor c({m, n}, DType::kF32);
  for (auto _ : state) {
    backend->ledger().clear();
    backend->gemm("bench/fwd", a, false, b, true, c, false);
    benchmark::DoNotOptimize(c.raw());
  }
  state.counters["threads"] = cpu_gemm_threads();
  state.counters["flops"] = 2.0 * m * n * k;
  state.counters["rate"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}

// The reference sgemm runs first and last so a change of machine load during the layer
// runs shows up as a difference between the two.
void register_all() {
  const std::vector<int> thread_counts = {1, 2};
  for (int t : thread_counts) {
    benchmark::RegisterBenchmark("BM_OpenblasSgemm", BM_OpenblasSgemm)
        ->Args({2048, 4096, 1024, t})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
  }
  for (int t : thread_counts) {
    benchmark::RegisterBenchmark("BM_TransformerLayer", BM_TransformerLayer)
        ->Args({64, 32, 4, 64, 16, t})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
  }
  for (int t : thread_counts) {
    benchmark::RegisterBenchmark("BM_TransformerLayer", BM_TransformerLayer)
        ->Args({512, 2048, 8, 512, 4, t})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(3);
    benchmark::RegisterBenchmark("BM_TransformerLayer", BM_TransformerLayer)
        ->Args({1024, 4096, 16, 512, 4, t})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(3);
  }
  for (int t : thread_counts) {
    benchmark::RegisterBenchmark("BM_BackendGemm", BM_BackendGemm)
        ->Args({2048, 4096, 1024, t})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
    benchmark::RegisterBenchmark("BM_OpenblasSgemm", BM_OpenblasSgemm)
        ->Args({2048, 4096, 1024, t})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
  }
}

}  // namespace
}  // namespace tpcheck::bench

int main(int argc, char** argv) {
  tpcheck::bench::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

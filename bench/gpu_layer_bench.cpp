// gpu_layer_bench.cpp — the CUDA backend's speed, each figure next to its ceiling measured
// in the same process:
//   copy      device-to-device copy of 1 GiB (bytes read + written per second): the memory
//             bandwidth ceiling of the element-wise kernels;
//   gemm      a dense bf16 8192×8192×8192 GEMM through Backend::gemm (cuBLASLt, random
//             data): the matrix-rate ceiling;
//   layer     TransformerLayer forward + backward, bf16, TP 1, at hidden H, ffn F, heads A,
//             seq S, batch B (default 4096 / 16384 / 32 / 2048 / 4), causal: time per
//             step, FLOPs from the GEMM ledger (Σ 2·m·n·k·batch, attention's products
//             included, and again with them halved: what a causal mask leaves), the rate,
//             and the rate as a fraction of the gemm ceiling; with the unfused attention
//             (the reference's rounding points), with cuDNN's fused attention
//             (--attention fused), and under FP8 current scaling (the Linear GEMMs on FP8
//             operands, quantization included) with its speed-up over bf16; then the
//             time split by op kind of bf16 with each attention path and of FP8 with the
//             fused one;
//   quantize  each recipe's GPU quantization of a bf16 8192×8192 tensor (both copies),
//             bytes moved (input once, each copy once) per second against the copy rate
//             (both timed 10 calls back to back, as a layer issues them), and the same
//             with the amax pass's read of the input counted (the kernels' own traffic).
// Each timing: warm-up runs first, then `reps` timed runs (device synchronized around
// each); the median is reported. Prints one line per figure; with no GPU it says so and
// exits 0 (scripts/bench.sh runs every bench on the CPU machine too).
//   gpu_layer_bench [hidden ffn heads seq batch] [reps]
// TPCHECK_BENCH_QUANTIZE_ONLY=1 stops after the quantization figures;
// TPCHECK_PROFILE_CONFIG=<name> runs only that configuration's split (under a profiler).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "timed_backend.h"
#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/device.h"
#include "tpcheck/layers/any_layer.h"
#include "tpcheck/quant.h"
#include "tpcheck/rng.h"

namespace tpcheck {
namespace {

// Median seconds of `reps` runs of `body`, after two warm-up runs.
double median_seconds(Backend& be, int reps, const std::function<void()>& body) {
  for (int i = 0; i < 2; ++i) body();
  be.synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    be.synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Σ 2·m·n·k·batch over records[from..]. halve_attention: attention's products (the
// batched ones) count half, the FLOPs a causal mask leaves (what flash-attention
// benchmarks count; the unfused path computes the whole s×s products).
double ledger_flops(const std::vector<GemmRecord>& records, std::size_t from,
                    bool halve_attention = false) {
  double f = 0;
  for (std::size_t i = from; i < records.size(); ++i) {
    const GemmRecord& r = records[i];
    const double w = halve_attention && r.batch > 1 ? 0.5 : 1.0;
    f += w * 2.0 * r.m * r.n * r.k * r.batch;
  }
  return f;
}

int run(int argc, char** argv) {
  const DeviceInfo info = query_devices();
  if (info.cuda_devices == 0) {
    std::printf("gpu_layer_bench: skipped: %s\n", info.description.c_str());
    return 0;
  }
  std::int64_t hidden = 4096, ffn = 16384, heads = 32, seq = 2048, batch = 4;
  int reps = 5;
  if (argc >= 6) {
    hidden = std::atoll(argv[1]);
    ffn = std::atoll(argv[2]);
    heads = std::atoll(argv[3]);
    seq = std::atoll(argv[4]);
    batch = std::atoll(argv[5]);
  }
  if (argc == 7 || argc == 2) reps = std::atoi(argv[argc - 1]);
  std::unique_ptr<Backend> be = make_cuda_backend();
  const auto layer_options = [&] {
    return nlohmann::json{{"hidden_size", hidden},
                          {"ffn_hidden_size", ffn},
                          {"num_attention_heads", heads},
                          {"params_dtype", "bf16"},
                          {"layernorm_epsilon", 1e-5}};
  };
  std::printf("device: %s | %s\n", info.description.c_str(), cuda_versions().c_str());
  // Under a profiler (tests/gpu/run.sh kernels) only the split of one configuration runs.
  const bool profiling = std::getenv("TPCHECK_PROFILE_CONFIG") != nullptr;

  if (!profiling) {  // copy bandwidth
    Tensor src = generate(FillSpec::normal(0, 1), 1, "copy", {std::int64_t{1} << 28}, DType::kF32)
                     .to_device(Device::kCuda);
    Tensor dst;
    const double s = median_seconds(*be, 10, [&] { dst = src.clone(); });
    std::printf("copy: %.0f GB/s (1 GiB read + 1 GiB written, median of 10: %.3f ms)\n",
                2.0 * src.nbytes() / s / 1e9, s * 1e3);
  }
  double gemm_rate = 0;
  if (!profiling) {  // dense bf16 GEMM ceiling
    const std::int64_t n = 8192;
    Tensor a =
        generate(FillSpec::normal(0, 1), 1, "a", {n, n}, DType::kBF16).to_device(Device::kCuda);
    Tensor b =
        generate(FillSpec::normal(0, 1), 1, "b", {n, n}, DType::kBF16).to_device(Device::kCuda);
    Tensor c({n, n}, DType::kBF16, Device::kCuda);
    const double s =
        median_seconds(*be, 10, [&] { be->gemm("bench/gemm", a, false, b, true, c, false); });
    gemm_rate = 2.0 * n * n * n / s;
    std::printf("gemm: %.0f TFLOP/s (bf16 %lldx%lldx%lld, random data, %s)\n", gemm_rate / 1e12,
                static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n),
                be->ledger().records().back().implementation.c_str());
  }
  double copy_rate = 0;
  if (!profiling) {
    // Quantization kernels (quantize_on_gpu) on a bf16 [8192, 8192] activation, both copies
    // (rowwise and its transpose) as the layers ask for an input that fprop and wgrad
    // read. Bytes: the input read once and each copy written once (what a fused kernel
    // must move at least), against the copy bandwidth. Timed as a layer runs them: the
    // host issues a step far ahead of the GPU (~1 ms of a 13 ms step, the split below), so
    // a quantization costs its kernels back to back — kBackToBack calls between two
    // synchronizations, the copy likewise. The time of one call with a host wait around
    // it (launches, allocation and the wait included) is printed beside it.
    constexpr int kBackToBack = 10;
    Tensor src = generate(FillSpec::normal(0, 1), 1, "copy", {std::int64_t{1} << 28}, DType::kF32)
                     .to_device(Device::kCuda);
    Tensor dst;
    copy_rate = 2.0 * src.nbytes() * kBackToBack / median_seconds(*be, 10, [&] {
      for (int i = 0; i < kBackToBack; ++i) dst = src.clone();
    });
    const std::int64_t n = 8192;
    const Tensor x =
        generate(FillSpec::normal(0, 1), 2, "q", {n, n}, DType::kBF16).to_device(Device::kCuda);
    const std::pair<Recipe, QuantRole> recipes[] = {{Recipe::kFp8Current, QuantRole::kInput},
                                                    {Recipe::kFp8Block, QuantRole::kInput},
                                                    {Recipe::kMxfp8, QuantRole::kInput},
                                                    {Recipe::kNvfp4, QuantRole::kInput}};
    for (const auto& [recipe, role] : recipes) {
      QuantizeOptions o;
      o.recipe = recipe;
      o.role = role;
      std::shared_ptr<QuantizedData> q;
      const auto back_to_back = [&](QuantUsage usage) {
        o.usage = usage;
        return median_seconds(*be, 10, [&] {
                 for (int i = 0; i < kBackToBack; ++i) q = be->quantize(x, o, "bench");
               }) / kBackToBack;
      };
      // Each copy alone too: where the time goes between the rowwise stores (whole rows
      // per warp) and the transposed ones (16-byte pieces of 128 different rows a tile).
      const double rowwise_only = back_to_back(QuantUsage{true, false});
      const double columnwise_only = back_to_back(QuantUsage{false, true});
      const double s = back_to_back(QuantUsage{true, true});
      const double single = median_seconds(*be, 10, [&] { q = be->quantize(x, o, "bench"); });
      const double bytes = static_cast<double>(x.nbytes()) + 2.0 * n * n;  // + scales (small)
      // What the kernels move: FP8 current scaling and NVFP4 read the input once more in
      // an amax pass (their per-tensor scale needs the whole tensor's amax before the
      // first element is cast); block scaling and MXFP8 reduce it in the cast kernel.
      const bool amax_pass = recipe == Recipe::kFp8Current || recipe == Recipe::kNvfp4;
      const double traffic = bytes + (amax_pass ? static_cast<double>(x.nbytes()) : 0.0);
      std::printf(
          "quantize %s (bf16 %lldx%lld, rowwise + columnwise): %.3f ms a call back to back, "
          "%.0f GB/s = %.0f%% of the copy bandwidth (%.0f GB/s); the kernels' traffic (an "
          "amax pass's read included) %.0f GB/s = %.0f%%; one call with a host wait: %.3f ms; "
          "rowwise copy only %.3f ms, columnwise only %.3f ms\n",
          std::string(recipe_name(recipe)).c_str(), static_cast<long long>(n),
          static_cast<long long>(n), s * 1e3, bytes / s / 1e9, 100.0 * bytes / s / copy_rate,
          copy_rate / 1e9, traffic / s / 1e9, 100.0 * traffic / s / copy_rate, single * 1e3,
          rowwise_only * 1e3, columnwise_only * 1e3);
    }
  }
  // TPCHECK_BENCH_QUANTIZE_ONLY=1: the copy, GEMM and quantization figures only.
  if (std::getenv("TPCHECK_BENCH_QUANTIZE_ONLY") != nullptr) return 0;
  // The layer in four configurations, each with a backend of its own: bf16 with the
  // unfused attention (the reference's rounding points; the headline figure), bf16 with
  // cuDNN's fused attention (--attention fused), and FP8 current scaling with each.
  struct LayerConfig {
    const char* name;
    Recipe recipe;
    bool fused_attention;
  };
  const LayerConfig configs[] = {{"bf16", Recipe::kNone, false},
                                 {"bf16, fused attention", Recipe::kNone, true},
                                 {"fp8_cs", Recipe::kFp8Current, false},
                                 {"fp8_cs, fused attention", Recipe::kFp8Current, true}};
  // The bf16 layer's time with each attention path: an FP8 layer is compared with the
  // bf16 layer that has the same attention.
  double bf16_layer_seconds[2] = {0, 0};
  for (const LayerConfig& config : configs) {
    if (profiling) break;
    CudaBackendOptions backend_options;
    backend_options.fused_attention = config.fused_attention;
    std::unique_ptr<Backend> layer_be = make_cuda_backend(backend_options);
    std::unique_ptr<Communicator> comm = make_single_communicator();
    ModuleContext ctx{layer_be.get(), comm.get(), 1234};
    ctx.recipe = config.recipe;
    std::unique_ptr<AnyLayer> layer =
        make_layer(LayerSpec{"TransformerLayer", layer_options()}, ctx);
    const Tensor x =
        generate(FillSpec::normal(0, 1), 1, "input", {seq, batch, hidden}, DType::kBF16)
            .to_device(Device::kCuda);
    const Tensor dy =
        generate(FillSpec::normal(0, 1e-3), 1, "dy", {seq, batch, hidden}, DType::kBF16)
            .to_device(Device::kCuda);
    std::size_t from = 0;
    double flops = 0, causal_flops = 0;
    std::string attention_impl;
    const double s = median_seconds(*layer_be, reps, [&] {
      from = layer_be->ledger().records().size();
      layer->forward(x);
      layer->backward(OutputGrads{dy, Tensor(), Tensor()});
      const std::vector<GemmRecord>& records = layer_be->ledger().records();
      flops = ledger_flops(records, from);
      causal_flops = ledger_flops(records, from, /*halve_attention=*/true);
      for (std::size_t i = from; i < records.size(); ++i) {
        if (records[i].batch > 1) attention_impl = records[i].implementation;  // attention's
      }
    });
    if (config.recipe == Recipe::kNone) {
      bf16_layer_seconds[config.fused_attention] = s;
      std::printf(
          "layer (%s): TransformerLayer fwd+bwd bf16 hidden %lld ffn %lld heads %lld seq %lld "
          "batch "
          "%lld causal: %.2f ms, %.2f TFLOP (ledger) = %.0f TFLOP/s = %.0f%% of the gemm ceiling; "
          "attention's products counted for the causal half only: %.2f TFLOP = %.0f TFLOP/s = "
          "%.0f%%; %.2fx the unfused bf16 layer's speed; attention ran as: %s\n",
          config.name, static_cast<long long>(hidden), static_cast<long long>(ffn),
          static_cast<long long>(heads), static_cast<long long>(seq), static_cast<long long>(batch),
          s * 1e3, flops / 1e12, flops / s / 1e12, 100.0 * flops / s / gemm_rate,
          causal_flops / 1e12, causal_flops / s / 1e12, 100.0 * causal_flops / s / gemm_rate,
          bf16_layer_seconds[0] / s, attention_impl.c_str());
    } else {
      std::printf(
          "layer (%s): same layer, bf16 activations, Linear GEMMs on FP8 (quantization "
          "included): %.2f ms = %.2fx the speed of the bf16 layer with the same "
          "attention\n",
          config.name, s * 1e3, bf16_layer_seconds[config.fused_attention] / s);
    }
  }
  // Where the layer's time goes: one more iteration per configuration with the device
  // synchronized after every op (bench::TimedBackend), so each op kind's kernels are timed
  // by themselves. That iteration is also the window a profiler started with capture off
  // records (`ncu --profile-from-start off`: each kernel's time; tests/gpu/run.sh profile).
  const LayerConfig split_configs[] = {{"bf16, unfused attention", Recipe::kNone, false},
                                       {"bf16, fused attention", Recipe::kNone, true},
                                       {"fp8_cs, fused attention", Recipe::kFp8Current, true}};
  // TPCHECK_PROFILE_CONFIG=<name>: only that configuration's split (and its capture window).
  const char* only = std::getenv("TPCHECK_PROFILE_CONFIG");
  for (const LayerConfig& config : split_configs) {
    if (only != nullptr && config.name != std::string(only)) continue;
    CudaBackendOptions backend_options;
    backend_options.fused_attention = config.fused_attention;
    auto timed = std::make_unique<bench::TimedBackend>(make_cuda_backend(backend_options),
                                                       /*sync_each_op=*/true);
    bench::TimedBackend& tb = *timed;
    std::unique_ptr<Communicator> comm = make_single_communicator();
    ModuleContext ctx{&tb, comm.get(), 1234};
    ctx.recipe = config.recipe;
    std::unique_ptr<AnyLayer> layer =
        make_layer(LayerSpec{"TransformerLayer", layer_options()}, ctx);
    const Tensor x = generate(FillSpec::normal(0, 1), 1, "input", {seq, batch, hidden},
                              DType::kBF16, {}, 0, 1, Device::kCuda);
    const Tensor dy = generate(FillSpec::normal(0, 1e-3), 1, "dy", {seq, batch, hidden},
                               DType::kBF16, {}, 0, 1, Device::kCuda);
    double total = 0;
    for (int i = 0; i < 2; ++i) {  // the first is a warm-up
      tb.reset();
      tb.synchronize();
      if (i == 1) {
        std::fprintf(stderr, "[step] the measured iteration of %s begins\n", config.name);
        cuda_profiler_capture(true);
      }
      const auto start = std::chrono::steady_clock::now();
      layer->forward(x);
      layer->backward(OutputGrads{dy, Tensor(), Tensor()});
      tb.synchronize();
      total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (i == 1) cuda_profiler_capture(false);
    }
    const auto print_split = [&](const char* how, double all) {
      double ops = 0;
      std::printf("layer time split (%s; ms, %s; %.2f ms in all):", config.name, how, all * 1e3);
      for (int k = 0; k < static_cast<int>(bench::OpKind::kCount); ++k) {
        const double sec = tb.seconds(static_cast<bench::OpKind>(k));
        ops += sec;
        std::printf(" %s %.2f", std::string(bench::kOpKindNames[k]).c_str(), sec * 1e3);
      }
      std::printf(", other %.2f\n", (all - ops) * 1e3);
    };
    print_split("device synchronized after every op", total);
    // The host's side: the same step with no synchronization, each op's time being what
    // the host spends issuing it. When the host's total comes near the step's time, the
    // GPU waits for the host (launch overhead, or an op that waits for the GPU inside).
    tb.set_sync_each_op(false);
    tb.reset();
    tb.synchronize();
    const auto start = std::chrono::steady_clock::now();
    layer->forward(x);
    layer->backward(OutputGrads{dy, Tensor(), Tensor()});
    const double issued = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tb.synchronize();
    const double step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    print_split("host time issuing each op, no synchronization", issued);
    std::printf("layer host issue (%s): %.2f ms of host time to issue a step of %.2f ms\n",
                config.name, issued * 1e3, step * 1e3);
  }
  return 0;
}

}  // namespace
}  // namespace tpcheck

int main(int argc, char** argv) {
  try {
    return tpcheck::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_layer_bench: error: %s\n", e.what());
    return 3;
  }
}

// fused_attention.cpp — CudaBackend::run_fused_attention_forward / _backward: scaled
// dot-product attention in one cuDNN call per pass (cuDNN's flash attention through its
// frontend's SDPA graphs), what TransformerEngine's FusedAttention backend runs on Hopper.
// Taken when CudaBackendOptions::fused_attention is on (`--attention fused`) and the
// problem is one this path supports: q, k, v f16 or bf16, no mask or a causal mask
// without a window, head dim a multiple of 8 up to 256, and cuDNN accepts the graph.
// Otherwise the hooks return false and Backend::attention_forward composes the unfused
// primitives (src/backend/composed_attention.cpp); the ledger's implementation text says which ran.
//
// Numerics (against the unfused path, whose rounding points are the reference's unfused
// attention): the scores are never stored; the softmax is computed online in f32 over
// key blocks (a running maximum and sum, rescaled per block), P is rounded to the input
// type for the context product inside the kernel, the output rounded once. The backward
// recomputes P from q, k and the saved row log-sum-exp (`stats`), and forms dQ, dK, dV with
// f32 accumulation; dK, dV of a key/value group sum its query heads inside the kernel.
// The backward is asked to be deterministic (no atomics in dQ); `implementation` records
// whether cuDNN gave that.
//
// Buffers (s = sequence, b = batch, h = heads, g = groups, d = head dim; the layers'
// layout, passed to cuDNN by strides, no copies):
//   q, out, dout, dq   [s, b, h, d]  T  → cuDNN dims [b, h, s, d], strides [h·d, d, b·h·d, 1]
//   k, v, dk, dv       [s, b, g, d]  T  → [b, g, s, d], strides [g·d, d, b·g·d, 1]
//   stats              [b, h, s, 1]  f32 (contiguous)
//
// cuDNN is loaded at run time (the frontend's dynamic loading): libcudnn.so.9 from the
// library path, or the file TPCHECK_CUDNN_LIBRARY names. A build without the frontend's
// headers (TPCHECK_HAVE_CUDNN_FRONTEND unset) has no fused path: asking for it is an
// error that says so.
//
// Graphs are built once per problem (shape, type, mask, scale) and device, and kept for
// the process: the suite makes a backend per run. One cuDNN handle per device, shared by
// the rank threads under a mutex held while a call is enqueued on the rank's stream.
// Thread safety: any rank thread; the per-device state is locked.
#include "backend/cuda/cuda_backend_impl.h"

#include <string>

#include "tpcheck/error.h"

#if TPCHECK_HAVE_CUDNN_FRONTEND

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"

// The frontend's dynamic loading reads cuDNN's symbols from this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace tpcheck {
namespace cuda {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the graphs' variant packs.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// Loads libcudnn.so.9 once; throws Error(kInput) saying how to make it loadable.
void load_cudnn() {
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    const char* named = std::getenv("TPCHECK_CUDNN_LIBRARY");
    const char* file = named != nullptr && *named != '\0' ? named : "libcudnn.so.9";
    void* handle = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      failure = TPCHECK_FORMAT(
          "--attention fused needs cuDNN 9 ({}), which could not be loaded: {}. Put the folder "
          "that holds libcudnn.so.9 on LD_LIBRARY_PATH (pip's nvidia-cudnn-cu13 installs it in "
          "site-packages/nvidia/cudnn/lib), or name the file in TPCHECK_CUDNN_LIBRARY; or run "
          "with --attention unfused",
          file, why != nullptr ? why : "unknown error");
      return;
    }
    cudnn_frontend::cudnn_dlhandle = handle;
  });
  TPCHECK_CHECK_INPUT(failure.empty(), "{}", failure);
}

std::string fe_message(fe::error_t e) { return e.get_message(); }

// A built graph and what the ledger says of it.
struct FusedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  std::string implementation;
  std::string unsupported;  // non-empty: cuDNN refused the graph (why); not fused
};

// One device's cuDNN handle and graph cache.
struct CudnnDevice {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  std::map<std::string, std::shared_ptr<FusedGraph>> graphs;
};

CudnnDevice& cudnn_device(int device) {
  static std::mutex mutex;
  // Never destroyed: graphs and the handle live until the process ends (destroying them
  // from a static destructor would race CUDA's own teardown).
  static auto* devices = new std::map<int, std::unique_ptr<CudnnDevice>>();
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<CudnnDevice>& d = (*devices)[device];
  if (!d) d = std::make_unique<CudnnDevice>();
  return *d;
}

struct Problem {
  std::int64_t s, b, h, g, d;
  DType dtype;
  bool causal;
  double scale;
};

std::string problem_key(const char* pass, const Problem& p) {
  std::uint64_t scale_bits = 0;
  std::memcpy(&scale_bits, &p.scale, sizeof scale_bits);
  return TPCHECK_FORMAT("{} {} s{} b{} h{} g{} d{} {} scale {:x}", pass, dtype_name(p.dtype), p.s,
                        p.b, p.h, p.g, p.d, p.causal ? "causal" : "no mask", scale_bits);
}

// The layers' [s, b, n, d] as cuDNN's [b, n, s, d] by strides.
std::vector<std::int64_t> bnsd_dims(std::int64_t b, std::int64_t n, std::int64_t s,
                                    std::int64_t d) {
  return {b, n, s, d};
}
std::vector<std::int64_t> sbnd_strides(std::int64_t b, std::int64_t n, std::int64_t d) {
  return {n * d, d, b * n * d, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> layer_tensor(fe::graph::Graph& g, const char* name,
                                                           Uid uid, std::int64_t b,
                                                           std::int64_t n, std::int64_t s,
                                                           std::int64_t d) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(bnsd_dims(b, n, s, d))
                      .set_stride(sbnd_strides(b, n, d)));
}

void set_layer_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid,
                      std::int64_t b, std::int64_t n, std::int64_t s, std::int64_t d) {
  t->set_output(true).set_uid(uid).set_dim(bnsd_dims(b, n, s, d)).set_stride(sbnd_strides(b, n, d));
}

// The inputs q, k, v as both graphs declare them: names, uids, and the layers' layout by
// strides (the file comment's table); their data type is the graph's io type (new_graph).
struct QkvTensors {
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v;
};

QkvTensors qkv_tensors(fe::graph::Graph& g, const Problem& p) {
  QkvTensors t;
  t.q = layer_tensor(g, "q", kQ, p.b, p.h, p.s, p.d);
  t.k = layer_tensor(g, "k", kK, p.b, p.g, p.s, p.d);
  t.v = layer_tensor(g, "v", kV, p.b, p.g, p.s, p.d);
  return t;
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(dtype == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

// validate → operation graph → heuristics' plans → support → build. Returns "" or why not.
std::string build(fe::graph::Graph& graph, cudnnHandle_t handle) {
  if (auto e = graph.validate(); e.is_bad()) return "validate: " + fe_message(e);
  if (auto e = graph.build_operation_graph(handle); e.is_bad()) {
    return "build_operation_graph: " + fe_message(e);
  }
  if (auto e = graph.create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) {
    return "create_execution_plans: " + fe_message(e);
  }
  if (auto e = graph.check_support(handle); e.is_bad()) return "check_support: " + fe_message(e);
  if (auto e = graph.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad()) {
    return "build_plans: " + fe_message(e);
  }
  return "";
}

std::string describe_plan(fe::graph::Graph& graph, const char* pass, bool deterministic) {
  std::string plan;
  if (graph.get_plan_name(plan).is_bad()) plan = "?";
  const std::size_t v = fe::detail::get_backend_version();
  return TPCHECK_FORMAT("cuDNN {}.{}.{} fused attention {} (flash; engine {}{})", v / 10000,
                        v % 10000 / 100, v % 100, pass, plan,
                        deterministic ? "" : "; non-deterministic dQ");
}

std::shared_ptr<FusedGraph> forward_graph(const Problem& p, cudnnHandle_t handle) {
  auto out = std::make_shared<FusedGraph>();
  out->graph = new_graph(p.dtype);
  fe::graph::Graph& g = *out->graph;
  auto [q, k, v] = qkv_tensors(g, p);
  fe::graph::SDPA_attributes options;
  options.set_name("tpcheck_attention_forward")
      .set_generate_stats(true)
      .set_attn_scale(static_cast<float>(p.scale))
      .set_causal_mask(p.causal);
  auto [o, stats] = g.sdpa(q, k, v, options);
  set_layer_output(o, kO, p.b, p.h, p.s, p.d);
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  out->unsupported = build(g, handle);
  if (out->unsupported.empty()) {
    out->workspace = g.get_workspace_size();
    out->implementation = describe_plan(g, "forward", true);
  }
  return out;
}

std::shared_ptr<FusedGraph> backward_graph(const Problem& p, cudnnHandle_t handle,
                                           bool deterministic) {
  auto out = std::make_shared<FusedGraph>();
  out->graph = new_graph(p.dtype);
  fe::graph::Graph& g = *out->graph;
  auto [q, k, v] = qkv_tensors(g, p);
  auto o = layer_tensor(g, "o", kO, p.b, p.h, p.s, p.d);
  auto dout = layer_tensor(g, "dout", kDO, p.b, p.h, p.s, p.d);
  auto stats = g.tensor(fe::graph::Tensor_attributes()
                            .set_name("stats")
                            .set_uid(kStats)
                            .set_dim({p.b, p.h, p.s, 1})
                            .set_stride({p.h * p.s, p.s, 1, 1})
                            .set_data_type(fe::DataType_t::FLOAT));
  fe::graph::SDPA_backward_attributes options;
  options.set_name("tpcheck_attention_backward")
      .set_attn_scale(static_cast<float>(p.scale))
      .set_causal_mask(p.causal)
      .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, options);
  set_layer_output(dq, kDQ, p.b, p.h, p.s, p.d);
  set_layer_output(dk, kDK, p.b, p.g, p.s, p.d);
  set_layer_output(dv, kDV, p.b, p.g, p.s, p.d);
  out->unsupported = build(g, handle);
  if (out->unsupported.empty()) {
    out->workspace = g.get_workspace_size();
    out->implementation = describe_plan(g, "backward", deterministic);
  }
  return out;
}

// The cached graph for `key`, built on first use (under the device lock).
std::shared_ptr<FusedGraph> graph_for(CudnnDevice& dev, const std::string& key, const Problem& p,
                                      bool backward) {
  auto it = dev.graphs.find(key);
  if (it != dev.graphs.end()) return it->second;
  std::shared_ptr<FusedGraph> graph;
  if (!backward) {
    graph = forward_graph(p, dev.handle);
  } else {
    graph = backward_graph(p, dev.handle, /*deterministic=*/true);
    if (!graph->unsupported.empty()) {
      // Not every cuDNN offers a deterministic backward for every shape; the atomic one
      // differs only in dQ's summation order (and says so in the ledger).
      std::shared_ptr<FusedGraph> any = backward_graph(p, dev.handle, /*deterministic=*/false);
      if (any->unsupported.empty()) graph = any;
    }
  }
  dev.graphs.emplace(key, graph);
  return graph;
}

// Enqueues `graph` on the calling rank's stream with the pointers of `pack`.
void execute(CudnnDevice& dev, const FusedGraph& graph,
             std::unordered_map<std::int64_t, void*>& pack, const std::string& key) {
  std::shared_ptr<std::byte> workspace;
  if (graph.workspace > 0) {
    workspace = install_cuda_runtime().allocate(static_cast<std::size_t>(graph.workspace));
  }
  if (auto e = fe::detail::set_stream(dev.handle, current_stream()); e != CUDNN_STATUS_SUCCESS) {
    TPCHECK_CHECK(false, "cuDNN: cudnnSetStream failed ({}) for {}",
                  fe::detail::get_error_string(e), key);
  }
  if (auto e = graph.graph->execute(dev.handle, pack, workspace.get()); e.is_bad()) {
    TPCHECK_CHECK(false, "cuDNN fused attention failed to run {}: {}", key, fe_message(e));
  }
  // The workspace goes back to this stream's pool: later work on the stream reuses it
  // only after the call above.
}

// What this path takes; "" or why not (the problem then runs unfused).
std::string unsupported_problem(const Tensor& q, const AttentionMask& mask) {
  if (q.dtype() != DType::kF16 && q.dtype() != DType::kBF16) {
    return TPCHECK_FORMAT("{} inputs (cuDNN's fused attention takes f16 and bf16)",
                          dtype_name(q.dtype()));
  }
  if (mask.type == AttentionMask::Type::kSlidingWindow ||
      (mask.type == AttentionMask::Type::kCausal && mask.window_left >= 0)) {
    return "a sliding-window mask (not mapped to cuDNN's diagonal band here)";
  }
  const std::int64_t d = q.dim(3);
  if (d % 8 != 0 || d > 256) return TPCHECK_FORMAT("head dim {} (a multiple of 8 up to 256)", d);
  return "";
}

Problem problem_of(const Tensor& q, const Tensor& k, const AttentionMask& mask, double scale) {
  return Problem{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3), q.dtype(),
                 mask.type == AttentionMask::Type::kCausal, scale};
}

void* ptr(const Tensor& t) { return const_cast<void*>(t.raw()); }

}  // namespace
}  // namespace cuda

bool CudaBackend::run_fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const AttentionMask& mask, double scale,
                                              AttentionForward& out,
                                              std::string& implementation) {
  if (!options_.fused_attention || !cuda::unsupported_problem(q, mask).empty()) return false;
  cuda::load_cudnn();
  const cuda::Problem p = cuda::problem_of(q, k, mask, scale);
  const std::string key = cuda::problem_key("forward", p);
  cuda::CudnnDevice& dev = cuda::cudnn_device(options_.device);
  std::lock_guard<std::mutex> lock(dev.mutex);
  if (dev.handle == nullptr) {
    if (auto e = cudnn_frontend::detail::create_handle(&dev.handle); e != CUDNN_STATUS_SUCCESS) {
      TPCHECK_CHECK(false, "cuDNN: cudnnCreate failed on GPU {}: {}", options_.device,
                    cudnn_frontend::detail::get_error_string(e));
    }
  }
  const std::shared_ptr<cuda::FusedGraph> graph = cuda::graph_for(dev, key, p, false);
  if (!graph->unsupported.empty()) return false;
  out.out = Tensor(q.shape(), q.dtype(), Device::kCuda);
  out.stats = Tensor({p.b, p.h, p.s, 1}, DType::kF32, Device::kCuda);
  std::unordered_map<std::int64_t, void*> pack = {
      {cuda::kQ, cuda::ptr(q)},         {cuda::kK, cuda::ptr(k)},
      {cuda::kV, cuda::ptr(v)},         {cuda::kO, out.out.raw()},
      {cuda::kStats, out.stats.raw()}};
  cuda::execute(dev, *graph, pack, key);
  implementation = graph->implementation;
  return true;
}

AttentionGrads CudaBackend::run_fused_attention_backward(const Tensor& dout, const Tensor& q,
                                                         const Tensor& k, const Tensor& v,
                                                         const AttentionForward& saved,
                                                         const AttentionMask& mask, double scale,
                                                         std::string& implementation) {
  TPCHECK_CHECK_INPUT(dout.dtype() == q.dtype(),
                      "attention_backward (fused): dout is {}, q {}; the fused backward takes "
                      "them in one dtype",
                      dout.describe(), q.describe());
  cuda::load_cudnn();
  const cuda::Problem p = cuda::problem_of(q, k, mask, scale);
  const std::string key = cuda::problem_key("backward", p);
  cuda::CudnnDevice& dev = cuda::cudnn_device(options_.device);
  std::lock_guard<std::mutex> lock(dev.mutex);
  TPCHECK_CHECK(dev.handle != nullptr, "fused attention backward before any fused forward");
  const std::shared_ptr<cuda::FusedGraph> graph = cuda::graph_for(dev, key, p, true);
  TPCHECK_CHECK(graph->unsupported.empty(),
                "cuDNN runs this attention's forward fused but refuses its backward ({}): {}", key,
                graph->unsupported);
  AttentionGrads grads{Tensor(q.shape(), q.dtype(), Device::kCuda),
                       Tensor(k.shape(), k.dtype(), Device::kCuda),
                       Tensor(v.shape(), v.dtype(), Device::kCuda)};
  std::unordered_map<std::int64_t, void*> pack = {
      {cuda::kQ, cuda::ptr(q)},           {cuda::kK, cuda::ptr(k)},
      {cuda::kV, cuda::ptr(v)},           {cuda::kO, cuda::ptr(saved.out)},
      {cuda::kDO, cuda::ptr(dout)},       {cuda::kStats, cuda::ptr(saved.stats)},
      {cuda::kDQ, grads.dq.raw()},        {cuda::kDK, grads.dk.raw()},
      {cuda::kDV, grads.dv.raw()}};
  cuda::execute(dev, *graph, pack, key);
  implementation = graph->implementation;
  return grads;
}

}  // namespace tpcheck

#else  // no cuDNN frontend headers at build time

namespace tpcheck {

bool CudaBackend::run_fused_attention_forward(const Tensor& q, const Tensor&, const Tensor&,
                                              const AttentionMask&, double, AttentionForward&,
                                              std::string&) {
  TPCHECK_CHECK_INPUT(!options_.fused_attention,
                      "--attention fused: this tpcheck was built without cuDNN's frontend "
                      "headers (scripts/setup.sh installs them in .deps/; see "
                      "docs/ARCHITECTURE.md), so it has no fused attention; run with "
                      "--attention unfused (q {})",
                      q.describe());
  return false;
}

AttentionGrads CudaBackend::run_fused_attention_backward(const Tensor&, const Tensor&,
                                                         const Tensor&, const Tensor&,
                                                         const AttentionForward&,
                                                         const AttentionMask&, double,
                                                         std::string&) {
  TPCHECK_CHECK_INPUT(false, "fused attention: this tpcheck was built without cuDNN's frontend");
  return {};
}

}  // namespace tpcheck

#endif

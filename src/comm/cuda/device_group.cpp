// device_group.cpp — the device-local communicator: N ranks as threads on one GPU.
//
// A collective on rank r (stream s = the rank's current stream):
//   1. record the ledger; deposit (the input tensor, its call) in slot r; record ready[r]
//      on s;
//   2. rendezvous A (every rank deposited; the deposits are compared: same collective,
//      shape, dtype, arguments);
//   3. s waits for ready[q] of every peer (cudaStreamWaitEvent: no host blocking), then
//      computes rank r's own result into a fresh buffer, reading the peers' buffers
//      directly (same device): reduction kernel, concatenation or copy;
//   4. record done[r] on s; rendezvous B (every rank has enqueued its reads);
//   5. s waits for done[q] of every peer, so nothing later on s (a write to the input, the
//      allocator reusing its block) overtakes a peer's read; all_reduce then copies the
//      result into the caller's tensor.
// The events of one rank are reused by every collective: a peer records ready[q] again
// only after B, which r reaches after its waits of step 3; done[q] again only after the
// next A, which r reaches after its waits of step 5.
// The host never blocks on the GPU here; every host wait is a rendezvous with a deadline
// (Rendezvous: abort, timeout, a departed rank), so a failing or silent rank ends the group
// with an error. Sums: CommOrder::kNcclRing reproduces NCCL's ring (ring_reference.h),
// kRank the CPU semantics (comm.h). The result's chunk count is in the ledger.
// Thread safety: DeviceGroupState is shared (its slots are written by their own rank
// before A and read by all between A and B); each communicator is used by its rank only.
#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "comm/cuda/device_collectives.h"
#include "comm/rendezvous.h"
#include "comm/ring_reference.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

struct Deposit {
  CommKind kind = CommKind::kAllReduce;
  bool barrier = false;
  int dim = 0;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Tensor tensor;
};

std::string describe(const Deposit& d) {
  if (d.barrier) return "barrier()";
  std::string s = fmt::format("{}({}", comm_kind_name(d.kind), d.tensor.describe());
  if (d.kind == CommKind::kAllGather || d.kind == CommKind::kReduceScatter)
    s += fmt::format(", dim {}", d.dim);
  if (d.kind == CommKind::kAllReduce) s += fmt::format(", {}", reduce_op_name(d.op));
  if (d.kind == CommKind::kBroadcast) s += fmt::format(", root {}", d.root);
  return s + ")";
}

bool same_call(const Deposit& a, const Deposit& b) {
  if (a.barrier || b.barrier) return a.barrier == b.barrier;
  return a.kind == b.kind && a.dim == b.dim && a.op == b.op && a.root == b.root &&
         a.tensor.shape() == b.tensor.shape() && a.tensor.dtype() == b.tensor.dtype();
}

struct DeviceGroupState {
  DeviceGroupState(int world, const CudaGroupOptions& o)
      : options(o), rv(world, o.timeout), slots(world), ready(world, nullptr), done(world, nullptr) {
    TPCHECK_CUDA_CHECK(cudaSetDevice(o.device));
    for (int r = 0; r < world; ++r) {
      TPCHECK_CUDA_CHECK(cudaEventCreateWithFlags(&ready[r], cudaEventDisableTiming));
      TPCHECK_CUDA_CHECK(cudaEventCreateWithFlags(&done[r], cudaEventDisableTiming));
    }
  }
  ~DeviceGroupState() {
    for (cudaEvent_t e : ready)
      if (e != nullptr) cudaEventDestroy(e);
    for (cudaEvent_t e : done)
      if (e != nullptr) cudaEventDestroy(e);
  }
  CudaGroupOptions options;
  Rendezvous rv;
  std::vector<Deposit> slots;
  std::vector<cudaEvent_t> ready, done;
  std::uint64_t unused = 0;
};


class DeviceCommunicator final : public Communicator {
 public:
  DeviceCommunicator(DeviceGroupState& g, int rank, int world) : g_(g), rank_(rank), world_(world) {}

  int rank() const override { return rank_; }
  int size() const override { return world_; }

  Tensor all_gather(const Tensor& local, int dim) override {
    const int d = check_all_gather(local, dim, kGpuOnly);
    record(CommKind::kAllGather, local, d, ReduceOp::kSum, 0, "concatenation (device copies)");
    Tensor out;
    run(Deposit{CommKind::kAllGather, false, d, ReduceOp::kSum, 0, local}, [&] {
      std::vector<Tensor> parts;
      for (const Deposit& p : g_.slots) parts.push_back(p.tensor);
      out = Tensor::cat(parts, d);
    });
    return out;
  }

  Tensor reduce_scatter(const Tensor& full, int dim) override {
    const int d = check_reduce_scatter(full, dim, world_, kGpuOnly);
    record(CommKind::kReduceScatter, full, d, ReduceOp::kSum, 0, algorithm(ReduceOp::kSum, full, true));
    Shape piece = full.shape();
    piece[d] /= world_;
    Tensor out;
    run(Deposit{CommKind::kReduceScatter, false, d, ReduceOp::kSum, 0, full}, [&] {
      out = Tensor(piece, full.dtype(), Device::kCuda);
      cuda::ReduceLaunch p = launch_for(ReduceOp::kSum, out);
      p.dim_size = full.dim(d);
      p.rows = piece[d];
      p.row_start = static_cast<long long>(rank_) * piece[d];
      p.inner = 1;
      for (int i = d + 1; i < full.rank(); ++i) p.inner *= full.dim(i);
      p.fixed_start = (rank_ + 1) % world_;  // block r is summed from r+1 around to r
      cuda::launch_reduce(p, cuda::current_stream());
    });
    return out;
  }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_all_reduce(t, kGpuOnly);
    record(CommKind::kAllReduce, t, 0, op, 0, algorithm(op, t, false));
    Tensor out;
    run(Deposit{CommKind::kAllReduce, false, 0, op, 0, t}, [&] {
      out = Tensor(t.shape(), t.dtype(), Device::kCuda);
      cuda::ReduceLaunch p = launch_for(op, out);
      p.inner = 1;
      p.fixed_start = -1;  // the all-reduce chunk rule
      p.count = t.numel();
      p.chunk_elems = ring::chunk_elements(g_.options.nccl_chunk_bytes, t.dtype());
      cuda::launch_reduce(p, cuda::current_stream());
    });
    t.copy_from(out);  // after every peer's reads of t (step 5)
  }

  void broadcast(Tensor& t, int root) override {
    check_broadcast(t, root, world_, kGpuOnly);
    record(CommKind::kBroadcast, t, 0, ReduceOp::kSum, root, "copy from root (device)");
    Tensor copy;
    run(Deposit{CommKind::kBroadcast, false, 0, ReduceOp::kSum, root, t}, [&] {
      if (rank_ != root) copy = g_.slots[root].tensor.clone();
    });
    if (rank_ != root) t.copy_from(copy);
  }

  void barrier() override {
    Deposit d;
    d.barrier = true;
    run(std::move(d), [] {});
  }

  void abort(const std::string& reason) override { g_.rv.abort(rank_, reason); }

 private:
  // Collectives take GPU tensors only (check_all_gather and the others).
  static constexpr const char* kGpuOnly = "the device group";

  std::string algorithm(ReduceOp op, const Tensor& t, bool scatter) const {
    if (g_.options.order == CommOrder::kRank) {
      if (op == ReduceOp::kMax) return "rank-order max (NaN propagates)";
      return t.dtype() == DType::kF64 ? "rank-order f64 sum" : "rank-order f32 sum, rounded once";
    }
    if (op == ReduceOp::kMax) return "nccl-ring emulated fmax";
    if (scatter) return "nccl-ring emulated (1 channel)";
    return fmt::format("nccl-ring emulated ({} chunks, 1 channel)",
                       ring::all_reduce_chunk_count(t.numel(), world_, t.dtype(),
                                                    g_.options.nccl_chunk_bytes));
  }

  cuda::ReduceLaunch launch_for(ReduceOp op, Tensor& out) const {
    cuda::ReduceLaunch p;
    p.world = world_;
    p.dtype = out.dtype();
    const bool ring = g_.options.order == CommOrder::kNcclRing;
    p.mode = op == ReduceOp::kSum ? (ring ? cuda::ReduceMode::kRingSum : cuda::ReduceMode::kRankSum)
                                  : (ring ? cuda::ReduceMode::kRingMax : cuda::ReduceMode::kRankMax);
    for (int r = 0; r < world_; ++r) p.inputs[r] = g_.slots[r].tensor.raw();
    p.out = out.raw();
    p.n_out = out.numel();
    return p;
  }

  // Steps 1-5 of the file comment around `compute` (step 3's own work).
  template <typename F>
  void run(Deposit dep, F&& compute) {
    const std::string what =
        fmt::format("{} (collective #{} of rank {})", dep.barrier ? "barrier" : std::string(comm_kind_name(dep.kind)),
                    count_, rank_);
    ++count_;
    g_.rv.throw_if_aborted(rank_);
    cudaStream_t s = cuda::current_stream();
    g_.slots[rank_] = std::move(dep);
    TPCHECK_CUDA_CHECK(cudaEventRecord(g_.ready[rank_], s));
    g_.rv.arrive(rank_, what);
    for (int q = 0; q < world_; ++q) {
      if (!same_call(g_.slots[q], g_.slots[rank_])) {
        const std::string reason =
            fmt::format("mismatched collective: rank {} called {} but rank {} called {}", rank_,
                        describe(g_.slots[rank_]), q, describe(g_.slots[q]));
        g_.rv.abort(rank_, reason);
        throw Error(ErrorKind::kRuntime, reason, {}, rank_);
      }
    }
    for (int q = 0; q < world_; ++q)
      if (q != rank_) TPCHECK_CUDA_CHECK(cudaStreamWaitEvent(s, g_.ready[q], 0));
    try {
      compute();
    } catch (const std::exception& e) {
      g_.rv.abort(rank_, e.what());
      throw;
    }
    TPCHECK_CUDA_CHECK(cudaEventRecord(g_.done[rank_], s));
    g_.rv.arrive(rank_, what + ", after the reads");
    for (int q = 0; q < world_; ++q)
      if (q != rank_) TPCHECK_CUDA_CHECK(cudaStreamWaitEvent(s, g_.done[q], 0));
    g_.slots[rank_].tensor = Tensor();  // our handle on our own input only
  }

  DeviceGroupState& g_;
  int rank_;
  int world_;
  std::uint64_t count_ = 0;
};

}  // namespace

void run_device_group(int world, const std::function<void(Communicator&)>& body,
                      CudaGroupOptions options) {
  TPCHECK_CHECK_INPUT(world >= 1 && world <= cuda::kMaxDeviceRanks,
                      "device group size {} must be between 1 and {}", world, cuda::kMaxDeviceRanks);
  TPCHECK_CHECK_INPUT(options.timeout.count() > 0, "device group timeout {} ms must be positive",
                      options.timeout.count());
  TPCHECK_CHECK_INPUT(options.nccl_chunk_bytes >= 16,
                      "device group: NCCL chunk of {} bytes is too small (at least 16)",
                      options.nccl_chunk_bytes);
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  TPCHECK_CHECK_INPUT(status == cudaSuccess && count > 0,
                      "device group: no usable GPU ({}); use the CPU backend's thread group",
                      status == cudaSuccess ? "no CUDA device" : cudaGetErrorString(status));
  TPCHECK_CHECK_INPUT(options.device >= 0 && options.device < count,
                      "device group: CUDA device {} does not exist; this machine has {}",
                      options.device, count);
  cuda::install_cuda_runtime();
  DeviceGroupState state(world, options);
  run_rank_threads(world, state.rv, [&](int r) {
    TPCHECK_CUDA_CHECK(cudaSetDevice(options.device));
    DeviceCommunicator comm(state, r, world);
    body(comm);
  });
}

}  // namespace tpcheck

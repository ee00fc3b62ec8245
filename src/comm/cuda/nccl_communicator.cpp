// nccl_communicator.cpp — the NCCL communicator (one rank per GPU) and its launchers:
// run_nccl_group and NcclThreadGroup (one process, a thread per GPU; the group keeps its
// communicators from one run to the next) and connect_nccl_process_group (one
// process per rank: mpirun / torchrun, NCCL id shared over TCP, comm/tcp_group.h).
//
// Every NCCL communicator is non-blocking (ncclConfig_t.blocking = 0). Init and every
// collective are followed by a poll with a deadline (options.timeout): NCCL's async error
// (ncclCommGetAsyncError), then an event recorded after the collective on the rank's
// stream (cudaEventQuery), and between polls the group's failure source (another thread's
// Rendezvous, or the TCP failure channel). On an NCCL error, a timeout or a failure
// elsewhere, the communicator is aborted (ncclCommAbort: pending NCCL kernels end) and the
// rank throws: Error(kAborted) "rank R failed: ..." when another rank failed first,
// Error(kRuntime) naming this rank otherwise (and the others are told).
// Layout: NCCL reduce-scatters and all-gathers flat blocks in rank order; for dim != 0 the
// slices along dim are laid out one after the other first (reduce_scatter) or put back in
// place after (all_gather), with Tensor copies on the same stream.
// Thread safety: a communicator is used by its rank's thread only (comm.h).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_libraries.h"
#include "backend/cuda/cuda_runtime.h"
#include "comm/rendezvous.h"
#include "comm/tcp_group.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NcclId must hold an ncclUniqueId");

using Clock = std::chrono::steady_clock;

// NVLink multicast (NVLS) stays off unless the user chose otherwise; before any NCCL call.
void prepare_nccl_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("NCCL_NVLS_ENABLE") == nullptr) ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  });
}

// Where a rank learns that another rank failed, and tells the others it did.
class FailureSource {
 public:
  virtual ~FailureSource() = default;
  virtual std::optional<GroupFailure> failure() = 0;
  virtual void report(int rank, const std::string& reason) = 0;
  // Whether a communicator destroyed while its rank unwinds an exception reports it (a
  // process may exit before anyone calls abort(); threads have run_rank_threads for it).
  virtual bool report_unwinding() const { return false; }
};

// The kept one-process group's failure source: the Rendezvous of the run in progress
// (each NcclThreadGroup::run has its own), none between runs.
class RunFailures final : public FailureSource {
 public:
  void bind(Rendezvous* rv) {
    std::lock_guard<std::mutex> lock(mu_);
    rv_ = rv;
  }
  std::optional<GroupFailure> failure() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (rv_ == nullptr || !rv_->aborted()) return std::nullopt;
    return GroupFailure{rv_->abort_origin(), rv_->abort_message()};
  }
  void report(int rank, const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (rv_ != nullptr) rv_->abort(rank, reason);
  }

 private:
  std::mutex mu_;
  Rendezvous* rv_ = nullptr;
};

class TcpFailures final : public FailureSource {
 public:
  explicit TcpFailures(std::unique_ptr<TcpGroup> g) : g_(std::move(g)) {}
  std::optional<GroupFailure> failure() override {
    std::optional<GroupFailure> f = g_->failure();
    if (f) f->reason = fmt::format("rank {} failed: {}", f->rank, f->reason);
    return f;
  }
  void report(int, const std::string& reason) override { g_->report(reason); }
  bool report_unwinding() const override { return true; }

 private:
  std::unique_ptr<TcpGroup> g_;
};

ncclDataType_t nccl_type(DType dtype, bool reduction, const char* what) {
  switch (dtype) {
    case DType::kF64:
      return ncclFloat64;
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    default:
      TPCHECK_CHECK_INPUT(!reduction, "{}: NCCL reductions of {} are not supported (f64, f32, f16, bf16)",
                          what, dtype_name(dtype));
      return ncclUint8;  // fp8 moved as bytes (1 byte each)
  }
}


class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world, int device, const NcclId& id, NcclOptions options,
                   std::shared_ptr<FailureSource> failures)
      : rank_(rank), world_(world), device_(device), options_(options), failures_(std::move(failures)) {
    cuda::require_nccl();  // a wheel without NCCL on this machine says so here
    prepare_nccl_environment();
    cuda::install_cuda_runtime();
    TPCHECK_CUDA_CHECK(cudaSetDevice(device));
    TPCHECK_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes.data(), sizeof(uid));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const Clock::time_point deadline = Clock::now() + options_.timeout;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      fail(ErrorKind::kRuntime, fmt::format("ncclCommInitRankConfig (rank {} of {} on GPU {}) "
                                            "failed: {}", rank, world, device, ncclGetErrorString(r)));
    }
    wait_async(fmt::format("ncclCommInitRankConfig (rank {} of {} on GPU {})", rank, world, device),
               deadline);
  }

  ~NcclCommunicator() override {
    // Never throws. A rank unwinding an exception tells the others before it goes.
    if (std::uncaught_exceptions() > 0 && failures_ && failures_->report_unwinding() &&
        !failures_->failure())
      failures_->report(rank_, "its thread or process is unwinding an exception (see its message)");
    if (comm_ != nullptr) {
      // Flush (non-blocking: poll until done, bounded); abort when it fails or hangs.
      ncclResult_t st = ncclCommFinalize(comm_);
      const Clock::time_point deadline = Clock::now() + options_.timeout;
      while (st == ncclInProgress) {
        if (Clock::now() > deadline || (failures_ && failures_->failure())) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) break;
      }
      if (st == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (event_ != nullptr) cudaEventDestroy(event_);
  }

  int rank() const override { return rank_; }
  int size() const override { return world_; }

  Tensor all_gather(const Tensor& local, int dim) override {
    const int d = check_all_gather(local, dim, kGpuOnly);
    record(CommKind::kAllGather, local, d, ReduceOp::kSum, 0, "nccl");
    const ncclDataType_t type = nccl_type(local.dtype(), false, "all_gather");
    const std::size_t count = local.nbytes() / (type == ncclUint8 ? 1 : dtype_size(local.dtype()));
    Tensor buf({static_cast<std::int64_t>(world_), local.numel()}, local.dtype(), Device::kCuda);
    collective("all_gather", [&](cudaStream_t s) {
      return ncclAllGather(local.raw(), buf.raw(), count, type, comm_, s);
    });
    Shape full = local.shape();
    full[d] *= world_;
    if (d == 0) return buf.reshape(full);
    std::vector<Tensor> parts;
    for (int r = 0; r < world_; ++r) parts.push_back(buf.slice(0, r, 1).reshape(local.shape()));
    return Tensor::cat(parts, d);
  }

  Tensor reduce_scatter(const Tensor& full, int dim) override {
    const int d = check_reduce_scatter(full, dim, world_, kGpuOnly);
    record(CommKind::kReduceScatter, full, d, ReduceOp::kSum, 0, "nccl");
    const ncclDataType_t type = nccl_type(full.dtype(), true, "reduce_scatter");
    Tensor staging = full;
    if (d != 0) {  // the slices along d, one after the other
      const std::int64_t chunk = full.dim(d) / world_;
      std::vector<Tensor> parts;
      for (int r = 0; r < world_; ++r)
        parts.push_back(full.slice(d, r * chunk, chunk).reshape({1, full.numel() / world_}));
      staging = Tensor::cat(parts, 0);
    }
    Shape piece = full.shape();
    piece[d] /= world_;
    Tensor out(piece, full.dtype(), Device::kCuda);
    collective("reduce_scatter", [&](cudaStream_t s) {
      return ncclReduceScatter(staging.raw(), out.raw(), static_cast<std::size_t>(out.numel()), type,
                               ncclSum, comm_, s);
    });
    return out;
  }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_all_reduce(t, kGpuOnly);
    record(CommKind::kAllReduce, t, 0, op, 0, "nccl");
    const ncclDataType_t type = nccl_type(t.dtype(), true, "all_reduce");
    collective("all_reduce", [&](cudaStream_t s) {
      return ncclAllReduce(t.raw(), t.raw(), static_cast<std::size_t>(t.numel()), type,
                           op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, s);
    });
  }

  void broadcast(Tensor& t, int root) override {
    check_broadcast(t, root, world_, kGpuOnly);
    record(CommKind::kBroadcast, t, 0, ReduceOp::kSum, root, "nccl");
    const ncclDataType_t type = nccl_type(t.dtype(), false, "broadcast");
    const std::size_t count = t.nbytes() / (type == ncclUint8 ? 1 : dtype_size(t.dtype()));
    collective("broadcast", [&](cudaStream_t s) {
      return ncclBroadcast(t.raw(), t.raw(), count, type, root, comm_, s);
    });
  }

  void barrier() override {
    Tensor one({1}, DType::kF32, Device::kCuda);
    collective("barrier", [&](cudaStream_t s) {
      return ncclAllReduce(one.raw(), one.raw(), 1, ncclFloat32, ncclSum, comm_, s);
    });
  }

  void abort(const std::string& reason) override {
    if (failures_ && !failures_->failure()) failures_->report(rank_, reason);
    abort_comm();
  }

 private:
  // Collectives take GPU tensors only (check_all_gather and the others).
  static constexpr const char* kGpuOnly = "NCCL";

  void abort_comm() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Aborts the communicator; tells the others when this rank is the origin; throws.
  [[noreturn]] void fail(ErrorKind kind, const std::string& message) {
    if (kind != ErrorKind::kAborted && failures_ && !failures_->failure()) failures_->report(rank_, message);
    abort_comm();
    throw Error(kind, message, {}, rank_);
  }

  void check_peers() {
    if (!failures_) return;
    if (std::optional<GroupFailure> f = failures_->failure(); f && f->rank != rank_)
      fail(ErrorKind::kAborted, f->reason);
  }

  // Polls NCCL's async state until it leaves ncclInProgress (an error, or success).
  void wait_async(const std::string& what, Clock::time_point deadline) {
    while (true) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
      if (q != ncclSuccess) st = q;
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        fail(ErrorKind::kRuntime, fmt::format("rank {}: {} failed: NCCL error {} ({})", rank_, what,
                                              ncclGetErrorString(st), ncclGetLastError(comm_)));
      }
      check_peers();
      if (Clock::now() > deadline) {
        fail(ErrorKind::kRuntime, fmt::format("rank {}: {} timed out after {} ms (a peer did not "
                                              "join, or stopped answering)",
                                              rank_, what, options_.timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  template <typename F>
  void collective(const char* name, F&& call) {
    const std::string what = fmt::format("{} (collective #{} of rank {})", name, count_++, rank_);
    check_peers();
    TPCHECK_CHECK(comm_ != nullptr, "rank {}: {} after the NCCL communicator was aborted", rank_, what);
    const Clock::time_point deadline = Clock::now() + options_.timeout;
    cudaStream_t s = cuda::current_stream();
    const ncclResult_t r = call(s);
    if (r != ncclSuccess && r != ncclInProgress) {
      fail(ErrorKind::kRuntime, fmt::format("rank {}: {} failed: NCCL error {} ({})", rank_, what,
                                            ncclGetErrorString(r), ncclGetLastError(comm_)));
    }
    wait_async(what, deadline);  // enqueued
    TPCHECK_CUDA_CHECK(cudaEventRecord(event_, s));
    while (true) {  // complete
      const cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        fail(ErrorKind::kRuntime, fmt::format("rank {}: {} failed on the GPU: CUDA error {} ({})",
                                              rank_, what, cudaGetErrorName(e), cudaGetErrorString(e)));
      }
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st != ncclSuccess && st != ncclInProgress) {
        fail(ErrorKind::kRuntime, fmt::format("rank {}: {} failed: NCCL error {} ({})", rank_, what,
                                              ncclGetErrorString(st), ncclGetLastError(comm_)));
      }
      check_peers();
      if (Clock::now() > deadline) {
        fail(ErrorKind::kRuntime,
             fmt::format("rank {}: {} did not complete within {} ms and NCCL reported no error: a "
                         "peer rank never called it or stopped answering",
                         rank_, what, options_.timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  const int rank_;
  const int world_;
  const int device_;
  const NcclOptions options_;
  std::shared_ptr<FailureSource> failures_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::uint64_t count_ = 0;
};

int device_count_or_throw(const char* what) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  TPCHECK_CHECK_INPUT(status == cudaSuccess && count > 0, "{}: no usable GPU ({})", what,
                      status == cudaSuccess ? "no CUDA device" : cudaGetErrorString(status));
  return count;
}

}  // namespace

NcclId make_nccl_id() {
  cuda::require_nccl();
  prepare_nccl_environment();
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  TPCHECK_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: NCCL error {} ({})", ncclGetErrorString(r),
                ncclGetLastError(nullptr));
  NcclId id;
  std::memcpy(id.bytes.data(), &uid, sizeof(uid));
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world, int device,
                                                     const NcclId& id, NcclOptions options) {
  const int count = device_count_or_throw("NCCL communicator");
  TPCHECK_CHECK_INPUT(world >= 1 && rank >= 0 && rank < world,
                      "NCCL communicator: rank {} out of range for a group of {}", rank, world);
  TPCHECK_CHECK_INPUT(device >= 0 && device < count,
                      "NCCL communicator: rank {} asks for GPU {}, this machine has {} (0..{})",
                      rank, device, count, count - 1);
  return std::make_unique<NcclCommunicator>(rank, world, device, id, options, nullptr);
}

void run_nccl_group(int world, const std::function<void(Communicator&)>& body, NcclOptions options) {
  NcclThreadGroup(world, options).run(body);
}

struct NcclThreadGroup::State {
  NcclOptions options;
  std::optional<NcclId> id;  // made on the first run (ncclGetUniqueId starts NCCL's bootstrap)
  std::shared_ptr<RunFailures> failures = std::make_shared<RunFailures>();
  std::vector<std::unique_ptr<NcclCommunicator>> comms;  // [rank], made on rank r's thread
  bool failed = false;
};

NcclThreadGroup::NcclThreadGroup(int world, NcclOptions options)
    : world_(world), state_(std::make_unique<State>()) {
  const int count = device_count_or_throw("--comm nccl");
  TPCHECK_CHECK_INPUT(world >= 1 && world <= count,
                      "NCCL group of {} ranks needs {} GPUs (one per rank; NCCL refuses two ranks "
                      "on one GPU), this machine has {}; use the device group to emulate them on one",
                      world, world, count);
  TPCHECK_CHECK_INPUT(options.timeout.count() > 0, "NCCL timeout {} ms must be positive",
                      options.timeout.count());
  state_->options = options;
  state_->comms.resize(static_cast<std::size_t>(world));
}

NcclThreadGroup::~NcclThreadGroup() {
  // ncclCommFinalize completes only when every rank has called it: one thread per rank.
  std::vector<std::thread> threads;
  for (int r = 0; r < world_; ++r) {
    if (!state_->comms[r]) continue;
    threads.emplace_back([this, r] {
      (void)cudaSetDevice(r);
      state_->comms[r].reset();  // ~NcclCommunicator never throws
    });
  }
  for (std::thread& t : threads) t.join();
}

void NcclThreadGroup::run(const std::function<void(Communicator&)>& body) {
  State& s = *state_;
  TPCHECK_CHECK(!s.failed,
                "NCCL group of {} ranks: an earlier run failed and its communicators were "
                "aborted; make a new group",
                world_);
  if (!s.id) s.id = make_nccl_id();
  Rendezvous rv(world_, s.options.timeout);
  s.failures->bind(&rv);
  try {
    run_rank_threads(world_, rv, [&](int r) {
      TPCHECK_CUDA_CHECK(cudaSetDevice(r));
      if (!s.comms[r]) {
        s.comms[r] = std::make_unique<NcclCommunicator>(r, world_, r, *s.id, s.options, s.failures);
      }
      body(*s.comms[r]);
    });
  } catch (...) {
    // A rank that threw outside a collective left its communicator live while the others
    // aborted theirs: abort them all now (never a finalize that waits for the dead ones).
    s.failed = true;
    s.failures->bind(nullptr);
    for (int r = 0; r < world_; ++r) {
      if (!s.comms[r]) continue;
      (void)cudaSetDevice(r);
      s.comms[r]->abort("the group failed");
    }
    throw;
  }
  s.failures->bind(nullptr);
}

std::unique_ptr<Communicator> connect_nccl_process_group(const NcclProcessLaunch& launch,
                                                         NcclOptions options) {
  const int count = device_count_or_throw("NCCL process group");
  TPCHECK_CHECK_INPUT(launch.local_rank >= 0 && launch.local_rank < count,
                      "{} rank {}: local rank {} has no GPU, this node has {} (one rank per GPU)",
                      launch.launcher, launch.rank, launch.local_rank, count);
  prepare_nccl_environment();
  if (launch.id) {  // shared by the launcher (set_process_nccl_id): no TCP rendezvous
    return std::make_unique<NcclCommunicator>(launch.rank, launch.world, launch.local_rank,
                                              *launch.id, options, nullptr);
  }
  TcpGroup::Payload payload{};
  if (launch.rank == 0) {
    TPCHECK_CUDA_CHECK(cudaSetDevice(launch.local_rank));
    NcclId id = make_nccl_id();
    std::memcpy(payload.data(), id.bytes.data(), payload.size());
  }
  auto group = std::make_unique<TcpGroup>(launch.rank, launch.world, launch.master_addr,
                                          launch.master_port, payload, options.connect_timeout);
  NcclId id;
  std::memcpy(id.bytes.data(), group->payload().data(), id.bytes.size());
  auto failures = std::make_shared<TcpFailures>(std::move(group));
  return std::make_unique<NcclCommunicator>(launch.rank, launch.world, launch.local_rank, id,
                                            options, failures);
}

}  // namespace tpcheck

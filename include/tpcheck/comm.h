// tpcheck/comm.h — collectives across the ranks of one tensor-parallel group.
//
// Layers talk to their peers only through this interface, so the same layer code runs
// on one device (SingleCommunicator), on threads of one process (ThreadGroup: CPU tests
// and CI), on N ranks emulated on one GPU (device group, tpcheck/cuda_comm.h) and on one
// GPU per rank through NCCL (tpcheck/cuda_comm.h).
//
// Semantics (all collectives are blocking and must be called by every rank in the same
// order with matching shapes and dtypes):
//   all_gather(t, dim)      concatenates every rank's `t` along `dim`, in rank order;
//   reduce_scatter(t, dim)  reduces (sums) every rank's `t` and returns rank r's r-th equal
//                           slice along `dim`;
//   all_reduce(t, op)       sum or max over ranks, in place;
//   broadcast(t, root)      every rank's `t` becomes root's.
// Results never alias an input of another rank; returned tensors are the caller's own.
//
// Order of additions and rounding — what each implementation promises (CommOrder):
//   kRank      ("rank"): the sum of element i is ((x0 + x1) + x2) + ... + x_{N-1} in rank
//              order, accumulated in f64 for f64 tensors and in f32 for every other dtype,
//              rounded once to the dtype at the end. max propagates NaN. ThreadGroup
//              (default), the device group with --comm-order rank.
//   kNcclRing  ("nccl-ring"): what NCCL's ring algorithm computes with NCCL_ALGO=Ring,
//              NCCL_PROTO=Simple and one channel (NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=1),
//              default buffer size (chunks of 2 MiB), ring order 0 → 1 → ... → N-1:
//              the buffer is cut into chunks (see src/comm/ring_reference.h for the exact
//              rule); the sum of chunk c starts at rank c+1 (mod N), adds ranks c+2, ...,
//              c+N (= c) in that order, and rounds to the dtype after EVERY addition
//              (f16/bf16 additions are f16/bf16 additions, f32 in f32, f64 in f64).
//              reduce_scatter: the slice owned by rank d is summed from rank d+1 around to
//              d the same way (no chunk dependence). max uses fmax (a NaN loses to a
//              number), as NCCL does. The device group's default.
//   NCCL itself: whatever the library chooses (algorithm, protocol, channels); bitwise
//              equal to kNcclRing under the settings above (checked on 2 GPUs).
// SingleCommunicator: every collective is the identity (no rounding).
//
// Ledger: every implementation appends one CommRecord per all_gather, reduce_scatter,
// all_reduce and broadcast (not barrier) to its rank's ledger, in call order, before the
// data moves (a collective that fails is still recorded).
//
// Failure: `abort(reason)` marks the group failed. Every rank blocked in, or later
// entering, a collective gets Error(kAborted) naming the failed rank and its reason,
// within the group's timeout, instead of waiting forever.
// Thread safety: one Communicator object per rank; a rank's object (and its ledger) is
// used by one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/tensor.h"

namespace tpcheck {

enum class ReduceOp { kSum, kMax };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "max"

// The order of additions a group promises (see above).
enum class CommOrder { kRank, kNcclRing };
std::string_view comm_order_name(CommOrder order);  // "rank", "nccl-ring"
// Inverse of comm_order_name; throws Error(kInput) naming the text and the accepted names.
CommOrder parse_comm_order(std::string_view name);

enum class CommKind { kAllGather, kReduceScatter, kAllReduce, kBroadcast };
std::string_view comm_kind_name(CommKind kind);  // "all_gather", "reduce_scatter", ...

// One collective as one rank saw it.
struct CommRecord {
  int rank = 0;
  int world = 1;
  CommKind kind = CommKind::kAllReduce;
  DType dtype = DType::kF32;
  // Elements of this rank's input: the local shard for all_gather, the full tensor for
  // reduce_scatter, the tensor for all_reduce and broadcast. bytes = elements × size.
  std::int64_t elements = 0;
  std::size_t bytes = 0;
  Shape shape;                  // this rank's input shape
  int dim = 0;                  // all_gather / reduce_scatter (normalized); else 0
  ReduceOp op = ReduceOp::kSum; // reduce_scatter (always sum) / all_reduce
  int root = 0;                 // broadcast only
  // How it was computed: "rank-order f32 sum", "nccl-ring emulated (3 chunks, 1 channel)",
  // "nccl", "concatenation", "identity (group of 1)", ...
  std::string algorithm;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual Tensor all_gather(const Tensor& local, int dim) = 0;
  virtual Tensor reduce_scatter(const Tensor& full, int dim) = 0;
  virtual void all_reduce(Tensor& t, ReduceOp op = ReduceOp::kSum) = 0;
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Marks the group failed (see above). Safe to call from any rank, more than once.
  virtual void abort(const std::string& reason) = 0;

  // This rank's collectives so far, in call order.
  const std::vector<CommRecord>& comm_ledger() const { return ledger_; }
  void clear_comm_ledger() { ledger_.clear(); }

 protected:
  // Appends a record of a collective on `t` (the rank's input) to the ledger.
  void record(CommKind kind, const Tensor& t, int dim, ReduceOp op, int root,
              std::string algorithm);

 private:
  std::vector<CommRecord> ledger_;
};

// A group of one: every collective is the identity.
std::unique_ptr<Communicator> make_single_communicator();

// Runs `body(comm)` on `world` threads, one rank each, and waits for all of them.
// If a rank throws, the group is aborted (so the others fail fast instead of hanging)
// and run() rethrows the first rank's exception (an Error names the rank).
struct ThreadGroupOptions {
  // How long a collective waits for the other ranks before it aborts the group.
  std::chrono::milliseconds timeout{10000};
  // Order of additions in sums (see above); kRank keeps CPU results independent of NCCL.
  CommOrder order = CommOrder::kRank;
  // kNcclRing only: NCCL's all-reduce chunk in bytes (NCCL_BUFFSIZE / 2; default 2 MiB).
  std::size_t nccl_chunk_bytes = std::size_t{2} << 20;
};
void run_thread_group(int world, const std::function<void(Communicator&)>& body,
                      ThreadGroupOptions options = {});

}  // namespace tpcheck

// tpcheck/comm.h — collectives across the ranks of one tensor-parallel group.
//
// Layers talk to their peers only through this interface, so the same layer code runs
// on one device (SingleCommunicator), on threads of one process (ThreadGroup: CPU tests
// and CI) and, later, on GPUs through NCCL.
//
// Semantics (all collectives are blocking and must be called by every rank in the same
// order with matching shapes and dtypes):
//   all_gather(t, dim)      concatenates every rank's `t` along `dim`, in rank order;
//   reduce_scatter(t, dim)  sums every rank's `t` and returns rank r's r-th equal slice
//                           along `dim`;
//   all_reduce(t, op)       sum or max over ranks, in place.
// Sums are taken in rank order 0, 1, ..., N-1 in f64 for f64 tensors and in f32
// otherwise, then rounded once to the tensor's dtype (what a ring all-reduce on one node
// does up to the order of additions).
//
// Failure: `abort(reason)` marks the group failed. Every rank blocked in, or later
// entering, a collective gets Error(kAborted) naming the failed rank and its reason,
// within the group's timeout, instead of waiting forever.
// Thread safety: one Communicator object per rank; a rank's object is used by one thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "tpcheck/tensor.h"

namespace tpcheck {

enum class ReduceOp { kSum, kMax };

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
};

// A group of one: every collective is the identity.
std::unique_ptr<Communicator> make_single_communicator();

// Runs `body(comm)` on `world` threads, one rank each, and waits for all of them.
// If a rank throws, the group is aborted (so the others fail fast instead of hanging)
// and run() rethrows the first rank's exception (an Error names the rank).
struct ThreadGroupOptions {
  // How long a collective waits for the other ranks before it aborts the group.
  std::chrono::milliseconds timeout{10000};
};
void run_thread_group(int world, const std::function<void(Communicator&)>& body,
                      ThreadGroupOptions options = {});

}  // namespace tpcheck

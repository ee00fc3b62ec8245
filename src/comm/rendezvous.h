// rendezvous.h — a reusable barrier for the rank threads of one process, with a deadline,
// a group abort and the first failure's origin; what the device group and the
// one-process NCCL group build their "no hang on failure" on.
//
// arrive(rank, what) returns once every rank has arrived in the same generation. It
// throws instead of waiting forever:
//   * Error(kAborted) "rank R failed: <reason>" once any rank called abort();
//   * Error(kRuntime), after aborting the group, when the deadline (entry + timeout) passes
//     ("timed out after T ms in <what>: rank(s) ... never arrived") or when a rank whose
//     body has returned (mark_done) never arrived ("rank(s) ... returned without calling
//     <what> while rank(s) ... wait in it").
// Thread safety: every method may be called from any rank thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace tpcheck {

class Tensor;

// What the communicators share (defined in rendezvous.cpp):
// `dim` of a collective on `t`, normalized (negative counts from the end); Error naming
// `what` when t is undefined or dim is out of range.
int normalize_collective_dim(const Tensor& t, int dim, const char* what);
// The argument checks before each collective, in one order for every communicator (so a
// bad call fails with the same message on each): the tensor defined and `dim` in range
// (normalized and returned), its device, then the collective's own conditions (dim
// divisible by the group size; root in the group). `gpu_only` names a communicator that
// takes GPU tensors only ("NCCL": "all_reduce: NCCL takes GPU tensors, got ..."); nullptr
// for one that takes any.
int check_all_gather(const Tensor& local, int dim, const char* gpu_only);
int check_reduce_scatter(const Tensor& full, int dim, int world, const char* gpu_only);
void check_all_reduce(const Tensor& t, const char* gpu_only);
void check_broadcast(const Tensor& t, int root, int world, const char* gpu_only);
// The message of an exception held in `e` ("unknown exception" for non-std ones).
std::string describe_exception(const std::exception_ptr& e);
// Rethrows `e` as an Error that carries `rank` (an Error of that rank as it is).
[[noreturn]] void rethrow_with_rank(const std::exception_ptr& e, int rank);

class Rendezvous {
 public:
  Rendezvous(int world, std::chrono::milliseconds timeout);

  void arrive(int rank, const std::string& what);
  // Marks the group failed; the first reason wins. Wakes every waiting rank.
  void abort(int origin, const std::string& reason);
  // The rank's body returned or threw: it will never arrive again.
  void mark_done(int rank);
  // Throws Error(kAborted) for `rank` when the group is aborted.
  void throw_if_aborted(int rank);

  bool aborted();
  int abort_origin();           // -1 when not aborted
  std::string abort_message();  // "rank R failed: <reason>"
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void abort_locked(int origin, const std::string& reason);
  [[noreturn]] void fail_locked(int rank, const std::string& reason);

  const int world_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  std::vector<bool> arrived_;  // in the current generation
  int count_ = 0;
  std::vector<bool> done_;
  bool aborted_ = false;
  int abort_origin_ = -1;
  std::string abort_message_;
};

// Runs body(rank) on `world` threads and joins them. A rank that throws aborts `rv` (the
// first failure stays the cause) and is marked done; when the group was aborted, the
// origin's exception is rethrown as an Error carrying its rank (or, when the origin called
// abort() itself and returned, Error(kRuntime) with the abort message).
void run_rank_threads(int world, Rendezvous& rv, const std::function<void(int rank)>& body);

}  // namespace tpcheck

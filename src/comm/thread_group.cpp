// ThreadGroup: an in-process tensor-parallel group whose ranks are std::threads.
//
// All ranks share one GroupState: a mutex, a condition variable and a generation-counted
// rendezvous. For each collective every rank deposits what it passed (a Call); the last
// to arrive checks nothing is left to compare, computes every rank's result into fresh
// buffers, and flips the state to "releasing"; each rank then picks up its own result.
// When all have picked up, the generation advances and the next collective may gather.
// A fast rank entering the next collective while the previous one is still releasing
// waits for the release to finish, so generations never mix.
//
// Reductions (the contract of comm.h), CommOrder::kRank (default): sums in rank order
// 0..N-1, accumulated in f64 for f64 tensors and in f32 for every other dtype, then rounded
// once to the dtype. So for f32 the result is ((x0 + x1) + x2) + ... in f32 arithmetic; for
// f16/bf16 the f32 sum is rounded once to f16/bf16. reduce_scatter is the same sum followed
// by a slice, so its pieces are bit-identical to the matching slices of all_reduce. max
// propagates NaN. CommOrder::kNcclRing: the host model of NCCL's ring
// (comm/ring_reference.h) on the flat tensor (all_reduce) or on the slices along `dim`
// laid out one after the other (reduce_scatter), as the NCCL communicator lays them out.
// Every collective but barrier is recorded in the calling rank's ledger.
// Results never alias any rank's input buffer (a rank that leaves early may write its
// input while others still copy their result).
//
// Failure: every wait has a deadline (entry + timeout). abort() records the first reason
// and wakes everyone; a rank in, or later entering, a collective throws Error(kAborted)
// "rank R failed: <reason>". A rank that waits past its deadline aborts the group naming
// the ranks that never arrived; a rank whose body returned without joining a collective
// its peers wait in is reported at once (it can never arrive).
// Thread safety: GroupState is shared by all ranks and guarded by its mutex; each
// ThreadCommunicator is used by its own rank's thread only.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/rendezvous.h"
#include "comm/ring_reference.h"
#include "tpcheck/comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using Clock = std::chrono::steady_clock;

enum class Kind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

// What one rank passed to a collective.
struct Call {
  Kind kind = Kind::kBarrier;
  int dim = 0;  // normalized (non-negative); all_gather / reduce_scatter only
  ReduceOp op = ReduceOp::kSum;
  int root = 0;   // broadcast only
  Tensor tensor;  // undefined for barrier
};

std::string describe_call(const Call& c) {
  std::string s =
      fmt::format("{}({}", kind_name(c.kind), c.tensor.defined() ? c.tensor.describe() : "");
  if (c.kind == Kind::kAllGather || c.kind == Kind::kReduceScatter)
    s += fmt::format(", dim {}", c.dim);
  if (c.kind == Kind::kAllReduce) s += c.op == ReduceOp::kSum ? ", sum" : ", max";
  if (c.kind == Kind::kBroadcast) s += fmt::format(", root {}", c.root);
  return s + ")";
}

// Sum (rank order, f64 for f64 else f32, one final rounding) or max (NaN-propagating,
// exact) of equally shaped tensors. Returns a fresh tensor.
Tensor reduce(const std::vector<Tensor>& ts, ReduceOp op) {
  const Tensor& first = ts[0];
  if (op == ReduceOp::kMax) {
    std::vector<double> acc = first.to_f64();
    for (std::size_t r = 1; r < ts.size(); ++r) {
      std::vector<double> v = ts[r].to_f64();
      for (std::size_t i = 0; i < acc.size(); ++i) {
        if (std::isnan(acc[i]) || std::isnan(v[i])) {
          acc[i] = std::numeric_limits<double>::quiet_NaN();
        } else {
          acc[i] = std::max(acc[i], v[i]);
        }
      }
    }
    return Tensor::from_f64(acc, first.shape(), first.dtype());  // exact: a max is a stored value
  }
  if (first.dtype() == DType::kF64) {
    std::vector<double> acc = first.to_f64();
    for (std::size_t r = 1; r < ts.size(); ++r) {
      const double* v = ts[r].data<double>();
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += v[i];
    }
    return Tensor::from_f64(acc, first.shape(), DType::kF64);
  }
  std::vector<float> acc = first.to_f32();  // exact widening for every non-f64 dtype
  for (std::size_t r = 1; r < ts.size(); ++r) {
    std::vector<float> v = ts[r].to_f32();
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += v[i];
  }
  return Tensor::from_f32(acc, first.shape(), first.dtype());  // the one rounding
}

// The slices of `full` along `dim` laid out one after the other: [N, numel / N].
Tensor slices_flat(const Tensor& full, int dim, int world) {
  const std::int64_t chunk = full.dim(dim) / world;
  std::vector<Tensor> parts;
  for (int r = 0; r < world; ++r) parts.push_back(full.slice(dim, r * chunk, chunk).reshape({1, full.numel() / world}));
  return Tensor::cat(parts, 0);
}

// The ledger's description of how a sum or max is computed.
std::string reduce_algorithm(CommOrder order, ReduceOp op, const Tensor& t, int world,
                             std::size_t chunk_bytes, bool scatter) {
  if (order == CommOrder::kNcclRing) {
    if (op == ReduceOp::kMax) return "nccl-ring fmax (host model)";
    if (scatter) return "nccl-ring host model (1 channel)";
    return fmt::format("nccl-ring host model ({} chunks, 1 channel)",
                       ring::all_reduce_chunk_count(t.numel(), world, t.dtype(), chunk_bytes));
  }
  if (op == ReduceOp::kMax) return "rank-order max (NaN propagates)";
  return t.dtype() == DType::kF64 ? "rank-order f64 sum" : "rank-order f32 sum, rounded once";
}

class GroupState {
 public:
  GroupState(int world, const ThreadGroupOptions& options)
      : world_(world),
        timeout_(options.timeout),
        order_(options.order),
        chunk_bytes_(options.nccl_chunk_bytes),
        calls_(world),
        results_(world),
        done_(world, false) {}

  // Runs one collective for `rank`. Returns rank's result; `shared` tells whether the
  // same buffer went to every rank (then the caller copies it before writing).
  Tensor exchange(int rank, Call call, bool* shared) {
    std::unique_lock<std::mutex> lk(mu_);
    const Clock::time_point deadline = Clock::now() + timeout_;
    // The previous collective may still be handing out results.
    if (!cv_.wait_until(lk, deadline, [&] { return aborted_ || !releasing_; })) {
      fail_locked(rank, fmt::format("waited {} ms in {} for the previous collective to finish",
                                    timeout_.count(), kind_name(call.kind)));
    }
    throw_if_aborted(rank);
    check_matches_locked(rank, call);
    const std::uint64_t gen = generation_;
    const Kind kind = call.kind;
    calls_[rank] = std::move(call);
    ++arrived_;
    if (arrived_ == world_) {
      try {
        compute_locked(rank);
      } catch (const std::exception& e) {
        fail_locked(rank, fmt::format("{} failed: {}", kind_name(kind), e.what()));
      }
      releasing_ = true;
      cv_.notify_all();
    } else {
      bool ready = cv_.wait_until(lk, deadline, [&] {
        return aborted_ || (releasing_ && generation_ == gen) || !departed_missing_locked().empty();
      });
      throw_if_aborted(rank);
      if (!(releasing_ && generation_ == gen)) {
        std::vector<int> departed = departed_missing_locked();
        if (!departed.empty()) {
          fail_locked(rank, fmt::format("rank(s) {} returned without calling {} (collective #{}) "
                                        "while rank(s) {} wait in it",
                                        fmt::join(departed, ", "), kind_name(kind), gen,
                                        fmt::join(present_locked(), ", ")));
        }
        TPCHECK_CHECK(!ready, "rendezvous woke without a result");
        fail_locked(rank, fmt::format("timed out after {} ms in {} (collective #{}): rank(s) {} "
                                      "never arrived",
                                      timeout_.count(), kind_name(kind), gen,
                                      fmt::join(missing_locked(), ", ")));
      }
    }
    Tensor out = results_[rank];
    *shared = shared_results_;
    if (++picked_ == world_) {
      for (auto& c : calls_) c.reset();
      for (auto& t : results_) t = Tensor();
      arrived_ = 0;
      picked_ = 0;
      releasing_ = false;
      ++generation_;
      cv_.notify_all();
    }
    return out;
  }

  // Marks the group failed; the first reason wins. Safe from any thread, repeatedly.
  void abort(int origin, const std::string& reason) {
    std::lock_guard<std::mutex> lk(mu_);
    abort_locked(origin, reason);
  }

  void mark_done(int rank) {
    std::lock_guard<std::mutex> lk(mu_);
    done_[rank] = true;
    cv_.notify_all();
  }

  CommOrder order() const { return order_; }
  std::size_t chunk_bytes() const { return chunk_bytes_; }

  bool aborted() {
    std::lock_guard<std::mutex> lk(mu_);
    return aborted_;
  }
  int abort_origin() {
    std::lock_guard<std::mutex> lk(mu_);
    return abort_origin_;
  }
  std::string abort_message() {
    std::lock_guard<std::mutex> lk(mu_);
    return abort_message_;
  }

 private:
  void abort_locked(int origin, const std::string& reason) {
    if (aborted_) return;
    aborted_ = true;
    abort_origin_ = origin;
    abort_message_ = fmt::format("rank {} failed: {}", origin, reason);
    cv_.notify_all();
  }

  // This rank detected the failure: abort everyone, then throw the root-cause error.
  [[noreturn]] void fail_locked(int rank, const std::string& reason) {
    abort_locked(rank, reason);
    throw Error(ErrorKind::kRuntime, reason, {}, rank);
  }

  void throw_if_aborted(int rank) const {
    if (aborted_) throw Error(ErrorKind::kAborted, abort_message_, {}, rank);
  }

  // Every rank must pass the same collective with the same shape, dtype and arguments.
  void check_matches_locked(int rank, const Call& call) {
    for (int q = 0; q < world_; ++q) {
      if (!calls_[q]) continue;
      const Call& ref = *calls_[q];
      bool same = ref.kind == call.kind && ref.dim == call.dim && ref.op == call.op &&
                  ref.root == call.root && ref.tensor.defined() == call.tensor.defined();
      if (same && call.tensor.defined()) {
        same =
            ref.tensor.shape() == call.tensor.shape() && ref.tensor.dtype() == call.tensor.dtype();
      }
      if (!same) {
        fail_locked(rank,
                    fmt::format("mismatched collective #{}: rank {} called {} but rank {} "
                                "called {}",
                                generation_, rank, describe_call(call), q, describe_call(ref)));
      }
      return;  // all deposited calls already match each other
    }
  }

  void compute_locked(int rank) {
    const Call& c0 = *calls_[0];
    std::vector<Tensor> ts;
    for (const auto& c : calls_) ts.push_back(c->tensor);
    shared_results_ = false;
    switch (c0.kind) {
      case Kind::kAllGather: {
        Tensor all = Tensor::cat(ts, c0.dim);
        for (auto& r : results_) r = all;
        shared_results_ = true;
        break;
      }
      case Kind::kReduceScatter: {
        if (order_ == CommOrder::kNcclRing) {
          std::vector<Tensor> flat;
          for (const Tensor& t : ts) flat.push_back(slices_flat(t, c0.dim, world_));
          std::vector<Tensor> pieces = ring::reduce_scatter(flat, ReduceOp::kSum);
          Shape piece = ts[0].shape();
          piece[c0.dim] /= world_;
          for (int r = 0; r < world_; ++r) results_[r] = pieces[r].reshape(piece);
          break;
        }
        Tensor sum = reduce(ts, ReduceOp::kSum);
        std::int64_t chunk = sum.dim(c0.dim) / world_;
        for (int r = 0; r < world_; ++r) results_[r] = sum.slice(c0.dim, r * chunk, chunk);
        break;
      }
      case Kind::kAllReduce: {
        if (order_ == CommOrder::kNcclRing) {
          std::vector<Tensor> outs = ring::all_reduce(ts, c0.op, chunk_bytes_);
          for (int r = 0; r < world_; ++r) results_[r] = outs[r];
          break;
        }
        Tensor out = reduce(ts, c0.op);
        for (auto& r : results_) r = out;
        shared_results_ = true;
        break;
      }
      case Kind::kBroadcast: {
        Tensor out = ts[c0.root].clone();
        for (auto& r : results_) r = out;
        shared_results_ = true;
        break;
      }
      case Kind::kBarrier:
        break;
    }
  }

  std::vector<int> missing_locked() const {
    std::vector<int> out;
    for (int r = 0; r < world_; ++r)
      if (!calls_[r]) out.push_back(r);
    return out;
  }
  std::vector<int> present_locked() const {
    std::vector<int> out;
    for (int r = 0; r < world_; ++r)
      if (calls_[r]) out.push_back(r);
    return out;
  }
  std::vector<int> departed_missing_locked() const {
    std::vector<int> out;
    for (int r = 0; r < world_; ++r)
      if (!calls_[r] && done_[r]) out.push_back(r);
    return out;
  }

  const int world_;
  const std::chrono::milliseconds timeout_;
  const CommOrder order_;
  const std::size_t chunk_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;  // collectives completed so far
  bool releasing_ = false;        // results of `generation_` are being picked up
  int arrived_ = 0;
  int picked_ = 0;
  std::vector<std::optional<Call>> calls_;
  std::vector<Tensor> results_;
  bool shared_results_ = false;
  std::vector<bool> done_;  // the rank's body has returned or thrown
  bool aborted_ = false;
  int abort_origin_ = -1;
  std::string abort_message_;
};


class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<GroupState> state, int rank, int world)
      : state_(std::move(state)), rank_(rank), world_(world) {}

  int rank() const override { return rank_; }
  int size() const override { return world_; }

  Tensor all_gather(const Tensor& local, int dim) override {
    Call c{Kind::kAllGather, check_all_gather(local, dim, nullptr), ReduceOp::kSum, 0, local};
    record(CommKind::kAllGather, local, c.dim, ReduceOp::kSum, 0, "concatenation");
    bool shared = false;
    Tensor out = state_->exchange(rank_, std::move(c), &shared);
    return shared ? out.clone() : out;
  }

  Tensor reduce_scatter(const Tensor& full, int dim) override {
    const int d = check_reduce_scatter(full, dim, world_, nullptr);
    record(CommKind::kReduceScatter, full, d, ReduceOp::kSum, 0,
           reduce_algorithm(state_->order(), ReduceOp::kSum, full, world_, state_->chunk_bytes(),
                            true));
    bool shared = false;
    Tensor out =
        state_->exchange(rank_, Call{Kind::kReduceScatter, d, ReduceOp::kSum, 0, full}, &shared);
    return shared ? out.clone() : out;
  }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_all_reduce(t, nullptr);
    record(CommKind::kAllReduce, t, 0, op, 0,
           reduce_algorithm(state_->order(), op, t, world_, state_->chunk_bytes(), false));
    bool shared = false;
    Tensor out = state_->exchange(rank_, Call{Kind::kAllReduce, 0, op, 0, t}, &shared);
    t.copy_from(out);
  }

  void broadcast(Tensor& t, int root) override {
    check_broadcast(t, root, world_, nullptr);
    record(CommKind::kBroadcast, t, 0, ReduceOp::kSum, root, "copy from root");
    bool shared = false;
    Tensor out =
        state_->exchange(rank_, Call{Kind::kBroadcast, 0, ReduceOp::kSum, root, t}, &shared);
    if (rank_ != root) t.copy_from(out);
  }

  void barrier() override {
    bool shared = false;
    state_->exchange(rank_, Call{}, &shared);
  }

  void abort(const std::string& reason) override { state_->abort(rank_, reason); }

 private:
  std::shared_ptr<GroupState> state_;
  int rank_;
  int world_;
};

}  // namespace

void run_thread_group(int world, const std::function<void(Communicator&)>& body,
                      ThreadGroupOptions options) {
  TPCHECK_CHECK_INPUT(world >= 1, "thread group size {} must be at least 1", world);
  TPCHECK_CHECK_INPUT(options.timeout.count() > 0, "thread group timeout {} ms must be positive",
                      options.timeout.count());
  TPCHECK_CHECK_INPUT(options.nccl_chunk_bytes >= 16,
                      "thread group: NCCL chunk of {} bytes is too small (at least 16)",
                      options.nccl_chunk_bytes);
  auto state = std::make_shared<GroupState>(world, options);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(state, r, world);
      try {
        body(comm);
      } catch (...) {
        errors[r] = std::current_exception();
        // A no-op when the group is already aborted: the first failure stays the cause.
        state->abort(r, describe_exception(errors[r]));
      }
      state->mark_done(r);
    });
  }
  for (auto& t : threads) t.join();
  if (!state->aborted()) return;
  int origin = state->abort_origin();
  if (errors[origin]) rethrow_with_rank(errors[origin], origin);
  // The origin called abort() itself and returned normally.
  throw Error(ErrorKind::kRuntime, state->abort_message(), {}, origin);
}

}  // namespace tpcheck

// rendezvous.cpp — see rendezvous.h. A generation-counted barrier: the last rank to arrive
// advances the generation and wakes the others; a fast rank arriving for the next
// generation counts towards it only (waiters compare generations, not counts).
#include "comm/rendezvous.h"

#include "tpcheck/tensor.h"

#include <exception>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tpcheck/error.h"

namespace tpcheck {

using Clock = std::chrono::steady_clock;

Rendezvous::Rendezvous(int world, std::chrono::milliseconds timeout)
    : world_(world), timeout_(timeout), arrived_(world, false), done_(world, false) {}

void Rendezvous::arrive(int rank, const std::string& what) {
  std::unique_lock<std::mutex> lk(mu_);
  const Clock::time_point deadline = Clock::now() + timeout_;
  if (aborted_) throw Error(ErrorKind::kAborted, abort_message_, {}, rank);
  const std::uint64_t gen = generation_;
  arrived_[rank] = true;
  if (++count_ == world_) {
    count_ = 0;
    arrived_.assign(world_, false);
    ++generation_;
    cv_.notify_all();
    return;
  }
  auto departed = [&] {
    std::vector<int> out;
    for (int r = 0; r < world_; ++r)
      if (!arrived_[r] && done_[r]) out.push_back(r);
    return out;
  };
  auto pending = [&](bool want_arrived) {
    std::vector<int> out;
    for (int r = 0; r < world_; ++r)
      if (arrived_[r] == want_arrived) out.push_back(r);
    return out;
  };
  cv_.wait_until(lk, deadline,
                 [&] { return aborted_ || generation_ != gen || !departed().empty(); });
  if (generation_ != gen) return;
  if (aborted_) throw Error(ErrorKind::kAborted, abort_message_, {}, rank);
  std::vector<int> gone = departed();
  if (!gone.empty()) {
    fail_locked(rank, fmt::format("rank(s) {} returned without calling {} while rank(s) {} wait in it",
                                  fmt::join(gone, ", "), what, fmt::join(pending(true), ", ")));
  }
  fail_locked(rank, fmt::format("timed out after {} ms in {}: rank(s) {} never arrived",
                                timeout_.count(), what, fmt::join(pending(false), ", ")));
}

void Rendezvous::abort(int origin, const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  abort_locked(origin, reason);
}

void Rendezvous::mark_done(int rank) {
  std::lock_guard<std::mutex> lk(mu_);
  done_[rank] = true;
  cv_.notify_all();
}

void Rendezvous::throw_if_aborted(int rank) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) throw Error(ErrorKind::kAborted, abort_message_, {}, rank);
}

bool Rendezvous::aborted() {
  std::lock_guard<std::mutex> lk(mu_);
  return aborted_;
}
int Rendezvous::abort_origin() {
  std::lock_guard<std::mutex> lk(mu_);
  return abort_origin_;
}
std::string Rendezvous::abort_message() {
  std::lock_guard<std::mutex> lk(mu_);
  return abort_message_;
}

void Rendezvous::abort_locked(int origin, const std::string& reason) {
  if (aborted_) return;
  aborted_ = true;
  abort_origin_ = origin;
  abort_message_ = fmt::format("rank {} failed: {}", origin, reason);
  cv_.notify_all();
}

void Rendezvous::fail_locked(int rank, const std::string& reason) {
  abort_locked(rank, reason);
  throw Error(ErrorKind::kRuntime, reason, {}, rank);
}

int normalize_collective_dim(const Tensor& t, int dim, const char* what) {
  TPCHECK_CHECK(t.defined(), "{}: undefined tensor", what);
  TPCHECK_CHECK(dim >= -t.rank() && dim < t.rank(), "{}: dim {} out of range for {}", what, dim,
                t.describe());
  return dim < 0 ? dim + t.rank() : dim;
}

namespace {

void check_device(const Tensor& t, const char* what, const char* gpu_only) {
  if (gpu_only == nullptr) return;
  TPCHECK_CHECK(t.device() == Device::kCuda, "{}: {} takes GPU tensors, got {}", what, gpu_only,
                t.describe());
}

}  // namespace

int check_all_gather(const Tensor& local, int dim, const char* gpu_only) {
  const int d = normalize_collective_dim(local, dim, "all_gather");
  check_device(local, "all_gather", gpu_only);
  return d;
}

int check_reduce_scatter(const Tensor& full, int dim, int world, const char* gpu_only) {
  const int d = normalize_collective_dim(full, dim, "reduce_scatter");
  check_device(full, "reduce_scatter", gpu_only);
  TPCHECK_CHECK(full.dim(d) % world == 0,
                "reduce_scatter: dim {} of {} is not divisible by the group size {}", d,
                full.describe(), world);
  return d;
}

void check_all_reduce(const Tensor& t, const char* gpu_only) {
  TPCHECK_CHECK(t.defined(), "all_reduce: undefined tensor");
  check_device(t, "all_reduce", gpu_only);
}

void check_broadcast(const Tensor& t, int root, int world, const char* gpu_only) {
  TPCHECK_CHECK(t.defined(), "broadcast: undefined tensor");
  check_device(t, "broadcast", gpu_only);
  TPCHECK_CHECK(root >= 0 && root < world, "broadcast: root {} out of range for a group of {}",
                root, world);
}

std::string describe_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

[[noreturn]] void rethrow_with_rank(const std::exception_ptr& e, int rank) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (err.rank() == rank) throw;
    throw Error(err.kind(), err.what(), err.where(), rank);
  } catch (const std::exception& ex) {
    throw Error(ErrorKind::kRuntime, ex.what(), {}, rank);
  } catch (...) {
    throw Error(ErrorKind::kRuntime, "unknown exception", {}, rank);
  }
}


void run_rank_threads(int world, Rendezvous& rv, const std::function<void(int rank)>& body) {
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
        rv.abort(r, describe_exception(errors[r]));
      }
      rv.mark_done(r);
    });
  }
  for (auto& t : threads) t.join();
  if (!rv.aborted()) return;
  const int origin = rv.abort_origin();
  if (origin >= 0 && origin < world && errors[origin]) rethrow_with_rank(errors[origin], origin);
  throw Error(ErrorKind::kRuntime, rv.abort_message(), {}, origin);
}

}  // namespace tpcheck

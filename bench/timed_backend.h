// timed_backend.h — a Backend decorator that forwards every op to an inner backend and
// adds up the wall time spent in each kind of op, so a benchmark can split a layer's time
// into GEMM (attention's products and the quantized GEMMs included), attention (its layout
// and softmax primitives, or the fused library call), norms, activations, bias,
// elementwise, a recipe's quantization, and the layer's own code (whatever remains of the
// total).
//
// Two clocks per op kind: wall time, and the calling thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID). Every op other than a multi-threaded GEMM runs on the calling
// thread, so its CPU time is its work, and unlike wall time it does not grow when other
// processes take the core (it still does with cache and memory-bandwidth contention).
// Why a decorator and not a profiler: it measures exactly the boundary the performance
// requirement talks about ("no loop outside the GEMM ...") on every run of the benchmark,
// with no extra tools, and costs two clock reads per op (ops here take micro- to
// milliseconds).
// A BackendWrapper: it shares the inner backend's state (GEMM rule, ledger, rank), so
// `set_gemm_rule` and `ledger()` on either are the same, and GEMMs pass the one front end;
// it implements only the wrapper's before_op / after_op hook, so every op is timed.
// Thread safety: like every Backend, one rank (thread) at a time.
#pragma once

#include <time.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "tpcheck/backend.h"

namespace tpcheck::bench {

enum class OpKind { kGemm, kAttention, kNorm, kActivation, kBias, kElementwise, kQuantize, kCount };

inline constexpr std::array<std::string_view, static_cast<int>(OpKind::kCount)> kOpKindNames = {
    "gemm", "attn", "norm", "act", "bias", "elem", "quant"};

// CPU time consumed by the calling thread so far.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The kind each op's time is added to. Attention is a composition
// (Backend::attention_forward / attention_backward): its products pass run_gemm and count
// as GEMM time; its layout and softmax primitives, or the fused library call, count as
// attention. The fusions (bias + gelu, the residual join) are forwarded whole to the
// target (BackendWrapper::Fusions::kForward): bias + gelu counts as an activation.
inline OpKind op_kind(Op op) {
  switch (op) {
    case Op::kGemm:
    case Op::kGemmQuantized:
      return OpKind::kGemm;
    case Op::kQuantize:
      return OpKind::kQuantize;
    case Op::kAddBias:
    case Op::kAccumulateBiasGrad:
      return OpKind::kBias;
    case Op::kNormForward:
    case Op::kNormBackward:
      return OpKind::kNorm;
    case Op::kActivationForward:
    case Op::kActivationBackward:
    case Op::kBiasGeluForward:
    case Op::kBiasGeluBackward:
      return OpKind::kActivation;
    case Op::kBiasResidualAdd:
    case Op::kAdd:
    case Op::kAccumulate:
    case Op::kScale:
    case Op::kMseLoss:
    case Op::kMseLossBackward:
      return OpKind::kElementwise;
    case Op::kAttentionHeadsIn:
    case Op::kAttentionHeadsOut:
    case Op::kAttentionSoftmaxForward:
    case Op::kAttentionSoftmaxBackward:
    case Op::kFusedAttentionForward:
    case Op::kFusedAttentionBackward:
      return OpKind::kAttention;
  }
  return OpKind::kElementwise;
}

// Owns the wrapped backend; a base so it is built before BackendWrapper takes a reference.
struct OwnedBackend {
  std::unique_ptr<Backend> inner_;
};

class TimedBackend final : private OwnedBackend, public BackendWrapper {
 public:
  // sync_each_op: wait for the device after every op before stopping its clock, so a
  // GPU op's wall time is its kernels' time (costs a synchronization per op: use it for
  // a breakdown run, not for the headline time).
  explicit TimedBackend(std::unique_ptr<Backend> inner, bool sync_each_op = false)
      : OwnedBackend{std::move(inner)},
        BackendWrapper(*inner_, Fusions::kForward),
        sync_each_op_(sync_each_op) {}

  Backend& inner() { return *inner_; }
  void set_sync_each_op(bool sync) { sync_each_op_ = sync; }

  // Wall / calling-thread CPU seconds spent in ops of `kind` since the last reset().
  double seconds(OpKind kind) const { return seconds_[static_cast<int>(kind)]; }
  double cpu_seconds(OpKind kind) const { return cpu_seconds_[static_cast<int>(kind)]; }
  // Elements the ops of `kind` were given (OpCall::elements: the output of a GEMM, the
  // activation tensor of the others; attention: its layout and softmax primitives'
  // inputs): a count of work that no other load on the machine changes, so the scaling of
  // an op's work can be told apart from the scaling of its time.
  double elements(OpKind kind) const { return elements_[static_cast<int>(kind)]; }
  void reset() {
    seconds_.fill(0.0);
    cpu_seconds_.fill(0.0);
    elements_.fill(0.0);
  }

  void set_rule(const GemmClassRule& rule) { set_gemm_rule(rule); }

 protected:
  void before_op(const OpCall& call) override {
    elements_[static_cast<int>(op_kind(call.op))] += static_cast<double>(call.elements);
    start_ = std::chrono::steady_clock::now();
    cpu_start_ = thread_cpu_seconds();
  }
  void after_op(const OpCall& call) override {
    if (sync_each_op_) inner_->synchronize();
    const int kind = static_cast<int>(op_kind(call.op));
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
    seconds_[kind] += d.count();
    cpu_seconds_[kind] += thread_cpu_seconds() - cpu_start_;
  }

 private:
  bool sync_each_op_ = false;
  // The op in flight's clocks (ops never nest: BackendWrapper::before_op).
  std::chrono::steady_clock::time_point start_;
  double cpu_start_ = 0;
  std::array<double, static_cast<int>(OpKind::kCount)> seconds_{};
  std::array<double, static_cast<int>(OpKind::kCount)> cpu_seconds_{};
  std::array<double, static_cast<int>(OpKind::kCount)> elements_{};
};

}  // namespace tpcheck::bench

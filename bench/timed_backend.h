// timed_backend.h — a Backend decorator that forwards every op to an inner backend and
// adds up the wall time spent in each kind of op, so a benchmark can split a layer's time
// into GEMM, attention, norms, activations, bias, elementwise, and the layer's own code
// (whatever remains of the total).
//
// Why a decorator and not a profiler: it measures exactly the boundary the performance
// requirement talks about ("no loop outside the GEMM ...") on every run of the benchmark,
// with no extra tools, and costs two clock reads per op (ops here take micro- to
// milliseconds).
// The GEMM ledger: the inner backend records each GEMM in its own ledger; the decorator
// copies the record into its own, so `ledger()` of either holds the same records.
// Thread safety: like every Backend, one rank (thread) at a time.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string_view>
#include <utility>

#include "tpcheck/backend.h"

namespace tpcheck::bench {

enum class OpKind { kGemm, kAttention, kNorm, kActivation, kBias, kElementwise, kCount };

inline constexpr std::array<std::string_view, static_cast<int>(OpKind::kCount)> kOpKindNames = {
    "gemm", "attn", "norm", "act", "bias", "elem"};

class TimedBackend final : public Backend {
 public:
  explicit TimedBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  std::string_view name() const override { return inner_->name(); }
  Backend& inner() { return *inner_; }

  // Seconds spent in ops of `kind` since the last reset().
  double seconds(OpKind kind) const { return seconds_[static_cast<int>(kind)]; }
  void reset() { seconds_.fill(0.0); }

  void gemm(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            Tensor& c, bool accumulate) override {
    Timer t(this, OpKind::kGemm);
    inner_->gemm(site, a, trans_a, b, trans_b, c, accumulate);
    ledger_.add(inner_->ledger().records().back());
  }
  void add_bias(Tensor& y, const Tensor& bias) override {
    Timer t(this, OpKind::kBias);
    inner_->add_bias(y, bias);
  }
  void accumulate_bias_grad(const Tensor& dy, Tensor& dbias) override {
    Timer t(this, OpKind::kBias);
    inner_->accumulate_bias_grad(dy, dbias);
  }
  NormForward norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           double eps, bool zero_centered_gamma) override {
    Timer t(this, OpKind::kNorm);
    return inner_->norm_forward(kind, x, gamma, beta, eps, zero_centered_gamma);
  }
  Tensor norm_backward(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                       const NormForward& saved, bool zero_centered_gamma, Tensor& dgamma,
                       Tensor& dbeta) override {
    Timer t(this, OpKind::kNorm);
    return inner_->norm_backward(kind, dy, x, gamma, saved, zero_centered_gamma, dgamma, dbeta);
  }
  Tensor activation_forward(Activation act, const Tensor& x) override {
    Timer t(this, OpKind::kActivation);
    return inner_->activation_forward(act, x);
  }
  Tensor activation_backward(Activation act, const Tensor& dy, const Tensor& x) override {
    Timer t(this, OpKind::kActivation);
    return inner_->activation_backward(act, dy, x);
  }
  AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionMask& mask, double scale) override {
    Timer t(this, OpKind::kAttention);
    return inner_->attention_forward(q, k, v, mask, scale);
  }
  AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionForward& saved,
                                    const AttentionMask& mask, double scale) override {
    Timer t(this, OpKind::kAttention);
    return inner_->attention_backward(dout, q, k, v, saved, mask, scale);
  }
  Tensor add(const Tensor& a, const Tensor& b) override {
    Timer t(this, OpKind::kElementwise);
    return inner_->add(a, b);
  }
  void accumulate(Tensor& into, const Tensor& x) override {
    Timer t(this, OpKind::kElementwise);
    inner_->accumulate(into, x);
  }
  Tensor scale(const Tensor& x, double s) override {
    Timer t(this, OpKind::kElementwise);
    return inner_->scale(x, s);
  }
  double mse_loss(const Tensor& y, const Tensor& target) override {
    Timer t(this, OpKind::kElementwise);
    return inner_->mse_loss(y, target);
  }
  Tensor mse_loss_backward(const Tensor& y, const Tensor& target) override {
    Timer t(this, OpKind::kElementwise);
    return inner_->mse_loss_backward(y, target);
  }

  // The rule lives in the inner backend, which is the one that picks classes.
  void set_rule(const GemmClassRule& rule) {
    set_gemm_rule(rule);
    inner_->set_gemm_rule(rule);
  }

 private:
  // Adds the scope's wall time to its kind on destruction.
  class Timer {
   public:
    Timer(TimedBackend* owner, OpKind kind)
        : owner_(owner), kind_(kind), start_(std::chrono::steady_clock::now()) {}
    ~Timer() {
      const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
      owner_->seconds_[static_cast<int>(kind_)] += d.count();
    }

   private:
    TimedBackend* owner_;
    OpKind kind_;
    std::chrono::steady_clock::time_point start_;
  };

  std::unique_ptr<Backend> inner_;
  std::array<double, static_cast<int>(OpKind::kCount)> seconds_{};
};

}  // namespace tpcheck::bench

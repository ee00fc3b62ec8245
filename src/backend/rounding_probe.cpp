// rounding_probe.cpp — the rounding probe as a backend decorator (tpcheck/backend.h,
// make_rounding_probe_backend): every f64 tensor an op stores is multiplied by (1 + u·r)
// on the device that holds it, r from one fixed stream (random_math::probe_factor).
//
// The CPU backend perturbs inside its store routine (ScopedRoundingProbe); a GPU kernel
// cannot see that thread-local state, so for the CUDA backend the same perturbation is
// applied at each op's boundary, to what the op wrote: the same stored values, in a
// different stream order (the floor is a statistic of the noise, not of its stream).
// Copies (attention's heads-in layout change) store nothing new and are not perturbed.
// Thread safety: one instance per rank thread, like the backend it wraps.
#include <cstdint>
#include <memory>

#include "core/device_runtime.h"
#include "core/random_math.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// Owns the wrapped backend; a base class so it is built before BackendWrapper takes the
// reference (bases are constructed in declaration order).
struct OwnedTarget {
  explicit OwnedTarget(std::unique_ptr<Backend> t) : owned(std::move(t)) {
    TPCHECK_CHECK(owned != nullptr, "rounding probe: no backend to wrap");
  }
  std::unique_ptr<Backend> owned;
};

class RoundingProbeBackend final : private OwnedTarget, public BackendWrapper {
 public:
  RoundingProbeBackend(std::unique_ptr<Backend> target, double u, std::uint64_t seed)
      : OwnedTarget(std::move(target)), BackendWrapper(*owned), u_(u), seed_(seed) {
    TPCHECK_CHECK_INPUT(u > 0 && u < 1, "rounding probe: u = {} must be in (0, 1)", u);
  }

  void add_bias(Tensor& y, const Tensor& bias) override {
    BackendWrapper::add_bias(y, bias);
    perturb(y);
  }
  void accumulate_bias_grad(const Tensor& dy, Tensor& dbias) override {
    BackendWrapper::accumulate_bias_grad(dy, dbias);
    perturb(dbias);
  }
  NormForward norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           double eps, bool zero_centered_gamma) override {
    NormForward f = BackendWrapper::norm_forward(kind, x, gamma, beta, eps, zero_centered_gamma);
    perturb(f.y);
    perturb(f.mean);
    perturb(f.rstd);
    return f;
  }
  Tensor norm_backward(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                       const NormForward& saved, bool zero_centered_gamma, Tensor& dgamma,
                       Tensor& dbeta) override {
    Tensor dx = BackendWrapper::norm_backward(kind, dy, x, gamma, saved, zero_centered_gamma,
                                              dgamma, dbeta);
    perturb(dx);
    perturb(dgamma);
    perturb(dbeta);
    return dx;
  }
  Tensor activation_forward(Activation act, const Tensor& x) override {
    return perturbed(BackendWrapper::activation_forward(act, x));
  }
  Tensor activation_backward(Activation act, const Tensor& dy, const Tensor& x) override {
    return perturbed(BackendWrapper::activation_backward(act, dy, x));
  }
  Tensor add(const Tensor& a, const Tensor& b) override {
    return perturbed(BackendWrapper::add(a, b));
  }
  void accumulate(Tensor& into, const Tensor& x) override {
    BackendWrapper::accumulate(into, x);
    perturb(into);
  }
  Tensor scale(const Tensor& x, double s) override { return perturbed(BackendWrapper::scale(x, s)); }
  Tensor mse_loss_backward(const Tensor& y, const Tensor& target) override {
    return perturbed(BackendWrapper::mse_loss_backward(y, target));
  }

 protected:
  void run_gemm(const GemmProblem& p, GemmRecord& record) override {
    BackendWrapper::run_gemm(p, record);
    perturb(*p.c);
    if (p.epilogue.aux != nullptr && p.epilogue.activation == GemmEpilogue::Activation::kGelu)
      perturb(*p.epilogue.aux);
  }
  Tensor attention_heads_out(const Tensor& x, std::int64_t batch, std::int64_t groups) override {
    return perturbed(BackendWrapper::attention_heads_out(x, batch, groups));
  }
  Tensor attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) override {
    return perturbed(BackendWrapper::attention_softmax_forward(scores, mask));
  }
  Tensor attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) override {
    return perturbed(BackendWrapper::attention_softmax_backward(dprobs, probs));
  }

 private:
  // Only f64 stores are perturbed (the probe runs the f64 truth computation).
  void perturb(Tensor& t) {
    if (!t.defined() || t.dtype() != DType::kF64 || t.numel() == 0) return;
    const std::uint64_t first = counter_ + 1;
    counter_ += static_cast<std::uint64_t>(t.numel());
    auto* values = static_cast<double*>(t.raw());
    if (t.device() == Device::kCpu) {
      for (std::int64_t i = 0; i < t.numel(); ++i)
        values[i] *= random_math::probe_factor(u_, seed_, first + static_cast<std::uint64_t>(i));
      return;
    }
    device_runtime(t.device()).perturb_f64(values, t.numel(), u_, seed_, first);
  }
  Tensor perturbed(Tensor t) {
    perturb(t);
    return t;
  }

  double u_;
  std::uint64_t seed_;
  std::uint64_t counter_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_rounding_probe_backend(std::unique_ptr<Backend> target, double u,
                                                     std::uint64_t seed) {
  return std::make_unique<RoundingProbeBackend>(std::move(target), u, seed);
}

}  // namespace tpcheck

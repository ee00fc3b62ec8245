// cpu_backend.h — the reference backend: every Backend op on the host, in plain C++.
//
// CpuBackend is the backend CI runs and the one truth runs use. GEMMs go through
// OpenBLAS with their inputs rounded to the chosen math class (see gemm.cpp); every
// other op (attention's primitives too: its products are GEMMs) is a straightforward loop with its math in f32 (f64 for f64 inputs) and one
// rounding to the storage dtype where a GPU kernel would store.
// The methods live in one file per op: gemm.cpp, bias.cpp, norm.cpp, activation.cpp,
// attention.cpp, elementwise.cpp (and cpu_backend.cpp for the factory).
// Thread safety: like every Backend, used by one rank (thread) at a time. Distinct
// CpuBackend objects may run on distinct threads at once.
#pragma once

#include <cstdint>
#include <string_view>

#include "tpcheck/backend.h"

namespace tpcheck {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  Device device() const override { return Device::kCpu; }

  // norm.cpp accumulates dgamma and dbeta before it makes dx; gemm.cpp stores the gelu
  // epilogue's aux before C (Backend::store_order).
  StoreOrder store_order() const override {
    return {.norm_param_grads_first = true, .gelu_aux_first = true};
  }

 protected:
  // gemm.cpp
  void run_gemm(const GemmProblem& p, GemmRecord& record) override;
  void run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord& record) override;

  // attention.cpp (the primitives; Backend::attention_forward / attention_backward in
  // src/backend/composed_attention.cpp compose them with the GEMM front end)
  Tensor attention_heads_in(const Tensor& x, std::int64_t heads) override;
  Tensor attention_heads_out(const Tensor& x, std::int64_t batch, std::int64_t groups) override;
  Tensor attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) override;
  Tensor attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) override;

 public:

  // bias.cpp
  void add_bias(Tensor& y, const Tensor& bias) override;
  void accumulate_bias_grad(const Tensor& dy, Tensor& dbias) override;

  // norm.cpp
  NormForward norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           double eps, bool zero_centered_gamma) override;
  Tensor norm_backward(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                       const NormForward& saved, bool zero_centered_gamma, Tensor& dgamma,
                       Tensor& dbeta) override;

  // activation.cpp
  Tensor activation_forward(Activation act, const Tensor& x) override;
  Tensor activation_backward(Activation act, const Tensor& dy, const Tensor& x) override;

  // elementwise.cpp
  Tensor add(const Tensor& a, const Tensor& b) override;
  void accumulate(Tensor& into, const Tensor& x) override;
  Tensor scale(const Tensor& x, double s) override;
  double mse_loss(const Tensor& y, const Tensor& target) override;
  Tensor mse_loss_backward(const Tensor& y, const Tensor& target) override;
};

}  // namespace tpcheck

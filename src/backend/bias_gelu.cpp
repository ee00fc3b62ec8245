// bias_gelu.cpp — Backend::bias_gelu_forward / bias_gelu_backward: the composition every
// backend inherits (LayerNormMLP's fc1 bias + gelu, the reference's fused elementwise
// path). It defines the arithmetic a fusing backend must reproduce bit for bit:
//   forward   pre = round_R(h + bias)          (to(R), then add_bias in R)
//             y   = round_T(gelu(pre))         (activation_forward in R, then to(T))
//   backward  dpre = da · gelu'(pre) in R      (activation_backward reads da as R)
//             dh   = round_T(dpre)
//             dbias += Σ_rows dpre             (accumulate_bias_grad of the R tensor)
// R = f32, f64 for f64 h; T = h's dtype (forward), da's (backward).
// Thread safety: as any Backend op, one rank (thread) at a time.
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

DType wide_dtype(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

// pre = round_R(h + bias), a new R tensor (to() copies even when h is already R, so h
// itself is never modified).
Tensor bias_gelu_pre(Backend& be, const Tensor& h, const Tensor& bias) {
  Tensor pre = h.to(wide_dtype(h.dtype()));
  if (bias.defined()) be.add_bias(pre, bias);
  return pre;
}

void check_bias_gelu_input(const char* op, const Tensor& h, const Tensor& bias) {
  TPCHECK_CHECK_INPUT(h.defined() && h.rank() >= 1, "{}: h must be a tensor of rank >= 1, got {}",
                      op, h.defined() ? h.describe() : std::string("an undefined tensor"));
  TPCHECK_CHECK_INPUT(!bias.defined() || (bias.rank() == 1 && bias.dim(0) == h.dim(-1)),
                      "{}: bias is {}, h {}; expected a bias of shape [{}] (h's last dimension)",
                      op, bias.defined() ? bias.describe() : std::string(), h.describe(),
                      h.dim(-1));
}

}  // namespace

Tensor Backend::bias_gelu_forward(const Tensor& h, const Tensor& bias) {
  check_bias_gelu_input("bias_gelu_forward", h, bias);
  const Tensor pre = bias_gelu_pre(*this, h, bias);
  return activation_forward(Activation::kGelu, pre).to(h.dtype());
}

Tensor Backend::bias_gelu_backward(const Tensor& da, const Tensor& h, const Tensor& bias,
                                   Tensor& dbias) {
  check_bias_gelu_input("bias_gelu_backward", h, bias);
  TPCHECK_CHECK_INPUT(da.defined() && da.shape() == h.shape(),
                      "bias_gelu_backward: da must have h's shape {}, got {}", shape_str(h.shape()),
                      da.defined() ? da.describe() : std::string("an undefined tensor"));
  const Tensor pre = bias_gelu_pre(*this, h, bias);
  const Tensor dpre = activation_backward(Activation::kGelu, da, pre);
  if (bias.defined()) accumulate_bias_grad(dpre, dbias);
  return dpre.to(da.dtype());
}

}  // namespace tpcheck

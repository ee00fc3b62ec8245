// bias_residual_add.cpp — Backend::bias_residual_add: the composition every backend
// inherits (TransformerLayer's residual join, the reference's fused bias_dropout_add with
// dropout 0). It defines the arithmetic a fusing backend must reproduce bit for bit:
//   y = round_T(round_R(round_R(out + bias) + residual))
// with R = f32 (f64 for f64 out) and T = out's dtype: out widened exactly (to(R)), the
// bias added by add_bias in R, the residual by accumulate in R (in f64 when the residual
// is f64, as accumulate adds), one rounding back to T.
// Thread safety: as any Backend op, one rank (thread) at a time.
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

Tensor Backend::bias_residual_add(const Tensor& out, const Tensor& bias, const Tensor& residual) {
  TPCHECK_CHECK_INPUT(out.defined() && out.rank() >= 1,
                      "bias_residual_add: out must be a tensor of rank >= 1, got {}",
                      out.defined() ? out.describe() : std::string("an undefined tensor"));
  TPCHECK_CHECK_INPUT(residual.defined() && residual.shape() == out.shape(),
                      "bias_residual_add: residual must have out's shape {}, got {}",
                      shape_str(out.shape()),
                      residual.defined() ? residual.describe() : std::string("an undefined tensor"));
  TPCHECK_CHECK_INPUT(!bias.defined() || (bias.rank() == 1 && bias.dim(0) == out.dim(-1)),
                      "bias_residual_add: bias is {}, out {}; expected a bias of shape [{}] "
                      "(out's last dimension)",
                      bias.defined() ? bias.describe() : std::string(), out.describe(), out.dim(-1));
  const DType wide = out.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor y = out.to(wide);  // a copy even when out is already wide: out is never modified
  if (bias.defined()) add_bias(y, bias);
  accumulate(y, residual);
  return y.to(out.dtype());
}

}  // namespace tpcheck

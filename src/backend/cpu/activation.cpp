// activation.cpp — CpuBackend::activation_forward / activation_backward: the MLP
// activations, elementwise (gelu, relu, srelu, qgelu) and gated (geglu, swiglu).
//
// Math in Real = f32 (f64 for f64 input); each result is rounded once to the input's
// dtype, where a GPU kernel would store it. Derivatives are the analytic ones, written
// out below next to the function they differentiate.
//
// Gated activations read x [.., 2n] as two halves [a | b] (a first, as TransformerEngine
// lays out fc1's output) and produce y [.., n] = act(a) · b.
// Thread safety: pure functions of their arguments (see cpu_backend.h).
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using cpu::gelu_tanh;
using cpu::ValueAndGrad;

// ---- scalar functions and their derivatives -----------------------------------------
// Each returns f(x) and f'(x) together: they share the one transcendental (tanh, exp),
// and gated backward needs both. Forward ignores the derivative (a few multiplies).


// Numerically safe logistic function: never evaluates exp of a large positive number.
template <typename Real>
Real sigmoid(Real x) {
  if (x >= 0) return Real(1) / (Real(1) + std::exp(-x));
  const Real e = std::exp(x);
  return e / (Real(1) + e);
}

// relu: f = max(x, 0); f' = 1 for x > 0, else 0 (0 at the kink, as PyTorch).
template <typename Real>
ValueAndGrad<Real> relu(Real x) {
  return x > 0 ? ValueAndGrad<Real>{x, Real(1)} : ValueAndGrad<Real>{Real(0), Real(0)};
}

// srelu (squared relu): f = relu(x)²; f' = 2 relu(x).
template <typename Real>
ValueAndGrad<Real> srelu(Real x) {
  const Real r = x > 0 ? x : Real(0);
  return {r * r, Real(2) * r};
}

// x·sigmoid(k x) (qgelu: k = 1.702; silu: k = 1): with s = sigmoid(k x),
// f = x s; f' = s + k x s (1 − s).
template <typename Real>
ValueAndGrad<Real> x_sigmoid(Real x, Real k) {
  const Real s = sigmoid(k * x);
  return {x * s, s + k * x * s * (Real(1) - s)};
}

// The elementwise function of `act`; for gated activations, the function applied to a.
template <typename Real>
ValueAndGrad<Real> evaluate(Activation act, Real x) {
  switch (act) {
    case Activation::kGelu:
      return gelu_tanh(x);
    case Activation::kRelu:
      return relu(x);
    case Activation::kSrelu:
      return srelu(x);
    case Activation::kQgelu:
      return x_sigmoid(x, Real(1.702));
    case Activation::kGeglu:
      return gelu_tanh(x);
    case Activation::kSwiglu:
      return x_sigmoid(x, Real(1));
  }
  TPCHECK_CHECK(false, "unknown activation {}", static_cast<int>(act));
  return {};
}

// ---- buffers ----------------------------------------------------------------------------
// The big MLP activations (tokens × ffn) are memory-bound: read a tensor in place when it
// already stores Real, and write results straight into the output when it stores Real.
// Other storage dtypes (f16, bf16, fp8) go through a converted copy.

template <typename Real>
constexpr DType real_dtype() {
  return sizeof(Real) == sizeof(double) ? DType::kF64 : DType::kF32;
}

// t's values as Real: t's own buffer, or a widened copy held in `copy`.
template <typename Real>
const Real* read_as(const Tensor& t, std::vector<Real>& copy) {
  if (t.dtype() == real_dtype<Real>()) return t.data<Real>();
  copy = cpu::load<Real>(t);
  return copy.data();
}

// A result tensor of `dtype`, written as Real through data() and rounded once by finish().
template <typename Real>
class Result {
 public:
  Result(Shape shape, DType dtype) : tensor_(std::move(shape), dtype) {
    if (dtype != real_dtype<Real>()) staging_.resize(static_cast<std::size_t>(tensor_.numel()));
  }
  Real* data() { return staging_.empty() ? tensor_.data<Real>() : staging_.data(); }
  Tensor finish() {
    if (!staging_.empty()) cpu::store(staging_, tensor_);
    return tensor_;
  }

 private:
  Tensor tensor_;
  std::vector<Real> staging_;
};

// ---- kernels ----------------------------------------------------------------------------

template <typename Real>
Tensor forward(Activation act, const Tensor& x, const Shape& out_shape) {
  std::vector<Real> x_copy;
  const Real* xv = read_as(x, x_copy);
  Result<Real> result(out_shape, x.dtype());
  Real* y = result.data();
  if (!is_gated(act)) {
    for (std::int64_t i = 0; i < x.numel(); ++i) y[i] = evaluate(act, xv[i]).value;
  } else {
    // Row r of x is [a_r | b_r], each of n values.
    const std::int64_t n = out_shape.back();
    const std::int64_t rows = n == 0 ? 0 : shape_numel(out_shape) / n;
    for (std::int64_t r = 0; r < rows; ++r) {
      const Real* a = xv + r * 2 * n;
      const Real* b = a + n;
      Real* yr = y + r * n;
      for (std::int64_t j = 0; j < n; ++j) yr[j] = evaluate(act, a[j]).value * b[j];
    }
  }
  return result.finish();
}

template <typename Real>
Tensor backward(Activation act, const Tensor& dy, const Tensor& x) {
  std::vector<Real> x_copy, dy_copy;
  const Real* xv = read_as(x, x_copy);
  const Real* g = read_as(dy, dy_copy);
  Result<Real> result(x.shape(), x.dtype());
  Real* dx = result.data();
  if (!is_gated(act)) {
    for (std::int64_t i = 0; i < x.numel(); ++i) dx[i] = g[i] * evaluate(act, xv[i]).grad;
  } else {
    // y = act(a) · b:  da = dy · act'(a) · b,  db = dy · act(a).
    const std::int64_t n = dy.shape().back();
    const std::int64_t rows = n == 0 ? 0 : dy.numel() / n;
    for (std::int64_t r = 0; r < rows; ++r) {
      const Real* a = xv + r * 2 * n;
      const Real* b = a + n;
      const Real* gr = g + r * n;
      Real* da = dx + r * 2 * n;
      Real* db = da + n;
      for (std::int64_t j = 0; j < n; ++j) {
        const ValueAndGrad<Real> f = evaluate(act, a[j]);
        da[j] = gr[j] * f.grad * b[j];
        db[j] = gr[j] * f.value;
      }
    }
  }
  return result.finish();
}

}  // namespace

Tensor CpuBackend::activation_forward(Activation act, const Tensor& x) {
  const Shape out_shape = activation_output_shape(act, x);
  return cpu::is_f64(x) ? forward<double>(act, x, out_shape) : forward<float>(act, x, out_shape);
}

Tensor CpuBackend::activation_backward(Activation act, const Tensor& dy, const Tensor& x) {
  const Shape out_shape = activation_output_shape(act, x);
  TPCHECK_CHECK_INPUT(dy.defined() && dy.shape() == out_shape,
                      "activation {} backward: dy must have the output's shape {} (input {}), "
                      "got {}",
                      activation_name(act), shape_str(out_shape), x.describe(),
                      dy.defined() ? dy.describe() : "an undefined tensor");
  return cpu::is_f64(x) ? backward<double>(act, dy, x) : backward<float>(act, dy, x);
}

}  // namespace tpcheck

// activation_math.cuh — the MLP activations' scalar functions on the device, f(x) and
// f'(x) together, twins of cpu_math.h / cpu/activation.cpp: activation.cu's kernels and
// bias_gelu.cu's fused ones evaluate the same expressions, so their results agree bit for
// bit (bias_gelu.cu promises the bits of the composition that uses activation.cu).
// Thread safety: pure device functions.
#pragma once

#include "tpcheck/backend.h"

namespace tpcheck::cuda {

template <typename Real>
struct ValueAndGrad {
  Real value;  // f(x)
  Real grad;   // f'(x)
};

__device__ __forceinline__ float real_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double real_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float real_exp(float x) { return expf(x); }
__device__ __forceinline__ double real_exp(double x) { return exp(x); }

// gelu, tanh form: f = ½ x (1 + t), t = tanh(u), u = c (x + 0.044715 x³), c = √(2/π);
// f' = ½ (1 + t) + ½ x (1 − t²) u',  u' = c (1 + 3·0.044715 x²).
template <typename Real>
__device__ __forceinline__ ValueAndGrad<Real> gelu_tanh(Real x) {
  const Real c = Real(0.79788456080286535588);  // √(2/π)
  const Real t = real_tanh(c * (x + Real(0.044715) * x * x * x));
  const Real du = c * (Real(1) + Real(3 * 0.044715) * x * x);
  return {Real(0.5) * x * (Real(1) + t),
          Real(0.5) * (Real(1) + t) + Real(0.5) * x * (Real(1) - t * t) * du};
}

// Numerically safe logistic function: never evaluates exp of a large positive number.
template <typename Real>
__device__ __forceinline__ Real sigmoid(Real x) {
  if (x >= 0) return Real(1) / (Real(1) + real_exp(-x));
  const Real e = real_exp(x);
  return e / (Real(1) + e);
}

// relu: f = max(x, 0); f' = 1 for x > 0, else 0 (0 at the kink, as PyTorch).
template <typename Real>
__device__ __forceinline__ ValueAndGrad<Real> relu(Real x) {
  return x > 0 ? ValueAndGrad<Real>{x, Real(1)} : ValueAndGrad<Real>{Real(0), Real(0)};
}

// srelu (squared relu): f = relu(x)²; f' = 2 relu(x).
template <typename Real>
__device__ __forceinline__ ValueAndGrad<Real> srelu(Real x) {
  const Real r = x > 0 ? x : Real(0);
  return {r * r, Real(2) * r};
}

// x·sigmoid(k x) (qgelu: k = 1.702; silu: k = 1): with s = sigmoid(k x),
// f = x s; f' = s + k x s (1 − s).
template <typename Real>
__device__ __forceinline__ ValueAndGrad<Real> x_sigmoid(Real x, Real k) {
  const Real s = sigmoid(k * x);
  return {x * s, s + k * x * s * (Real(1) - s)};
}

// The elementwise function of `A`; for gated activations, the function applied to a.
template <Activation A, typename Real>
__device__ __forceinline__ ValueAndGrad<Real> evaluate(Real x) {
  if constexpr (A == Activation::kGelu || A == Activation::kGeglu) {
    return gelu_tanh(x);
  } else if constexpr (A == Activation::kRelu) {
    return relu(x);
  } else if constexpr (A == Activation::kSrelu) {
    return srelu(x);
  } else if constexpr (A == Activation::kQgelu) {
    return x_sigmoid(x, Real(1.702));
  } else {
    static_assert(A == Activation::kSwiglu);
    return x_sigmoid(x, Real(1));
  }
}

}  // namespace tpcheck::cuda

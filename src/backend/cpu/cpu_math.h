// cpu_math.h — load a tensor into a plain f32/f64 buffer and store one back, for the
// CPU backend's op files.
//
// Ops compute in `Real` (float for storage dtypes f32/f16/bf16/fp8, double for f64) and
// round exactly once when they store: `store` writes each value rounded (nearest even)
// to the tensor's dtype. f32 → f16/bf16 via round_to; f64 values into a narrower dtype
// are rounded once from f64 (no double rounding through f32).
// Thread safety: pure functions of their arguments.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tpcheck/error.h"
#include "tpcheck/tensor.h"

namespace tpcheck::cpu {

// The values of `t` as Real (f64: exact; f32 from narrower dtypes: exact widening; f32
// from f64: rounded). REQUIRES: a CPU tensor.
template <typename Real>
std::vector<Real> load(const Tensor& t) {
  TPCHECK_CHECK(t.defined(), "cpu::load of an undefined tensor");
  TPCHECK_CHECK(t.device() == Device::kCpu, "the CPU backend was given {}", t.describe());
  if constexpr (sizeof(Real) == sizeof(double)) {
    return t.to_f64();
  } else {
    return t.to_f32();
  }
}

// Writes `values` into `t`'s buffer, each rounded once to t.dtype().
// REQUIRES: values.size() == t.numel().
template <typename Real>
void store(const std::vector<Real>& values, Tensor& t) {
  TPCHECK_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(),
                "cpu::store: {} values into {}", values.size(), t.describe());
  switch (t.dtype()) {
    case DType::kF64: {
      double* p = t.data<double>();
      for (std::size_t i = 0; i < values.size(); ++i) p[i] = static_cast<double>(values[i]);
      return;
    }
    case DType::kF32: {
      float* p = t.data<float>();
      for (std::size_t i = 0; i < values.size(); ++i) p[i] = static_cast<float>(values[i]);
      return;
    }
    case DType::kF16: {
      std::uint16_t* p = t.data<std::uint16_t>();
      for (std::size_t i = 0; i < values.size(); ++i) {
        if constexpr (sizeof(Real) == sizeof(double))
          p[i] = f64_to_f16_bits(values[i]);
        else
          p[i] = f32_to_f16_bits(values[i]);
      }
      return;
    }
    case DType::kBF16: {
      std::uint16_t* p = t.data<std::uint16_t>();
      for (std::size_t i = 0; i < values.size(); ++i) {
        if constexpr (sizeof(Real) == sizeof(double))
          p[i] = f64_to_bf16_bits(values[i]);
        else
          p[i] = f32_to_bf16_bits(values[i]);
      }
      return;
    }
    default:  // fp8: rare here; the slow, checked path
      for (std::size_t i = 0; i < values.size(); ++i) {
        t.set(static_cast<std::int64_t>(i), static_cast<double>(values[i]));
      }
      return;
  }
}

// A new tensor of `shape` and `dtype` holding `values` rounded once to `dtype`.
template <typename Real>
Tensor make(const std::vector<Real>& values, Shape shape, DType dtype) {
  Tensor t(std::move(shape), dtype);
  store(values, t);
  return t;
}

// f(x) and f'(x) together (they share the one transcendental).
template <typename Real>
struct ValueAndGrad {
  Real value;  // f(x)
  Real grad;   // f'(x)
};

// gelu, tanh form: f = ½ x (1 + t), t = tanh(u), u = c (x + 0.044715 x³), c = √(2/π);
// f' = ½ (1 + t) + ½ x (1 − t²) u',  u' = c (1 + 3·0.044715 x²).
template <typename Real>
ValueAndGrad<Real> gelu_tanh(Real x) {
  const Real c = Real(0.79788456080286535588);  // √(2/π)
  const Real t = std::tanh(c * (x + Real(0.044715) * x * x * x));
  const Real du = c * (Real(1) + Real(3 * 0.044715) * x * x);
  return {Real(0.5) * x * (Real(1) + t),
          Real(0.5) * (Real(1) + t) + Real(0.5) * x * (Real(1) - t * t) * du};
}

// True when math on a tensor of this dtype runs in f64 (truth runs).
inline bool is_f64(const Tensor& t) { return t.dtype() == DType::kF64; }

}  // namespace tpcheck::cpu

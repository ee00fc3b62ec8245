// tests/support/finite_diff.h — central finite differences in f64, for gradient tests.
//
// Usage: build f64 inputs with non-zero random values, define `loss()` that runs the
// forward pass and returns Σ w ⊙ output for a fixed random w (so dL/doutput = w), run
// the backward pass with dy = w, then compare each analytic gradient against
// `numeric_gradient(loss, input)` with `relative_error`.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "tpcheck/rng.h"
#include "tpcheck/tensor.h"

namespace tpcheck::testing {

// dloss/dx[i] ≈ (loss(x + h e_i) − loss(x − h e_i)) / 2h for every i, with h scaled by
// max(1, |x_i|). REQUIRES: x is f64; loss() reads x's buffer (x is modified and
// restored in place).
inline std::vector<double> numeric_gradient(const std::function<double()>& loss, Tensor& x,
                                            double h = 1e-6) {
  std::vector<double> grad(x.numel());
  double* p = x.data<double>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double saved = p[i];
    const double step = h * std::max(1.0, std::abs(saved));
    p[i] = saved + step;
    const double up = loss();
    p[i] = saved - step;
    const double down = loss();
    p[i] = saved;
    grad[i] = (up - down) / (2 * step);
  }
  return grad;
}

// Norm-wise relative error ‖a − b‖₂ / max(‖b‖₂, tiny).
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-300);
}

// ‖v‖₂ in f64.
inline double l2_norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// relative_error(analytic, numeric), refusing the case where it proves nothing: a
// gradient the test builds to be non-zero must have a non-zero numeric estimate, or a
// zero analytic gradient (a dropped accumulation, an unwired parameter) would match a
// zero numeric one and pass silently. Returns +inf when ‖numeric‖₂ ≤ min_norm.
inline double checked_gradient_error(const std::vector<double>& analytic,
                                     const std::vector<double>& numeric,
                                     double min_norm = 1e-8) {
  if (!(l2_norm(numeric) > min_norm)) return std::numeric_limits<double>::infinity();
  return relative_error(analytic, numeric);
}

// Σ w ⊙ t in f64.
inline double weighted_sum(const Tensor& t, const Tensor& w) {
  std::vector<double> a = t.to_f64(), b = w.to_f64();
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A random f64 tensor with entries N(0, std), bounded away from zero is not guaranteed
// but exact zeros have probability 0.
inline Tensor random_f64(const Shape& shape, std::string_view name, double std = 1.0,
                         std::uint64_t seed = 1234) {
  return generate(FillSpec::normal(0.0, std), seed, name, shape, DType::kF64);
}

}  // namespace tpcheck::testing

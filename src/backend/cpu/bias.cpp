// bias.cpp — bias add (forward) and bias gradient (backward) on the CPU.
//
// y[.., n] += bias[n]: math in f32 (f64 for f64 y), rounded once to y's dtype.
// dbias[n] += Σ_rows dy[.., n]: the column sums are formed in f32 (f64 for f64 dy), then
// added to dbias's stored value and rounded once to dbias's dtype.
// Thread safety: see cpu_backend.h.
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// Checks that `vec` is a [n] vector matching the last dimension of `mat`.
void check_bias_shape(std::string_view op, const Tensor& mat, const Tensor& vec) {
  TPCHECK_CHECK_INPUT(mat.defined() && vec.defined(), "{}: undefined tensor", op);
  TPCHECK_CHECK_INPUT(mat.rank() >= 1 && vec.rank() == 1 && vec.dim(0) == mat.dim(-1),
                      "{}: bias is {}, activations {}; expected a bias of shape [{}] (the last "
                      "dimension)",
                      op, vec.describe(), mat.describe(), mat.rank() >= 1 ? mat.dim(-1) : 0);
}

template <typename Real>
void add_bias_impl(Tensor& y, const Tensor& bias) {
  std::vector<Real> yv = cpu::load<Real>(y);
  const std::vector<Real> bv = cpu::load<Real>(bias);
  const std::size_t n = bv.size();
  for (std::size_t i = 0; i < yv.size(); ++i) yv[i] += bv[i % n];
  cpu::store(yv, y);
}

template <typename Real>
void bias_grad_impl(const Tensor& dy, Tensor& dbias) {
  const std::vector<Real> g = cpu::load<Real>(dy);
  const std::size_t n = static_cast<std::size_t>(dbias.numel());
  std::vector<Real> sum(n, Real(0));
  for (std::size_t i = 0; i < g.size(); ++i) sum[i % n] += g[i];
  if (dbias.dtype() == DType::kF64) {
    std::vector<double> acc = dbias.to_f64();
    for (std::size_t j = 0; j < n; ++j) acc[j] += static_cast<double>(sum[j]);
    cpu::store(acc, dbias);
  } else {
    std::vector<Real> acc = cpu::load<Real>(dbias);
    for (std::size_t j = 0; j < n; ++j) acc[j] += sum[j];
    cpu::store(acc, dbias);
  }
}

}  // namespace

void CpuBackend::add_bias(Tensor& y, const Tensor& bias) {
  check_bias_shape("add_bias", y, bias);
  if (cpu::is_f64(y)) {
    add_bias_impl<double>(y, bias);
  } else {
    add_bias_impl<float>(y, bias);
  }
}

void CpuBackend::accumulate_bias_grad(const Tensor& dy, Tensor& dbias) {
  check_bias_shape("accumulate_bias_grad", dy, dbias);
  if (dy.numel() == 0) return;
  if (cpu::is_f64(dy)) {
    bias_grad_impl<double>(dy, dbias);
  } else {
    bias_grad_impl<float>(dy, dbias);
  }
}

}  // namespace tpcheck

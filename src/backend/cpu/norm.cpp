// norm.cpp — LayerNorm and RMSNorm over the last dimension, forward and backward, on
// the CPU.
//
// x is viewed as [rows, n]. With s = gamma (or 1 + gamma when zero_centered_gamma):
//   LayerNorm: mean = Σx/n, var = Σ(x − mean)²/n, rstd = 1/√(var + eps),
//              x̂ = (x − mean)·rstd, y = x̂·s + beta
//   RMSNorm:   rstd = 1/√(Σx²/n + eps), x̂ = x·rstd, y = x̂·s
// Backward, with g = dy·s:
//   LayerNorm: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), dgamma += Σ_rows dy·x̂, dbeta += Σ_rows dy
//   RMSNorm:   dx = rstd·(g − x̂·mean(g·x̂)),           dgamma += Σ_rows dy·x̂
// Math in f32 (f64 for f64 x); y and dx rounded once to x's dtype; mean and rstd saved
// in the math type; dgamma/dbeta rounded once into their own dtype after adding.
// Thread safety: see cpu_backend.h.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

DType math_dtype(const Tensor& x) { return cpu::is_f64(x) ? DType::kF64 : DType::kF32; }

// The scale applied to x̂: gamma, or 1 + gamma.
template <typename Real>
std::vector<Real> scale_of(const Tensor& gamma, bool zero_centered_gamma) {
  std::vector<Real> s = cpu::load<Real>(gamma);
  if (zero_centered_gamma) {
    for (Real& v : s) v += Real(1);
  }
  return s;
}

// param += sum, rounded once into param's dtype (added in f64 if param is f64).
template <typename Real>
void accumulate_param(const std::vector<Real>& sum, Tensor& param) {
  if (param.dtype() == DType::kF64) {
    std::vector<double> acc = param.to_f64();
    for (std::size_t j = 0; j < acc.size(); ++j) acc[j] += static_cast<double>(sum[j]);
    cpu::store(acc, param);
  } else {
    std::vector<Real> acc = cpu::load<Real>(param);
    for (std::size_t j = 0; j < acc.size(); ++j) acc[j] += sum[j];
    cpu::store(acc, param);
  }
}

template <typename Real>
NormForward forward_impl(NormKind kind, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         double eps, bool zero_centered_gamma) {
  const std::int64_t n = x.dim(-1);
  const std::int64_t rows = x.numel() / n;
  const std::vector<Real> xv = cpu::load<Real>(x);
  const std::vector<Real> s = scale_of<Real>(gamma, zero_centered_gamma);
  std::vector<Real> bv;
  if (kind == NormKind::kLayerNorm) bv = cpu::load<Real>(beta);
  const Real eps_r = static_cast<Real>(eps);

  std::vector<Real> y(xv.size()), mean(rows, Real(0)), rstd(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const Real* xr = xv.data() + r * n;
    Real* yr = y.data() + r * n;
    if (kind == NormKind::kLayerNorm) {
      Real sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += xr[j];
      const Real mu = sum / static_cast<Real>(n);
      Real sq = 0;
      for (std::int64_t j = 0; j < n; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
      const Real rs = Real(1) / std::sqrt(sq / static_cast<Real>(n) + eps_r);
      for (std::int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rs * s[j] + bv[j];
      mean[r] = mu;
      rstd[r] = rs;
    } else {
      Real sq = 0;
      for (std::int64_t j = 0; j < n; ++j) sq += xr[j] * xr[j];
      const Real rs = Real(1) / std::sqrt(sq / static_cast<Real>(n) + eps_r);
      for (std::int64_t j = 0; j < n; ++j) yr[j] = xr[j] * rs * s[j];
      rstd[r] = rs;
    }
  }
  NormForward out;
  out.y = cpu::make(y, x.shape(), x.dtype());
  if (kind == NormKind::kLayerNorm) out.mean = cpu::make(mean, {rows}, math_dtype(x));
  out.rstd = cpu::make(rstd, {rows}, math_dtype(x));
  return out;
}

template <typename Real>
Tensor backward_impl(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                     const NormForward& saved, bool zero_centered_gamma, Tensor& dgamma,
                     Tensor& dbeta) {
  const std::int64_t n = x.dim(-1);
  const std::int64_t rows = x.numel() / n;
  const bool layer_norm = kind == NormKind::kLayerNorm;
  const std::vector<Real> xv = cpu::load<Real>(x);
  const std::vector<Real> dyv = cpu::load<Real>(dy);
  const std::vector<Real> s = scale_of<Real>(gamma, zero_centered_gamma);
  const std::vector<Real> rstd = cpu::load<Real>(saved.rstd);
  std::vector<Real> mean;
  if (layer_norm) mean = cpu::load<Real>(saved.mean);

  std::vector<Real> dx(xv.size()), dgamma_sum(n, Real(0)), dbeta_sum(n, Real(0));
  std::vector<Real> xhat(n), g(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    const Real* xr = xv.data() + r * n;
    const Real* dyr = dyv.data() + r * n;
    Real* dxr = dx.data() + r * n;
    const Real mu = layer_norm ? mean[r] : Real(0);
    const Real rs = rstd[r];
    Real g_sum = 0, gx_sum = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      xhat[j] = (xr[j] - mu) * rs;
      g[j] = dyr[j] * s[j];
      g_sum += g[j];
      gx_sum += g[j] * xhat[j];
      dgamma_sum[j] += dyr[j] * xhat[j];
      dbeta_sum[j] += dyr[j];
    }
    const Real g_mean = layer_norm ? g_sum / static_cast<Real>(n) : Real(0);
    const Real gx_mean = gx_sum / static_cast<Real>(n);
    for (std::int64_t j = 0; j < n; ++j) dxr[j] = rs * (g[j] - g_mean - xhat[j] * gx_mean);
  }
  accumulate_param(dgamma_sum, dgamma);
  if (layer_norm && dbeta.defined()) accumulate_param(dbeta_sum, dbeta);
  return cpu::make(dx, x.shape(), x.dtype());
}

}  // namespace

NormForward CpuBackend::norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma,
                                     const Tensor& beta, double eps, bool zero_centered_gamma) {
  check_norm_input(kind, x);
  check_norm_param(kind, "gamma", x, gamma);
  if (kind == NormKind::kLayerNorm) check_norm_param(kind, "beta", x, beta);
  TPCHECK_CHECK_INPUT(eps >= 0, "{}: eps = {}; expected eps >= 0", norm_kind_name(kind), eps);
  if (cpu::is_f64(x)) return forward_impl<double>(kind, x, gamma, beta, eps, zero_centered_gamma);
  return forward_impl<float>(kind, x, gamma, beta, eps, zero_centered_gamma);
}

Tensor CpuBackend::norm_backward(NormKind kind, const Tensor& dy, const Tensor& x,
                                 const Tensor& gamma, const NormForward& saved,
                                 bool zero_centered_gamma, Tensor& dgamma, Tensor& dbeta) {
  check_norm_input(kind, x);
  check_norm_param(kind, "gamma", x, gamma);
  check_norm_param(kind, "dgamma", x, dgamma);
  if (kind == NormKind::kLayerNorm && dbeta.defined()) check_norm_param(kind, "dbeta", x, dbeta);
  TPCHECK_CHECK_INPUT(dy.defined() && dy.shape() == x.shape(),
                      "{}: dy is {}, x is {}; expected the same shape", norm_kind_name(kind),
                      dy.defined() ? dy.describe() : "undefined", x.describe());
  const std::int64_t rows = x.numel() / x.dim(-1);
  TPCHECK_CHECK_INPUT(
      saved.rstd.defined() && saved.rstd.numel() == rows &&
          (kind == NormKind::kRMSNorm || (saved.mean.defined() && saved.mean.numel() == rows)),
      "{}: saved statistics do not match input {} ({} rows); expected the "
      "NormForward of this input",
      norm_kind_name(kind), x.describe(), rows);
  if (cpu::is_f64(x)) {
    return backward_impl<double>(kind, dy, x, gamma, saved, zero_centered_gamma, dgamma, dbeta);
  }
  return backward_impl<float>(kind, dy, x, gamma, saved, zero_centered_gamma, dgamma, dbeta);
}

}  // namespace tpcheck

// elementwise.cpp — residual add, accumulation, scaling and the MSE loss on the CPU.
//
// Math in f32 (f64 when an input is f64), one rounding to the output dtype. The loss
// itself is always reduced in f64: it is a scalar the tests and reports read, not a
// tensor a GPU would store.
// Thread safety: see cpu_backend.h.
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

void check_same_shape(std::string_view op, const Tensor& a, const Tensor& b) {
  TPCHECK_CHECK_INPUT(a.defined() && b.defined(), "{}: undefined tensor", op);
  TPCHECK_CHECK_INPUT(a.shape() == b.shape(), "{}: shapes differ: {} and {}; expected equal shapes",
                      op, a.describe(), b.describe());
}

template <typename Real>
void add_into(std::vector<Real>& acc, const Tensor& x) {
  const std::vector<Real> xv = cpu::load<Real>(x);
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += xv[i];
}

}  // namespace

Tensor CpuBackend::add(const Tensor& a, const Tensor& b) {
  check_same_shape("add", a, b);
  Tensor out(a.shape(), a.dtype());
  if (cpu::is_f64(a) || cpu::is_f64(b)) {
    std::vector<double> acc = cpu::load<double>(a);
    add_into(acc, b);
    cpu::store(acc, out);
  } else {
    std::vector<float> acc = cpu::load<float>(a);
    add_into(acc, b);
    cpu::store(acc, out);
  }
  return out;
}

void CpuBackend::accumulate(Tensor& into, const Tensor& x) {
  check_same_shape("accumulate", into, x);
  if (cpu::is_f64(into) || cpu::is_f64(x)) {
    std::vector<double> acc = cpu::load<double>(into);
    add_into(acc, x);
    cpu::store(acc, into);
  } else {
    std::vector<float> acc = cpu::load<float>(into);
    add_into(acc, x);
    cpu::store(acc, into);
  }
}

Tensor CpuBackend::scale(const Tensor& x, double s) {
  TPCHECK_CHECK_INPUT(x.defined(), "scale: undefined tensor");
  Tensor out(x.shape(), x.dtype());
  if (cpu::is_f64(x)) {
    std::vector<double> v = cpu::load<double>(x);
    for (double& e : v) e *= s;
    cpu::store(v, out);
  } else {
    std::vector<float> v = cpu::load<float>(x);
    const float sf = static_cast<float>(s);
    for (float& e : v) e *= sf;
    cpu::store(v, out);
  }
  return out;
}

double CpuBackend::mse_loss(const Tensor& y, const Tensor& target) {
  check_same_shape("mse_loss", y, target);
  TPCHECK_CHECK_INPUT(y.numel() > 0, "mse_loss: empty tensor {}; expected at least one element",
                      y.describe());
  const std::vector<double> yv = y.to_f64(), tv = target.to_f64();
  double sum = 0;
  for (std::size_t i = 0; i < yv.size(); ++i) sum += (yv[i] - tv[i]) * (yv[i] - tv[i]);
  return sum / static_cast<double>(yv.size());
}

Tensor CpuBackend::mse_loss_backward(const Tensor& y, const Tensor& target) {
  check_same_shape("mse_loss_backward", y, target);
  TPCHECK_CHECK_INPUT(y.numel() > 0,
                      "mse_loss_backward: empty tensor {}; expected at least one element",
                      y.describe());
  Tensor dy(y.shape(), y.dtype());
  if (cpu::is_f64(y)) {
    std::vector<double> g = cpu::load<double>(y);
    const std::vector<double> t = cpu::load<double>(target);
    const double factor = 2.0 / static_cast<double>(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = factor * (g[i] - t[i]);
    cpu::store(g, dy);
  } else {
    std::vector<float> g = cpu::load<float>(y);
    const std::vector<float> t = cpu::load<float>(target);
    const float factor = 2.0f / static_cast<float>(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = factor * (g[i] - t[i]);
    cpu::store(g, dy);
  }
  return dy;
}

}  // namespace tpcheck

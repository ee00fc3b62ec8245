// activation.cpp — placeholder until the activation implementation lands (owned by
// another engineer; this file will be overwritten).
#include "backend/cpu/cpu_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

Tensor CpuBackend::activation_forward(Activation act, const Tensor& x) {
  TPCHECK_CHECK(false, "not implemented yet");
  return {};
}

Tensor CpuBackend::activation_backward(Activation act, const Tensor& dy, const Tensor& x) {
  TPCHECK_CHECK(false, "not implemented yet");
  return {};
}

}  // namespace tpcheck

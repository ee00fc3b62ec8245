// attention.cpp — placeholder until the attention implementation lands (owned by
// another engineer; this file will be overwritten).
#include "backend/cpu/cpu_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

AttentionForward CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const AttentionMask& mask, double scale) {
  TPCHECK_CHECK(false, "not implemented yet");
  return {};
}

AttentionGrads CpuBackend::attention_backward(const Tensor& dout, const Tensor& q,
                                              const Tensor& k, const Tensor& v,
                                              const AttentionForward& saved,
                                              const AttentionMask& mask, double scale) {
  TPCHECK_CHECK(false, "not implemented yet");
  return {};
}

}  // namespace tpcheck

// attention.cu — CudaBackend::attention_forward / attention_backward.
// (Being written: every entry point below throws until its kernels land.)
#include "backend/cuda/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

AttentionForward CudaBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const AttentionMask& mask, double scale) {
  TPCHECK_CHECK(false, "CUDA op not implemented yet");
}
AttentionGrads CudaBackend::attention_backward(const Tensor& dout, const Tensor& q,
                                               const Tensor& k, const Tensor& v,
                                               const AttentionForward& saved,
                                               const AttentionMask& mask, double scale) {
  TPCHECK_CHECK(false, "CUDA op not implemented yet");
}

}  // namespace tpcheck

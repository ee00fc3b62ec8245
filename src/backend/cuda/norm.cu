// norm.cu — CudaBackend::norm_forward / norm_backward (LayerNorm, RMSNorm).
// (Being written: every entry point below throws until its kernels land.)
#include "backend/cuda/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

NormForward CudaBackend::norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma,
                                      const Tensor& beta, double eps, bool zero_centered_gamma) {
  TPCHECK_CHECK(false, "CUDA op not implemented yet");
}
Tensor CudaBackend::norm_backward(NormKind kind, const Tensor& dy, const Tensor& x,
                                  const Tensor& gamma, const NormForward& saved,
                                  bool zero_centered_gamma, Tensor& dgamma, Tensor& dbeta) {
  TPCHECK_CHECK(false, "CUDA op not implemented yet");
}

}  // namespace tpcheck

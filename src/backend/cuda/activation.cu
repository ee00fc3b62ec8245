// activation.cu — CudaBackend::activation_forward / activation_backward.
// (Being written: every entry point below throws until its kernels land.)
#include "backend/cuda/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

Tensor CudaBackend::activation_forward(Activation act, const Tensor& x) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }
Tensor CudaBackend::activation_backward(Activation act, const Tensor& dy, const Tensor& x) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }

}  // namespace tpcheck

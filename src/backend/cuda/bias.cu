// bias.cu — CudaBackend::add_bias / accumulate_bias_grad.
// (Being written: every entry point below throws until its kernels land.)
#include "backend/cuda/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

void CudaBackend::add_bias(Tensor& y, const Tensor& bias) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }
void CudaBackend::accumulate_bias_grad(const Tensor& dy, Tensor& dbias) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }

}  // namespace tpcheck

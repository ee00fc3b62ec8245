// elementwise.cu — CudaBackend::add / accumulate / scale / mse_loss.
// (Being written: every entry point below throws until its kernels land.)
#include "backend/cuda/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

Tensor CudaBackend::add(const Tensor& a, const Tensor& b) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }
void CudaBackend::accumulate(Tensor& into, const Tensor& x) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }
Tensor CudaBackend::scale(const Tensor& x, double s) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }
double CudaBackend::mse_loss(const Tensor& y, const Tensor& target) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }
Tensor CudaBackend::mse_loss_backward(const Tensor& y, const Tensor& target) { TPCHECK_CHECK(false, "CUDA op not implemented yet"); }

}  // namespace tpcheck

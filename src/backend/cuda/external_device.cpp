// external_device.cpp — use_external_cuda_device / restore_cuda_device
// (tpcheck/cuda_backend.h): device memory that DLPack producers (PyTorch, JAX, CuPy) own,
// read in place by tpcheck on the stream the producer made it ready for.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
void register_cuda_compare();  // compare_stats.cu
}  // namespace cuda

int use_external_cuda_device(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  TPCHECK_CHECK_INPUT(device >= 0 && device < count,
                      "a CUDA tensor on device {} was given, but {} GPU(s) are visible", device,
                      count);
  int previous = 0;
  TPCHECK_CUDA_CHECK(cudaGetDevice(&previous));
  cuda::install_cuda_runtime();
  cuda::register_cuda_compare();
  // The legacy default stream: DLPack's contract when the consumer names no stream, and
  // PyTorch's default stream; it orders after the work of every blocking stream.
  cuda::set_current_stream(device, nullptr);
  return previous;
}

void restore_cuda_device(int device) { TPCHECK_CUDA_CHECK(cudaSetDevice(device)); }

}  // namespace tpcheck

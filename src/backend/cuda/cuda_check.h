// cuda_check.h — every CUDA, cuBLASLt and kernel-launch call checked, with file:line.
//
// A failure throws tpcheck's Error(kRuntime) naming the call, the library's error name
// and text; out of device memory says how much was asked and what to do.
// Thread safety: macros over thread-safe calls.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "tpcheck/error.h"

namespace tpcheck::cuda {

[[noreturn]] void fail_cuda(cudaError_t status, const char* call, const char* file, int line);
// "CUBLAS_STATUS_NOT_SUPPORTED" (cuBLASLt alone has no name function; libcublas does).
const char* cublas_status_name(cublasStatus_t status);
[[noreturn]] void fail_cublas(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace tpcheck::cuda

#define TPCHECK_CUDA_CHECK(call)                                                  \
  do {                                                                            \
    const cudaError_t tpcheck_status_ = (call);                                   \
    if (tpcheck_status_ != cudaSuccess)                                           \
      ::tpcheck::cuda::fail_cuda(tpcheck_status_, #call, __FILE__, __LINE__);     \
  } while (0)

#define TPCHECK_CUBLAS_CHECK(call)                                                \
  do {                                                                            \
    const cublasStatus_t tpcheck_status_ = (call);                                \
    if (tpcheck_status_ != CUBLAS_STATUS_SUCCESS)                                 \
      ::tpcheck::cuda::fail_cublas(tpcheck_status_, #call, __FILE__, __LINE__);   \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, at the launch.
#define TPCHECK_LAUNCH_CHECK() TPCHECK_CUDA_CHECK(cudaGetLastError())

// cuda_libraries.h — cuBLASLt and NCCL: linked, or loaded from the machine at first use.
//
// The development build links both (CUDA::cublasLt, libnccl). A pip-built wheel
// (TPCHECK_CUDA_DLOPEN, on under scikit-build-core) links neither: cuda_libraries.cpp then
// defines every cuBLASLt and NCCL function tpcheck calls as a forwarder that loads the
// library on its first call (dlopen) and calls the real function, so the wheel imports on a
// machine without them and the CPU side works there. Where each is looked for, in order:
//   1. the file named by TPCHECK_CUBLASLT_LIBRARY / TPCHECK_NCCL_LIBRARY (only that one);
//   2. the plain soname (libcublasLt.so.13, libnccl.so.2): a copy already loaded (PyTorch's,
//      after `import torch`), LD_LIBRARY_PATH, the ldconfig cache;
//   3. pip's NVIDIA packages beside the installed module (site-packages/nvidia/cu13/lib,
//      nvidia/cublas/lib, nvidia/nccl/lib), which PyTorch's CUDA wheels install;
//   4. $CUDA_HOME/lib64, $CUDA_HOME/lib, /usr/local/cuda/lib64, /usr/local/cuda/lib.
// When none loads, the first call of the library throws Error(kInput) naming the library,
// the places tried and the two ways to fix it (LD_LIBRARY_PATH, the variable above).
// Thread safety: each library is loaded once (std::call_once); the functions are safe to
// call from any thread.
#pragma once

#include <string>

namespace tpcheck::cuda {

// "" when cuBLASLt can be called (linked, or loaded now); else why not and how to fix it.
// Never throws; loads the library if it was not loaded yet.
std::string cublaslt_unavailable();
std::string nccl_unavailable();

// Throw Error(kInput) with that message when the library cannot be loaded; no-ops in a
// build that links them. Called where a CUDA feature starts (the CUDA backend, an NCCL
// communicator) so the message comes before any other work.
void require_cublaslt();
void require_nccl();

// Where the library was loaded from ("linked" in a build that links it; "" when not loaded).
std::string cublaslt_location();
std::string nccl_location();

}  // namespace tpcheck::cuda

// cpu_backend.cpp — the factory for the reference CPU backend. The ops themselves live
// in one file per op (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <memory>

namespace tpcheck {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

void set_cpu_gemm_threads(int threads) { openblas_set_num_threads(threads); }
int cpu_gemm_threads() { return openblas_get_num_threads(); }
std::string cpu_gemm_library() { return openblas_get_config(); }

}  // namespace tpcheck

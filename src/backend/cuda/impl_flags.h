// impl_flags.h — CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS in words, shared by the GEMM engine
// (gemm.cu) and the log query (cublaslt_query.cu).
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <string>

namespace tpcheck::cuda {

// "HMMA, input TF32, accumulator 32F" (", gaussian (3M)" when set).
std::string decode_impl_flags(std::uint64_t flags);

}  // namespace tpcheck::cuda

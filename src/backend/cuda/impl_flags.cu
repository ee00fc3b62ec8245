// decode_impl_flags: the numerical implementation flags of a cuBLASLt algorithm in words.
#include <cublasLt.h>

#include "backend/cuda/impl_flags.h"
#include "tpcheck/error.h"

namespace tpcheck::cuda {

std::string decode_impl_flags(std::uint64_t f) {
  std::string op = (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA)    ? "FMA"
                   : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA) ? "HMMA"
                   : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_IMMA) ? "IMMA"
                   : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_DMMA) ? "DMMA"
                                                              : "op?";
  const char* input = (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F)       ? "16F"
                      : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF)    ? "16BF"
                      : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32)    ? "TF32"
                      : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F)     ? "32F"
                      : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_64F)     ? "64F"
                      : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E4M3) ? "8F_E4M3"
                      : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E5M2) ? "8F_E5M2"
                      : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8I)      ? "8I"
                                                                          : "?";
  const char* acc = (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_16F)   ? "16F"
                    : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F) ? "32F"
                    : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_64F) ? "64F"
                    : (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32I) ? "32I"
                                                                          : "?";
  std::string words = TPCHECK_FORMAT("{}, input {}, accumulator {}", op, input, acc);
  if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_GAUSSIAN) words += ", gaussian (3M)";
  return words;
}

}  // namespace tpcheck::cuda

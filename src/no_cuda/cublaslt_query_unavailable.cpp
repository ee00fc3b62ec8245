// query_numerical_impls for builds without CUDA: a clear error (the CUDA build provides
// the real one, src/forensics/cuda/cublaslt_query.cu).
#include "tpcheck/cublaslt_log.h"
#include "tpcheck/error.h"

namespace tpcheck {

bool cublaslt_query_available() { return false; }

void query_numerical_impls(std::vector<CublasLtCall>&) {
  throw Error(ErrorKind::kInput,
              "--query needs tpcheck built with CUDA (this build has TPCHECK_CUDA=OFF) and a GPU: "
              "the numerical implementation of an algorithm is cuBLASLt's answer on the machine "
              "that wrote the log");
}

}  // namespace tpcheck

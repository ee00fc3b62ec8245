// query_numerical_impls: what a logged cuBLASLt algorithm computes, asked of cuBLASLt.
//
// A log names the algorithm (id, tile, stages, split-K, ...) but not its numerical
// implementation. cublasLtMatmulAlgoInit rebuilds the algorithm for the call's types,
// the configuration attributes set its tile, stages, split-K, reduction scheme, swizzle,
// custom option and cluster shape, and CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS says which
// instruction it uses (FMA / HMMA / ...), how it rounds the inputs (32F / TF32 / 16BF ...)
// and what it accumulates in. The answer is for this GPU and this cuBLASLt: query on the
// machine (and library version) that wrote the log.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <string_view>

#include "backend/cuda/cublaslt_names.h"
#include "backend/cuda/impl_flags.h"
#include "tpcheck/cublaslt_log.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

bool data_type_of(std::string_view name, cudaDataType_t& out) {
  static const std::map<std::string_view, cudaDataType_t> kTypes = {
      {"64F", CUDA_R_64F},         {"32F", CUDA_R_32F},         {"16F", CUDA_R_16F},
      {"16BF", CUDA_R_16BF},       {"8I", CUDA_R_8I},           {"32I", CUDA_R_32I},
      {"8F_E4M3", CUDA_R_8F_E4M3}, {"8F_E5M2", CUDA_R_8F_E5M2}, {"4F_E2M1", CUDA_R_4F_E2M1},
  };
  auto it = kTypes.find(name);
  if (it == kTypes.end()) return false;
  out = it->second;
  return true;
}

bool compute_type_of(std::string_view name, cublasComputeType_t& out) {
  static const std::map<std::string_view, cublasComputeType_t> kCompute = {
      {"16F", CUBLAS_COMPUTE_16F},
      {"16F_PEDANTIC", CUBLAS_COMPUTE_16F_PEDANTIC},
      {"32F", CUBLAS_COMPUTE_32F},
      {"32F_PEDANTIC", CUBLAS_COMPUTE_32F_PEDANTIC},
      {"32F_FAST_16F", CUBLAS_COMPUTE_32F_FAST_16F},
      {"32F_FAST_16BF", CUBLAS_COMPUTE_32F_FAST_16BF},
      {"32F_FAST_TF32", CUBLAS_COMPUTE_32F_FAST_TF32},
      {"64F", CUBLAS_COMPUTE_64F},
      {"64F_PEDANTIC", CUBLAS_COMPUTE_64F_PEDANTIC},
      {"32I", CUBLAS_COMPUTE_32I},
      {"32I_PEDANTIC", CUBLAS_COMPUTE_32I_PEDANTIC},
  };
  auto it = kCompute.find(name);
  if (it == kCompute.end()) return false;
  out = it->second;
  return true;
}

// The class the flags say ran. 16-bit inputs take the class of the operand type (an
// H200 bf16 algorithm was seen reporting INPUT_16F; see gemm.cu).
std::string class_of(std::uint64_t f, const std::string& a_type) {
  if (a_type == "16BF") return "bf16";
  if (a_type == "16F") return "fp16";
  if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_64F) return "fp64";
  if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32) return "tf32";
  if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F) return "fp32";
  if (f & (CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E4M3 | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E5M2)) {
    return "fp8";
  }
  return "";
}

struct Answer {
  bool ok = false;
  std::uint64_t flags = 0;
  std::string words;  // decoded flags, or why there is no answer
};

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

Answer query_one(cublasLtHandle_t lt, const CublasLtCall& c) {
  Answer answer;
  cublasComputeType_t compute;
  cudaDataType_t scale, ta, tb, tc, td;
  if (!compute_type_of(c.compute_type, compute)) {
    answer.words = TPCHECK_FORMAT("not queried: compute type '{}' unknown here", c.compute_type);
    return answer;
  }
  const std::string scale_name = c.scale_type.empty() ? std::string("32F") : c.scale_type;
  if (!data_type_of(scale_name, scale) || !data_type_of(c.a.type, ta) ||
      !data_type_of(c.b.type, tb) || !data_type_of(c.c.type, tc) || !data_type_of(c.d.type, td)) {
    answer.words = TPCHECK_FORMAT("not queried: a type of {}/{}/{}/{} (scale {}) unknown here",
                                  c.a.type, c.b.type, c.c.type, c.d.type, scale_name);
    return answer;
  }
  int tile = 0, stages = 0, reduction = 0, cluster = 0;
  if (!cuda::value_of(cuda::kTileNames, c.tile, tile) ||
      !cuda::value_of(cuda::kStagesNames, c.stages, stages) ||
      !cuda::value_of(cuda::kReductionSchemeNames, c.reduction_scheme, reduction) ||
      !cuda::value_of(cuda::kClusterShapeNames, c.cluster_shape, cluster)) {
    answer.words = TPCHECK_FORMAT(
        "not queried: tile {} / stages {} / reduction {} / cluster {}: a name this build's "
        "cublasLt.h does not have", c.tile, c.stages, c.reduction_scheme, c.cluster_shape);
    return answer;
  }
  cublasLtMatmulAlgo_t algo{};
  cublasStatus_t s = cublasLtMatmulAlgoInit(lt, compute, scale, ta, tb, tc, td, c.algo_id, &algo);
  if (s != CUBLAS_STATUS_SUCCESS) {
    answer.words = TPCHECK_FORMAT("not queried: cublasLtMatmulAlgoInit(algoId={}) failed: {}",
                                  c.algo_id, status_name(s));
    return answer;
  }
  const std::uint32_t tile32 = tile, stages32 = stages, reduction32 = reduction;
  const std::uint32_t swizzle32 = c.cta_swizzling, custom32 = c.custom_option;
  const std::int32_t split = c.split_k;
  const std::uint16_t cluster16 = static_cast<std::uint16_t>(cluster);
  auto set = [&](cublasLtMatmulAlgoConfigAttributes_t attr, const auto& v, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) return;
    s = cublasLtMatmulAlgoConfigSetAttribute(&algo, attr, &v, sizeof(v));
    if (s != CUBLAS_STATUS_SUCCESS) {
      answer.words = TPCHECK_FORMAT("not queried: setting {} failed: {}", what, status_name(s));
    }
  };
  set(CUBLASLT_ALGO_CONFIG_TILE_ID, tile32, "tile");
  set(CUBLASLT_ALGO_CONFIG_STAGES_ID, stages32, "stages");
  set(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, split, "split-K");
  set(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, reduction32, "reduction scheme");
  set(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swizzle32, "swizzle");
  set(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom32, "custom option");
  set(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster16, "cluster shape");
  if (s != CUBLAS_STATUS_SUCCESS) return answer;
  std::uint64_t flags = 0;
  std::size_t written = 0;
  s = cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, &flags,
                                        sizeof(flags), &written);
  if (s != CUBLAS_STATUS_SUCCESS) {
    answer.words = TPCHECK_FORMAT("not queried: NUMERICAL_IMPL_FLAGS failed: {}", status_name(s));
    return answer;
  }
  answer.ok = true;
  answer.flags = flags;
  answer.words = cuda::decode_impl_flags(flags);
  return answer;
}

}  // namespace

bool cublaslt_query_available() { return true; }

void query_numerical_impls(std::vector<CublasLtCall>& calls) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    throw Error(ErrorKind::kRuntime,
                TPCHECK_FORMAT("--query asks cuBLASLt on a GPU, and there is none here ({}); run "
                               "it on the machine that wrote the log",
                               status != cudaSuccess ? cudaGetErrorString(status) : "0 devices"));
  }
  cublasLtHandle_t lt = nullptr;
  const cublasStatus_t created = cublasLtCreate(&lt);
  if (created != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::kRuntime,
                TPCHECK_FORMAT("--query: cublasLtCreate failed: {}", status_name(created)));
  }
  std::map<std::string, Answer> cache;  // one query per distinct algorithm and types
  for (CublasLtCall& c : calls) {
    const std::string key = TPCHECK_FORMAT("{}|{}|{}|{}|{}|{}|{}", c.compute_type, c.scale_type,
                                           c.a.type, c.b.type, c.c.type, c.d.type,
                                           c.algorithm_text());
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, query_one(lt, c)).first;
    const Answer& a = it->second;
    c.numerical_impl = a.words;
    if (a.ok) {
      c.numerical_impl_flags = a.flags;
      c.math_class = class_of(a.flags, c.a.type);
    }
  }
  cublasLtDestroy(lt);
}

}  // namespace tpcheck

// gemm.cu — CudaBackend::run_gemm: the cuBLASLt engine behind Backend::gemm (which has
// already validated, chosen the math class and canonicalized to column-major).
//
// As the reference library calls cuBLASLt:
//   * types: A/B/C/D in the storage dtypes (f64 64F, f32 32F, f16 16F, bf16 16BF); an
//     f32 operand next to a 16-bit one is cast to the 16-bit type first (cuBLASLt takes
//     one input type; the CPU class rule rounds it there too);
//   * compute: f64 → CUBLAS_COMPUTE_64F; f32 → CUBLAS_COMPUTE_32F_FAST_TF32 when the
//     class asked for is tf32 (`--tf32 on`, the default), CUBLAS_COMPUTE_32F when fp32;
//     f16/bf16 → CUBLAS_COMPUTE_32F (fp32 accumulation); scale type 32F (64F for f64);
//   * epilogues: BIAS, GELU_AUX(_BIAS) (aux = the pre-activation, in D's type), DGELU;
//     beta = 1 with C = D when accumulating;
//   * a 32 MiB workspace, minimum-alignment preferences from the pointers (the largest
//     power of two ≤ 256 dividing each address), CUBLASLT_MATMUL_PREF_IMPL_MASK from
//     `--gemm-impl`, and the heuristic's first result.
// Each call fills the record's cuBLASLt part: the algorithm's configuration (id, tile,
// stages, split-K, reduction scheme, swizzle, custom option, cluster shape), workspace,
// alignments and its numerical implementation flags decoded into words; the record's math
// class becomes the class those flags say ran (an f32 GEMM with TF32 allowed may still run
// a full-FP32 FMA kernel: the effect tpcheck exists for).
// f64 with gelu or dgelu: cuBLASLt's f64 GELU epilogue was measured 2e-11 (gelu) to 3e-10
// (dgelu) relative from the exact tanh form on an H200 (2026-11-30): too coarse for the
// truth run, so f64 applies gelu / dgelu in its own f64 kernel after the GEMM (with the
// bias still in cuBLASLt's epilogue): the same math, computed exactly.
// Pinning (GemmProblem::pin, set only by explain's counterfactual re-runs): the pinned
// record's compute type and implementation kind (FMA or tensor core) replace the run's,
// and its algorithm (id, tile, stages, split-K, reduction, swizzle, custom option,
// cluster) is re-created with cublasLtMatmulAlgoInit and used when
// cublasLtMatmulAlgoCheck accepts it for this shape; otherwise the heuristic's first
// algorithm under that compute type and mask runs, and the record says so.
// Heuristic results are cached per problem description (the heuristic is a pure function
// of it), so repeated shapes cost one query.
#include <cublasLt.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "backend/cuda/cublaslt_names.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/impl_flags.h"
#include "backend/decoded_gemm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF64: return CUDA_R_64F;
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: break;
  }
  TPCHECK_CHECK_INPUT(false, "cuBLASLt GEMM: dtype {} is not supported here (expected f64, f32, "
                      "f16 or bf16; fp8 GEMMs belong to the quantized recipes)", dtype_name(t));
  return CUDA_R_32F;
}

const char* compute_type_name(cublasComputeType_t c) {
  switch (c) {
    case CUBLAS_COMPUTE_64F: return "64F";
    case CUBLAS_COMPUTE_32F: return "32F";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "32F_FAST_TF32";
    case CUBLAS_COMPUTE_32F_FAST_16F: return "32F_FAST_16F";
    case CUBLAS_COMPUTE_32F_FAST_16BF: return "32F_FAST_16BF";
    default: return "other";
  }
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "other";
  }
}

// The largest power of two ≤ 256 that divides the address (what cuBLASLt may assume).
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

std::uint64_t impl_mask_bits(GemmImplMask m) {
  switch (m) {
    case GemmImplMask::kAny: return ~std::uint64_t{0};
    case GemmImplMask::kTensorCore:
      // Every tensor-core op type, with any accumulator and input.
      return ~std::uint64_t{0} & ~std::uint64_t{CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA};
    case GemmImplMask::kFma:
      return ~std::uint64_t{CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK};
  }
  return ~std::uint64_t{0};
}

// The class the algorithm's flags say ran. The flags do not reliably tell bf16 from f16
// (an H200 bf16 algorithm was seen reporting INPUT_16F), so 16-bit inputs take the
// class of the operand dtype.
MathClass class_from_flags(std::uint64_t f, MathClass asked) {
  if (asked == MathClass::kBf16 || asked == MathClass::kFp16) return asked;
  if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_64F) return MathClass::kFp64;
  if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32) return MathClass::kTf32;
  if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F) return MathClass::kFp32;
  return asked;
}

// RAII for the cuBLASLt descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t x = nullptr, y = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (y) cublasLtMatrixLayoutDestroy(y);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename T>
void set_op(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  TPCHECK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

void make_layout(cublasLtMatrixLayout_t* out, cudaDataType_t type, std::int64_t rows,
                 std::int64_t cols, std::int64_t ld, std::int64_t batch, std::int64_t stride) {
  TPCHECK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(out, type, static_cast<std::uint64_t>(rows),
                                                  static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    const std::int32_t count = static_cast<std::int32_t>(batch);
    TPCHECK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TPCHECK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
}

// The heuristic's preference: workspace limit, minimum alignments (C = D) and impl mask.
void make_preference(cublasLtMatmulPreference_t* pref, std::uint64_t workspace_limit,
                     std::uint32_t align_a, std::uint32_t align_b, std::uint32_t align_d,
                     std::uint64_t impl_mask) {
  TPCHECK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(pref));
  auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& v) {
    TPCHECK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(*pref, attr, &v, sizeof(v)));
  };
  set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_limit);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  set(CUBLASLT_MATMUL_PREF_IMPL_MASK, impl_mask);
}

template <typename T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  TPCHECK_CUBLAS_CHECK(
      cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written));
  return value;
}

// gelu (tanh form) and its derivative in f64, as the CPU's cpu::gelu_tanh.
__device__ void gelu_tanh_f64(double x, double* value, double* grad) {
  const double c = 0.79788456080286535588;  // sqrt(2/pi)
  const double t = tanh(c * (x + 0.044715 * x * x * x));
  const double du = c * (1.0 + 3 * 0.044715 * x * x);
  *value = 0.5 * x * (1.0 + t);
  *grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

// d holds P (+ bias). kGelu: aux = d, d = gelu(d). kDgelu: d = d · gelu'(aux).
__global__ void gelu_epilogue_f64(double* d, double* aux, long long n, bool backward) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    double value, grad;
    if (backward) {
      gelu_tanh_f64(aux[i], &value, &grad);
      d[i] *= grad;
    } else {
      aux[i] = d[i];
      gelu_tanh_f64(d[i], &value, &grad);
      d[i] = value;
    }
  }
}

}  // namespace

// Friend of CudaBackend: the engine's steps, with access to the handle and the cache.
struct CudaGemmEngine {
  // One cuBLASLt matmul as both engines set it up (CudaGemmEngine::run for the unquantized
  // GEMMs, CudaQuantizedGemmEngine::run_cublaslt_fp8 for FP8): its descriptors and the
  // heuristic preference's inputs, which the algorithm choice and the record both read.
  // x, y, d are cuBLASLt's A, B and D (C = D); in the column-major form cuBLASLt's A is the
  // caller's B.
  struct LtMatmul {
    Descriptors desc;
    std::uint32_t align_x = 0, align_y = 0, align_d = 0;
    std::uint64_t workspace_limit = 0;
    GemmImplMask mask_kind = GemmImplMask::kAny;
    std::uint64_t mask = 0;  // impl_mask_bits(mask_kind)
  };

  // The algorithm's configuration and numerical flags, as cuBLASLt reports them.
  static void describe_algorithm(const CudaBackend::CachedAlgo& chosen, CublasLtAlgoRecord& lt) {
    lt.algo_id = algo_config<std::int32_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_ID);
    lt.tile = static_cast<int>(algo_config<std::uint32_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
    lt.tile_name = cuda::name_of(cuda::kTileNames, lt.tile, "TILE");
    lt.stages = static_cast<int>(algo_config<std::uint32_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
    lt.stages_name = cuda::name_of(cuda::kStagesNames, lt.stages, "STAGES");
    lt.split_k = algo_config<std::int32_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    if (lt.split_k == 0) lt.split_k = 1;
    lt.reduction_scheme = static_cast<int>(
        algo_config<std::uint32_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
    lt.reduction_scheme_name =
        cuda::name_of(cuda::kReductionSchemeNames, lt.reduction_scheme, "SCHEME");
    lt.cta_swizzling = static_cast<int>(
        algo_config<std::uint32_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
    lt.custom_option = static_cast<int>(
        algo_config<std::uint32_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
    lt.cluster_shape = static_cast<int>(
        algo_config<std::uint16_t>(chosen.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
    lt.cluster_shape_name = cuda::name_of(cuda::kClusterShapeNames, lt.cluster_shape, "CLUSTER");
    std::uint64_t flags = 0;
    std::size_t written = 0;
    TPCHECK_CUBLAS_CHECK(cublasLtMatmulAlgoCapGetAttribute(
        &chosen.algo, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, &flags, sizeof(flags), &written));
    lt.numerical_impl_flags = flags;
    lt.numerical_impl = cuda::decode_impl_flags(flags);
    lt.workspace_bytes = chosen.workspace;
    lt.waves_count = chosen.waves;
  }

  // ---- the steps every GEMM engine shares ----

  // The heuristic's preference for `mm` (its descriptors made): the workspace limit, the
  // operands' alignments (x, y, d: cuBLASLt's A, B, D) and the implementation mask.
  static void prefer(const CudaBackend& be, LtMatmul& mm, const void* x, const void* y,
                     const void* d, GemmImplMask mask_kind) {
    mm.align_x = alignment_of(x);
    mm.align_y = alignment_of(y);
    mm.align_d = alignment_of(d);
    mm.mask_kind = mask_kind;
    mm.mask = impl_mask_bits(mask_kind);
    mm.workspace_limit = be.options_.workspace_bytes;
    make_preference(&mm.desc.pref, mm.workspace_limit, mm.align_x, mm.align_y, mm.align_d, mm.mask);
  }

  // The heuristic's first algorithm for `mm`, asked once per `key` (a description of the
  // problem that determines the heuristic's answer) and cached in the backend.
  // no_algorithm(reason) is the error message when cuBLASLt has none (reason: its status,
  // or "no result").
  // REQUIRES: prefer(mm) was called.
  template <typename Message>
  static const CudaBackend::CachedAlgo& cached_heuristic(CudaBackend& be, const std::string& key,
                                                         const LtMatmul& mm,
                                                         const Message& no_algorithm) {
    auto it = be.algo_cache_.find(key);
    if (it != be.algo_cache_.end()) return it->second;
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(be.lt_, mm.desc.op, mm.desc.x, mm.desc.y, mm.desc.d,
                                       mm.desc.d, mm.desc.pref, 1, &result, &returned);
    TPCHECK_CHECK_INPUT(
        status == CUBLAS_STATUS_SUCCESS && returned > 0, "{}",
        no_algorithm(status == CUBLAS_STATUS_SUCCESS ? "no result"
                                                     : cuda::cublas_status_name(status)));
    it = be.algo_cache_
             .emplace(key,
                      CudaBackend::CachedAlgo{result.algo, result.workspaceSize, result.wavesCount})
             .first;
    return it->second;
  }

  // D = alpha · op(x) op(y) + beta · D with the chosen algorithm, on the backend's stream.
  static void matmul(CudaBackend& be, const LtMatmul& mm, const CudaBackend::CachedAlgo& chosen,
                     const void* alpha, const void* x, const void* y, const void* beta, void* d) {
    TPCHECK_CUBLAS_CHECK(cublasLtMatmul(be.lt_, mm.desc.op, alpha, x, mm.desc.x, y, mm.desc.y, beta,
                                        d, mm.desc.d, d, mm.desc.d, &chosen.algo, be.workspace_,
                                        be.options_.workspace_bytes, be.stream_));
  }

  // What ran, for the record: the types and epilogue as the engine set them, the chosen
  // algorithm (describe_algorithm) and the preference it was chosen under.
  static CublasLtAlgoRecord describe_run(const LtMatmul& mm, const CudaBackend::CachedAlgo& chosen,
                                         std::string compute_type, std::string scale_type,
                                         std::string epilogue) {
    CublasLtAlgoRecord lt;
    lt.compute_type = std::move(compute_type);
    lt.scale_type = std::move(scale_type);
    lt.epilogue = std::move(epilogue);
    describe_algorithm(chosen, lt);
    lt.workspace_limit = mm.workspace_limit;
    lt.alignment_a = mm.align_x;  // cuBLASLt's A is the caller's B (column-major form)
    lt.alignment_b = mm.align_y;
    lt.alignment_c = mm.align_d;
    lt.alignment_d = mm.align_d;
    lt.impl_mask = std::string(gemm_impl_mask_name(mm.mask_kind));
    return lt;
  }

  // ---- the unquantized engine (Backend::gemm) ----

  // The operands in cuBLASLt's one input type, and the compute and scale types.
  struct Operands {
    DType in_type;
    Tensor x, y;
    bool f64 = false;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    cudaDataType_t scale_type = CUDA_R_32F;
  };

  static Operands choose_types(const GemmProblem& p) {
    const GemmProblem::ColumnMajor& g = p.col;
    // One input type: a 16-bit operand decides (the class rule's reading of mixed pairs).
    DType in_type = g.x->dtype();
    if (g.y->dtype() != in_type) {
      in_type = (g.x->dtype() == DType::kF32) ? g.y->dtype() : g.x->dtype();
    }
    Operands o{in_type, g.x->dtype() == in_type ? *g.x : g.x->to(in_type),
               g.y->dtype() == in_type ? *g.y : g.y->to(in_type)};
    o.f64 = in_type == DType::kF64;
    if (o.f64) {
      o.compute = CUBLAS_COMPUTE_64F;
    } else if (in_type == DType::kF32 && p.math_class == MathClass::kTf32) {
      o.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    }
    // A pinned algorithm (explain's counterfactual re-runs) brings its compute type.
    if (p.pin != nullptr && in_type == DType::kF32) {
      if (p.pin->compute_type == "32F_FAST_TF32") o.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
      if (p.pin->compute_type == "32F") o.compute = CUBLAS_COMPUTE_32F;
    }
    TPCHECK_CHECK_INPUT(o.f64 == (p.c->dtype() == DType::kF64),
                        "GEMM '{}': {} inputs with a {} output are not a cuBLASLt combination "
                        "(f64 goes with f64 only)",
                        p.site, dtype_name(in_type), dtype_name(p.c->dtype()));
    o.scale_type = o.f64 ? CUDA_R_64F : CUDA_R_32F;
    return o;
  }

  // cuBLASLt's epilogue, the bias in D's type (cuBLASLt's default bias type), and whether
  // f64's activation runs in our own exact kernel instead (see the file comment).
  struct Epilogue {
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    Tensor bias;
    bool f64_activation = false;
  };

  static Epilogue choose_epilogue(const GemmProblem& p, bool f64) {
    Epilogue e;
    if (p.epilogue.bias != nullptr) {
      e.bias = p.epilogue.bias->dtype() == p.c->dtype() ? *p.epilogue.bias
                                                        : p.epilogue.bias->to(p.c->dtype());
    }
    e.f64_activation = f64 && p.epilogue.activation != GemmEpilogue::Activation::kNone;
    TPCHECK_CHECK_INPUT(!(e.f64_activation && p.accumulate),
                        "GEMM '{}': an activation epilogue with accumulate is not supported",
                        p.site);
    switch (e.f64_activation ? GemmEpilogue::Activation::kNone : p.epilogue.activation) {
      case GemmEpilogue::Activation::kNone:
        e.epilogue = e.bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        break;
      case GemmEpilogue::Activation::kGelu:
        e.epilogue =
            e.bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        break;
      case GemmEpilogue::Activation::kDgelu:
        TPCHECK_CHECK_INPUT(!e.bias.defined(),
                            "GEMM '{}': a dgelu epilogue with a bias is not a cuBLASLt epilogue",
                            p.site);
        e.epilogue = CUBLASLT_EPILOGUE_DGELU;
        break;
    }
    return e;
  }

  // The operation descriptor (compute, transposes, epilogue) and the three layouts.
  static void make_descriptors(const GemmProblem& p, const Operands& o, const Epilogue& e,
                               Descriptors& desc) {
    const GemmProblem::ColumnMajor& g = p.col;
    TPCHECK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, o.compute, o.scale_type));
    const cublasOperation_t tx = g.trans_x ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t ty = g.trans_y ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_op(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, tx);
    set_op(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, ty);
    if (e.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      set_op(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, e.epilogue);
      if (e.bias.defined()) {
        const void* bias_ptr = e.bias.raw();
        set_op(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
        set_op(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(e.bias.dtype()));
      }
      if (e.epilogue != CUBLASLT_EPILOGUE_BIAS) {
        void* aux_ptr = p.epilogue.aux->raw();
        const std::int64_t aux_ld = g.m;
        set_op(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_ptr);
        set_op(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
        set_op(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
               cuda_type(p.epilogue.aux->dtype()));
      }
    }
    // Stored (pre-transpose) shapes of the column-major operands.
    const std::int64_t x_rows = g.trans_x ? g.k : g.m, x_cols = g.trans_x ? g.m : g.k;
    const std::int64_t y_rows = g.trans_y ? g.n : g.k, y_cols = g.trans_y ? g.k : g.n;
    make_layout(&desc.x, cuda_type(o.in_type), x_rows, x_cols, g.ldx, p.batch, g.stride_x);
    make_layout(&desc.y, cuda_type(o.in_type), y_rows, y_cols, g.ldy, p.batch, g.stride_y);
    make_layout(&desc.d, cuda_type(p.c->dtype()), g.m, g.n, g.ldd, p.batch, g.stride_d);
  }

  // The implementation mask: --gemm-impl's, or, under a pin, the pinned algorithm's kind
  // (FMA or tensor core), so the heuristic fallback stays in its numerical class.
  static GemmImplMask mask_for(const CudaBackend& be, const GemmProblem& p) {
    GemmImplMask mask_kind = be.options_.impl_mask;
    if (p.pin != nullptr) {
      const std::uint64_t f = p.pin->numerical_impl_flags;
      if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA) mask_kind = GemmImplMask::kFma;
      else if (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK) mask_kind = GemmImplMask::kTensorCore;
    }
    return mask_kind;
  }

  // The heuristic cache's key: every input of the heuristic's answer.
  static std::string heuristic_key(const GemmProblem& p, const Operands& o, const Epilogue& e,
                                   const LtMatmul& mm) {
    const GemmProblem::ColumnMajor& g = p.col;
    return TPCHECK_FORMAT("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
                          static_cast<int>(o.compute), static_cast<int>(cuda_type(o.in_type)),
                          static_cast<int>(cuda_type(p.c->dtype())), static_cast<int>(e.epilogue),
                          g.trans_x, g.trans_y, g.m, g.n, g.k, g.ldx, g.ldy, g.ldd, p.batch,
                          mm.align_x, mm.align_y, mm.align_d, mm.mask,
                          e.bias.defined() ? static_cast<int>(e.bias.dtype()) : -1, p.accumulate);
  }

  // The pinned algorithm itself, when cuBLASLt accepts it for this problem: an algorithm
  // re-created with AlgoInit needs its tile and stages (and the rest of its
  // configuration) set before AlgoCheck accepts it. `note` starts the record's
  // implementation: "pinned ", or why the pin was rejected and what runs instead.
  // REQUIRES: p.pin != nullptr and p.pin->algo_id >= 0; prefer(mm) was called.
  static std::optional<CudaBackend::CachedAlgo> try_pin(CudaBackend& be, const GemmProblem& p,
                                                        const Operands& o, const LtMatmul& mm,
                                                        std::string& note) {
    const CublasLtAlgoRecord& pin = *p.pin;
    cublasLtMatmulAlgo_t algo{};
    const cudaDataType_t t_in = cuda_type(o.in_type), t_d = cuda_type(p.c->dtype());
    cublasStatus_t st = cublasLtMatmulAlgoInit(be.lt_, o.compute, o.scale_type, t_in, t_in, t_d,
                                               t_d, pin.algo_id, &algo);
    auto set_cfg = [&](cublasLtMatmulAlgoConfigAttributes_t attr, const auto& v) {
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoConfigSetAttribute(&algo, attr, &v, sizeof(v));
    };
    set_cfg(CUBLASLT_ALGO_CONFIG_TILE_ID, static_cast<std::uint32_t>(pin.tile));
    set_cfg(CUBLASLT_ALGO_CONFIG_STAGES_ID, static_cast<std::uint32_t>(pin.stages));
    set_cfg(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, static_cast<std::int32_t>(pin.split_k));
    set_cfg(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
            static_cast<std::uint32_t>(pin.reduction_scheme));
    set_cfg(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, static_cast<std::uint32_t>(pin.cta_swizzling));
    set_cfg(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, static_cast<std::uint32_t>(pin.custom_option));
    set_cfg(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, static_cast<std::uint16_t>(pin.cluster_shape));
    cublasLtMatmulHeuristicResult_t check{};
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulAlgoCheck(be.lt_, mm.desc.op, mm.desc.x, mm.desc.y, mm.desc.d, mm.desc.d,
                                   &algo, &check);
    }
    if (st == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= mm.workspace_limit) {
      note = "pinned ";
      return CudaBackend::CachedAlgo{algo, check.workspaceSize, check.wavesCount};
    }
    note = TPCHECK_FORMAT(
        "pin of algo {} rejected ({}); heuristic under compute {} and mask {}: ", pin.algo_id,
        st == CUBLAS_STATUS_SUCCESS ? "workspace" : cuda::cublas_status_name(st),
        compute_type_name(o.compute), gemm_impl_mask_name(mm.mask_kind));
    return std::nullopt;
  }

  // f64 gelu / dgelu after the GEMM, in our own exact kernel (see the file comment).
  static void run_f64_activation(CudaBackend& be, const GemmProblem& p) {
    const long long count = p.col.m * p.col.n * p.batch;
    gelu_epilogue_f64<<<cuda::grid_for(count), 256, 0, be.stream_>>>(
        static_cast<double*>(p.c->raw()), static_cast<double*>(p.epilogue.aux->raw()), count,
        p.epilogue.activation == GemmEpilogue::Activation::kDgelu);
    TPCHECK_LAUNCH_CHECK();
  }

  static void run(CudaBackend& be, const GemmProblem& p, GemmRecord& record) {
    if (p.col.m == 0 || p.col.n == 0) return;  // nothing to write
    const Operands o = choose_types(p);
    const Epilogue e = choose_epilogue(p, o.f64);
    Tensor& d = *p.c;
    LtMatmul mm;
    make_descriptors(p, o, e, mm.desc);
    prefer(be, mm, o.x.raw(), o.y.raw(), d.raw(), mask_for(be, p));
    const std::string key = heuristic_key(p, o, e, mm);
    std::optional<CudaBackend::CachedAlgo> pinned;
    std::string pin_note;
    if (p.pin != nullptr && p.pin->algo_id >= 0) pinned = try_pin(be, p, o, mm, pin_note);
    const CudaBackend::CachedAlgo& chosen =
        pinned ? *pinned : cached_heuristic(be, key, mm, [&](std::string_view reason) {
          return TPCHECK_FORMAT(
              "GEMM '{}' (m={} n={} k={}, {} inputs, compute {}, epilogue {}): cuBLASLt has no "
              "algorithm under --gemm-impl {} ({}); try --gemm-impl any",
              p.site, p.m, p.n, p.k, dtype_name(o.in_type), compute_type_name(o.compute),
              epilogue_name(e.epilogue), gemm_impl_mask_name(be.options_.impl_mask), reason);
        });

    const double alpha64 = p.alpha, beta64 = p.accumulate ? 1.0 : 0.0;
    const float alpha32 = static_cast<float>(p.alpha), beta32 = static_cast<float>(beta64);
    const void* alpha = o.f64 ? static_cast<const void*>(&alpha64) : &alpha32;
    const void* beta = o.f64 ? static_cast<const void*>(&beta64) : &beta32;
    matmul(be, mm, chosen, alpha, o.x.raw(), o.y.raw(), beta, d.raw());
    if (e.f64_activation) run_f64_activation(be, p);

    // What ran.
    std::string epilogue = epilogue_name(e.epilogue);
    if (e.f64_activation)
      epilogue += p.epilogue.activation == GemmEpilogue::Activation::kGelu
                      ? " + f64 gelu kernel (aux)"
                      : " + f64 dgelu kernel";
    CublasLtAlgoRecord lt = describe_run(mm, chosen, compute_type_name(o.compute),
                                         o.f64 ? "64F" : "32F", std::move(epilogue));
    record.math_class = class_from_flags(lt.numerical_impl_flags, p.math_class);
    record.implementation = TPCHECK_FORMAT("{}cublasLt algo {} {} {} splitK {}: {}", pin_note, lt.algo_id,
                                           lt.tile_name, lt.stages_name, lt.split_k,
                                           lt.numerical_impl);
    record.cublaslt = std::move(lt);
  }
};

void CudaBackend::run_gemm(const GemmProblem& p, GemmRecord& record) {
  CudaGemmEngine::run(*this, p, record);
}

// ---- quantized operands (Backend::gemm_quantized) ------------------------------------
//
// Per-tensor FP8 (delayed and current scaling) runs cuBLASLt's FP8 GEMM as the reference
// calls it on Hopper: the operands in the TN layout (both copies have k contiguous: A'
// [m, k] and B' [n, k] row-major, which column-major reads as Bᵀ-op-T times A'-op-N), the
// scale_inv of each through CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER (device f32), fp32
// compute, CUBLASLT_MATMUL_DESC_FAST_ACCUM for the GEMMs the recipe runs with fast
// accumulation (the forward one), the bias epilogue with a bf16 bias (f16 with an f16
// output), beta = 1 when accumulating.
// FP8 block scaling on compute capability 9.0 with cuBLASLt 12.9 or later (checked at run
// time: the library loaded, not the headers) runs cuBLASLt's block-scaled FP8 GEMM as the
// reference calls it on Hopper (run_fp8_block, below): the same TN layout, E4M3 operands,
// one f32 scale per 1×128 block (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: activations and
// gradients) or per 128×128 block (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: weights),
// the split accumulator, each operand's scale_inv rearranged into cuBLASLt's layout first.
// The other block-scaled recipes (MXFP8, NVFP4), and FP8 block scaling elsewhere, run
// emulated: each copy decoded on the GPU into f32 (the quantized value times its block
// scale, exact) and an f32 GEMM in CUBLAS_COMPUTE_32F (no TF32: the decoded values are
// exact in f32, and so are their products in its accumulation) with the recipe's alpha —
// the CPU's contract, on the GPU. The record says "emulated"; its class stays the recipe's.

// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F and BLK128x128_32F appeared in cuBLAS 12.9.
static_assert(CUBLAS_VERSION >= 120900,
              "the CUDA backend needs cuBLAS 12.9 or later headers (CUDA 12.9+): FP8 block "
              "scaling uses CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F");

namespace {

// cuBLASLt's FP8 GEMMs take a 16-bit bias: bf16, or f16 with an f16 output.
DType fp8_bias_dtype(DType output) { return output == DType::kF16 ? DType::kF16 : DType::kBF16; }

cudaDataType_t fp8_cuda_type(DType t) {
  return t == DType::kF8E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

// ---- cuBLASLt's block scales (FP8 block scaling on sm_90) ----
//
// What cuBLASLt documents for these scale modes (cuBLAS documentation, section
// "128-element 1D and 128x128 2D Block Scaling For FP8 Data Types" and its "Scaling
// factors layouts"), for an operand op(X) of R rows (M for A, N for B) and k columns, with
// L = ceil(k / 128):
//   * VEC128_32F: an R × L tensor of f32 that is R-major: the scale of row r, k-block b
//     at offset b · R + r;
//   * BLK128x128_32F: an L4 × ceil(R / 128) tensor that is K-major, L4 = L rounded up to
//     a multiple of 4 (the stride between its columns must be a multiple of 4): the scale
//     of row block p, k-block b at offset p · L4 + b;
//   * the start of each scale tensor 16-byte aligned; M and N multiples of 4; A and B may
//     take different modes but not both BLK128x128_32F.
// TransformerEngine keeps its scale_inv for these GEMMs in exactly these layouts ("GEMM
// ready": 1×128 scales [k/128, pad4(rows)], 128×128 scales [rows/128, pad4(k/128)],
// Float8BlockQuantizer.get_scale_shape): the contiguous dimension padded to a multiple of 4
// in both.
// Ours (QuantizedData) are row-major [rows / b0, k / 128] for the copy whose blocks run
// along k (the columnwise copy in its own, transposed, layout), so:
//   * 1×128: transposed, to [k/128, pad4(rows)];
//   * 128×128: the same order, each row padded from k/128 to pad4(k/128) values.
// The padding is zeros. Scales are small (one per 128 or 16384 values): one thread per
// scale, no tiling.

constexpr std::int64_t kScaleBlock = 128;

std::int64_t round_up(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// dst[row · row_stride + col · col_stride] = src[row · cols + col] for a row-major src
// [rows, cols]; dst's other elements (the padding) are left as they are.
__global__ void place_block_scales(const float* src, long long rows, long long cols, float* dst,
                                   long long row_stride, long long col_stride) {
  const long long n = rows * cols;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = i / cols, col = i % cols;
    dst[row * row_stride + col * col_stride] = src[i];
  }
}

// The cuBLASLt name of an operand's scale mode, as the ledger writes it.
const char* block_scale_mode_name(bool blocks_128x128) {
  return blocks_128x128 ? "BLK128x128_32F" : "VEC128_32F";
}

// One operand copy's scale_inv (ours: f32 [rows / b0, k / 128], row-major) in the layout
// cuBLASLt reads for its scale mode (above), as a new zero-padded GPU tensor. `rows` is
// the copy's row count (m for A', n for B'); `operand` names it in errors.
Tensor cublaslt_block_scales(std::string_view site, std::string_view operand,
                             const Tensor& scale_inv, bool blocks_128x128, std::int64_t rows,
                             std::int64_t k, cudaStream_t stream) {
  const std::int64_t k_blocks = k / kScaleBlock;
  const std::int64_t scale_rows = blocks_128x128 ? rows / kScaleBlock : rows;
  TPCHECK_CHECK_INPUT(
      k % kScaleBlock == 0 && (!blocks_128x128 || rows % kScaleBlock == 0) &&
          scale_inv.defined() && scale_inv.dtype() == DType::kF32 &&
          scale_inv.numel() == scale_rows * k_blocks,
      "quantized GEMM '{}': operand {}'s scale_inv is {}; its [{}, {}] copy in {} blocks needs "
      "f32 [{}, {}] (rows and k multiples of the block)",
      site, operand, scale_inv.defined() ? scale_inv.describe() : "undefined", rows, k,
      blocks_128x128 ? "128x128" : "1x128", scale_rows, k_blocks);
  const Tensor src = scale_inv.to_device(Device::kCuda);
  Tensor out;
  long long row_stride = 0, col_stride = 0;
  if (blocks_128x128) {
    const std::int64_t k_blocks_padded = round_up(k_blocks, 4);
    out = Tensor({scale_rows, k_blocks_padded}, DType::kF32, Device::kCuda);
    row_stride = k_blocks_padded;
    col_stride = 1;
  } else {
    const std::int64_t rows_padded = round_up(rows, 4);
    out = Tensor({k_blocks, rows_padded}, DType::kF32, Device::kCuda);
    row_stride = 1;
    col_stride = rows_padded;
  }
  const long long count = scale_rows * k_blocks;
  if (count > 0) {
    place_block_scales<<<cuda::grid_for(count), 256, 0, stream>>>(
        static_cast<const float*>(src.raw()), scale_rows, k_blocks, static_cast<float*>(out.raw()),
        row_stride, col_stride);
    TPCHECK_LAUNCH_CHECK();
  }
  return out;
}

}  // namespace

struct CudaQuantizedGemmEngine {
  // How the operands' scales reach one cuBLASLt FP8 GEMM: device f32 tensors for A' and B'
  // (the caller's operands), and the scale modes when they are block scales (none: the
  // per-tensor scalar mode, cuBLASLt's default).
  struct Fp8Scales {
    Tensor a, b;
    std::optional<std::int32_t> a_mode, b_mode;  // cublasLtMatmulMatrixScale_t
    std::string description;                     // the record's scale_mode
  };

  // Per-tensor FP8 (delayed and current scaling): each operand's scale_inv through a
  // scale pointer.
  static void run_fp8(CudaBackend& be, const QuantizedGemmProblem& q, GemmRecord& record) {
    TPCHECK_CHECK_INPUT(!(q.a->format == DType::kF8E5M2 && q.b->format == DType::kF8E5M2),
                        "quantized GEMM '{}': both operands are E5M2; cuBLASLt's FP8 GEMM needs "
                        "at least one E4M3 operand",
                        q.site);
    Fp8Scales scales;
    scales.a = (q.a_columnwise ? q.a->columnwise_scale_inv : q.a->rowwise_scale_inv).to_device(Device::kCuda);
    scales.b = (q.b_columnwise ? q.b->columnwise_scale_inv : q.b->rowwise_scale_inv).to_device(Device::kCuda);
    scales.description = "per-tensor scale_inv pointers";
    run_cublaslt_fp8(be, q, scales, "FP8", record);
  }

  // FP8 block scaling through cuBLASLt's block-scaled FP8 GEMM (compute capability 9.0,
  // cuBLASLt >= 12.9; run_gemm_quantized decides): the scale modes and cuBLASLt's scale
  // layouts (cublaslt_block_scales above). The reference's requirements, the first built
  // in, the others checked here with errors that name them:
  //   * TN layout: TransformerEngine passes block-scaled operands as A transposed, B not
  //     (cublaslt_gemm.cu, CanonicalizeGemmInput: "Hopper only supports TN GEMMs for FP8");
  //     QuantizedGemmProblem is that form already;
  //   * not 128×128 × 128×128 (cuBLAS documentation's table of supported combinations;
  //     TE checks the same);
  //   * the split accumulator: TE's Float8BlockScaling recipe fixes use_split_accumulator
  //     for fprop, dgrad and wgrad, and PyTorch's scaled_mm refuses fast accumulation with
  //     1×128 / 128×128 scales;
  //   * m and n multiples of 8: cuBLAS documents multiples of 4; TE requires 8 of the
  //     output's leading dimension (16 bytes of a 16-bit output) and of the 1×128
  //     operand's rows when it is cuBLASLt's B (ours A', always 1×128 here) "observed"
  //     (cublaslt_gemm.cu) — we require what the reference does;
  //   * an output in f32, f16 or bf16 (cuBLAS documentation); epilogue DEFAULT or BIAS
  //     (TE allows DEFAULT, BIAS, DGELU with block scaling; the layers fuse only a bias).
  // With no algorithm for a combination the GEMM fails with an error naming the site, the
  // shapes and the scale modes: no silent fallback to the emulation.
  static void run_fp8_block(CudaBackend& be, const QuantizedGemmProblem& q, GemmRecord& record) {
    // Our operands' block shapes: {1, 128} or {128, 128} in each copy's own layout.
    const bool a_2d = q.a->block.size() == 2 && q.a->block[0] == kScaleBlock;
    const bool b_2d = q.b->block.size() == 2 && q.b->block[0] == kScaleBlock;
    Fp8Scales scales;
    scales.description = TPCHECK_FORMAT("A {} x B {}", block_scale_mode_name(a_2d),
                                        block_scale_mode_name(b_2d));
    const std::string& modes = scales.description;
    TPCHECK_CHECK_INPUT(!(a_2d && b_2d),
                        "quantized GEMM '{}' (m={} n={} k={}): both operands have 128x128 "
                        "blocks ({}); cuBLASLt's block-scaled FP8 GEMM takes 1x128 x 1x128, "
                        "1x128 x 128x128 or 128x128 x 1x128",
                        q.site, q.m, q.n, q.k, modes);
    TPCHECK_CHECK_INPUT(!q.fast_accumulation,
                        "quantized GEMM '{}': fast accumulation was asked for with FP8 block "
                        "scaling ({}); the recipe uses the split accumulator (the reference's "
                        "Float8BlockScaling requires it)",
                        q.site, modes);
    TPCHECK_CHECK_INPUT(q.m % 8 == 0 && q.n % 8 == 0,
                        "quantized GEMM '{}' (m={} n={} k={}, {}): cuBLASLt's block-scaled FP8 "
                        "GEMM on sm_90 needs m and n to be multiples of 8 (the reference "
                        "requires the same; its callers pad): in a Linear, the token count and "
                        "the features",
                        q.site, q.m, q.n, q.k, modes);
    scales.a = cublaslt_block_scales(
        q.site, "A", q.a_columnwise ? q.a->columnwise_scale_inv : q.a->rowwise_scale_inv, a_2d,
        q.m, q.k, be.stream_);
    scales.b = cublaslt_block_scales(
        q.site, "B", q.b_columnwise ? q.b->columnwise_scale_inv : q.b->rowwise_scale_inv, b_2d,
        q.n, q.k, be.stream_);
    TPCHECK_CHECK(alignment_of(scales.a.raw()) >= 16 && alignment_of(scales.b.raw()) >= 16,
                  "quantized GEMM '{}': the rearranged block scales are not 16-byte aligned "
                  "(cuBLASLt requires it)",
                  q.site);
    scales.a_mode = a_2d ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                         : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    scales.b_mode = b_2d ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                         : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    run_cublaslt_fp8(be, q, scales, "FP8 block-scaled", record);
  }

  // One cuBLASLt FP8 GEMM as the reference calls it on Hopper, for both engines above:
  // the TN layout (A' [m, k] and B' [n, k] both have k contiguous, which column-major reads
  // as B'ᵀ-op-T times A'-op-N), fp32 compute, the scales, fast accumulation as the caller
  // asks, the BIAS epilogue with a bf16 bias (f16 with an f16 output), alpha 1, beta = 1
  // when accumulating; the algorithm from
  // cuBLASLt's heuristic, cached per problem; the record. `kind` names the GEMM in the
  // record and in errors ("FP8", "FP8 block-scaled").
  static void run_cublaslt_fp8(CudaBackend& be, const QuantizedGemmProblem& q,
                               const Fp8Scales& scales, std::string_view kind, GemmRecord& record) {
    Tensor& d = *q.c;
    const Tensor& a_data = q.a_columnwise ? q.a->columnwise_data : q.a->rowwise_data;  // [m, k]
    const Tensor& b_data = q.b_columnwise ? q.b->columnwise_data : q.b->rowwise_data;  // [n, k]
    TPCHECK_CHECK_INPUT(q.epilogue.activation == GemmEpilogue::Activation::kNone,
                        "quantized GEMM '{}': epilogue {} is not offered on FP8 operands (the "
                        "layers apply activations in their own kernels under a recipe)",
                        q.site, gemm_epilogue_name(q.epilogue));
    Tensor bias;
    if (q.epilogue.bias != nullptr) {
      const DType want = fp8_bias_dtype(d.dtype());
      bias = q.epilogue.bias->dtype() == want ? *q.epilogue.bias : q.epilogue.bias->to(want);
    }
    const cublasLtEpilogue_t epilogue =
        bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;

    CudaGemmEngine::LtMatmul mm;
    make_fp8_descriptors(q, scales, bias, mm.desc);
    CudaGemmEngine::prefer(be, mm, b_data.raw(), a_data.raw(), d.raw(), be.options_.impl_mask);
    const cudaDataType_t tx = fp8_cuda_type(q.b->format), ty = fp8_cuda_type(q.a->format);
    const std::int8_t fast = q.fast_accumulation ? 1 : 0;
    const std::string key = TPCHECK_FORMAT(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", kind, static_cast<int>(tx),
        static_cast<int>(ty), scales.b_mode.value_or(-1), scales.a_mode.value_or(-1),
        static_cast<int>(cuda_type(d.dtype())), static_cast<int>(epilogue), q.m, q.n, q.k,
        mm.align_x, mm.align_y, mm.align_d, mm.mask, static_cast<int>(fast),
        bias.defined() ? static_cast<int>(bias.dtype()) : -1, q.accumulate);
    const CudaBackend::CachedAlgo& chosen =
        CudaGemmEngine::cached_heuristic(be, key, mm, [&](std::string_view reason) {
          return TPCHECK_FORMAT(
              "quantized GEMM '{}' (m={} n={} k={}, {} x {} -> {}, scales {}, epilogue {}): "
              "cuBLASLt has no {} algorithm under --gemm-impl {} ({})",
              q.site, q.m, q.n, q.k, dtype_name(q.a->format), dtype_name(q.b->format),
              dtype_name(d.dtype()), scales.description, epilogue_name(epilogue), kind,
              gemm_impl_mask_name(be.options_.impl_mask), reason);
        });
    // alpha 1: the scales carry every factor (per tensor through the pointers; block
    // scaling has no per-tensor factor).
    const float alpha = 1.0f, beta = q.accumulate ? 1.0f : 0.0f;
    if (q.m > 0 && q.n > 0) {
      CudaGemmEngine::matmul(be, mm, chosen, &alpha, b_data.raw(), a_data.raw(), &beta, d.raw());
    }

    CublasLtAlgoRecord lt =
        CudaGemmEngine::describe_run(mm, chosen, "32F", "32F", epilogue_name(epilogue));
    lt.fast_accumulation = q.fast_accumulation;
    lt.scale_mode = scales.description;  // A and B are the caller's operands
    record.math_class = q.math_class;
    record.implementation =
        scales.a_mode ? TPCHECK_FORMAT("cublasLt {} algo {} {} {} splitK {}, {} accumulation, {}: {}",
                                       kind, lt.algo_id, lt.tile_name, lt.stages_name, lt.split_k,
                                       q.fast_accumulation ? "fast" : "split", lt.scale_mode,
                                       lt.numerical_impl)
                      : TPCHECK_FORMAT("cublasLt {} algo {} {} {} splitK {}, {} accumulation: {}",
                                       kind, lt.algo_id, lt.tile_name, lt.stages_name, lt.split_k,
                                       q.fast_accumulation ? "fast" : "split", lt.numerical_impl);
    record.cublaslt = std::move(lt);
  }

  // The FP8 GEMM's operation descriptor (fp32 compute, TN, the scales, fast accumulation,
  // the bias epilogue when `bias` is defined) and its three layouts.
  static void make_fp8_descriptors(const QuantizedGemmProblem& q, const Fp8Scales& scales,
                                   const Tensor& bias, Descriptors& desc) {
    TPCHECK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_op(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set_op(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    // Column-major: cuBLASLt's A is B' (scale b), its B is A' (scale a).
    const void* x_scale = scales.b.raw();
    const void* y_scale = scales.a.raw();
    set_op(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, x_scale);
    set_op(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, y_scale);
    // The mode attributes are int32_t holding a cublasLtMatmulMatrixScale_t (cublasLt.h).
    if (scales.b_mode) set_op(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, *scales.b_mode);
    if (scales.a_mode) set_op(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, *scales.a_mode);
    const std::int8_t fast = q.fast_accumulation ? 1 : 0;
    set_op(desc.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    if (bias.defined()) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      set_op(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
      const void* bias_ptr = bias.raw();
      set_op(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
      set_op(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(bias.dtype()));
    }
    const cudaDataType_t tx = fp8_cuda_type(q.b->format), ty = fp8_cuda_type(q.a->format);
    const std::int64_t ld = std::max<std::int64_t>(1, q.k);
    make_layout(&desc.x, tx, q.k, q.n, ld, 1, 0);
    make_layout(&desc.y, ty, q.k, q.m, ld, 1, 0);
    make_layout(&desc.d, cuda_type(q.c->dtype()), q.n, q.m, std::max<std::int64_t>(1, q.n), 1, 0);
  }

  static void run_emulated(CudaBackend& be, const QuantizedGemmProblem& q, GemmRecord& record) {
    TPCHECK_CHECK_INPUT(q.epilogue.activation == GemmEpilogue::Activation::kNone,
                        "quantized GEMM '{}': epilogue {} is not offered on quantized operands "
                        "(the layers apply activations in their own kernels under a recipe)",
                        q.site, gemm_epilogue_name(q.epilogue));
    const Tensor a = quantized_values_on_gpu(*q.a, q.a_columnwise).values;  // [m, k]
    const Tensor b = quantized_values_on_gpu(*q.b, q.b_columnwise).values;  // [n, k]
    // cuBLASLt's f32 GEMM writes f32: a 16-bit output is accumulated in an f32 copy and
    // rounded once at the end, which is the CPU's contract (f32 result, one rounding to C's
    // dtype; C's old values widened exactly when accumulating).
    const bool wide_output = q.c->dtype() == DType::kF32;
    Tensor c32 = wide_output ? Tensor()
                 : q.accumulate ? q.c->to(DType::kF32)
                                : Tensor(q.c->shape(), DType::kF32, Device::kCuda);
    Tensor& c = wide_output ? *q.c : c32;
    // CUBLAS_COMPUTE_32F on the exact decoded values (the record keeps the recipe's class).
    const GemmProblem p = decoded_gemm_problem(q, a, b, c, MathClass::kFp32);
    CudaGemmEngine::run(be, p, record);
    if (!wide_output) q.c->copy_from(c32.to(q.c->dtype()));
    record.math_class = q.math_class;
    record.implementation = TPCHECK_FORMAT("emulated {}: operands decoded on the GPU, f32 GEMM {}",
                                           math_class_name(q.math_class), record.implementation);
    if (record.cublaslt) record.cublaslt->scale_mode = "emulated (decoded operands)";
  }
};

void CudaBackend::run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord& record) {
  // FP8 tensor cores: compute capability 8.9 and later.
  int major = 0, minor = 0;
  TPCHECK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options_.device));
  TPCHECK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options_.device));
  const bool fp8_tensor_cores = major * 10 + minor >= 89;
  // cuBLASLt's 1×128 / 128×128 block-scaled FP8 GEMM: compute capability 9.0 only (cuBLAS
  // documentation, "Scaling Mode Support Overview"), from cuBLAS 12.9 on. The version is
  // the library's loaded now (12.9 = 120900), which may be older than the headers.
  const bool block_scaled_fp8 =
      major == 9 && minor == 0 && cublasLtGetVersion() >= std::size_t{120900};
  if (p.math_class == MathClass::kFp8 && fp8_tensor_cores) {
    CudaQuantizedGemmEngine::run_fp8(*this, p, record);
  } else if (p.math_class == MathClass::kFp8Block && block_scaled_fp8) {
    CudaQuantizedGemmEngine::run_fp8_block(*this, p, record);
  } else {
    CudaQuantizedGemmEngine::run_emulated(*this, p, record);
  }
}

std::shared_ptr<QuantizedData> CudaBackend::quantize(const Tensor& x, const QuantizeOptions& options,
                                                     std::string_view what) {
  return quantize_on_gpu(x, options, what);
}

}  // namespace tpcheck

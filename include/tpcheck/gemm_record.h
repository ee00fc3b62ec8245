// tpcheck/gemm_record.h — what one GEMM call was and how it was computed.
//
// Every GEMM goes through Backend::gemm, which appends one GemmRecord to the backend's
// ledger. Site names are stable ("mlp.fc1/fwd", "mlp.fc1/dgrad", "mlp.fc1/wgrad") so the
// single and sharded ledgers line up record by record.
// Thread safety: GemmLedger is not synchronized; each rank owns its backend and ledger.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/dtype.h"

namespace tpcheck {

// The numerical class of a GEMM: how inputs are rounded and what accumulates.
//   kFp64  f64 inputs, f64 accumulation (truth runs)
//   kFp32  f32 inputs, f32 FMA accumulation (SIMT / FMA kernels)
//   kTf32  inputs rounded to TF32 (10 mantissa bits), f32 accumulation (tensor cores)
//   kBf16  inputs rounded to bf16, f32 accumulation
//   kFp16  inputs rounded to f16, f32 accumulation
// Quantized operands (Backend::gemm_quantized, quant.h): the products of the quantized
// values times their block scales, accumulated in f32, times the per-tensor factors:
//   kFp8       FP8 (E4M3 / E5M2) with a per-tensor scale (delayed and current scaling)
//   kFp8Block  E4M3 with power-of-two scales per 1x128 / 128x128 block
//   kMxfp8     E4M3 with E8M0 scales per 32 values
//   kNvfp4     E2M1 with E4M3 scales per 16 values and a per-tensor alpha
enum class MathClass { kFp64, kFp32, kTf32, kBf16, kFp16, kFp8, kFp8Block, kMxfp8, kNvfp4 };
// "fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4"
std::string_view math_class_name(MathClass c);
bool is_quantized_class(MathClass c);
MathClass parse_math_class(std::string_view name);  // throws Error(kInput)

// What cuBLASLt ran for one GEMM: the algorithm as `cublasLtMatmulAlgoConfigGetAttribute`
// and `cublasLtMatmulAlgoCapGetAttribute` report it. Names are the enum names without
// their prefix ("TILE_128x128", "CUBLASLT_REDUCTION_SCHEME_NONE" → "NONE").
struct CublasLtAlgoRecord {
  std::string compute_type;          // "32F_FAST_TF32", "32F", "64F", ...
  std::string scale_type;            // "32F", "64F"
  std::string epilogue;              // "DEFAULT", "BIAS", "GELU_AUX_BIAS", "DGELU"
  int algo_id = -1;
  int tile = 0;                      // CUBLASLT_ALGO_CONFIG_TILE_ID
  std::string tile_name;
  int stages = 0;                    // CUBLASLT_ALGO_CONFIG_STAGES_ID
  std::string stages_name;
  int split_k = 1;                   // CUBLASLT_ALGO_CONFIG_SPLITK_NUM (1: no split)
  int reduction_scheme = 0;          // CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME
  std::string reduction_scheme_name;
  int cta_swizzling = 0;
  int custom_option = 0;
  int cluster_shape = 0;             // CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID
  std::string cluster_shape_name;
  std::uint64_t numerical_impl_flags = 0;  // CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS
  std::string numerical_impl;        // decoded: "HMMA 16x8x8, input TF32, accumulator FP32"
  std::uint64_t workspace_bytes = 0; // the algorithm's need (heuristic result)
  std::uint64_t workspace_limit = 0; // what the preference allowed
  std::uint32_t alignment_a = 0, alignment_b = 0, alignment_c = 0, alignment_d = 0;  // bytes
  float waves_count = 0;
  std::string impl_mask;             // the CUBLASLT_MATMUL_PREF_IMPL_MASK asked for ("any", ...)
  // Quantized GEMMs: how the scales reach cuBLASLt ("per-tensor scale_inv pointers";
  // FP8 block scaling on sm_90: cuBLASLt's scale mode of the caller's A and B, e.g.
  // "A VEC128_32F x B BLK128x128_32F"; or "emulated (decoded operands)"; empty for an
  // unquantized GEMM) and whether Hopper's FP8 fast accumulation
  // (CUBLASLT_MATMUL_DESC_FAST_ACCUM) was on.
  std::string scale_mode;
  bool fast_accumulation = false;
};

struct GemmRecord {
  std::string site;                 // "module.sub/pass"
  int rank = 0;                     // the TP rank whose backend ran it
  std::int64_t m = 0, n = 0, k = 0;  // C[m, n] = op(A)[m, k] · op(B)[k, n] (row-major, as called)
  std::int64_t batch = 1;           // > 1 for gemm_batched (attention's products)
  double alpha = 1.0;
  bool trans_a = false, trans_b = false;
  bool accumulate = false;          // C += (beta = 1) instead of C = (beta = 0)
  DType a_dtype = DType::kF32, b_dtype = DType::kF32, c_dtype = DType::kF32;
  std::string epilogue = "none";    // gemm_epilogue_name()
  MathClass math_class = MathClass::kFp32;  // what ran (the engine's report)
  std::string implementation;       // e.g. "openblas sgemm, inputs rounded to tf32"
  std::optional<CublasLtAlgoRecord> cublaslt;  // set by the CUDA backend

  // True when `other` ran the same algorithm (same class; on CUDA the same algorithm id,
  // tile, stages, split-K, reduction scheme, swizzle, custom option and cluster shape).
  bool same_algorithm(const GemmRecord& other) const;
};

class GemmLedger {
 public:
  void add(GemmRecord record) { records_.push_back(std::move(record)); }
  const std::vector<GemmRecord>& records() const { return records_; }
  void clear() { records_.clear(); }

 private:
  std::vector<GemmRecord> records_;
};

}  // namespace tpcheck

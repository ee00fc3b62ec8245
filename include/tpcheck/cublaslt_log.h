// tpcheck/cublaslt_log.h — cuBLASLt API-trace logs: parse, align two runs, query.
//
// With CUBLASLT_LOG_LEVEL=2 (Trace) or 5 (API trace) cuBLASLt writes one line per matmul
// it launches, e.g. (one line, wrapped here):
//
//   [2025-11-03 19:02:38][cublasLt][557785][Trace][cublasLtMatmul] A=0X736CB315E800
//   Adesc=[type=R_8F_E4M3 rows=64 cols=1088 ld=64] B=0X736C9B644000
//   Bdesc=[type=R_8F_E4M3 rows=128 cols=1088 ld=128] C=0X0
//   Cdesc=[type=R_16BF rows=64 cols=128 ld=64] D=0X736CB30A4400
//   Ddesc=[type=R_16BF rows=64 cols=128 ld=64]
//   computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transb=OP_T ...]
//   algo=[algoId=66 tile=MATMUL_TILE_128x128 stages=MATMUL_STAGES_128xAUTO customOption=3
//   clusterShape=CLUSTER_SHAPE_1x1x1] workSpace=0X0 workSpaceSizeInBytes=0 beta=0
//   outOfPlace=1 stream=0X0
//
// Fields at their default are left out by the library (no `transa` means OP_N, no
// `epilogue` EPILOGUE_DEFAULT, no `numSplitsK` 1, ...); the parser fills the defaults.
// Legacy cuBLAS calls that dispatch through cuBLASLt log under internal names such as
// `cublasLtSSSMatmul`: every `[Trace][cublasLt*Matmul]` line is a matmul call. Other lines
// (Api, Info, other functions, program output) are skipped silently; a matmul trace line
// that is truncated or malformed is reported with its line number and skipped.
// Sources for the format (no NVIDIA specification of it exists): the example lines in
// vuiseng9/fp4-training README.md (CUBLASLT_LOG_LEVEL=2, cuBLASLt 12.9/13), the algo
// fields `reductionScheme=... numSplitsK=N` and `ctaSwizzling=1` as public scripts parse
// them from real logs, cuBLASLt's own enum names (cublasLt.h), and the `[cublasLt][pid]`
// header of error lines quoted in NVIDIA/CUDALibrarySamples#185. Names are kept without
// their enum prefix, as tpcheck's GEMM records keep them ("128x128", "32F_FAST_TF32").
// Thread safety: pure functions; query_numerical_impls uses the current CUDA device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpcheck {

// One matrix layout (cublasLtMatrixLayout_t) as the log prints it.
struct CublasLtLayout {
  std::string type;                  // "R_32F" → "32F", "R_16BF" → "16BF", "R_8F_E4M3" → "8F_E4M3"
  std::int64_t rows = 0, cols = 0, ld = 0;
  std::string order = "COL";         // ORDER_COL unless the log says otherwise
  std::int64_t batch_count = 1;
  std::int64_t batch_stride = 0;     // stridedBatchOffset
  bool operator==(const CublasLtLayout&) const = default;
};

// One cuBLASLt matmul launch, with the defaults of omitted fields filled in.
struct CublasLtCall {
  std::int64_t line = 0;             // 1-based line number in its log
  int pid = 0;                       // from the [cublasLt][pid] header (0 when absent)
  std::string function;              // "cublasLtMatmul", "cublasLtSSSMatmul", ...
  CublasLtLayout a, b, c, d;
  // computeDesc
  std::string compute_type;          // COMPUTE_32F_FAST_TF32 → "32F_FAST_TF32"
  std::string scale_type;            // R_32F → "32F"
  bool trans_a = false, trans_b = false;
  std::string epilogue = "DEFAULT";  // EPILOGUE_GELU_AUX_BIAS → "GELU_AUX_BIAS"
  // algo
  int algo_id = -1;
  std::string tile = "UNDEFINED";    // MATMUL_TILE_128x128 → "128x128"
  std::string stages = "UNDEFINED";  // MATMUL_STAGES_32x5 → "32x5"
  int custom_option = 0;
  std::string cluster_shape = "AUTO";  // CLUSTER_SHAPE_1x1x1 → "1x1x1"
  std::string reduction_scheme = "NONE";
  int split_k = 1;                   // numSplitsK
  int cta_swizzling = 0;
  std::uint64_t workspace_bytes = 0; // workSpaceSizeInBytes
  std::string beta = "0";
  // D[m, n] = op(A)[m, k] · op(B)[k, n] in cuBLASLt's (column-major) terms.
  std::int64_t m = 0, n = 0, k = 0;
  // Filled by query_numerical_impls (--query on a GPU machine).
  std::optional<std::uint64_t> numerical_impl_flags;
  std::string numerical_impl;        // "HMMA, input TF32, accumulator 32F" or why unknown
  std::string math_class;            // "tf32", "fp32", "bf16", ... when known

  // Same algorithm: id, tile, stages, custom option, cluster shape, reduction scheme,
  // split-K and swizzle.
  bool same_algorithm(const CublasLtCall& other) const;
  // "algoId=21 tile=64x64 stages=32x5 splitK=2 ..." (defaults left out, as the log does).
  std::string algorithm_text() const;
  // "m=64 n=1024 k=32" (", batch=8" when batched).
  std::string shape_text() const;
  // "32F·32F→32F compute 32F_FAST_TF32, transa, epilogue BIAS" (what besides the shape
  // identifies the call).
  std::string kind_text() const;
};

struct CublasLtLogProblem {
  std::int64_t line = 0;
  std::string reason;  // "truncated: Ddesc=[ not closed", "rows='x' is not an integer"
};

struct CublasLtLog {
  std::string path;                  // where it was read from ("" for text)
  std::vector<CublasLtCall> calls;
  std::vector<CublasLtLogProblem> problems;
  std::int64_t lines = 0;
};

// Parses one line. Returns nullopt when the line is not a matmul trace line (other log
// lines, program output); otherwise the call or the reason it is malformed.
struct CublasLtLineResult {
  std::optional<CublasLtCall> call;
  std::string problem;  // non-empty: a matmul trace line that could not be parsed
};
std::optional<CublasLtLineResult> parse_cublaslt_line(std::string_view line,
                                                      std::int64_t line_number);

// Every line of a log; never throws on content.
CublasLtLog parse_cublaslt_log(std::string_view text);
// Reads and parses a file; Error(kInput) naming the path when it cannot be read.
CublasLtLog read_cublaslt_log(const std::string& path);

// Two call streams lined up: by order, and by shape where calls were added or dropped.
// Two calls pair when they have the same types, transposes, epilogue and layout orders
// and their (m, n, k, batch) agree except in dimensions where one is a whole multiple of
// the other. A pair with at most one such dimension (the one a tensor-parallel run
// shards) is preferred: in order, else found up to 256 calls ahead; a pair whose shapes
// differ in several dimensions (tokens per rank changed too) is taken in order unless a
// closer one lies within 4 calls. Calls left unpaired on both sides that are the same
// problem then pair in order (threads of one process interleave differently per run).
struct CublasLtPair {
  std::optional<std::size_t> a, b;   // indices into the two call vectors; one may be absent
  bool shape_differs = false;        // paired with some dimension different
  bool algorithm_differs = false;
  bool compute_differs = false;      // compute or scale type differs
};
std::vector<CublasLtPair> align_cublaslt_calls(const std::vector<CublasLtCall>& a,
                                               const std::vector<CublasLtCall>& b);

// True when a GPU query is possible in this build (false: built without CUDA).
bool cublaslt_query_available();
// Fills numerical_impl_flags / numerical_impl / math_class of every call through
// cublasLtMatmulAlgoInit + the algo's configuration + CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS
// on the current GPU (one query per distinct algorithm). A call whose names this cuBLASLt
// does not know, or whose algorithm it cannot initialize, gets the reason in
// numerical_impl. Throws Error(kRuntime) when built without CUDA or with no GPU.
void query_numerical_impls(std::vector<CublasLtCall>& calls);

}  // namespace tpcheck

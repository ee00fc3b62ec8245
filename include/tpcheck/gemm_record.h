// tpcheck/gemm_record.h — what one GEMM call was and how it was computed.
//
// Every GEMM goes through Backend::gemm, which appends one GemmRecord to the backend's
// ledger. Site names are stable ("mlp.fc1/fwd", "mlp.fc1/dgrad", "mlp.fc1/wgrad") so the
// single and sharded ledgers line up record by record.
// Thread safety: GemmLedger is not synchronized; each rank owns its backend and ledger.
#pragma once

#include <cstdint>
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
enum class MathClass { kFp64, kFp32, kTf32, kBf16, kFp16 };
std::string_view math_class_name(MathClass c);  // "fp64", "fp32", "tf32", "bf16", "fp16"
MathClass parse_math_class(std::string_view name);  // throws Error(kInput)

struct GemmRecord {
  std::string site;                 // "module.sub/pass"
  std::int64_t m = 0, n = 0, k = 0;  // C[m, n] = op(A)[m, k] · op(B)[k, n]
  bool trans_a = false, trans_b = false;
  bool accumulate = false;          // C += (beta = 1) instead of C = (beta = 0)
  DType a_dtype = DType::kF32, b_dtype = DType::kF32, c_dtype = DType::kF32;
  MathClass math_class = MathClass::kFp32;
  std::string implementation;       // e.g. "openblas sgemm, inputs rounded to tf32"
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

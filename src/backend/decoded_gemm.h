// decoded_gemm.h — the plain GEMM a quantized GEMM becomes once its operands are decoded
// to f32 values (quantized_values): row-major C = A' B'ᵀ with A' [m, k] and B' [n, k] (both
// k-contiguous, the copies gemm_quantized picked), in the column-major form engines take
// (GemmProblem::col): Cᵀ = B' A'ᵀ, X = B' read transposed, Y = A' as stored. Shared by the
// CPU engine and the CUDA backend's emulation of the block-scaled recipes.
// Private to src/backend.
#pragma once

#include <algorithm>

#include "tpcheck/backend.h"

namespace tpcheck {

// `a` [m, k], `b` [n, k] f32 decoded values; `c` the output; the rest from `q`.
inline GemmProblem decoded_gemm_problem(const QuantizedGemmProblem& q, const Tensor& a,
                                        const Tensor& b, Tensor& c, MathClass math_class) {
  GemmProblem p;
  p.site = q.site;
  p.m = q.m;
  p.n = q.n;
  p.k = q.k;
  p.trans_a = false;
  p.trans_b = true;
  p.accumulate = q.accumulate;
  p.a = &a;
  p.b = &b;
  p.c = &c;
  p.epilogue = q.epilogue;
  p.math_class = math_class;
  p.alpha = q.alpha;
  p.col.m = q.n;
  p.col.n = q.m;
  p.col.k = q.k;
  p.col.x = &b;
  p.col.trans_x = true;
  p.col.ldx = std::max<std::int64_t>(1, q.k);
  p.col.y = &a;
  p.col.trans_y = false;
  p.col.ldy = std::max<std::int64_t>(1, q.k);
  p.col.ldd = std::max<std::int64_t>(1, q.n);
  return p;
}

}  // namespace tpcheck

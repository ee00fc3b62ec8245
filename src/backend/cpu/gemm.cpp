// gemm.cpp — CpuBackend::run_gemm: the CPU GEMM engine behind Backend::gemm (which
// validates, chooses the class, canonicalizes to column-major and records), emulating
// the GPU math classes on top of OpenBLAS.
//
// How a class is emulated (the class comes from Backend::choose_math_class):
//   fp64       operands in f64, cblas_dgemm (f64 accumulation);
//   fp32       operands in f32, cblas_sgemm (f32 accumulation);
//   tf32       operands loaded to f32, each rounded to TF32 (round_tf32, nearest even),
//              then cblas_sgemm: the products of TF32 values are exact in f32, so this is
//              the tensor-core result up to the order of the f32 accumulation;
//   bf16/fp16  operands rounded to bf16/f16 (values kept in f32), cblas_sgemm.
// The product P = op(A)·op(B) is computed first (beta = 0), then the epilogue (bias, gelu
// with its aux output, dgelu) on P in f32 (f64), as cuBLASLt applies it; with `accumulate` C's stored
// values are read, P added (in f32, f64 when C or the class is f64) and the sum rounded
// once to C's dtype — what a GPU epilogue with beta = 1 does. Without `accumulate`, P
// is rounded once to C's dtype.
// Determinism: OpenBLAS' blocking and thread partition are a function of the shape and
// the thread count, and the thread count is left at the library default
// (OPENBLAS_NUM_THREADS, else the core count), fixed for a process: repeated runs, and
// concurrent calls from several rank threads, give bit-identical results (checked with
// OpenBLAS 0.3.21: 200 concurrent 300x200x500 sgemms matched the serial one). Results
// do change in the last bits with the thread count (1 vs 2 threads differ on that
// shape), so bit-level figures are comparable only between runs with the same count.
#include <cblas.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/decoded_gemm.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {
namespace {

// Rounds every operand value to the input format of `cls` (no-op for fp32 and fp64).
void round_to_class(MathClass cls, std::vector<float>& v) {
  switch (cls) {
    case MathClass::kTf32:
      for (float& x : v) x = round_tf32(x);
      return;
    case MathClass::kBf16:
      for (float& x : v) x = round_to(DType::kBF16, x);
      return;
    case MathClass::kFp16:
      for (float& x : v) x = round_to(DType::kF16, x);
      return;
    case MathClass::kFp32:
    case MathClass::kFp64:
      return;
    case MathClass::kFp8:
    case MathClass::kFp8Block:
    case MathClass::kMxfp8:
    case MathClass::kNvfp4:
      return;  // quantized values times block scales: exact in f32 already
  }
}

// P = op(X)·op(Y), column-major [M, N] (leading dimension M), beta = 0: the problem in
// the one canonical form the front end gives every engine (GemmProblem::col).
// Batches one after another; alpha scales the product before any epilogue, as cuBLASLt's
// alpha does.
std::vector<float> blas_product(const GemmProblem& problem, const std::vector<float>& x,
                                const std::vector<float>& y) {
  const GemmProblem::ColumnMajor& g = problem.col;
  std::vector<float> p(static_cast<std::size_t>(problem.batch * g.m * g.n), 0.0f);
  if (g.m == 0 || g.n == 0 || g.k == 0) return p;
  for (std::int64_t i = 0; i < problem.batch; ++i) {
    cblas_sgemm(CblasColMajor, g.trans_x ? CblasTrans : CblasNoTrans,
                g.trans_y ? CblasTrans : CblasNoTrans, static_cast<int>(g.m),
                static_cast<int>(g.n), static_cast<int>(g.k), static_cast<float>(problem.alpha),
                x.data() + i * g.stride_x, static_cast<int>(g.ldx), y.data() + i * g.stride_y,
                static_cast<int>(g.ldy), 0.0f, p.data() + i * g.stride_d,
                static_cast<int>(g.ldd));
  }
  return p;
}

std::vector<double> blas_product(const GemmProblem& problem, const std::vector<double>& x,
                                 const std::vector<double>& y) {
  const GemmProblem::ColumnMajor& g = problem.col;
  std::vector<double> p(static_cast<std::size_t>(problem.batch * g.m * g.n), 0.0);
  if (g.m == 0 || g.n == 0 || g.k == 0) return p;
  for (std::int64_t i = 0; i < problem.batch; ++i) {
    cblas_dgemm(CblasColMajor, g.trans_x ? CblasTrans : CblasNoTrans,
                g.trans_y ? CblasTrans : CblasNoTrans, static_cast<int>(g.m),
                static_cast<int>(g.n), static_cast<int>(g.k), problem.alpha,
                x.data() + i * g.stride_x, static_cast<int>(g.ldx), y.data() + i * g.stride_y,
                static_cast<int>(g.ldy), 0.0, p.data() + i * g.stride_d,
                static_cast<int>(g.ldd));
  }
  return p;
}

// The epilogue on the accumulator P (row-major [m, n] memory, which is the column-major
// [n, m] result), before the one rounding to C's dtype: + bias, then gelu (storing the
// pre-activation, rounded to the aux dtype, into aux) or times gelu'(aux).
template <typename Real>
void apply_epilogue(const GemmEpilogue& e, std::int64_t n, std::vector<Real>& p) {
  if (e.bias != nullptr) {
    const std::vector<Real> bias = cpu::load<Real>(*e.bias);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] += bias[i % n];
  }
  switch (e.activation) {
    case GemmEpilogue::Activation::kNone:
      return;
    case GemmEpilogue::Activation::kGelu:
      cpu::store(p, *e.aux);
      for (Real& v : p) v = cpu::gelu_tanh(v).value;
      return;
    case GemmEpilogue::Activation::kDgelu: {
      const std::vector<Real> pre = cpu::load<Real>(*e.aux);
      for (std::size_t i = 0; i < p.size(); ++i) p[i] *= cpu::gelu_tanh(pre[i]).grad;
      return;
    }
  }
}

// C = P or C += P, rounded once to C's dtype. The sum is formed in f32 unless C or P is
// f64 (a GPU epilogue adds beta·C in its compute type).
template <typename Real>
void write_result(const std::vector<Real>& p, Tensor& c, bool accumulate) {
  if (!accumulate) {
    cpu::store(p, c);
    return;
  }
  if (c.dtype() == DType::kF64 || sizeof(Real) == sizeof(double)) {
    std::vector<double> sum = c.to_f64();
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<double>(p[i]);
    cpu::store(sum, c);
  } else {
    std::vector<float> sum = c.to_f32();
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<float>(p[i]);
    cpu::store(sum, c);
  }
}

std::string implementation_text(MathClass cls) {
  switch (cls) {
    case MathClass::kFp64:
      return "openblas dgemm, f64 inputs, f64 accumulation";
    case MathClass::kFp32:
      return "openblas sgemm, f32 inputs, f32 accumulation";
    case MathClass::kTf32:
      return "openblas sgemm, inputs rounded to tf32, f32 accumulation";
    case MathClass::kBf16:
      return "openblas sgemm, inputs rounded to bf16, f32 accumulation";
    case MathClass::kFp16:
      return "openblas sgemm, inputs rounded to fp16, f32 accumulation";
    case MathClass::kFp8:
      return "openblas sgemm on exactly dequantized fp8 values (per-tensor scales in alpha), "
             "f32 accumulation";
    case MathClass::kFp8Block:
      return "openblas sgemm on exactly dequantized fp8 values (power-of-two block scales), "
             "f32 accumulation";
    case MathClass::kMxfp8:
      return "openblas sgemm on exactly dequantized mxfp8 values (e8m0 block scales), f32 "
             "accumulation";
    case MathClass::kNvfp4:
      return "openblas sgemm on exactly dequantized nvfp4 values (e4m3 block scales; global "
             "scales in alpha), f32 accumulation";
  }
  return "";
}

}  // namespace

void CpuBackend::run_gemm(const GemmProblem& p, GemmRecord& record) {
  const MathClass cls = p.math_class;
  if (cls == MathClass::kFp64) {
    std::vector<double> product = blas_product(p, p.col.x->to_f64(), p.col.y->to_f64());
    apply_epilogue(p.epilogue, p.n, product);
    write_result(product, *p.c, p.accumulate);
  } else {
    std::vector<float> x = cpu::load<float>(*p.col.x);
    std::vector<float> y = cpu::load<float>(*p.col.y);
    round_to_class(cls, x);
    round_to_class(cls, y);
    std::vector<float> product = blas_product(p, x, y);
    apply_epilogue(p.epilogue, p.n, product);
    write_result(product, *p.c, p.accumulate);
  }
  record.math_class = cls;
  record.implementation = implementation_text(cls);
}

// Quantized operands: each copy is turned into its exact f32 values (quantized value times
// block scale_inv: a power of two, or an E4M3 times an E2M1 significand, so no rounding),
// and the TN product C = alpha · A' B'ᵀ runs through the same f32 path as an fp32 GEMM:
// sgemm's f32 accumulation, alpha applied by sgemm to the accumulated sum, the epilogue,
// one rounding to C. This is the exact-dequantization model of an FP8 GEMM with f32
// accumulation; Hopper's FP8 tensor cores accumulate differently (the forward GEMM's
// "fast accumulation" keeps fewer accumulator bits between promotions), which is not
// modelled bit for bit (docs/QUANTIZATION.md).
void CpuBackend::run_gemm_quantized(const QuantizedGemmProblem& q, GemmRecord& record) {
  const Tensor a = quantized_values(*q.a, q.a_columnwise).values;  // [m, k]
  const Tensor b = quantized_values(*q.b, q.b_columnwise).values;  // [n, k]
  const GemmProblem p = decoded_gemm_problem(q, a, b, *q.c, q.math_class);
  run_gemm(p, record);
  // Hopper's FP8 fast accumulation is not modelled bit for bit (docs/QUANTIZATION.md).
  if (q.fast_accumulation) record.implementation += "; fast accumulation asked for, exact f32 here";
}

}  // namespace tpcheck

// gemm.cpp — CpuBackend::gemm: the one entry point of every CPU GEMM, emulating the GPU
// math classes on top of OpenBLAS and recording each call in the ledger.
//
// How a class is emulated (the class comes from Backend::choose_math_class):
//   fp64       operands in f64, cblas_dgemm (f64 accumulation);
//   fp32       operands in f32, cblas_sgemm (f32 accumulation);
//   tf32       operands loaded to f32, each rounded to TF32 (round_tf32, nearest even),
//              then cblas_sgemm: the products of TF32 values are exact in f32, so this is
//              the tensor-core result up to the order of the f32 accumulation;
//   bf16/fp16  operands rounded to bf16/f16 (values kept in f32), cblas_sgemm.
// The product P = op(A)·op(B) is computed first (beta = 0); with `accumulate` C's stored
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

#include <climits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// A tensor viewed as a row-major matrix [rows, last dim].
struct MatrixView {
  std::int64_t rows = 0, cols = 0;
};

MatrixView as_matrix(std::string_view site, std::string_view operand, const Tensor& t) {
  TPCHECK_CHECK_INPUT(t.defined(), "GEMM '{}': operand {} is undefined", site, operand);
  TPCHECK_CHECK_INPUT(t.device() == Device::kCpu, "GEMM '{}': operand {} ({}) is not on the CPU",
                      site, operand, t.describe());
  TPCHECK_CHECK_INPUT(t.rank() >= 2,
                      "GEMM '{}': operand {} is {}; expected a matrix (rank >= 2, viewed as "
                      "[rows, last dim])",
                      site, operand, t.describe());
  const std::int64_t cols = t.dim(-1);
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

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
  }
}

// P[m, n] = op(A)·op(B) with BLAS (row-major, beta = 0).
std::vector<float> blas_product(const std::vector<float>& a, bool trans_a,
                                const std::vector<float>& b, bool trans_b, int m, int n, int k,
                                int lda, int ldb) {
  std::vector<float> p(static_cast<std::size_t>(m) * n, 0.0f);
  if (m == 0 || n == 0 || k == 0) return p;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a.data(), lda, b.data(), ldb,
              0.0f, p.data(), std::max(1, n));
  return p;
}

std::vector<double> blas_product(const std::vector<double>& a, bool trans_a,
                                 const std::vector<double>& b, bool trans_b, int m, int n, int k,
                                 int lda, int ldb) {
  std::vector<double> p(static_cast<std::size_t>(m) * n, 0.0);
  if (m == 0 || n == 0 || k == 0) return p;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0, a.data(), lda, b.data(), ldb, 0.0,
              p.data(), std::max(1, n));
  return p;
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
  }
  return "";
}

}  // namespace

void CpuBackend::gemm(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, Tensor& c, bool accumulate) {
  // Validate every shape before any work.
  const MatrixView av = as_matrix(site, "A", a);
  const MatrixView bv = as_matrix(site, "B", b);
  const MatrixView cv = as_matrix(site, "C", c);
  const std::int64_t m = trans_a ? av.cols : av.rows;
  const std::int64_t k = trans_a ? av.rows : av.cols;
  const std::int64_t kb = trans_b ? bv.cols : bv.rows;
  const std::int64_t n = trans_b ? bv.rows : bv.cols;
  TPCHECK_CHECK_INPUT(k == kb,
                      "GEMM '{}': inner dimensions differ: op(A) is [{}, {}] (A {}{}), op(B) is "
                      "[{}, {}] (B {}{}); expected equal K",
                      site, m, k, a.describe(), trans_a ? "^T" : "", kb, n, b.describe(),
                      trans_b ? "^T" : "");
  TPCHECK_CHECK_INPUT(cv.rows == m && cv.cols == n,
                      "GEMM '{}': C is {} (viewed as [{}, {}]); expected [{}, {}] = op(A) {}{} · "
                      "op(B) {}{}",
                      site, c.describe(), cv.rows, cv.cols, m, n, a.describe(), trans_a ? "^T" : "",
                      b.describe(), trans_b ? "^T" : "");
  TPCHECK_CHECK_INPUT(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
                      "GEMM '{}': m={} n={} k={} exceeds the BLAS index range", site, m, n, k);

  const MathClass cls = choose_math_class(a.dtype(), b.dtype(), k);
  const int lda = static_cast<int>(std::max<std::int64_t>(1, av.cols));
  const int ldb = static_cast<int>(std::max<std::int64_t>(1, bv.cols));
  if (cls == MathClass::kFp64) {
    const std::vector<double> p =
        blas_product(a.to_f64(), trans_a, b.to_f64(), trans_b, static_cast<int>(m),
                     static_cast<int>(n), static_cast<int>(k), lda, ldb);
    write_result(p, c, accumulate);
  } else {
    std::vector<float> av32 = cpu::load<float>(a);
    std::vector<float> bv32 = cpu::load<float>(b);
    round_to_class(cls, av32);
    round_to_class(cls, bv32);
    const std::vector<float> p = blas_product(av32, trans_a, bv32, trans_b, static_cast<int>(m),
                                              static_cast<int>(n), static_cast<int>(k), lda, ldb);
    write_result(p, c, accumulate);
  }

  GemmRecord record;
  record.site = std::string(site);
  record.m = m;
  record.n = n;
  record.k = k;
  record.trans_a = trans_a;
  record.trans_b = trans_b;
  record.accumulate = accumulate;
  record.a_dtype = a.dtype();
  record.b_dtype = b.dtype();
  record.c_dtype = c.dtype();
  record.math_class = cls;
  record.implementation = implementation_text(cls);
  ledger_.add(std::move(record));
}

}  // namespace tpcheck

// cpu_backend.cpp — the factory for the reference CPU backend. The ops themselves live
// in one file per op (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace tpcheck {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

void set_cpu_gemm_threads(int threads) { openblas_set_num_threads(threads); }
int cpu_gemm_threads() { return openblas_get_num_threads(); }
std::string cpu_gemm_library() { return openblas_get_config(); }

namespace {

// FNV-1a over the result's bytes.
void hash_bytes(std::uint64_t& h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
}

// Operand i of a fingerprint GEMM: spread over [-1, 1] with most values inexact in binary,
// so every product and partial sum rounds.
template <typename T>
std::vector<T> operand(int count, unsigned salt) {
  std::vector<T> v(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    const unsigned x = (static_cast<unsigned>(i) + salt) * 2654435761u;
    v[static_cast<std::size_t>(i)] = static_cast<T>(static_cast<int>(x % 2001u) - 1000) / T(997);
  }
  return v;
}

}  // namespace

std::string cpu_gemm_fingerprint() {
  struct Shape {
    int m, n, k;
    bool trans_a, trans_b;
  };
  // The suite's GEMM shapes and transposes (forward, dgrad, wgrad at hidden 128/256,
  // 64 tokens) and one odd shape for the kernels' edge paths.
  const Shape shapes[] = {{64, 128, 128, false, true},  {64, 128, 128, false, false},
                          {128, 128, 64, true, false},  {16, 64, 32, false, true},
                          {128, 256, 256, false, true}, {33, 17, 257, false, false}};
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  std::uint64_t h = 1469598103934665603ull;
  for (const Shape& s : shapes) {
    const auto ta = s.trans_a ? CblasTrans : CblasNoTrans;
    const auto tb = s.trans_b ? CblasTrans : CblasNoTrans;
    const int lda = s.trans_a ? s.k : s.m, ldb = s.trans_b ? s.n : s.k;
    {
      const auto a = operand<float>(s.m * s.k, 1), b = operand<float>(s.k * s.n, 2);
      std::vector<float> c(static_cast<std::size_t>(s.m) * s.n);
      cblas_sgemm(CblasColMajor, ta, tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                  c.data(), s.m);
      hash_bytes(h, c.data(), c.size() * sizeof(float));
    }
    {
      const auto a = operand<double>(s.m * s.k, 3), b = operand<double>(s.k * s.n, 4);
      std::vector<double> c(static_cast<std::size_t>(s.m) * s.n);
      cblas_dgemm(CblasColMajor, ta, tb, s.m, s.n, s.k, 1.0, a.data(), lda, b.data(), ldb, 0.0,
                  c.data(), s.m);
      hash_bytes(h, c.data(), c.size() * sizeof(double));
    }
  }
  openblas_set_num_threads(threads);
  return fmt::format("{:016x}", h);
}

}  // namespace tpcheck

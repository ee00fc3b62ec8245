// column_reduce.cuh — deterministic column sums over rows: the parameter gradients of
// bias.cu (dbias += Σ_rows dy) and norm.cu (dgamma += Σ_rows dy·x̂, dbeta += Σ_rows dy).
//
// Two passes, no atomics, so the bits are the same on every run:
//   1. column_partials_kernel: block (column tile of 32, row chunk c) sums its chunk's rows
//      for its 32 columns (8 row lanes, each summing rows lane, lane + 8, ... in order;
//      then the 8 lane sums in lane order) into partials[c, term, col]. A warp reads 32
//      consecutive columns of one row. column_partials_vec_kernel does the same sums with
//      V columns a thread and 16-byte loads (f32 math on f32/f16/bf16 inputs whose rows
//      allow it): the same order per column, the same bits.
//   2. column_accumulate_kernel: param[j] += Σ_c partials[c, term, j] (chunks in order),
//      added in f64 when param or the math type is f64 (else f32) and rounded once to
//      param's dtype — the CPU's accumulate_param rule.
// The chunk size depends only on the number of rows, never on the device, so the
// summation order (and the result) is a function of the shape alone.
//
// Buffers (math type Real = f32, or f64 for f64 inputs):
//   dy, x     [rows, n]               any kernel dtype (x only for the norm terms)
//   mean      [rows] Real             (LayerNorm only)      rstd [rows] Real (norm terms)
//   partials  [chunks, terms, n] Real (temporary, from the caching allocator)
// Thread safety: one rank at a time, on the calling thread's stream.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"
#include "tpcheck/tensor.h"

namespace tpcheck::cuda {

enum class ColumnTerms {
  kSum,             // term 0: Σ_rows dy                       (bias gradient)
  kNormScale,       // term 0: Σ_rows dy·x̂, x̂ = x·rstd          (RMSNorm dgamma)
  kNormScaleShift,  // term 0: Σ_rows dy·x̂, x̂ = (x − mean)·rstd; term 1: Σ_rows dy
                    //                                          (LayerNorm dgamma, dbeta)
};

constexpr int column_term_count(ColumnTerms t) { return t == ColumnTerms::kNormScaleShift ? 2 : 1; }

constexpr int kColumnTile = 32;          // columns per block (threadIdx.x)
constexpr int kRowLanes = 8;             // row lanes per block (threadIdx.y)
constexpr long long kChunkRows = 256;    // rows per block (blockIdx.y), at least
constexpr long long kMaxChunks = 65535;  // gridDim.y limit

template <typename Real, ColumnTerms kTerms>
__global__ void __launch_bounds__(kColumnTile* kRowLanes)
    column_partials_kernel(const void* __restrict__ dy, DType dy_dtype, const void* __restrict__ x,
                           DType x_dtype, const Real* __restrict__ mean,
                           const Real* __restrict__ rstd, Real* __restrict__ partials,
                           long long rows, long long n, long long chunk_rows) {
  constexpr int kCount = column_term_count(kTerms);
  __shared__ Real lane_sums[kCount][kRowLanes][kColumnTile];
  const long long col = static_cast<long long>(blockIdx.x) * kColumnTile + threadIdx.x;
  const long long first = static_cast<long long>(blockIdx.y) * chunk_rows;
  const long long last = first + chunk_rows < rows ? first + chunk_rows : rows;
  Real acc[kCount];
  for (int c = 0; c < kCount; ++c) acc[c] = Real(0);
  if (col < n) {
    for (long long r = first + threadIdx.y; r < last; r += kRowLanes) {
      const long long i = r * n + col;
      const Real g = load_as<Real>(dy, dy_dtype, i);
      if constexpr (kTerms == ColumnTerms::kSum) {
        acc[0] += g;
      } else {
        const Real mu = kTerms == ColumnTerms::kNormScaleShift ? mean[r] : Real(0);
        const Real xhat = (load_as<Real>(x, x_dtype, i) - mu) * rstd[r];
        acc[0] += g * xhat;
        if constexpr (kCount == 2) acc[1] += g;
      }
    }
  }
  for (int c = 0; c < kCount; ++c) lane_sums[c][threadIdx.y][threadIdx.x] = acc[c];
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    for (int c = 0; c < kCount; ++c) {
      Real s = Real(0);
      for (int k = 0; k < kRowLanes; ++k) s += lane_sums[c][k][threadIdx.x];
      partials[(static_cast<long long>(blockIdx.y) * kCount + c) * n + col] = s;
    }
  }
}

// The same partial sums with V consecutive columns a thread, read as one 16-byte access of
// T (dy, and x for the norm terms, both of storage type T): thread (x, lane) owns columns
// c0 + x·V ... + V − 1 and sums each over rows first + lane, first + lane + kRowLanes, ...
// in order, then the lane sums in lane order — per column exactly column_partials_kernel's
// order and arithmetic, so the partials (and pass 2's result) have the same bits, with a
// warp reading 512 contiguous bytes of a row instead of 32 scattered elements.
// REQUIRES: V divides n; dy and x aligned to V·sizeof(T).
template <typename T, ColumnTerms kTerms, int V>
__global__ void __launch_bounds__(kColumnTile* kRowLanes)
    column_partials_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                               const float* __restrict__ mean, const float* __restrict__ rstd,
                               float* __restrict__ partials, long long rows, long long n,
                               long long chunk_rows) {
  constexpr int kCount = column_term_count(kTerms);
  struct alignas(sizeof(T) * V) Pack {
    T v[V];
  };
  __shared__ float lane_sums[kCount][kRowLanes][kColumnTile * V];
  const long long c0 = static_cast<long long>(blockIdx.x) * kColumnTile * V + threadIdx.x * V;
  const long long first = static_cast<long long>(blockIdx.y) * chunk_rows;
  const long long last = first + chunk_rows < rows ? first + chunk_rows : rows;
  float acc[kCount][V];
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
#pragma unroll
    for (int e = 0; e < V; ++e) acc[c][e] = 0.0f;
  }
  if (c0 < n) {
    for (long long r = first + threadIdx.y; r < last; r += kRowLanes) {
      const long long i = r * n + c0;
      const Pack g = *reinterpret_cast<const Pack*>(dy + i);
      if constexpr (kTerms == ColumnTerms::kSum) {
#pragma unroll
        for (int e = 0; e < V; ++e) acc[0][e] += to_real(g.v[e]);
      } else {
        const float mu = kTerms == ColumnTerms::kNormScaleShift ? mean[r] : 0.0f;
        const float rs = rstd[r];
        const Pack xv = *reinterpret_cast<const Pack*>(x + i);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float ge = to_real(g.v[e]);
          const float xhat = (to_real(xv.v[e]) - mu) * rs;
          acc[0][e] += ge * xhat;
          if constexpr (kCount == 2) acc[1][e] += ge;
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
#pragma unroll
    for (int e = 0; e < V; ++e) lane_sums[c][threadIdx.y][threadIdx.x * V + e] = acc[c][e];
  }
  __syncthreads();
  if (threadIdx.y == 0 && c0 < n) {
#pragma unroll
    for (int c = 0; c < kCount; ++c) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float sum = 0.0f;
        for (int k = 0; k < kRowLanes; ++k) sum += lane_sums[c][k][threadIdx.x * V + e];
        partials[(static_cast<long long>(blockIdx.y) * kCount + c) * n + c0 + e] = sum;
      }
    }
  }
}

template <typename P, typename Real>
__global__ void column_accumulate_kernel(P* __restrict__ param, const Real* __restrict__ partials,
                                         int term, int count, long long chunks, long long n) {
  using Acc =
      std::conditional_t<std::is_same_v<P, double> || std::is_same_v<Real, double>, double, float>;
  for (long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    Real s = Real(0);
    for (long long c = 0; c < chunks; ++c) s += partials[(c * count + term) * n + j];
    param[j] = from_real<P>(static_cast<Acc>(to_real(param[j])) + static_cast<Acc>(s));
  }
}

// One column reduction of [rows, n] inputs: partials() launches pass 1, accumulate_into()
// pass 2 for one term. REQUIRES: inputs already validated (GPU tensors, kernel dtypes,
// shapes), mean/rstd of dtype `math`.
class ColumnReduce {
 public:
  ColumnReduce(ColumnTerms terms, DType math, long long rows, long long n)
      : terms_(terms), math_(math), rows_(rows), n_(n) {
    TPCHECK_CHECK(math == DType::kF32 || math == DType::kF64, "ColumnReduce: math dtype {}",
                  dtype_name(math));
    chunk_rows_ = kChunkRows;
    if ((rows + chunk_rows_ - 1) / chunk_rows_ > kMaxChunks) {
      chunk_rows_ = (rows + kMaxChunks - 1) / kMaxChunks;
    }
    chunks_ = (rows + chunk_rows_ - 1) / chunk_rows_;
    if (chunks_ > 0 && n > 0) {
      partials_ = Tensor({static_cast<std::int64_t>(chunks_ * column_term_count(terms) * n)}, math,
                         Device::kCuda);
    }
  }

  // Pass 1 over dy (and x, mean, rstd for the norm terms; pass undefined tensors otherwise).
  void partials(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd) {
    if (chunks_ == 0 || n_ == 0) return;
    if (math_ == DType::kF64) {
      launch<double>(dy, x, mean, rstd);
    } else {
      launch<float>(dy, x, mean, rstd);
    }
  }

  // For a fused kernel that computes pass 1 itself (bias_gelu.cu): the chunking, and the
  // [chunks, terms, n] buffer it must fill exactly as column_partials_kernel would (the
  // same rows per chunk, lanes and order, so pass 2 gives the same bits).
  long long chunk_rows() const { return chunk_rows_; }
  long long chunks() const { return chunks_; }
  Tensor& partials_buffer() { return partials_; }

  // Pass 2: param[j] += Σ_chunks partials[term][j], rounded once to param's dtype.
  // REQUIRES: param is a [n] GPU tensor of a kernel dtype.
  void accumulate_into(int term, Tensor& param) {
    if (n_ == 0) return;
    TPCHECK_DISPATCH_FLOAT(param.dtype(), "parameter gradient", P, {
      if (math_ == DType::kF64) {
        accumulate<P, double>(term, param);
      } else {
        accumulate<P, float>(term, param);
      }
    });
  }

 private:
  // The vectorized pass 1 (column_partials_vec_kernel) for f32 math on dy (and x) of one
  // storage type T, when V divides n and the rows are 16-byte aligned; false otherwise.
  template <typename T>
  bool launch_vectorized(const Tensor& dy, const Tensor& x, const Tensor& mean,
                         const Tensor& rstd) {
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const bool norm = terms_ != ColumnTerms::kSum;
    if (n_ % V != 0 || reinterpret_cast<std::uintptr_t>(dy.raw()) % 16 != 0) return false;
    if (norm && (x.dtype() != dy.dtype() || reinterpret_cast<std::uintptr_t>(x.raw()) % 16 != 0)) {
      return false;
    }
    const dim3 block(kColumnTile, kRowLanes);
    const long long tile = static_cast<long long>(kColumnTile) * V;
    const dim3 grid(static_cast<unsigned>((n_ + tile - 1) / tile), static_cast<unsigned>(chunks_));
    const auto* dy_p = static_cast<const T*>(dy.raw());
    const auto* x_p = norm ? static_cast<const T*>(x.raw()) : nullptr;
    const float* mean_p = mean.defined() ? static_cast<const float*>(mean.raw()) : nullptr;
    const float* rstd_p = rstd.defined() ? static_cast<const float*>(rstd.raw()) : nullptr;
    auto* out = static_cast<float*>(partials_.raw());
    switch (terms_) {
      case ColumnTerms::kSum:
        column_partials_vec_kernel<T, ColumnTerms::kSum, V><<<grid, block, 0, current_stream()>>>(
            dy_p, x_p, mean_p, rstd_p, out, rows_, n_, chunk_rows_);
        break;
      case ColumnTerms::kNormScale:
        column_partials_vec_kernel<T, ColumnTerms::kNormScale, V>
            <<<grid, block, 0, current_stream()>>>(dy_p, x_p, mean_p, rstd_p, out, rows_, n_,
                                                   chunk_rows_);
        break;
      case ColumnTerms::kNormScaleShift:
        column_partials_vec_kernel<T, ColumnTerms::kNormScaleShift, V>
            <<<grid, block, 0, current_stream()>>>(dy_p, x_p, mean_p, rstd_p, out, rows_, n_,
                                                   chunk_rows_);
        break;
    }
    TPCHECK_LAUNCH_CHECK();
    return true;
  }

  template <typename Real>
  void launch(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd) {
    if constexpr (std::is_same_v<Real, float>) {
      bool done = false;
      switch (dy.dtype()) {
        case DType::kF32: done = launch_vectorized<float>(dy, x, mean, rstd); break;
        case DType::kF16: done = launch_vectorized<__half>(dy, x, mean, rstd); break;
        case DType::kBF16: done = launch_vectorized<__nv_bfloat16>(dy, x, mean, rstd); break;
        default: break;
      }
      if (done) return;
    }
    const dim3 block(kColumnTile, kRowLanes);
    const dim3 grid(static_cast<unsigned>((n_ + kColumnTile - 1) / kColumnTile),
                    static_cast<unsigned>(chunks_));
    const void* x_ptr = x.defined() ? x.raw() : nullptr;
    const DType x_dtype = x.defined() ? x.dtype() : DType::kF32;
    const Real* mean_ptr = mean.defined() ? static_cast<const Real*>(mean.raw()) : nullptr;
    const Real* rstd_ptr = rstd.defined() ? static_cast<const Real*>(rstd.raw()) : nullptr;
    Real* out = static_cast<Real*>(partials_.raw());
    switch (terms_) {
      case ColumnTerms::kSum:
        column_partials_kernel<Real, ColumnTerms::kSum><<<grid, block, 0, current_stream()>>>(
            dy.raw(), dy.dtype(), x_ptr, x_dtype, mean_ptr, rstd_ptr, out, rows_, n_, chunk_rows_);
        break;
      case ColumnTerms::kNormScale:
        column_partials_kernel<Real, ColumnTerms::kNormScale><<<grid, block, 0, current_stream()>>>(
            dy.raw(), dy.dtype(), x_ptr, x_dtype, mean_ptr, rstd_ptr, out, rows_, n_, chunk_rows_);
        break;
      case ColumnTerms::kNormScaleShift:
        column_partials_kernel<Real, ColumnTerms::kNormScaleShift>
            <<<grid, block, 0, current_stream()>>>(dy.raw(), dy.dtype(), x_ptr, x_dtype, mean_ptr,
                                                   rstd_ptr, out, rows_, n_, chunk_rows_);
        break;
    }
    TPCHECK_LAUNCH_CHECK();
  }

  template <typename P, typename Real>
  void accumulate(int term, Tensor& param) {
    const Real* partials = chunks_ > 0 ? static_cast<const Real*>(partials_.raw()) : nullptr;
    column_accumulate_kernel<P, Real><<<grid_for(n_), 256, 0, current_stream()>>>(
        static_cast<P*>(param.raw()), partials, term, column_term_count(terms_), chunks_, n_);
    TPCHECK_LAUNCH_CHECK();
  }

  ColumnTerms terms_;
  DType math_;
  long long rows_, n_;
  long long chunk_rows_ = kChunkRows;
  long long chunks_ = 0;
  Tensor partials_;
};

}  // namespace tpcheck::cuda

// bias_gelu.cu — CudaBackend::bias_gelu_forward / bias_gelu_backward: LayerNormMLP's
// bias + gelu in one kernel per pass, with the bits of Backend's composition
// (src/backend/bias_gelu.cpp) on this backend:
//   forward   y[r, j] = round_T(gelu(pre)), pre = round_R(h[r, j] + bias[j])   one pass
//   backward  dpre = da · gelu'(pre) in R; dh = round_T(dpre); the column partials of
//             dpre in ColumnReduce's order (column_reduce.cuh), then its pass 2 adds them
//             into dbias                                                     one pass + pass 2
// R = f32 (f64 for f64). The same scalar functions as activation.cu (activation_math.cuh)
// and the same additions as add_bias and the column reduction, so tests/gpu compares the
// two paths bit for bit. The composition's intermediate R tensors (pre, gelu(pre), dpre:
// 4 bytes an element each, written and read again) are what the fusion saves: on
// LayerNormMLP's fc1 output the traffic drops from ~12 to ~3 bytes an element per pass.
//
// Kernels: vectorized where the row length and the pointers allow (V elements per
// access, V·sizeof(T) ≤ 16 bytes), else one element per access; a thread of the backward
// owns V consecutive columns and sums them over its rows exactly as a thread of
// column_partials_kernel sums one column (per column the order is unchanged).
//
// Buffers (rows = numel / n):
//   h, da, y, dh   [rows, n]  T      bias [n] any kernel dtype (or none)
//   partials       [chunks, n] R     dbias [n] any kernel dtype (accumulated)
// Thread safety: see cuda_backend.h.
#include <initializer_list>
#include <optional>

#include "backend/cuda/activation_math.cuh"
#include "backend/cuda/column_reduce.cuh"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename Real>
__device__ __forceinline__ Real bias_at(const void* bias, DType dtype, long long j) {
  return bias == nullptr ? Real(0) : load_as<Real>(bias, dtype, j);
}

// a·b rounded once, never contracted into a following addition: the composition stores
// dpre (rounded) before the column sum reads it.
__device__ __forceinline__ float mul_rounded(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rounded(double a, double b) { return __dmul_rn(a, b); }

// pre = round_R(h + b) as add_bias computes it on an R tensor (no bias: h widened).
template <typename Real>
__device__ __forceinline__ Real pre_activation(Real h, const void* bias, DType dtype,
                                               long long j) {
  return bias == nullptr ? h : h + load_as<Real>(bias, dtype, j);
}

template <typename T, int V>
__global__ void bias_gelu_forward_kernel(const T* __restrict__ h, const void* __restrict__ bias,
                                         DType bias_dtype, T* __restrict__ y, long long packs,
                                         long long n) {
  using Real = ComputeType<T>;
  const Pack<T, V>* in = reinterpret_cast<const Pack<T, V>*>(h);
  Pack<T, V>* out = reinterpret_cast<Pack<T, V>*>(y);
  for (long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += static_cast<long long>(gridDim.x) * blockDim.x) {
    const Pack<T, V> x = in[p];
    const long long j0 = (p * V) % n;  // V divides n: a pack never wraps a row
    Pack<T, V> r;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const Real pre = pre_activation(to_real(x.v[e]), bias, bias_dtype, j0 + e);
      r.v[e] = from_real<T>(gelu_tanh(pre).value);
    }
    out[p] = r;
  }
}

// Block (kColumnTile, kRowLanes) over V·kColumnTile columns and one chunk of rows (blockIdx.y):
// thread (x, lane) owns columns c0 + x·V ... + V − 1 and sums rows first + lane,
// first + lane + kRowLanes, ... in order; the kRowLanes lane sums are then added in lane
// order — column_partials_kernel's order for each column.
template <typename T, int V>
__global__ void __launch_bounds__(kColumnTile* kRowLanes)
    bias_gelu_backward_kernel(const T* __restrict__ da, const T* __restrict__ h,
                              const void* __restrict__ bias, DType bias_dtype, T* __restrict__ dh,
                              ComputeType<T>* __restrict__ partials, long long rows, long long n,
                              long long chunk_rows) {
  using Real = ComputeType<T>;
  __shared__ Real lane_sums[kRowLanes][kColumnTile * V];
  const long long c0 = static_cast<long long>(blockIdx.x) * kColumnTile * V + threadIdx.x * V;
  const long long first = static_cast<long long>(blockIdx.y) * chunk_rows;
  const long long last = first + chunk_rows < rows ? first + chunk_rows : rows;
  Real acc[V];
  Real b[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    acc[e] = Real(0);
    b[e] = c0 + e < n ? bias_at<Real>(bias, bias_dtype, c0 + e) : Real(0);
  }
  if (c0 < n) {  // V divides n (or V = 1): the whole pack is inside the row
#pragma unroll 4
    for (long long r = first + threadIdx.y; r < last; r += kRowLanes) {
      const long long i = r * n + c0;
      const Pack<T, V> g = *reinterpret_cast<const Pack<T, V>*>(da + i);
      const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(h + i);
      Pack<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const Real pre = bias == nullptr ? to_real(x.v[e]) : to_real(x.v[e]) + b[e];
        const Real dpre = mul_rounded(to_real(g.v[e]), gelu_tanh(pre).grad);
        out.v[e] = from_real<T>(dpre);
        acc[e] += dpre;
      }
      *reinterpret_cast<Pack<T, V>*>(dh + i) = out;
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) lane_sums[threadIdx.y][threadIdx.x * V + e] = acc[e];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < n && partials != nullptr) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      Real s = Real(0);
      for (int k = 0; k < kRowLanes; ++k) s += lane_sums[k][threadIdx.x * V + e];
      partials[static_cast<long long>(blockIdx.y) * n + c0 + e] = s;
    }
  }
}

// Whether the forward takes kWideV<T> elements per access (n and every pointer allow it);
// else it takes 1.
template <typename T>
bool can_vectorize(long long n, std::initializer_list<const void*> pointers) {
  constexpr int V = kWideV<T>;
  if (n % V != 0) return false;
  for (const void* p : pointers) {
    if (!aligned_to(p, sizeof(T) * V)) return false;
  }
  return true;
}

template <typename T>
void launch_forward(const Tensor& h, const Tensor& bias, Tensor& y) {
  const long long n = h.dim(-1);
  const T* hp = static_cast<const T*>(h.raw());
  T* yp = static_cast<T*>(y.raw());
  const void* bp = bias.defined() ? bias.raw() : nullptr;
  const DType bd = bias.defined() ? bias.dtype() : DType::kF32;
  if (can_vectorize<T>(n, {hp, yp})) {
    constexpr int V = kWideV<T>;
    const long long packs = h.numel() / V;
    bias_gelu_forward_kernel<T, V>
        <<<grid_for(packs, kThreads), kThreads, 0, current_stream()>>>(hp, bp, bd, yp, packs, n);
  } else {
    bias_gelu_forward_kernel<T, 1><<<grid_for(h.numel(), kThreads), kThreads, 0,
                                     current_stream()>>>(hp, bp, bd, yp, h.numel(), n);
  }
  TPCHECK_LAUNCH_CHECK();
}

template <typename T, int V>
void launch_backward_kernel(const Tensor& da, const Tensor& h, const Tensor& bias, Tensor& dh,
                            ColumnReduce* reduce, long long rows, long long n) {
  using Real = ComputeType<T>;
  const long long chunk_rows = reduce != nullptr ? reduce->chunk_rows() : kChunkRows;
  long long chunks = (rows + chunk_rows - 1) / chunk_rows;
  TPCHECK_CHECK(chunks <= kMaxChunks, "bias_gelu_backward: {} row chunks exceed the grid", chunks);
  Real* partials =
      reduce != nullptr ? static_cast<Real*>(reduce->partials_buffer().raw()) : nullptr;
  const long long tile = static_cast<long long>(kColumnTile) * V;
  const dim3 grid(static_cast<unsigned>((n + tile - 1) / tile), static_cast<unsigned>(chunks));
  bias_gelu_backward_kernel<T, V><<<grid, dim3(kColumnTile, kRowLanes), 0, current_stream()>>>(
      static_cast<const T*>(da.raw()), static_cast<const T*>(h.raw()),
      bias.defined() ? bias.raw() : nullptr, bias.defined() ? bias.dtype() : DType::kF32,
      static_cast<T*>(dh.raw()), partials, rows, n, chunk_rows);
  TPCHECK_LAUNCH_CHECK();
}

template <typename T>
void launch_backward(const Tensor& da, const Tensor& h, const Tensor& bias, Tensor& dh,
                     Tensor& dbias) {
  const long long n = h.dim(-1);
  const long long rows = h.numel() / n;
  std::optional<ColumnReduce> reduce;
  if (bias.defined()) reduce.emplace(ColumnTerms::kSum, math_dtype_of(h.dtype()), rows, n);
  ColumnReduce* r = reduce ? &*reduce : nullptr;
  constexpr int V = kWideV<T> < 4 ? kWideV<T> : 4;  // 4 columns a thread: 256 threads, 128 columns
  if (n % V == 0 && aligned_to(da.raw(), sizeof(T) * V) && aligned_to(h.raw(), sizeof(T) * V) &&
      aligned_to(dh.raw(), sizeof(T) * V)) {
    launch_backward_kernel<T, V>(da, h, bias, dh, r, rows, n);
  } else {
    launch_backward_kernel<T, 1>(da, h, bias, dh, r, rows, n);
  }
  if (r != nullptr) r->accumulate_into(0, dbias);
}

void check_inputs(const char* op, const Tensor& h, const Tensor& bias) {
  check_cuda_operand(op, "h", h);
  if (bias.defined()) check_cuda_operand(op, "bias", bias);
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::bias_gelu_forward(const Tensor& h, const Tensor& bias) {
  if (!h.defined() || h.rank() < 1 || h.numel() == 0 ||
      (bias.defined() && (bias.rank() != 1 || bias.dim(0) != h.dim(-1)))) {
    return Backend::bias_gelu_forward(h, bias);  // its checks name the problem
  }
  cuda::check_inputs("bias_gelu_forward", h, bias);
  Tensor y = Tensor::empty(h.shape(), h.dtype(), Device::kCuda);
  TPCHECK_DISPATCH_FLOAT(h.dtype(), "bias_gelu_forward", T, cuda::launch_forward<T>(h, bias, y));
  return y;
}

Tensor CudaBackend::bias_gelu_backward(const Tensor& da, const Tensor& h, const Tensor& bias,
                                       Tensor& dbias) {
  if (!h.defined() || h.rank() < 1 || h.numel() == 0 || !da.defined() ||
      da.shape() != h.shape() || da.dtype() != h.dtype() ||
      (bias.defined() && (bias.rank() != 1 || bias.dim(0) != h.dim(-1)))) {
    // Mixed dtypes (the fused kernel reads da and h as one T) and every error case: the
    // composition, whose checks name the problem.
    return Backend::bias_gelu_backward(da, h, bias, dbias);
  }
  cuda::check_inputs("bias_gelu_backward", h, bias);
  cuda::check_cuda_operand("bias_gelu_backward", "da", da);
  if (bias.defined()) {
    cuda::check_cuda_operand("bias_gelu_backward", "dbias", dbias);
    TPCHECK_CHECK_INPUT(dbias.rank() == 1 && dbias.dim(0) == h.dim(-1),
                        "bias_gelu_backward: dbias is {}; expected [{}]", dbias.describe(),
                        h.dim(-1));
  }
  Tensor dh(h.shape(), h.dtype(), Device::kCuda);
  TPCHECK_DISPATCH_FLOAT(h.dtype(), "bias_gelu_backward", T,
                         cuda::launch_backward<T>(da, h, bias, dh, dbias));
  return dh;
}

}  // namespace tpcheck

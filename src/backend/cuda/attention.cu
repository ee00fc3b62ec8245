// attention.cu — the CUDA attention primitives, twins of src/backend/cpu/attention.cpp:
// layout changes between the layers' [s, b, n, d] and the heads-major [b·h, s, d] the
// batched GEMMs take (expanding GQA groups on the way in, summing them on the way back),
// and the masked softmax with its backward. Backend::attention_forward /
// attention_backward (src/backend/composed_attention.cpp) compose them with the GEMM front end,
// whose CUDA engine is gemm.cu (cuBLASLt), so attention's six products are ledger GEMMs
// and follow the class rule (TF32 for f32 when the rule says so).
//
// Kernels (T = storage type, R = ComputeType<T>: double for double, float otherwise):
//   heads_in_kernel         out [b·h, s, d] T ← x [s, b, n, d] T, head i ← x head i/(h/n);
//                           grid-stride, one thread per output element, a plain copy
//   heads_out_kernel        out [s, b, g, d] T ← Σ_{r < h/g} x [b·h, s, d] T, in R, in the
//                           CPU's order (r ascending), one rounding; grid-stride
//   softmax_forward_kernel  probs [rows, s_k] R ← scores [rows, s_k] T; one block per row
//                           (row = (b·h)·s_q + i, query i); block max over allowed keys,
//                           then Σ exp(x − max), then exp(x − max) / Σ; 0 at masked keys;
//                           a row with no allowed key all 0
//   softmax_backward_kernel dS [rows, s_k] T ← probs R, dP T; one block per row:
//                           dot = Σ dP·P (block reduction), dS = P (dP − dot), one rounding
// Numerics against the CPU twin: the layouts are bit-identical (copies; the group sum in
// the same order); the softmax differs only in reduction order (tree vs left to right),
// in expf/exp (CUDA's are within 2 / 1 ulp, glibc's correctly rounded or nearly) and in
// FMA contraction of the backward's dot product: a few ulp of R per probability.
// Block reductions: warp shuffles, then the warp partials read in warp order by every
// thread — deterministic for a given block size (chosen from s_k only).
// Rows of up to 16 · 256 keys take the *_cached_kernel twins, which hold the row in
// registers (one read of each input, one write of each output); longer rows stream.
// Thread safety: kernels on the backend's stream; one rank (thread) at a time.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
namespace {

// AttentionMask in a form kernels can take by value.
struct MaskArgs {
  int type;  // 0 no mask, 1 causal, 2 sliding window
  long long left, right;
};

MaskArgs mask_args(const AttentionMask& m) {
  MaskArgs a{0, m.window_left, m.window_right};
  switch (m.type) {
    case AttentionMask::Type::kNoMask: a.type = 0; break;
    case AttentionMask::Type::kCausal: a.type = 1; break;
    case AttentionMask::Type::kSlidingWindow: a.type = 2; break;
  }
  return a;
}

// AttentionMask::allows, on the device.
__device__ __forceinline__ bool mask_allows(const MaskArgs& m, long long query, long long key) {
  if (m.type == 1) return key <= query && (m.left < 0 || key >= query - m.left);
  if (m.type == 2) {
    return (m.left < 0 || key >= query - m.left) && (m.right < 0 || key <= query + m.right);
  }
  return true;
}

__device__ __forceinline__ float real_exp(float x) { return expf(x); }
__device__ __forceinline__ double real_exp(double x) { return exp(x); }

struct MaxOp {
  template <typename R>
  __device__ R operator()(R a, R b) const { return a < b ? b : a; }  // std::max(a, b)
};
struct SumOp {
  template <typename R>
  __device__ R operator()(R a, R b) const { return a + b; }
};

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `partials` holds 32 values; the call begins and ends with a barrier,
// so it may be called again right away.
template <typename R, typename Op>
__device__ R block_reduce(R v, Op op, R* partials) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  R r = partials[0];
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int w = 1; w < warps; ++w) r = op(r, partials[w]);
  __syncthreads();
  return r;
}

template <typename T>
__global__ void heads_in_kernel(T* __restrict__ out, const T* __restrict__ x, long long s,
                                long long b, long long n, long long heads, long long d,
                                long long total) {
  const long long per_group = heads / n;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long e = idx % d;
    long long r = idx / d;
    const long long i = r % s;
    r /= s;
    const long long hh = r % heads;
    const long long bb = r / heads;
    out[idx] = x[((i * b + bb) * n + hh / per_group) * d + e];
  }
}

template <typename T>
__global__ void heads_out_kernel(T* __restrict__ out, const T* __restrict__ x, long long s,
                                 long long batch, long long groups, long long heads, long long d,
                                 long long total) {
  using R = ComputeType<T>;
  const long long per_group = heads / groups;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long e = idx % d;
    long long r = idx / d;
    const long long g = r % groups;
    r /= groups;
    const long long bb = r % batch;
    const long long i = r / batch;
    R sum = 0;
    for (long long k = 0; k < per_group; ++k) {
      sum += to_real(x[((bb * heads + g * per_group + k) * s + i) * d + e]);
    }
    out[idx] = from_real<T>(sum);
  }
}

template <typename T>
__global__ void softmax_forward_kernel(ComputeType<T>* __restrict__ probs,
                                       const T* __restrict__ scores, long long sq, long long sk,
                                       MaskArgs mask) {
  using R = ComputeType<T>;
  __shared__ R partials[32];
  const long long row = blockIdx.x;
  const long long query = row % sq;
  const T* in = scores + row * sk;
  R* out = probs + row * sk;

  R max = -INFINITY;
  for (long long j = threadIdx.x; j < sk; j += blockDim.x) {
    if (mask_allows(mask, query, j)) max = MaxOp{}(max, to_real(in[j]));
  }
  max = block_reduce(max, MaxOp{}, partials);
  if (max == static_cast<R>(-INFINITY)) {  // no key allowed (the same for every thread)
    for (long long j = threadIdx.x; j < sk; j += blockDim.x) out[j] = R(0);
    return;
  }
  R sum = 0;
  for (long long j = threadIdx.x; j < sk; j += blockDim.x) {
    const R e = mask_allows(mask, query, j) ? real_exp(to_real(in[j]) - max) : R(0);
    out[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, SumOp{}, partials);
  for (long long j = threadIdx.x; j < sk; j += blockDim.x) out[j] = out[j] / sum;
}

template <typename T>
__global__ void softmax_backward_kernel(T* __restrict__ ds, const T* __restrict__ dp,
                                        const ComputeType<T>* __restrict__ probs, long long sk) {
  using R = ComputeType<T>;
  __shared__ R partials[32];
  const long long row = blockIdx.x;
  const T* dp_row = dp + row * sk;
  const R* p_row = probs + row * sk;
  T* ds_row = ds + row * sk;
  R dot = 0;
  for (long long j = threadIdx.x; j < sk; j += blockDim.x) dot += to_real(dp_row[j]) * p_row[j];
  dot = block_reduce(dot, SumOp{}, partials);
  for (long long j = threadIdx.x; j < sk; j += blockDim.x) {
    ds_row[j] = from_real<T>(p_row[j] * (to_real(dp_row[j]) - dot));
  }
}

// The same two softmax kernels with the row held in registers: thread t owns keys t,
// t + blockDim.x, ..., t + (E − 1)·blockDim.x, so each input is read once and each output
// written once (the kernels above read the scores twice and write, read and write the
// probabilities again: ~2.7× the traffic). Same arithmetic per element; the row sums add
// each thread's E values first, then the block reduction.
template <typename T, int E>
__global__ void softmax_forward_cached_kernel(ComputeType<T>* __restrict__ probs,
                                              const T* __restrict__ scores, long long sq,
                                              long long sk, MaskArgs mask) {
  using R = ComputeType<T>;
  __shared__ R partials[32];
  const long long row = blockIdx.x;
  const long long query = row % sq;
  const T* in = scores + row * sk;
  R* out = probs + row * sk;
  R v[E];
  bool allowed[E];
  R max = -INFINITY;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const long long j = threadIdx.x + static_cast<long long>(e) * blockDim.x;
    allowed[e] = j < sk && mask_allows(mask, query, j);
    v[e] = allowed[e] ? to_real(in[j]) : R(0);
    if (allowed[e]) max = MaxOp{}(max, v[e]);
  }
  max = block_reduce(max, MaxOp{}, partials);
  R sum = 0;
  if (max != static_cast<R>(-INFINITY)) {  // else no key allowed: the row is all 0
#pragma unroll
    for (int e = 0; e < E; ++e) {
      v[e] = allowed[e] ? real_exp(v[e] - max) : R(0);
      sum += v[e];
    }
    sum = block_reduce(sum, SumOp{}, partials);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const long long j = threadIdx.x + static_cast<long long>(e) * blockDim.x;
    if (j < sk) out[j] = max == static_cast<R>(-INFINITY) ? R(0) : v[e] / sum;
  }
}

template <typename T, int E>
__global__ void softmax_backward_cached_kernel(T* __restrict__ ds, const T* __restrict__ dp,
                                               const ComputeType<T>* __restrict__ probs,
                                               long long sk) {
  using R = ComputeType<T>;
  __shared__ R partials[32];
  const long long row = blockIdx.x;
  const T* dp_row = dp + row * sk;
  const R* p_row = probs + row * sk;
  T* ds_row = ds + row * sk;
  R g[E], p[E];
  R dot = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const long long j = threadIdx.x + static_cast<long long>(e) * blockDim.x;
    g[e] = j < sk ? to_real(dp_row[j]) : R(0);
    p[e] = j < sk ? p_row[j] : R(0);
    dot += g[e] * p[e];
  }
  dot = block_reduce(dot, SumOp{}, partials);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const long long j = threadIdx.x + static_cast<long long>(e) * blockDim.x;
    if (j < sk) ds_row[j] = from_real<T>(p[e] * (g[e] - dot));
  }
}

// Threads per row for the softmax kernels: s_k rounded up to whole warps, at most 256.
unsigned row_block(long long sk) {
  long long b = (sk + 31) / 32 * 32;
  if (b < 32) b = 32;
  if (b > 256) b = 256;
  return static_cast<unsigned>(b);
}

// Keys per thread of the cached kernels (a power of two, at most kMaxCached), or 0 when a
// row is longer than kMaxCached · 256 keys (the streaming kernels then).
constexpr int kMaxCached = 16;
int cached_keys_per_thread(long long sk, unsigned block) {
  for (int e = 1; e <= kMaxCached; e *= 2) {
    if (sk <= static_cast<long long>(e) * block) return e;
  }
  return 0;
}

// Runs F<E> for the run-time E of cached_keys_per_thread (1, 2, 4, 8, 16).
#define TPCHECK_DISPATCH_CACHED(e, E, ...)             \
  switch (e) {                                         \
    case 1: { constexpr int E = 1; __VA_ARGS__; break; }   \
    case 2: { constexpr int E = 2; __VA_ARGS__; break; }   \
    case 4: { constexpr int E = 4; __VA_ARGS__; break; }   \
    case 8: { constexpr int E = 8; __VA_ARGS__; break; }   \
    default: { constexpr int E = 16; __VA_ARGS__; break; } \
  }

std::string describe_or_undefined(const Tensor& t) {
  return t.defined() ? t.describe() : std::string("an undefined tensor");
}

void check_device_tensor(const char* op, const Tensor& t, int rank) {
  TPCHECK_CHECK_INPUT(t.defined() && t.rank() == rank && t.device() == Device::kCuda,
                      "{}: expected a rank-{} GPU tensor, got {}", op, rank,
                      describe_or_undefined(t));
}

// Rows of a softmax launch: one block each.
void check_rows(const char* op, long long rows) {
  TPCHECK_CHECK_INPUT(rows <= INT_MAX, "{}: {} softmax rows exceed the grid limit {}", op, rows,
                      INT_MAX);
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::attention_heads_in(const Tensor& x, std::int64_t heads) {
  cuda::check_device_tensor("attention_heads_in", x, 4);
  const long long s = x.dim(0), b = x.dim(1), n = x.dim(2), d = x.dim(3);
  TPCHECK_CHECK_INPUT(n >= 1 && heads >= n && heads % n == 0,
                      "attention_heads_in: {} heads cannot be expanded to {} heads", n, heads);
  Tensor out({b * heads, s, d}, x.dtype(), Device::kCuda);
  const long long total = out.numel();
  if (total == 0) return out;
  TPCHECK_DISPATCH_FLOAT(x.dtype(), "attention_heads_in", T, {
    cuda::heads_in_kernel<T><<<cuda::grid_for(total), 256, 0, stream_>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), s, b, n, heads, d, total);
    TPCHECK_LAUNCH_CHECK();
  });
  return out;
}

Tensor CudaBackend::attention_heads_out(const Tensor& x, std::int64_t batch, std::int64_t groups) {
  cuda::check_device_tensor("attention_heads_out", x, 3);
  TPCHECK_CHECK_INPUT(batch >= 1 && x.dim(0) % batch == 0 && groups >= 1 &&
                          (x.dim(0) / batch) % groups == 0,
                      "attention_heads_out: {} is not [batch {} · heads, s, d] with heads a "
                      "multiple of {} groups",
                      x.describe(), batch, groups);
  const long long heads = x.dim(0) / batch, s = x.dim(1), d = x.dim(2);
  Tensor out({s, batch, groups, d}, x.dtype(), Device::kCuda);
  const long long total = out.numel();
  if (total == 0) return out;
  TPCHECK_DISPATCH_FLOAT(x.dtype(), "attention_heads_out", T, {
    cuda::heads_out_kernel<T><<<cuda::grid_for(total), 256, 0, stream_>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), s, batch, groups, heads, d,
        total);
    TPCHECK_LAUNCH_CHECK();
  });
  return out;
}

Tensor CudaBackend::attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) {
  cuda::check_device_tensor("attention_softmax_forward", scores, 3);
  const DType pt = scores.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor probs(scores.shape(), pt, Device::kCuda);
  const long long sq = scores.dim(1), sk = scores.dim(2), rows = scores.dim(0) * sq;
  if (rows == 0 || sk == 0) return probs;
  cuda::check_rows("attention_softmax_forward", rows);
  const cuda::MaskArgs m = cuda::mask_args(mask);
  const unsigned block = cuda::row_block(sk);
  TPCHECK_DISPATCH_FLOAT(scores.dtype(), "attention_softmax_forward", T, {
    using R = cuda::ComputeType<T>;
    R* out = static_cast<R*>(probs.raw());
    const T* in = static_cast<const T*>(scores.raw());
    if (const int e = cuda::cached_keys_per_thread(sk, block); e > 0) {
      TPCHECK_DISPATCH_CACHED(e, E,
          cuda::softmax_forward_cached_kernel<T, E>
              <<<static_cast<unsigned>(rows), block, 0, stream_>>>(out, in, sq, sk, m));
    } else {
      cuda::softmax_forward_kernel<T><<<static_cast<unsigned>(rows), block, 0, stream_>>>(
          out, in, sq, sk, m);
    }
    TPCHECK_LAUNCH_CHECK();
  });
  return probs;
}

Tensor CudaBackend::attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) {
  cuda::check_device_tensor("attention_softmax_backward", dprobs, 3);
  const DType pt = dprobs.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  TPCHECK_CHECK_INPUT(probs.defined() && probs.device() == Device::kCuda &&
                          probs.numel() == dprobs.numel() && probs.dtype() == pt,
                      "attention_softmax_backward: probs must be {} with {} values on the GPU "
                      "(dprobs {}), got {}",
                      dtype_name(pt), dprobs.numel(), dprobs.describe(),
                      cuda::describe_or_undefined(probs));
  Tensor ds(dprobs.shape(), dprobs.dtype(), Device::kCuda);
  const long long sk = dprobs.dim(2), rows = dprobs.dim(0) * dprobs.dim(1);
  if (rows == 0 || sk == 0) return ds;
  cuda::check_rows("attention_softmax_backward", rows);
  const unsigned block = cuda::row_block(sk);
  TPCHECK_DISPATCH_FLOAT(dprobs.dtype(), "attention_softmax_backward", T, {
    using R = cuda::ComputeType<T>;
    T* out = static_cast<T*>(ds.raw());
    const T* dp = static_cast<const T*>(dprobs.raw());
    const R* p = static_cast<const R*>(probs.raw());
    if (const int e = cuda::cached_keys_per_thread(sk, block); e > 0) {
      TPCHECK_DISPATCH_CACHED(e, E,
          cuda::softmax_backward_cached_kernel<T, E>
              <<<static_cast<unsigned>(rows), block, 0, stream_>>>(out, dp, p, sk));
    } else {
      cuda::softmax_backward_kernel<T><<<static_cast<unsigned>(rows), block, 0, stream_>>>(
          out, dp, p, sk);
    }
    TPCHECK_LAUNCH_CHECK();
  });
  return ds;
}

}  // namespace tpcheck

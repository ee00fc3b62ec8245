// norm.cu — CudaBackend::norm_forward / norm_backward: LayerNorm and RMSNorm over the
// last dimension (twin of cpu/norm.cpp, same formulas).
//
// x is viewed as [rows, n]. With s = gamma (or 1 + gamma when zero_centered_gamma):
//   LayerNorm: mean = Σx/n, var = Σ(x − mean)²/n, rstd = 1/√(var + eps),
//              x̂ = (x − mean)·rstd, y = x̂·s + beta
//   RMSNorm:   rstd = 1/√(Σx²/n + eps), x̂ = x·rstd, y = x̂·s
// Backward, with g = dy·s:
//   LayerNorm: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), dgamma += Σ_rows dy·x̂, dbeta += Σ_rows dy
//   RMSNorm:   dx = rstd·(g − x̂·mean(g·x̂)),           dgamma += Σ_rows dy·x̂
// Math in f32 (f64 for f64 x); y and dx rounded once to x's dtype; mean and rstd saved in
// the math type (f32, f64 for f64 x); dgamma/dbeta accumulated by the deterministic
// column reduction (column_reduce.cuh) and rounded once into their own dtype.
//
// Kernels: one block per row (forward: two-pass mean and variance, as the CPU; backward
// dx: the row sums Σg and Σg·x̂ by block_sum); block reductions have a fixed order, so
// every result is bit-reproducible. Two variants of each:
//   held rows (the common case: f32/f16/bf16 x with gamma and beta of x's dtype, dy of
//     x's dtype, n a multiple of V = 16 / sizeof(T) up to 4·512·V, 16-byte aligned
//     buffers): each thread loads K vectors of V elements once (16-byte loads) and keeps
//     them in registers for both passes and the output — x read once, y written once;
//   element loop (everything else: f64, odd n, other dtypes, views off 16 bytes): a warp
//     reads consecutive elements, x read again from L1/L2 for each pass.
// The two sum a row in different orders (each a function of n and the dtype only), so
// their bits differ in the last place; one shape always takes the same variant.
//
// Buffers (rows = numel / n, Real = the math type):
//   x, y, dx   [rows, n]  T = x's storage type    dy [rows, n] any kernel dtype
//   gamma, beta, dgamma, dbeta [n] any kernel dtype
//   mean, rstd [rows] Real (a saved statistic of another dtype is cast to Real first)
// Thread safety: see cuda_backend.h.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/column_reduce.cuh"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
namespace {

// Threads per row: a function of n only (so the reduction order is too).
unsigned norm_threads(long long n) {
  if (n >= 4096) return 512;
  if (n >= 1024) return 256;
  return 128;
}

// The scale applied to x̂ at column j: gamma[j], or 1 + gamma[j] (added in Real, as the CPU).
template <typename Real>
__device__ __forceinline__ Real scale_at(const void* gamma, DType gamma_dtype, long long j,
                                         bool zero_centered) {
  const Real s = load_as<Real>(gamma, gamma_dtype, j);
  return zero_centered ? s + Real(1) : s;
}

template <typename T>
__global__ void norm_forward_kernel(const T* __restrict__ x, const void* __restrict__ gamma,
                                    DType gamma_dtype, const void* __restrict__ beta,
                                    DType beta_dtype, T* __restrict__ y,
                                    ComputeType<T>* __restrict__ mean_out,
                                    ComputeType<T>* __restrict__ rstd_out, long long n,
                                    ComputeType<T> eps, bool layer_norm, bool zero_centered) {
  using Real = ComputeType<T>;
  __shared__ Real scratch[32];
  const long long row = blockIdx.x;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  Real mu = Real(0);
  if (layer_norm) {
    Real sum = Real(0);
    for (long long j = threadIdx.x; j < n; j += blockDim.x) sum += to_real(xr[j]);
    mu = block_sum(sum, scratch) / static_cast<Real>(n);
  }
  Real sq = Real(0);
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {
    const Real d = to_real(xr[j]) - mu;
    sq += d * d;
  }
  const Real rs = Real(1) / real_sqrt(block_sum(sq, scratch) / static_cast<Real>(n) + eps);
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {
    Real v = (to_real(xr[j]) - mu) * rs * scale_at<Real>(gamma, gamma_dtype, j, zero_centered);
    if (layer_norm) v += load_as<Real>(beta, beta_dtype, j);
    yr[j] = from_real<T>(v);
  }
  if (threadIdx.x == 0) {
    if (layer_norm) mean_out[row] = mu;
    rstd_out[row] = rs;
  }
}

template <typename T>
__global__ void norm_backward_kernel(const void* __restrict__ dy, DType dy_dtype,
                                     const T* __restrict__ x, const void* __restrict__ gamma,
                                     DType gamma_dtype, const ComputeType<T>* __restrict__ mean,
                                     const ComputeType<T>* __restrict__ rstd, T* __restrict__ dx,
                                     long long n, bool layer_norm, bool zero_centered) {
  using Real = ComputeType<T>;
  __shared__ Real scratch[32];
  const long long row = blockIdx.x;
  const long long base = row * n;
  const Real mu = layer_norm ? mean[row] : Real(0);
  const Real rs = rstd[row];
  Real g_sum = Real(0), gx_sum = Real(0);
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {
    const Real xhat = (to_real(x[base + j]) - mu) * rs;
    const Real g = load_as<Real>(dy, dy_dtype, base + j) *
                   scale_at<Real>(gamma, gamma_dtype, j, zero_centered);
    g_sum += g;
    gx_sum += g * xhat;
  }
  g_sum = block_sum(g_sum, scratch);
  gx_sum = block_sum(gx_sum, scratch);
  const Real g_mean = layer_norm ? g_sum / static_cast<Real>(n) : Real(0);
  const Real gx_mean = gx_sum / static_cast<Real>(n);
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {
    const Real xhat = (to_real(x[base + j]) - mu) * rs;
    const Real g = load_as<Real>(dy, dy_dtype, base + j) *
                   scale_at<Real>(gamma, gamma_dtype, j, zero_centered);
    dx[base + j] = from_real<T>(rs * (g - g_mean - xhat * gx_mean));
  }
}

// ---- held rows --------------------------------------------------------------------------

// V elements of T in one 16-byte access.
template <typename T>
constexpr int kHeldV = 16 / static_cast<int>(sizeof(T));

template <typename T>
struct alignas(16) HeldPack {
  T v[kHeldV<T>];
};

// Thread t of the row's block holds vectors t, t + blockDim.x, ... (K of them; those past
// the row's end are zeros and masked out), so a warp's loads are consecutive 16-byte words.
constexpr int kHeldMaxThreads = 512;

template <typename T, int K>
__global__ void __launch_bounds__(kHeldMaxThreads) norm_forward_held_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                         const T* __restrict__ beta, T* __restrict__ y,
                                         float* __restrict__ mean_out,
                                         float* __restrict__ rstd_out, long long n, float eps,
                                         bool layer_norm, bool zero_centered) {
  constexpr int V = kHeldV<T>;
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const long long vectors = n / V;
  const auto* xr = reinterpret_cast<const HeldPack<T>*>(x + row * n);
  auto* yr = reinterpret_cast<HeldPack<T>*>(y + row * n);
  float v[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const long long idx = threadIdx.x + static_cast<long long>(k) * blockDim.x;
    if (idx < vectors) {
      const HeldPack<T> p = xr[idx];
#pragma unroll
      for (int e = 0; e < V; ++e) v[k][e] = to_real(p.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) v[k][e] = 0.0f;
    }
  }
  float mu = 0.0f;
  if (layer_norm) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) sum += v[k][e];
    }
    mu = block_sum(sum, scratch) / static_cast<float>(n);
  }
  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const long long idx = threadIdx.x + static_cast<long long>(k) * blockDim.x;
    if (idx < vectors) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = v[k][e] - mu;
        sq += d * d;
      }
    }
  }
  const float rs = 1.0f / real_sqrt(block_sum(sq, scratch) / static_cast<float>(n) + eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const long long idx = threadIdx.x + static_cast<long long>(k) * blockDim.x;
    if (idx >= vectors) continue;
    const HeldPack<T> g = reinterpret_cast<const HeldPack<T>*>(gamma)[idx];
    HeldPack<T> b{};
    if (layer_norm) b = reinterpret_cast<const HeldPack<T>*>(beta)[idx];
    HeldPack<T> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float s = zero_centered ? to_real(g.v[e]) + 1.0f : to_real(g.v[e]);
      float r = (v[k][e] - mu) * rs * s;
      if (layer_norm) r += to_real(b.v[e]);
      out.v[e] = from_real<T>(r);
    }
    yr[idx] = out;
  }
  if (threadIdx.x == 0) {
    if (layer_norm) mean_out[row] = mu;
    rstd_out[row] = rs;
  }
}

template <typename T, int K>
__global__ void __launch_bounds__(kHeldMaxThreads) norm_backward_held_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          const T* __restrict__ gamma,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, T* __restrict__ dx,
                                          long long n, bool layer_norm, bool zero_centered) {
  constexpr int V = kHeldV<T>;
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const long long vectors = n / V;
  const float mu = layer_norm ? mean[row] : 0.0f;
  const float rs = rstd[row];
  const auto* xr = reinterpret_cast<const HeldPack<T>*>(x + row * n);
  const auto* dyr = reinterpret_cast<const HeldPack<T>*>(dy + row * n);
  float xhat[K][V], g[K][V];
  float g_sum = 0.0f, gx_sum = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const long long idx = threadIdx.x + static_cast<long long>(k) * blockDim.x;
    if (idx < vectors) {
      const HeldPack<T> xp = xr[idx], dp = dyr[idx];
      const HeldPack<T> gp = reinterpret_cast<const HeldPack<T>*>(gamma)[idx];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float s = zero_centered ? to_real(gp.v[e]) + 1.0f : to_real(gp.v[e]);
        xhat[k][e] = (to_real(xp.v[e]) - mu) * rs;
        g[k][e] = to_real(dp.v[e]) * s;
        g_sum += g[k][e];
        gx_sum += g[k][e] * xhat[k][e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) xhat[k][e] = g[k][e] = 0.0f;
    }
  }
  g_sum = block_sum(g_sum, scratch);
  gx_sum = block_sum(gx_sum, scratch);
  const float g_mean = layer_norm ? g_sum / static_cast<float>(n) : 0.0f;
  const float gx_mean = gx_sum / static_cast<float>(n);
  auto* dxr = reinterpret_cast<HeldPack<T>*>(dx + row * n);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const long long idx = threadIdx.x + static_cast<long long>(k) * blockDim.x;
    if (idx >= vectors) continue;
    HeldPack<T> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      out.v[e] = from_real<T>(rs * (g[k][e] - g_mean - xhat[k][e] * gx_mean));
    }
    dxr[idx] = out;
  }
}

// The held-rows shape of a row of n elements: K vectors a thread and `threads` threads (a
// multiple of 32, at most 512), or K = 0 when the row does not fit (n > 4 · 512 · V:
// 16384 bf16 elements). K stops at 4: the backward holds 2·K·V floats a thread, and at
// K = 8 (168 registers for bf16) 512 threads would not fit an SM's register file.
struct HeldShape {
  int k = 0;
  unsigned threads = 0;
};

template <typename T>
HeldShape held_shape(long long n) {
  const long long vectors = n / kHeldV<T>;
  for (int k : {1, 2, 4}) {
    const long long threads = ((vectors + k - 1) / k + 31) / 32 * 32;
    if (threads <= kHeldMaxThreads) return {k, static_cast<unsigned>(threads)};
  }
  return {};
}

// Calls launch(std::integral_constant<int, K>{}) with held_shape's k (1, 2 or 4) as the
// compile-time K that the held-rows kernels size their registers by.
template <typename Launch>
void with_held_k(int k, const Launch& launch) {
  if (k == 1) launch(std::integral_constant<int, 1>{});
  else if (k == 2) launch(std::integral_constant<int, 2>{});
  else launch(std::integral_constant<int, 4>{});
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Whether the held-rows kernels take this norm (the file comment's conditions).
template <typename T>
bool takes_held_rows(long long n, std::initializer_list<const Tensor*> same_dtype,
                     std::initializer_list<const void*> pointers) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    if (n % kHeldV<T> != 0 || held_shape<T>(n).k == 0) return false;
    for (const Tensor* t : same_dtype) {
      if (t->dtype() != dtype_of<T>()) return false;
    }
    for (const void* p : pointers) {
      if (!aligned16(p)) return false;
    }
    return true;
  }
}

template <typename T>
void launch_norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         double eps, bool zero_centered, NormForward& out) {
  using Real = ComputeType<T>;
  const long long n = x.dim(-1);
  const long long rows = x.numel() / n;
  const bool layer_norm = kind == NormKind::kLayerNorm;
  TPCHECK_CHECK(rows <= 0x7fffffffLL, "norm_forward: {} rows exceed the grid limit", rows);
  Real* mean = layer_norm ? static_cast<Real*>(out.mean.raw()) : nullptr;
  Real* rstd = static_cast<Real*>(out.rstd.raw());
  if constexpr (!std::is_same_v<T, double>) {
    const bool held =
        layer_norm
            ? takes_held_rows<T>(n, {&gamma, &beta}, {x.raw(), out.y.raw(), gamma.raw(), beta.raw()})
            : takes_held_rows<T>(n, {&gamma}, {x.raw(), out.y.raw(), gamma.raw()});
    if (held) {
      const HeldShape shape = held_shape<T>(n);
      const auto* xp = static_cast<const T*>(x.raw());
      const auto* gp = static_cast<const T*>(gamma.raw());
      const auto* bp = layer_norm ? static_cast<const T*>(beta.raw()) : nullptr;
      auto* yp = static_cast<T*>(out.y.raw());
      const auto grid = static_cast<unsigned>(rows);
      const auto e = static_cast<float>(eps);
      const auto launch = [&](auto k) {
        norm_forward_held_kernel<T, decltype(k)::value>
            <<<grid, shape.threads, 0, current_stream()>>>(xp, gp, bp, yp, mean, rstd, n, e,
                                                           layer_norm, zero_centered);
      };
      with_held_k(shape.k, launch);
      TPCHECK_LAUNCH_CHECK();
      return;
    }
  }
  norm_forward_kernel<T><<<static_cast<unsigned>(rows), norm_threads(n), 0, current_stream()>>>(
      static_cast<const T*>(x.raw()), gamma.raw(), gamma.dtype(), layer_norm ? beta.raw() : nullptr,
      layer_norm ? beta.dtype() : DType::kF32, static_cast<T*>(out.y.raw()), mean, rstd, n,
      static_cast<Real>(eps), layer_norm, zero_centered);
  TPCHECK_LAUNCH_CHECK();
}

template <typename T>
void launch_norm_backward(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                          const Tensor& mean, const Tensor& rstd, bool zero_centered, Tensor& dx) {
  using Real = ComputeType<T>;
  const long long n = x.dim(-1);
  const long long rows = x.numel() / n;
  const bool layer_norm = kind == NormKind::kLayerNorm;
  TPCHECK_CHECK(rows <= 0x7fffffffLL, "norm_backward: {} rows exceed the grid limit", rows);
  const Real* mean_p = layer_norm ? static_cast<const Real*>(mean.raw()) : nullptr;
  const Real* rstd_p = static_cast<const Real*>(rstd.raw());
  if constexpr (!std::is_same_v<T, double>) {
    if (takes_held_rows<T>(n, {&dy, &gamma}, {dy.raw(), x.raw(), gamma.raw(), dx.raw()})) {
      const HeldShape shape = held_shape<T>(n);
      const auto* dyp = static_cast<const T*>(dy.raw());
      const auto* xp = static_cast<const T*>(x.raw());
      const auto* gp = static_cast<const T*>(gamma.raw());
      auto* dxp = static_cast<T*>(dx.raw());
      const auto grid = static_cast<unsigned>(rows);
      const auto launch = [&](auto k) {
        norm_backward_held_kernel<T, decltype(k)::value>
            <<<grid, shape.threads, 0, current_stream()>>>(dyp, xp, gp, mean_p, rstd_p, dxp, n,
                                                           layer_norm, zero_centered);
      };
      with_held_k(shape.k, launch);
      TPCHECK_LAUNCH_CHECK();
      return;
    }
  }
  norm_backward_kernel<T><<<static_cast<unsigned>(rows), norm_threads(n), 0, current_stream()>>>(
      dy.raw(), dy.dtype(), static_cast<const T*>(x.raw()), gamma.raw(), gamma.dtype(), mean_p,
      rstd_p, static_cast<T*>(dx.raw()), n, layer_norm, zero_centered);
  TPCHECK_LAUNCH_CHECK();
}

// ---- validation (the CPU's checks and messages, then the GPU's) ------------------------

// The shared checks (backend.cpp), then the GPU's: every operand on the GPU.
void check_param(NormKind kind, std::string_view what, const Tensor& x, const Tensor& p) {
  check_norm_param(kind, what, x, p);
  check_cuda_operand(norm_kind_name(kind), what, p);
}

void check_input(NormKind kind, const Tensor& x) {
  check_norm_input(kind, x);
  check_cuda_operand(norm_kind_name(kind), "x", x);
}

// A saved statistic as the math type `math` (cast on the GPU when saved in another dtype).
Tensor as_math(NormKind kind, std::string_view what, const Tensor& t, DType math) {
  check_cuda_operand(norm_kind_name(kind), what, t);
  return t.dtype() == math ? t : t.to(math);
}

}  // namespace
}  // namespace cuda

NormForward CudaBackend::norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma,
                                      const Tensor& beta, double eps, bool zero_centered_gamma) {
  cuda::check_input(kind, x);
  cuda::check_param(kind, "gamma", x, gamma);
  if (kind == NormKind::kLayerNorm) cuda::check_param(kind, "beta", x, beta);
  TPCHECK_CHECK_INPUT(eps >= 0, "{}: eps = {}; expected eps >= 0", norm_kind_name(kind), eps);
  const std::int64_t rows = x.numel() / x.dim(-1);
  const DType math = cuda::math_dtype_of(x.dtype());
  NormForward out;
  out.y = Tensor::empty(x.shape(), x.dtype(), Device::kCuda);
  if (kind == NormKind::kLayerNorm) out.mean = Tensor({rows}, math, Device::kCuda);
  out.rstd = Tensor({rows}, math, Device::kCuda);
  if (rows == 0) return out;
  TPCHECK_DISPATCH_FLOAT(
      x.dtype(), "norm_forward", T,
      cuda::launch_norm_forward<T>(kind, x, gamma, beta, eps, zero_centered_gamma, out));
  return out;
}

Tensor CudaBackend::norm_backward(NormKind kind, const Tensor& dy, const Tensor& x,
                                  const Tensor& gamma, const NormForward& saved,
                                  bool zero_centered_gamma, Tensor& dgamma, Tensor& dbeta) {
  const bool layer_norm = kind == NormKind::kLayerNorm;
  cuda::check_input(kind, x);
  cuda::check_param(kind, "gamma", x, gamma);
  cuda::check_param(kind, "dgamma", x, dgamma);
  if (layer_norm && dbeta.defined()) cuda::check_param(kind, "dbeta", x, dbeta);
  TPCHECK_CHECK_INPUT(dy.defined() && dy.shape() == x.shape(),
                      "{}: dy is {}, x is {}; expected the same shape", norm_kind_name(kind),
                      dy.defined() ? dy.describe() : "undefined", x.describe());
  cuda::check_cuda_operand(norm_kind_name(kind), "dy", dy);
  const std::int64_t n = x.dim(-1);
  const std::int64_t rows = x.numel() / n;
  TPCHECK_CHECK_INPUT(saved.rstd.defined() && saved.rstd.numel() == rows &&
                          (!layer_norm || (saved.mean.defined() && saved.mean.numel() == rows)),
                      "{}: saved statistics do not match input {} ({} rows); expected the "
                      "NormForward of this input",
                      norm_kind_name(kind), x.describe(), rows);
  const DType math = cuda::math_dtype_of(x.dtype());
  const Tensor rstd = cuda::as_math(kind, "saved rstd", saved.rstd, math);
  const Tensor mean = layer_norm ? cuda::as_math(kind, "saved mean", saved.mean, math) : Tensor();

  Tensor dx(x.shape(), x.dtype(), Device::kCuda);
  if (rows > 0) {
    TPCHECK_DISPATCH_FLOAT(
        x.dtype(), "norm_backward", T,
        cuda::launch_norm_backward<T>(kind, dy, x, gamma, mean, rstd, zero_centered_gamma, dx));
  }
  cuda::ColumnReduce reduce(
      layer_norm ? cuda::ColumnTerms::kNormScaleShift : cuda::ColumnTerms::kNormScale, math, rows,
      n);
  reduce.partials(dy, x, mean, rstd);
  reduce.accumulate_into(0, dgamma);
  if (layer_norm && dbeta.defined()) reduce.accumulate_into(1, dbeta);
  return dx;
}

}  // namespace tpcheck

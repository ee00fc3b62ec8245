// bias_residual_add.cu — CudaBackend::bias_residual_add: TransformerLayer's residual join
// in one kernel, with the bits of Backend's composition (src/backend/bias_residual_add.cpp)
// on this backend:
//   y[r, j] = round_T((round_R(out[r, j] + bias[j])) + residual[r, j])
// R = f32 (f64 for f64): the same two additions in R as add_bias and accumulate (no
// multiplication, so no FMA contraction can change them) and one rounding to T. The
// composition moves ~20 bytes an element for a bf16 out (a cast to f32, the bias, the
// residual, a cast back: four kernels); this one reads out and residual and writes y,
// 6 bytes, once.
//
// Vectorized (16 bytes an access) where the row length and the pointers allow, else one
// element per access. Mixed dtypes (a residual of another dtype than out) take the
// composition.
//
// Buffers (rows = numel / n):
//   out, residual, y  [rows, n]  T      bias [n] any kernel dtype (or none)
// Thread safety: see cuda_backend.h.
#include <cstddef>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, int V>
__global__ void bias_residual_add_kernel(const T* __restrict__ out, const void* __restrict__ bias,
                                         DType bias_dtype, const T* __restrict__ residual,
                                         T* __restrict__ y, long long packs, long long n) {
  using Real = ComputeType<T>;
  const auto* o = reinterpret_cast<const Pack<T, V>*>(out);
  const auto* res = reinterpret_cast<const Pack<T, V>*>(residual);
  auto* dst = reinterpret_cast<Pack<T, V>*>(y);
  for (long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += static_cast<long long>(gridDim.x) * blockDim.x) {
    const Pack<T, V> a = o[p];
    const Pack<T, V> r = res[p];
    const long long j0 = (p * V) % n;  // V divides n: a pack never wraps a row
    Pack<T, V> result;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      Real v = to_real(a.v[e]);
      if (bias != nullptr) v = v + load_as<Real>(bias, bias_dtype, j0 + e);
      result.v[e] = from_real<T>(v + to_real(r.v[e]));
    }
    dst[p] = result;
  }
}

template <typename T>
void launch(const Tensor& out, const Tensor& bias, const Tensor& residual, Tensor& y) {
  const long long n = out.dim(-1);
  const T* op = static_cast<const T*>(out.raw());
  const T* rp = static_cast<const T*>(residual.raw());
  T* yp = static_cast<T*>(y.raw());
  const void* bp = bias.defined() ? bias.raw() : nullptr;
  const DType bd = bias.defined() ? bias.dtype() : DType::kF32;
  constexpr int V = kWideV<T>;
  constexpr std::size_t kBytes = sizeof(T) * V;
  if (n % V == 0 && aligned_to(op, kBytes) && aligned_to(rp, kBytes) && aligned_to(yp, kBytes)) {
    const long long packs = out.numel() / V;
    bias_residual_add_kernel<T, V><<<grid_for(packs, kThreads), kThreads, 0, current_stream()>>>(
        op, bp, bd, rp, yp, packs, n);
  } else {
    bias_residual_add_kernel<T, 1><<<grid_for(out.numel(), kThreads), kThreads, 0,
                                     current_stream()>>>(op, bp, bd, rp, yp, out.numel(), n);
  }
  TPCHECK_LAUNCH_CHECK();
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::bias_residual_add(const Tensor& out, const Tensor& bias,
                                      const Tensor& residual) {
  if (!out.defined() || out.rank() < 1 || out.numel() == 0 || !residual.defined() ||
      residual.shape() != out.shape() || residual.dtype() != out.dtype() ||
      (bias.defined() && (bias.rank() != 1 || bias.dim(0) != out.dim(-1)))) {
    // Mixed dtypes (the kernel reads out and residual as one T) and every error case: the
    // composition, whose checks name the problem.
    return Backend::bias_residual_add(out, bias, residual);
  }
  cuda::check_cuda_operand("bias_residual_add", "out", out);
  cuda::check_cuda_operand("bias_residual_add", "residual", residual);
  if (bias.defined()) cuda::check_cuda_operand("bias_residual_add", "bias", bias);
  Tensor y = Tensor::empty(out.shape(), out.dtype(), Device::kCuda);
  TPCHECK_DISPATCH_FLOAT(out.dtype(), "bias_residual_add", T,
                         cuda::launch<T>(out, bias, residual, y));
  return y;
}

}  // namespace tpcheck

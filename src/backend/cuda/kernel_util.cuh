// kernel_util.cuh — what every kernel file shares: storage types per DType, exact
// widening to the compute type, one rounding (nearest even) back to storage, dispatch,
// and the 16-byte packs of the vectorized elementwise kernels.
//
// Kernels are templates over the storage type T (double, float, __half, __nv_bfloat16)
// and compute in Real = ComputeType<T> (double for double, float otherwise), as the CPU
// backend does: widen exactly, compute, round once where a kernel stores.
// Thread safety: device functions and host dispatch, no state.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "tpcheck/dtype.h"
#include "tpcheck/error.h"
#include "tpcheck/tensor.h"

namespace tpcheck::cuda {

template <typename T>
using ComputeType = std::conditional_t<std::is_same_v<T, double>, double, float>;

// The DType of storage type T.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, double>) {
    return DType::kF64;
  } else if constexpr (std::is_same_v<T, float>) {
    return DType::kF32;
  } else if constexpr (std::is_same_v<T, __half>) {
    return DType::kF16;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "a kernel storage type");
    return DType::kBF16;
  }
}

// Exact widening.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double to_real(double x) { return x; }
template <typename T>
__device__ __forceinline__ ComputeType<T> to_real(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return to_float(x);
  }
}

// One rounding (nearest even) from Real to T. From double, straight to the narrow
// format (no double rounding through float), like the CPU's f64_to_*_bits.
template <typename T, typename Real>
__device__ __forceinline__ T from_real(Real x) {
  if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(x);
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    if constexpr (std::is_same_v<Real, double>) return __double2half(x);
    else return __float2half_rn(x);
  } else {
    if constexpr (std::is_same_v<Real, double>) return __double2bfloat16(x);
    else return __float2bfloat16_rn(x);
  }
}


// ---- shared by the op files (bias, norm, activation, elementwise) -------------------

// The dtypes kernels read and write: f64, f32, f16, bf16.
inline bool is_kernel_dtype(DType d) {
  return d == DType::kF64 || d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

// The math dtype of an op on storage dtype `d` (f64 for f64, f32 otherwise): the dtype of
// saved statistics.
inline DType math_dtype_of(DType d) { return d == DType::kF64 ? DType::kF64 : DType::kF32; }

// Element i of a buffer whose dtype is known only at run time (a second operand: a bias,
// a parameter, a target), as Real: f32/f16/bf16 widen exactly; f64 → f32 rounds once
// (nearest even), as Tensor::to_f32 does on the host. REQUIRES: is_kernel_dtype(dtype).
template <typename Real>
__device__ __forceinline__ Real load_as(const void* p, DType dtype, long long i) {
  switch (dtype) {
    case DType::kF64: return static_cast<Real>(static_cast<const double*>(p)[i]);
    case DType::kF32: return static_cast<Real>(static_cast<const float*>(p)[i]);
    case DType::kF16: return static_cast<Real>(__half2float(static_cast<const __half*>(p)[i]));
    default: return static_cast<Real>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
}

// IEEE square root (correctly rounded: .cu files are built without fast math).
__device__ __forceinline__ float real_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double real_sqrt(double x) { return sqrt(x); }

// Sum over the 32 lanes of a warp (butterfly: every lane ends with the same bits, and the
// order is fixed, so the result is the same on every run). REQUIRES: all lanes active.
template <typename Real>
__device__ __forceinline__ Real warp_sum(Real v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread; fixed order (warp butterflies, then the
// warp totals in warp order), so bit-reproducible run to run. `scratch` is __shared__
// Real[32], reusable by consecutive calls. REQUIRES: blockDim.x a multiple of 32 (≤ 1024),
// blockDim.y == blockDim.z == 1, called by every thread of the block.
template <typename Real>
__device__ __forceinline__ Real block_sum(Real v, Real* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  Real total = 0;
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

// Host checks shared by the op files: `t` (named `what` in op `op`) is defined, on the
// GPU and of a kernel dtype; each failure is Error(kInput) naming the tensor.
inline void check_cuda_operand(std::string_view op, std::string_view what, const Tensor& t) {
  TPCHECK_CHECK_INPUT(t.defined(), "{}: {} is undefined", op, what);
  TPCHECK_CHECK_INPUT(t.device() == Device::kCuda,
                      "{}: the CUDA backend was given {} = {} in host memory; expected a GPU "
                      "tensor (Device::kCuda; move it with to_device)",
                      op, what, t.describe());
  TPCHECK_CHECK_INPUT(is_kernel_dtype(t.dtype()),
                      "{}: {} is {}; the CUDA backend takes f64, f32, f16 or bf16 here", op,
                      what, t.describe());
}

// ---- vectorized access (bias_gelu.cu, bias_residual_add.cu) ----------------------------
// A kernel over [rows, n] reads and writes V elements as one access where V divides n (a
// pack never wraps a row) and every pointer is aligned to sizeof(T)·V; the host checks
// that (aligned_to) and else launches the same kernel with V = 1. Only the width of the
// loads and stores depends on V, so both paths give the same bits.

// V values of T as one aligned access.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elements per access at the widest: 16 bytes' worth (2 for f64).
template <typename T>
constexpr int kWideV = sizeof(T) >= 8 ? 2 : 16 / static_cast<int>(sizeof(T));

// Whether p is a multiple of `bytes` (a Pack's sizeof(T)·V): the host's check before it
// launches a Pack kernel on p.
inline bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace tpcheck::cuda

// TPCHECK_DISPATCH_FLOAT(dtype, "what", T, statements...): runs the statements with `T`
// the storage type of dtype (f64 double, f32 float, f16 __half, bf16 __nv_bfloat16); any
// other dtype is Error(kInput) naming it and `what`. Example:
//   TPCHECK_DISPATCH_FLOAT(y.dtype(), "add_bias", T, launch_add_bias<T>(y, bias));
#define TPCHECK_DISPATCH_FLOAT(dtype, what, T, ...)                                     \
  switch (dtype) {                                                                      \
    case ::tpcheck::DType::kF64: { using T = double; __VA_ARGS__; break; }              \
    case ::tpcheck::DType::kF32: { using T = float; __VA_ARGS__; break; }               \
    case ::tpcheck::DType::kF16: { using T = __half; __VA_ARGS__; break; }              \
    case ::tpcheck::DType::kBF16: { using T = __nv_bfloat16; __VA_ARGS__; break; }      \
    default:                                                                            \
      TPCHECK_CHECK_INPUT(false, "{}: dtype {} is not supported (expected f64, f32, f16 " \
                          "or bf16)", what, ::tpcheck::dtype_name(dtype));              \
  }

// kernel_util.cuh — what every kernel file shares: storage types per DType, exact
// widening to the compute type, one rounding (nearest even) back to storage, dispatch.
//
// Kernels are templates over the storage type T (double, float, __half, __nv_bfloat16)
// and compute in Real = ComputeType<T> (double for double, float otherwise), as the CPU
// backend does: widen exactly, compute, round once where a kernel stores.
// Thread safety: device functions and host dispatch, no state.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "tpcheck/dtype.h"
#include "tpcheck/error.h"

namespace tpcheck::cuda {

template <typename T>
using ComputeType = std::conditional_t<std::is_same_v<T, double>, double, float>;

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

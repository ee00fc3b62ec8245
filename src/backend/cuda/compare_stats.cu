// compare_stats.cu — compare_tensors' statistics for GPU tensors, computed on the GPU
// (registered with register_device_compare by use_external_cuda_device).
//
// One pass: each thread accumulates a CompareSums (src/numerics/compare_sums.h) over a
// grid-stride range, kUnroll elements per step loaded before they are used (enough bytes
// in flight to run at memory bandwidth); the block merges its threads' sums in shared
// memory (a tree, fixed order); the host merges the blocks' sums in block order. The
// counts, maxima and their positions (first maximum, a NaN first for the reference's
// argmax) equal the host loop's exactly; the f64 sums of squares are added in another
// order, so norm-wise figures may differ from the host's in the last bits.
// Element rules are the host's (compare.cpp): exact widening to f64, the reference's
// difference rounded once to the promoted dtype, bit patterns compared when the dtypes
// agree. Runs on the calling thread's current stream and waits for its result.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "numerics/compare_sums.h"
#include "tpcheck/error.h"

namespace tpcheck::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 8;

struct CompareArgs {
  const void* sharded;
  const void* single;
  const double* truth;  // null: none
  const double* noise;  // null: none
  DType sharded_dtype, single_dtype, diff_dtype;
  int same_dtype_bytes;  // element size when the dtypes agree, else 0
  bool has_tolerance;
  double rtol, atol;
  long long n;
  CompareSums* partials;  // one per block
};

__device__ __forceinline__ double load_wide(const void* p, DType dtype, long long i) {
  switch (dtype) {
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF8E4M3:
      return __half2float(__half(__nv_cvt_fp8_to_halfraw(
          static_cast<const __nv_fp8_storage_t*>(p)[i], __NV_E4M3)));
    default:
      return __half2float(__half(__nv_cvt_fp8_to_halfraw(
          static_cast<const __nv_fp8_storage_t*>(p)[i], __NV_E5M2)));
  }
}

__device__ __forceinline__ unsigned long long load_bits(const void* p, int bytes, long long i) {
  switch (bytes) {
    case 8: return static_cast<const unsigned long long*>(p)[i];
    case 4: return static_cast<const unsigned int*>(p)[i];
    case 2: return static_cast<const unsigned short*>(p)[i];
    default: return static_cast<const unsigned char*>(p)[i];
  }
}

// |x - y| as the reference takes it: rounded once (nearest even) to the promoted dtype.
__device__ __forceinline__ double round_diff(double exact, DType dtype) {
  switch (dtype) {
    case DType::kF64: return exact;
    case DType::kF32: return __double2float_rn(exact);
    case DType::kF16: return __half2float(__double2half(exact));
    case DType::kBF16: return __bfloat162float(__double2bfloat16(exact));
    case DType::kF8E4M3:
      return __half2float(__half(__nv_cvt_fp8_to_halfraw(
          __nv_cvt_double_to_fp8(exact, __NV_NOSAT, __NV_E4M3), __NV_E4M3)));
    default:
      return __half2float(__half(__nv_cvt_fp8_to_halfraw(
          __nv_cvt_double_to_fp8(exact, __NV_NOSAT, __NV_E5M2), __NV_E5M2)));
  }
}

__device__ __forceinline__ void accumulate(const CompareArgs& a, CompareSums& s, long long i,
                                           double x, double y, bool bits_equal) {
  s.sharded_nan += isnan(x);
  s.sharded_inf += isinf(x);
  s.single_nan += isnan(y);
  s.single_inf += isinf(y);
  s.sharded_nonzero += x != 0;
  s.single_nonzero += y != 0;
  s.bits_differ += !bits_equal;
  const double exact = fabs(x - y);
  const double d = round_diff(exact, a.diff_dtype);
  const MaxAt here{d, i, static_cast<bool>(isnan(d))};
  if (beats_reference_argmax(here, s.diff)) s.diff = here;
  s.sq_diff += (x - y) * (x - y);
  s.sq_single += y * y;
  if (a.has_tolerance && !(exact <= a.atol + a.rtol * fabs(y))) ++s.over_allclose;
  if (a.truth != nullptr) {
    const double t = a.truth[i];
    s.truth_nonfinite += !isfinite(t);
    s.sq_truth += t * t;
    s.truth_max_abs = fmax(s.truth_max_abs, fabs(t));
    const double e1 = y - t, e2 = x - t;
    s.sq_single_err += e1 * e1;
    s.sq_sharded_err += e2 * e2;
    const MaxAt m1{fabs(e1), i, false}, m2{fabs(e2), i, false};
    if (beats_first_max(m1, s.single_err)) s.single_err = m1;
    if (beats_first_max(m2, s.sharded_err)) s.sharded_err = m2;
  }
  if (a.noise != nullptr) {
    const double v = a.noise[i];
    s.noise_sq += v * v;
    s.noise_max_abs = fmax(s.noise_max_abs, fabs(v));
  }
}

__global__ void __launch_bounds__(kThreads) compare_kernel(CompareArgs a) {
  // Raw storage: a __shared__ variable cannot have a constructor (CompareSums has member
  // initializers); every slot is written before it is read.
  __shared__ alignas(CompareSums) unsigned char storage[sizeof(CompareSums) * kThreads];
  CompareSums* block = reinterpret_cast<CompareSums*>(storage);
  CompareSums s;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < a.n; i += kUnroll * stride) {
    double x[kUnroll], y[kUnroll];
    bool eq[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const long long k = i + u * stride;
      x[u] = load_wide(a.sharded, a.sharded_dtype, k);
      y[u] = load_wide(a.single, a.single_dtype, k);
      eq[u] = a.same_dtype_bytes != 0 && load_bits(a.sharded, a.same_dtype_bytes, k) ==
                                              load_bits(a.single, a.same_dtype_bytes, k);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate(a, s, i + u * stride, x[u], y[u], eq[u]);
  }
  for (; i < a.n; i += stride) {
    const bool eq = a.same_dtype_bytes != 0 && load_bits(a.sharded, a.same_dtype_bytes, i) ==
                                                   load_bits(a.single, a.same_dtype_bytes, i);
    accumulate(a, s, i, load_wide(a.sharded, a.sharded_dtype, i),
               load_wide(a.single, a.single_dtype, i), eq);
  }
  block[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) merge_sums(block[threadIdx.x], block[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) a.partials[blockIdx.x] = block[0];
}

DType promoted(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kF64 || b == DType::kF64) return DType::kF64;
  return DType::kF32;
}

CompareSums compare_on_device(const Tensor& sharded, const Tensor& single, const Tensor* truth,
                              const Tolerance* tolerance, const Tensor* noise) {
  CompareArgs a{};
  a.sharded = sharded.raw();
  a.single = single.raw();
  a.truth = truth ? static_cast<const double*>(truth->raw()) : nullptr;
  a.noise = noise ? static_cast<const double*>(noise->raw()) : nullptr;
  a.sharded_dtype = sharded.dtype();
  a.single_dtype = single.dtype();
  a.diff_dtype = promoted(sharded.dtype(), single.dtype());
  a.same_dtype_bytes =
      sharded.dtype() == single.dtype() ? static_cast<int>(dtype_size(single.dtype())) : 0;
  a.has_tolerance = tolerance != nullptr;
  if (tolerance) {
    a.rtol = tolerance->rtol;
    a.atol = tolerance->atol;
  }
  a.n = single.numel();

  int device = 0, sms = 0;
  TPCHECK_CUDA_CHECK(cudaGetDevice(&device));
  TPCHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const long long per_block = static_cast<long long>(kThreads) * kUnroll;
  const long long wanted = (a.n + per_block - 1) / per_block;
  const int blocks = static_cast<int>(std::max(1LL, std::min<long long>(wanted, sms * 8LL)));

  DeviceRuntime& rt = install_cuda_runtime();
  std::shared_ptr<std::byte> partials = rt.allocate(sizeof(CompareSums) * blocks);
  a.partials = reinterpret_cast<CompareSums*>(partials.get());
  compare_kernel<<<blocks, kThreads, 0, current_stream()>>>(a);
  TPCHECK_LAUNCH_CHECK();
  std::vector<CompareSums> host(static_cast<std::size_t>(blocks));
  rt.copy(host.data(), Device::kCpu, partials.get(), Device::kCuda, sizeof(CompareSums) * blocks);
  CompareSums total = host[0];
  for (int b = 1; b < blocks; ++b) merge_sums(total, host[b]);
  return total;
}

}  // namespace

void register_cuda_compare() { register_device_compare(&compare_on_device); }

}  // namespace tpcheck::cuda

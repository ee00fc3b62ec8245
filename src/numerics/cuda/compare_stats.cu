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
#include <cstdint>
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
    accumulate_scale(s, t, x - y, e1);
  }
  if (a.noise != nullptr) {
    const double v = a.noise[i];
    s.noise_sq += v * v;
    s.noise_max_abs = fmax(s.noise_max_abs, fabs(v));
  }
}

// The block's sums into a.partials[blockIdx.x]: a tree over the threads, thread i merging
// i + half at each level. Shared memory holds half the threads' sums (the upper half writes,
// the lower merges its own in registers). At 264 bytes a CompareSums (the scale test's
// sums), a slot per thread took 33 KB a block: only 6 blocks fit an SM's 228 KB, where the
// f32 kernel without truth has registers for 9.
// Raw storage: a __shared__ variable cannot have a constructor (CompareSums has member
// initializers); every slot is written before it is read.
__device__ void reduce_block(CompareSums mine, CompareSums* partials) {
  __shared__ alignas(CompareSums) unsigned char storage[sizeof(CompareSums) * (kThreads / 2)];
  CompareSums* block = reinterpret_cast<CompareSums*>(storage);
  const int t = static_cast<int>(threadIdx.x);
  if (t >= kThreads / 2) block[t - kThreads / 2] = mine;
  __syncthreads();
  if (t < kThreads / 2) {
    merge_sums(mine, block[t]);
    block[t] = mine;
  }
  __syncthreads();
  for (int half = kThreads / 4; half > 0; half /= 2) {
    if (t < half) merge_sums(block[t], block[t + half]);
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = block[0];
}

__global__ void __launch_bounds__(kThreads) compare_kernel(CompareArgs a) {
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
  reduce_block(s, a.partials);
}

// ---- f32 against f32: the common case, at memory bandwidth ---------------------------
// The generic kernel above widens every element to f64 through a per-element dtype switch
// and keeps 64-bit counters: about 400 instructions an element, 15% of the H200's read
// bandwidth on 1 GiB tensors (bench/compare_bench.py, 2026-12-01). This one reads 16-byte
// vectors and keeps a small per-thread state (32-bit counts; the maxima with their first
// index), converted to a CompareSums only for the block merge. Same results as the host:
//   * |x - y| rounded to f32 is fabsf(__fsub_rn(x, y)): rounding the exact difference once
//     to f32 equals rounding it first to f64 and then to f32, as the host does (double
//     rounding is harmless for subtraction when 53 >= 2·24 + 2);
//   * the allclose test and every square sum use the exact f64 difference, as the host;
//   * a thread visits its indices in increasing order, so "strictly larger" keeps the
//     first maximum, and the first NaN difference is the reference argmax's winner.
struct F32State {
  unsigned sharded_nan = 0, sharded_inf = 0, single_nan = 0, single_inf = 0;
  unsigned sharded_nonzero = 0, single_nonzero = 0, bits_differ = 0, over_allclose = 0;
  float diff_max = -1.0f;
  long long diff_at = -1, nan_at = -1;
  double sq_diff = 0, sq_single = 0;
  // truth
  unsigned truth_nonfinite = 0;
  double sq_truth = 0, truth_max_abs = 0, sq_single_err = 0, sq_sharded_err = 0;
  double single_err = 0, sharded_err = 0;
  long long single_err_at = -1, sharded_err_at = -1;
  double sum_truth = 0, sum_truth_diff = 0, sum_truth_single_err = 0, sum_single_err = 0;
  double sum_t2_d2 = 0, sum_t3_d = 0, sum_t4 = 0;
  // rounding probe
  double noise_sq = 0, noise_max_abs = 0;
};

template <bool kTruth, bool kNoise>
__device__ __forceinline__ void accumulate_f32(const CompareArgs& a, F32State& s, long long i,
                                               float x, float y, double t, double v) {
  const unsigned xb = __float_as_uint(x), yb = __float_as_uint(y);
  const unsigned xa = xb & 0x7fffffffu, ya = yb & 0x7fffffffu;
  s.sharded_nan += xa > 0x7f800000u;
  s.sharded_inf += xa == 0x7f800000u;
  s.single_nan += ya > 0x7f800000u;
  s.single_inf += ya == 0x7f800000u;
  s.sharded_nonzero += xa != 0;
  s.single_nonzero += ya != 0;
  s.bits_differ += xb != yb;
  const float d = fabsf(__fsub_rn(x, y));
  if (d > s.diff_max) {
    s.diff_max = d;
    s.diff_at = i;
  }
  if (isnan(d) && s.nan_at < 0) s.nan_at = i;
  const double xd = x, yd = y;
  const double e = xd - yd;  // exact
  s.sq_diff = fma(e, e, s.sq_diff);
  s.sq_single = fma(yd, yd, s.sq_single);
  if (a.has_tolerance && !(fabs(e) <= a.atol + a.rtol * fabs(yd))) ++s.over_allclose;
  if constexpr (kTruth) {
    s.truth_nonfinite += !isfinite(t);
    s.sq_truth = fma(t, t, s.sq_truth);
    s.truth_max_abs = fmax(s.truth_max_abs, fabs(t));
    const double e1 = yd - t, e2 = xd - t;
    s.sq_single_err = fma(e1, e1, s.sq_single_err);
    s.sq_sharded_err = fma(e2, e2, s.sq_sharded_err);
    if (s.single_err_at < 0 || fabs(e1) > s.single_err) {
      s.single_err = fabs(e1);
      s.single_err_at = i;
    }
    if (s.sharded_err_at < 0 || fabs(e2) > s.sharded_err) {
      s.sharded_err = fabs(e2);
      s.sharded_err_at = i;
    }
    const double t2 = t * t;  // the scale test's sums, as accumulate_scale
    s.sum_truth += t;
    s.sum_truth_diff += t * e;
    s.sum_truth_single_err += t * e1;
    s.sum_single_err += e1;
    s.sum_t2_d2 += t2 * e * e;
    s.sum_t3_d += t2 * t * e;
    s.sum_t4 += t2 * t2;
  }
  if constexpr (kNoise) {
    s.noise_sq = fma(v, v, s.noise_sq);
    s.noise_max_abs = fmax(s.noise_max_abs, fabs(v));
  }
}

__device__ CompareSums to_sums(const F32State& f) {
  CompareSums s;
  s.sharded_nan = f.sharded_nan;
  s.sharded_inf = f.sharded_inf;
  s.single_nan = f.single_nan;
  s.single_inf = f.single_inf;
  s.sharded_nonzero = f.sharded_nonzero;
  s.single_nonzero = f.single_nonzero;
  s.bits_differ = f.bits_differ;
  s.over_allclose = f.over_allclose;
  if (f.nan_at >= 0) {
    s.diff = MaxAt{__longlong_as_double(0x7ff8000000000000LL), f.nan_at, true};
  } else if (f.diff_at >= 0) {
    s.diff = MaxAt{f.diff_max, f.diff_at, false};
  }
  s.sq_diff = f.sq_diff;
  s.sq_single = f.sq_single;
  s.truth_nonfinite = f.truth_nonfinite;
  s.sq_truth = f.sq_truth;
  s.truth_max_abs = f.truth_max_abs;
  s.sq_single_err = f.sq_single_err;
  s.sq_sharded_err = f.sq_sharded_err;
  if (f.single_err_at >= 0) s.single_err = MaxAt{f.single_err, f.single_err_at, false};
  if (f.sharded_err_at >= 0) s.sharded_err = MaxAt{f.sharded_err, f.sharded_err_at, false};
  s.sum_truth = f.sum_truth;
  s.sum_truth_diff = f.sum_truth_diff;
  s.sum_truth_single_err = f.sum_truth_single_err;
  s.sum_single_err = f.sum_single_err;
  s.sum_t2_d2 = f.sum_t2_d2;
  s.sum_t3_d = f.sum_t3_d;
  s.sum_t4 = f.sum_t4;
  s.noise_sq = f.noise_sq;
  s.noise_max_abs = f.noise_max_abs;
  return s;
}

// REQUIRES: sharded and single 16-byte aligned (4 floats a vector); truth and noise, when
// present, 16-byte aligned (2 doubles a vector). Each thread handles vectors
// k = thread, thread + stride, ... (elements 4k..4k+3).
template <bool kTruth, bool kNoise>
__global__ void __launch_bounds__(kThreads) compare_f32_kernel(CompareArgs a) {
  F32State s;
  const float4* xs = static_cast<const float4*>(a.sharded);
  const float4* ys = static_cast<const float4*>(a.single);
  const double2* ts = reinterpret_cast<const double2*>(a.truth);
  const double2* vs = reinterpret_cast<const double2*>(a.noise);
  const long long vectors = a.n / 4;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long k = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; k < vectors;
       k += stride) {
    const float4 x = xs[k], y = ys[k];
    double t[4] = {0, 0, 0, 0}, v[4] = {0, 0, 0, 0};
    if constexpr (kTruth) {
      const double2 t0 = ts[2 * k], t1 = ts[2 * k + 1];
      t[0] = t0.x, t[1] = t0.y, t[2] = t1.x, t[3] = t1.y;
    }
    if constexpr (kNoise) {
      const double2 v0 = vs[2 * k], v1 = vs[2 * k + 1];
      v[0] = v0.x, v[1] = v0.y, v[2] = v1.x, v[3] = v1.y;
    }
    const long long i = 4 * k;
    accumulate_f32<kTruth, kNoise>(a, s, i, x.x, y.x, t[0], v[0]);
    accumulate_f32<kTruth, kNoise>(a, s, i + 1, x.y, y.y, t[1], v[1]);
    accumulate_f32<kTruth, kNoise>(a, s, i + 2, x.z, y.z, t[2], v[2]);
    accumulate_f32<kTruth, kNoise>(a, s, i + 3, x.w, y.w, t[3], v[3]);
  }
  // The tail (the last n % 4 elements) goes to thread 0 of block 0, after its vectors: its
  // indices stay increasing, and the block and host merges compare indices anyway.
  if (a.n % 4 != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    const float* xf = static_cast<const float*>(a.sharded);
    const float* yf = static_cast<const float*>(a.single);
    for (long long i = 4 * vectors; i < a.n; ++i) {
      accumulate_f32<kTruth, kNoise>(a, s, i, xf[i], yf[i], kTruth ? a.truth[i] : 0.0,
                                     kNoise ? a.noise[i] : 0.0);
    }
  }
  reduce_block(to_sums(s), a.partials);
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

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
  const bool f32 = a.sharded_dtype == DType::kF32 && a.single_dtype == DType::kF32 &&
                   aligned16(a.sharded) && aligned16(a.single) && aligned16(a.truth) &&
                   aligned16(a.noise);
  void (*kernel)(CompareArgs) = compare_kernel;
  if (f32 && a.truth != nullptr && a.noise != nullptr) {
    kernel = compare_f32_kernel<true, true>;
  } else if (f32 && a.truth != nullptr) {
    kernel = compare_f32_kernel<true, false>;
  } else if (f32 && a.noise != nullptr) {
    kernel = compare_f32_kernel<false, true>;
  } else if (f32) {
    kernel = compare_f32_kernel<false, false>;
  }
  // One wave: as many blocks as fit on the GPU at once, each looping over its share. More
  // would leave a second, partial wave with the SMs half idle (the truth kernels use ~100
  // registers a thread, so 4 blocks of 128 fit an SM, not the 8 an earlier launch assumed).
  int resident = 0;
  TPCHECK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0));
  const long long per_block = static_cast<long long>(kThreads) * (f32 ? 4 : kUnroll);
  const long long wanted = (a.n + per_block - 1) / per_block;
  const long long fit = static_cast<long long>(sms) * std::max(1, resident);
  const int blocks = static_cast<int>(std::max(1LL, std::min(wanted, fit)));

  DeviceRuntime& rt = install_cuda_runtime();
  std::shared_ptr<std::byte> partials = rt.allocate(sizeof(CompareSums) * blocks);
  a.partials = reinterpret_cast<CompareSums*>(partials.get());
  kernel<<<blocks, kThreads, 0, current_stream()>>>(a);
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

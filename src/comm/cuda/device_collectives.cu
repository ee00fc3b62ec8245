// device_collectives.cu — the device group's reduction kernel (see device_collectives.h).
#include "comm/cuda/device_collectives.h"

#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"

namespace tpcheck::cuda {
namespace {

struct Inputs {
  const void* p[kMaxDeviceRanks];
};
struct Outputs {
  void* p[kMaxDeviceRanks];
  int n;
};

// The all-reduce chunk of element i (ring_reference.h's all_reduce_chunk_of).
__device__ __forceinline__ int ring_chunk(long long i, long long count, int world, long long c,
                                          long long align) {
  const long long loop = world * c;
  const long long start = i / loop * loop;
  const long long rem = count - start;
  long long chunk = c;
  if (rem < loop) chunk = ((rem + world - 1) / world + align - 1) / align * align;
  return static_cast<int>((i - start) / chunk);
}

// W consecutive elements of one input (W = 1, or 16 bytes' worth: one vector load).
template <typename T, int W>
struct alignas(sizeof(T) * W) Lanes {
  T v[W];
};

template <typename T, int W>
__device__ __forceinline__ Lanes<T, W> load(const void* base, long long src) {
  return *reinterpret_cast<const Lanes<T, W>*>(static_cast<const T*>(base) + src);
}

// The fold of elements [src, src + W) over the N inputs, per element exactly as the header
// says; `start` is kRingSum's first rank (the same for the W elements: the caller makes
// sure they lie in one ring chunk).
template <typename T, int W>
__device__ __forceinline__ Lanes<T, W> fold(const Inputs& in, long long src, int world,
                                            ReduceMode mode, int start) {
  using Real = ComputeType<T>;
  Lanes<T, W> result;
  if (mode == ReduceMode::kRingSum) {
    Lanes<T, W> acc = load<T, W>(in.p[start], src);
    for (int step = 1; step < world; ++step) {
      int r = start + step;
      if (r >= world) r -= world;
      const Lanes<T, W> x = load<T, W>(in.p[r], src);
#pragma unroll
      for (int e = 0; e < W; ++e) acc.v[e] = from_real<T>(to_real(acc.v[e]) + to_real(x.v[e]));
    }
    return acc;
  }
  Real acc[W];
  {
    const Lanes<T, W> x = load<T, W>(in.p[0], src);
#pragma unroll
    for (int e = 0; e < W; ++e) acc[e] = to_real(x.v[e]);
  }
  for (int r = 1; r < world; ++r) {
    const Lanes<T, W> x = load<T, W>(in.p[r], src);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const Real v = to_real(x.v[e]);
      Real& a = acc[e];
      if (mode == ReduceMode::kRankSum) {
        a += v;
      } else if (mode == ReduceMode::kRingMax) {
        a = fmax(a, v);
      } else {  // kRankMax: a NaN propagates
        a = (a != a || v != v) ? (a != a ? a : v) : (v > a ? v : a);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < W; ++e) result.v[e] = from_real<T>(acc[e]);
  return result;
}

// kRingSum's first rank for element src (the all-reduce rule when fixed_start < 0).
__device__ __forceinline__ int ring_start(long long src, int world, int fixed_start,
                                          long long count, long long chunk_elems,
                                          long long align) {
  return fixed_start >= 0 ? fixed_start
                          : (ring_chunk(src, count, world, chunk_elems, align) + 1) % world;
}

// The inputs of an output element are read before any output of it is written (an output
// may be an input: the in-place all-reduce), and no other thread touches that element.
template <typename T, int W>
__device__ __forceinline__ void put(const Lanes<T, W>& v, T* out, const Outputs& extra,
                                    long long j) {
  *reinterpret_cast<Lanes<T, W>*>(out + j) = v;
  for (int k = 0; k < extra.n; ++k) *reinterpret_cast<Lanes<T, W>*>(static_cast<T*>(extra.p[k]) + j) = v;
}

// Any layout (the header's src(j)), one element per thread and step.
template <typename T>
__global__ void reduce_kernel(Inputs in, Outputs extra, int world, ReduceMode mode, T* out,
                              long long n_out, long long dim_size, long long inner,
                              long long rows, long long row_start, int fixed_start,
                              long long count, long long chunk_elems) {
  const long long align = 16 / static_cast<long long>(sizeof(T)) > 0 ? 16 / static_cast<long long>(sizeof(T)) : 1;
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < n_out;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long i = j % inner;
    const long long k = (j / inner) % rows;
    const long long o = j / (inner * rows);
    const long long src = (o * dim_size + row_start + k) * inner + i;
    const int start = mode == ReduceMode::kRingSum
                          ? ring_start(src, world, fixed_start, count, chunk_elems, align)
                          : 0;
    put<T, 1>(fold<T, 1>(in, src, world, mode, start), out, extra, j);
  }
}

// A contiguous run, src(j) = src0 + j, with every address 16-byte aligned: W = 16 bytes of
// elements per thread and step (one vector load per input), the n_out % W last ones one
// by one. Each W-run lies in one ring chunk (chunks start at multiples of W: the launch
// checks), so one start serves the run.
template <typename T>
__global__ void reduce_contiguous_kernel(Inputs in, Outputs extra, int world, ReduceMode mode,
                                         T* out, long long n_out, long long src0,
                                         int fixed_start, long long count,
                                         long long chunk_elems) {
  constexpr int W = 16 / sizeof(T);
  const long long runs = n_out / W;
  const long long first = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long q = first; q < runs; q += stride) {
    const long long j = q * W;
    const int start = mode == ReduceMode::kRingSum
                          ? ring_start(src0 + j, world, fixed_start, count, chunk_elems, W)
                          : 0;
    put<T, W>(fold<T, W>(in, src0 + j, world, mode, start), out, extra, j);
  }
  for (long long j = runs * W + first; j < n_out; j += stride) {
    const int start = mode == ReduceMode::kRingSum
                          ? ring_start(src0 + j, world, fixed_start, count, chunk_elems, W)
                          : 0;
    put<T, 1>(fold<T, 1>(in, src0 + j, world, mode, start), out, extra, j);
  }
}

// TPCHECK_REDUCE_VECTOR=0 keeps every launch on reduce_kernel: tests/gpu/run.sh emulate
// checks both paths' bits and bench/emulate_bench.py times both. Read at each launch, so
// one process can time both.
bool vector_path_enabled() {
  const char* v = std::getenv("TPCHECK_REDUCE_VECTOR");
  return v == nullptr || !(v[0] == '0' && v[1] == '\0');
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Whether the launch can take reduce_contiguous_kernel; *src0 = src(0) when it can.
bool contiguous_run(const ReduceLaunch& p, long long* src0) {
  const long long w = 16 / static_cast<long long>(dtype_size(p.dtype));
  if (p.dim_size == p.rows && p.row_start == 0) {
    *src0 = 0;  // src(j) = j
  } else if (p.inner == 1 && p.rows >= p.n_out) {
    *src0 = p.row_start;  // one row: src(j) = row_start + j
  } else {
    return false;
  }
  if (*src0 % w != 0) return false;
  if (p.mode == ReduceMode::kRingSum && p.fixed_start < 0 && p.chunk_elems % w != 0) return false;
  if (!aligned16(p.out)) return false;
  for (int r = 0; r < p.world; ++r)
    if (!aligned16(p.inputs[r])) return false;
  for (int k = 0; k < p.extra_outs; ++k)
    if (!aligned16(p.outs[k])) return false;
  return true;
}

}  // namespace

void launch_reduce(const ReduceLaunch& p, cudaStream_t stream) {
  TPCHECK_CHECK(p.world >= 1 && p.world <= kMaxDeviceRanks, "device reduce: {} ranks (1..{})",
                p.world, kMaxDeviceRanks);
  if (p.n_out == 0) return;
  TPCHECK_CHECK(p.extra_outs >= 0 && p.extra_outs <= kMaxDeviceRanks,
                "device reduce: {} extra outputs (0..{})", p.extra_outs, kMaxDeviceRanks);
  Inputs in{};
  for (int r = 0; r < p.world; ++r) in.p[r] = p.inputs[r];
  Outputs extra{};
  extra.n = p.extra_outs;
  for (int k = 0; k < p.extra_outs; ++k) extra.p[k] = p.outs[k];
  long long src0 = 0;
  const bool contiguous = vector_path_enabled() && contiguous_run(p, &src0);
  TPCHECK_DISPATCH_FLOAT(p.dtype, "device-group reduction", T, {
    if (contiguous) {
      reduce_contiguous_kernel<T><<<grid_for(p.n_out / (16 / sizeof(T)) + 1), 256, 0, stream>>>(
          in, extra, p.world, p.mode, static_cast<T*>(p.out), p.n_out, src0, p.fixed_start,
          p.count, p.chunk_elems);
    } else {
      reduce_kernel<T><<<grid_for(p.n_out), 256, 0, stream>>>(
          in, extra, p.world, p.mode, static_cast<T*>(p.out), p.n_out, p.dim_size, p.inner,
          p.rows, p.row_start, p.fixed_start, p.count, p.chunk_elems);
    }
    TPCHECK_LAUNCH_CHECK();
  });
}

}  // namespace tpcheck::cuda

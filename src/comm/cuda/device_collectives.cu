// device_collectives.cu — the device group's reduction kernel (see device_collectives.h).
#include "comm/cuda/device_collectives.h"

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

template <typename T>
__global__ void reduce_kernel(Inputs in, Outputs extra, int world, ReduceMode mode, T* out,
                              long long n_out,
                              long long dim_size, long long inner, long long rows,
                              long long row_start, int fixed_start, long long count,
                              long long chunk_elems) {
  using Real = ComputeType<T>;
  const long long align = 16 / static_cast<long long>(sizeof(T)) > 0 ? 16 / static_cast<long long>(sizeof(T)) : 1;
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < n_out;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long i = j % inner;
    const long long k = (j / inner) % rows;
    const long long o = j / (inner * rows);
    const long long src = (o * dim_size + row_start + k) * inner + i;
    auto x = [&](int r) { return static_cast<const T*>(in.p[r])[src]; };
    // The inputs of element j are read before any output of it is written (an output may
    // be an input: the in-place all-reduce), and no other thread touches element j.
    auto put = [&](T v) {
      out[j] = v;
      for (int k = 0; k < extra.n; ++k) static_cast<T*>(extra.p[k])[j] = v;
    };
    switch (mode) {
      case ReduceMode::kRankSum: {
        Real acc = to_real(x(0));
        for (int r = 1; r < world; ++r) acc += to_real(x(r));
        put(from_real<T>(acc));
        break;
      }
      case ReduceMode::kRingSum: {
        const int s = fixed_start >= 0 ? fixed_start
                                       : (ring_chunk(src, count, world, chunk_elems, align) + 1) % world;
        T acc = x(s);
        for (int step = 1; step < world; ++step) {
          int r = s + step;
          if (r >= world) r -= world;
          acc = from_real<T>(to_real(acc) + to_real(x(r)));
        }
        put(acc);
        break;
      }
      case ReduceMode::kRankMax: {
        Real acc = to_real(x(0));
        for (int r = 1; r < world; ++r) {
          const Real v = to_real(x(r));
          acc = (acc != acc || v != v) ? (acc != acc ? acc : v) : (v > acc ? v : acc);
        }
        put(from_real<T>(acc));
        break;
      }
      case ReduceMode::kRingMax: {
        Real acc = to_real(x(0));
        for (int r = 1; r < world; ++r) acc = fmax(acc, to_real(x(r)));
        put(from_real<T>(acc));
        break;
      }
    }
  }
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
  TPCHECK_DISPATCH_FLOAT(p.dtype, "device-group reduction", T, {
    reduce_kernel<T><<<grid_for(p.n_out), 256, 0, stream>>>(
        in, extra, p.world, p.mode, static_cast<T*>(p.out), p.n_out, p.dim_size, p.inner, p.rows,
        p.row_start, p.fixed_start, p.count, p.chunk_elems);
    TPCHECK_LAUNCH_CHECK();
  });
}

}  // namespace tpcheck::cuda

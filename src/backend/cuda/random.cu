// random.cu — tensors generated on the GPU (Philox, rng.h) and the rounding probe's
// perturbation of stored f64 tensors (make_rounding_probe_backend),
// with the host's formulas (src/core/random_math.h).
//
// Generating on the device matters at production sizes: a TransformerLayer at hidden
// 4096 has 200 M parameters per run, which the host generates in seconds and the GPU
// in milliseconds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "core/random_math.h"

namespace tpcheck::cuda {
namespace {

namespace rm = random_math;

template <typename T>
__global__ void generate_kernel(T* out, long long n, rm::FillKind kind, double a, double b,
                                std::uint64_t seed, std::uint64_t name_hash, long long inner,
                                long long local_rows, long long global_rows,
                                const long long* row_map) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long global = i;
    if (row_map != nullptr) {
      const long long col = i % inner, rest = i / inner;
      const long long row = rest % local_rows, outer = rest / local_rows;
      global = (outer * global_rows + row_map[row]) * inner + col;
    }
    out[i] = from_real<T>(rm::fill_value(kind, a, b, seed, name_hash,
                                         static_cast<std::uint64_t>(global)));
  }
}

__global__ void perturb_kernel(double* values, long long n, double u, std::uint64_t seed,
                               std::uint64_t first_counter) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    values[i] *= rm::probe_factor(u, seed, first_counter + static_cast<std::uint64_t>(i));
  }
}

}  // namespace

void launch_generate(void* dst, DType dtype, std::int64_t n, int fill_kind, double a, double b,
                     std::uint64_t seed, std::uint64_t name_hash, const GlobalIndexMap& map) {
  if (n == 0) return;
  TPCHECK_CHECK(is_kernel_dtype(dtype), "generate on the GPU: dtype {} is not f64/f32/f16/bf16",
                dtype_name(dtype));
  TPCHECK_CHECK(fill_kind >= 0 && fill_kind <= 2, "generate: unknown fill kind {}", fill_kind);
  cudaStream_t stream = current_stream();
  // The row map is small (one entry per local row of the sharded dimension); it goes to
  // the device with the launch and is freed after it (stream-ordered).
  long long* row_map = nullptr;
  long long local_rows = 1;
  if (!map.row_map.empty()) {
    local_rows = static_cast<long long>(map.row_map.size());
    const std::size_t bytes = map.row_map.size() * sizeof(long long);
    TPCHECK_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&row_map), bytes, stream));
    TPCHECK_CUDA_CHECK(cudaMemcpyAsync(row_map, map.row_map.data(), bytes, cudaMemcpyHostToDevice, stream));
  }
  const auto kind = static_cast<rm::FillKind>(fill_kind);
  const unsigned grid = grid_for(n);
  const long long count = n;
  switch (dtype) {
    case DType::kF64:
      generate_kernel<<<grid, 256, 0, stream>>>(static_cast<double*>(dst), count, kind, a, b, seed,
                                                name_hash, map.inner, local_rows, map.global_rows, row_map);
      break;
    case DType::kF32:
      generate_kernel<<<grid, 256, 0, stream>>>(static_cast<float*>(dst), count, kind, a, b, seed,
                                                name_hash, map.inner, local_rows, map.global_rows, row_map);
      break;
    case DType::kF16:
      generate_kernel<<<grid, 256, 0, stream>>>(static_cast<__half*>(dst), count, kind, a, b, seed,
                                                name_hash, map.inner, local_rows, map.global_rows, row_map);
      break;
    default:
      generate_kernel<<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), count, kind, a, b,
                                                seed, name_hash, map.inner, local_rows,
                                                map.global_rows, row_map);
      break;
  }
  TPCHECK_LAUNCH_CHECK();
  // The host vector may die when we return: the copy above is from pageable memory, which
  // cudaMemcpyAsync stages before returning, so only the device buffer needs ordering.
  if (row_map != nullptr) TPCHECK_CUDA_CHECK(cudaFreeAsync(row_map, stream));
}

void launch_perturb_f64(double* values, std::int64_t n, double u, std::uint64_t seed,
                        std::uint64_t first_counter) {
  if (n == 0) return;
  perturb_kernel<<<grid_for(n), 256, 0, current_stream()>>>(values, n, u, seed, first_counter);
  TPCHECK_LAUNCH_CHECK();
}

}  // namespace tpcheck::cuda

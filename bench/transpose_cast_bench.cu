// transpose_cast_bench.cu — why the FP8 cast + transpose kernels (src/backend/cuda/
// quantize.cu) move about 2.2 TB/s of DRAM traffic where the GPU copies at 4.2: the same
// work in several memory layouts, each timed back to back next to a plain copy kernel, on
// a bf16 8192 × 8192 tensor. These are bare variants, not tpcheck's kernels: every one
// casts to E4M3 with one fixed scale (the same arithmetic in all), so what differs is only
// how the copies are stored.
//   copy               a 16-byte-vector copy kernel, 2 bytes read and 2 written an element
//                      (the ceiling), next to cudaMemcpyAsync
//   rowwise            the rowwise copy only: 2 bytes read, 1 written
//   <tile> R×C, lane K cols × S rows
//                      128 × 128 (quantize.cu's tile) or 256 × 64 tiles: the rowwise copy
//                      stored as the tile is read, staged as bytes in shared memory, then
//                      the transposed copy with each lane taking K consecutive tile columns
//                      (K transposed rows) and S consecutive tile rows of them: S = 16 is
//                      one 16-byte store a column (quantize.cu's), S = 32 two stores that
//                      fill a whole 32-byte sector; "transposed only" drops the rowwise store.
// Each figure: 20 launches between two events, the median of 5 such runs; bytes = what
// the variant must move at least (input once, each copy once).
//   transpose_cast_bench [rows cols]
// With no GPU it says so and exits 0 (scripts/bench.sh runs every bench on the CPU machine).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                              \
  do {                                                                                \
    const cudaError_t e = (call);                                                     \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "transpose_cast_bench: %s: %s\n", #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr int kThreads = 256;

__global__ void copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = in[i];
  }
}

// Eight bf16 (one 16-byte load) times `scale`, cast to E4M3, as two words.
__device__ __forceinline__ uint2 cast8(uint4 raw, float scale) {
  const std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  std::uint32_t out[2];
  for (int h = 0; h < 2; ++h) {
    const float a = __uint_as_float(w[2 * h] << 16) * scale;
    const float b = __uint_as_float(w[2 * h] & 0xffff0000u) * scale;
    const float c = __uint_as_float(w[2 * h + 1] << 16) * scale;
    const float d = __uint_as_float(w[2 * h + 1] & 0xffff0000u) * scale;
    const std::uint32_t ab = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const std::uint32_t cd = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    out[h] = __byte_perm(ab, cd, 0x5410);
  }
  return make_uint2(out[0], out[1]);
}

// One block per TR × TC tile (row tiles slowest). kRowwise / kColumnwise: which copies
// to store. K columns × S rows per lane in the transposed store (K = 4 or 2, S = 16 or
// 32; (TC / K) · (TR / S) = 256 work items, one a thread).
// kPaired (K = 4, S = 16, TC = 128 only): half-warps take neighbouring 16-row segments of
// the same 64 columns, so lanes l and l + 16 write the two halves of one 32-byte sector
// (quantize.cu's TransposedSlice since 2026-12-02).
template <int TR, int TC, int K, int S, bool kRowwise, bool kColumnwise, bool kPaired = false>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const __nv_bfloat16* __restrict__ x, long long rows, long long cols, float scale,
                std::uint8_t* row_out, std::uint8_t* col_out) {
  static_assert((TC / K) * (TR / S) == kThreads, "one transposed work item a thread");
  constexpr int kThreadsPerRow = TC / 8;
  constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  __shared__ __align__(16) std::uint8_t tile[TR][TC + 8];
  const long long col_tiles = cols / TC;
  const long long r0 = (blockIdx.x / col_tiles) * TR, c0 = (blockIdx.x % col_tiles) * TC;
  const int tid = threadIdx.x;
  const int cc = (tid % kThreadsPerRow) * 8;
#pragma unroll
  for (int pass = 0; pass < TR / kRowsPerPass; ++pass) {
    const int rr = pass * kRowsPerPass + tid / kThreadsPerRow;
    const uint4 raw = *reinterpret_cast<const uint4*>(x + (r0 + rr) * cols + c0 + cc);
    const uint2 q = cast8(raw, scale);
    if (kRowwise) *reinterpret_cast<uint2*>(row_out + (r0 + rr) * cols + c0 + cc) = q;
    if (kColumnwise) *reinterpret_cast<uint2*>(&tile[rr][cc]) = q;
  }
  if (!kColumnwise) return;
  __syncthreads();
  static_assert(!kPaired || (K == 4 && S == 16 && TC == 128), "the paired layout's shape");
  const int warp = tid / 32, lane = tid % 32;
  const int tc = kPaired ? 64 * (warp % 2) + 4 * (lane % 16) : (tid % (TC / K)) * K;
  const int tr = kPaired ? 16 * (2 * (warp / 2) + lane / 16) : (tid / (TC / K)) * S;
  std::uint32_t words[K][S / 4];  // [column][four rows each]
#pragma unroll
  for (int g = 0; g < S / 4; ++g) {
    const int r = tr + 4 * g;
    if constexpr (K == 4) {
      std::uint32_t w[4];
      for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<const std::uint32_t*>(&tile[r + i][tc]);
      const std::uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), lo23 = __byte_perm(w[2], w[3], 0x5140);
      const std::uint32_t hi01 = __byte_perm(w[0], w[1], 0x7362), hi23 = __byte_perm(w[2], w[3], 0x7362);
      words[0][g] = __byte_perm(lo01, lo23, 0x5410);
      words[1][g] = __byte_perm(lo01, lo23, 0x7632);
      words[2][g] = __byte_perm(hi01, hi23, 0x5410);
      words[3][g] = __byte_perm(hi01, hi23, 0x7632);
    } else {
      static_assert(K == 2);
      std::uint32_t h[4];
      for (int i = 0; i < 4; ++i) h[i] = *reinterpret_cast<const std::uint16_t*>(&tile[r + i][tc]);
      const std::uint32_t t01 = __byte_perm(h[0], h[1], 0x5140), t23 = __byte_perm(h[2], h[3], 0x5140);
      words[0][g] = __byte_perm(t01, t23, 0x5410);
      words[1][g] = __byte_perm(t01, t23, 0x7632);
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    std::uint8_t* dst = col_out + (c0 + tc + k) * rows + r0 + tr;
#pragma unroll
    for (int p = 0; p < S / 16; ++p) {
      *reinterpret_cast<uint4*>(dst + 16 * p) =
          make_uint4(words[k][4 * p], words[k][4 * p + 1], words[k][4 * p + 2], words[k][4 * p + 3]);
    }
  }
}

// Median over 5 runs of the time of one launch, each run 20 launches between two events.
double seconds_per_launch(const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<double> t;
  for (int run = 0; run < 5; ++run) {
    CHECK_CUDA(cudaEventRecord(start));
    for (int i = 0; i < 20; ++i) launch();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    t.push_back(ms * 1e-3 / 20);
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("transpose_cast_bench: skipped: no CUDA device\n");
    return 0;
  }
  long long rows = 8192, cols = 8192;
  if (argc == 3) {
    rows = std::atoll(argv[1]);
    cols = std::atoll(argv[2]);
  }
  if (rows <= 0 || cols <= 0 || rows % 256 != 0 || cols % 128 != 0) {
    std::fprintf(stderr, "transpose_cast_bench: rows %lld, cols %lld: expected positive "
                 "multiples of 256 and 128\n", rows, cols);
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const long long n = rows * cols;
  __nv_bfloat16* x = nullptr;
  std::uint8_t *row_out = nullptr, *col_out = nullptr;
  void* copy_out = nullptr;
  CHECK_CUDA(cudaMalloc(&x, n * 2));
  CHECK_CUDA(cudaMalloc(&copy_out, n * 2));
  CHECK_CUDA(cudaMalloc(&row_out, n));
  CHECK_CUDA(cudaMalloc(&col_out, n));
  CHECK_CUDA(cudaMemset(x, 0x3c, n * 2));  // bf16 0x3c3c ≈ 0.0115: finite, nonzero

  const double memcpy_s = seconds_per_launch(
      [&] { CHECK_CUDA(cudaMemcpyAsync(copy_out, x, n * 2, cudaMemcpyDeviceToDevice)); });
  const double copy_s = seconds_per_launch([&] {
    copy_kernel<<<prop.multiProcessorCount * 8, kThreads>>>(
        reinterpret_cast<const uint4*>(x), static_cast<uint4*>(copy_out), n * 2 / 16);
  });
  const double copy_rate = 4.0 * n / copy_s;
  std::printf("device: %s | bf16 %lld x %lld\n", prop.name, rows, cols);
  std::printf("cudaMemcpyAsync: %.1f us, %.0f GB/s\n", memcpy_s * 1e6, 4.0 * n / memcpy_s / 1e9);
  std::printf("copy kernel: %.1f us, %.0f GB/s (the reference below)\n", copy_s * 1e6,
              copy_rate / 1e9);
  const auto report = [&](const char* name, double bytes_per_element, const auto& kernel, int tr,
                          int tc) {
    const unsigned grid = static_cast<unsigned>((rows / tr) * (cols / tc));
    const double s = seconds_per_launch(
        [&] { kernel<<<grid, kThreads>>>(x, rows, cols, 0.5f, row_out, col_out); });
    const double rate = bytes_per_element * n / s;
    std::printf("%s: %.1f us, %.0f GB/s = %.0f%% of the copy kernel\n", name, s * 1e6,
                rate / 1e9, 100.0 * rate / copy_rate);
  };
  report("rowwise only, 128 x 128 tiles", 3, cast_kernel<128, 128, 4, 16, true, false>, 128, 128);
  report("both, 128 x 128, lane 4 cols x 16 rows (quantize.cu before 2026-12-02)", 4,
         cast_kernel<128, 128, 4, 16, true, true>, 128, 128);
  report("transposed only, 128 x 128, lane 4 x 16", 3, cast_kernel<128, 128, 4, 16, false, true>,
         128, 128);
  report("both, 128 x 128, lane 4 x 16, half-warps paired (whole sectors; quantize.cu since "
         "2026-12-02)", 4, cast_kernel<128, 128, 4, 16, true, true, true>, 128, 128);
  report("transposed only, 128 x 128, lane 4 x 16, paired", 3,
         cast_kernel<128, 128, 4, 16, false, true, true>, 128, 128);
  report("both, 128 x 128, lane 2 cols x 32 rows (a lane's two stores fill a sector; each warp store half sectors)", 4,
         cast_kernel<128, 128, 2, 32, true, true>, 128, 128);
  report("transposed only, 128 x 128, lane 2 x 32", 3, cast_kernel<128, 128, 2, 32, false, true>,
         128, 128);
  report("both, 256 x 64, lane 4 x 16", 4, cast_kernel<256, 64, 4, 16, true, true>, 256, 64);
  report("both, 256 x 64, lane 2 x 32", 4, cast_kernel<256, 64, 2, 32, true, true>, 256, 64);
  report("transposed only, 256 x 64, lane 2 x 32", 3, cast_kernel<256, 64, 2, 32, false, true>,
         256, 64);
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(copy_out));
  CHECK_CUDA(cudaFree(row_out));
  CHECK_CUDA(cudaFree(col_out));
  return 0;
}

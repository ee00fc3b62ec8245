// quantize.cu — the recipes' quantization on the GPU (quantize_on_gpu, cuda_backend.h),
// bit for bit the CPU's (src/quant, docs/QUANTIZATION.md): an amax kernel, the per-tensor
// FP8 cast (delayed and current scaling) writing the rowwise copy and its transpose, and a
// tiled block kernel for FP8 block scaling, MXFP8 and NVFP4 (each copy from high
// precision, both in one pass over the tensor). The per-tensor FP8 scale is computed on the device from the amax
// (fp8_scale_kernel, the device twin of fp8_current_scale), so a quantization makes no
// host round trip: the amax, the scale and scale_inv stay on the GPU, where the cast and
// cuBLASLt's FP8 GEMM read them. NVFP4's S_enc is computed on the host from the amax by
// the CPU's own function. The per-block formulas are device twins of the CPU's, operation
// for operation (the products below have no additions, so nvcc's FMA contraction cannot
// change them; division is IEEE).
// Speed: every kernel reads 16 bytes per load and writes whole 16-byte words where the
// layout allows (bench/gpu_layer_bench measures them against the copy bandwidth).
// Thread safety: kernels run on the calling thread's stream (current_stream()).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {
namespace cuda {
namespace {

enum class BlockRecipe : int { kFp8Block, kMxfp8, kNvfp4 };

// ---- device twins of src/quant/element.cpp ----------------------------------------------

// cast_satfinite for E4M3 / E5M2: ±inf first to ±FLT_MAX, then the hardware cast with
// __NV_SATFINITE (round to nearest even, finite overflow to ±max).
__device__ __forceinline__ std::uint8_t sat_fp8(float v, bool e5m2) {
  if (isinf(v)) v = copysignf(FLT_MAX, v);
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// cast_satfinite for E2M1: the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 with ties to the even
// pattern (the comparisons below: < at ties that go up, <= at ties that go down), larger
// magnitudes to 6; NaN to the zero of the opposite sign (dtype.h's rule).
__device__ __forceinline__ std::uint8_t sat_e2m1(float v) {
  const std::uint8_t sign = signbit(v) ? 0x8 : 0x0;
  if (isnan(v)) return sign ^ 0x8;
  const float m = fabsf(v);
  std::uint8_t b;
  if (m <= 0.25f)
    b = 0;  // tie 0.25 → 0 (even)
  else if (m < 0.75f)
    b = 1;  // tie 0.75 → 1.0 (0x2)
  else if (m <= 1.25f)
    b = 2;  // tie 1.25 → 1.0 (0x2)
  else if (m < 1.75f)
    b = 3;  // tie 1.75 → 2.0 (0x4)
  else if (m <= 2.5f)
    b = 4;  // tie 2.5 → 2.0 (0x4)
  else if (m < 3.5f)
    b = 5;  // tie 3.5 → 4.0 (0x6)
  else if (m <= 5.0f)
    b = 6;  // tie 5 → 4.0 (0x6)
  else
    b = 7;  // up to and beyond 6 (inf included): 6
  return sign | b;
}

__device__ __forceinline__ std::uint8_t e8m0_round_up_dev(float v) {
  if (isnan(v)) return 0xff;
  if (isinf(v)) return 0xfe;
  if (v == 0.0f) return 0x00;
  const std::uint32_t bits = __float_as_uint(v);
  std::uint32_t exponent = (bits >> 23) & 0xffu;
  const std::uint32_t mantissa = bits & 0x7fffffu;
  const bool subnormal_covered = exponent == 0 && mantissa <= 0x400000u;
  if (mantissa > 0 && exponent != 0xfe && !subnormal_covered) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

__device__ __forceinline__ float e8m0_reciprocal_dev(std::uint8_t e) {
  if (e == 0xff) return __uint_as_float(0x7fc00000u);
  if (e == 0) return 1.0f;
  // 2^-127 is an f32 subnormal: the exponent-field shift below would give 0 (and an inf
  // element × 0 = NaN). The CPU's ldexp gives 2^-127; see docs/QUANTIZATION.md (MXFP8).
  if (e == 0xfe) return __uint_as_float(0x00400000u);
  return __uint_as_float(static_cast<std::uint32_t>(254 - e) << 23);  // 2^(127 − e)
}

// fp8_block_scale: 448 / amax (special cases as fp8_current_scale), mantissa cleared.
__device__ __forceinline__ float fp8_block_scale_dev(float amax) {
  float scale = 1.0f;
  if (!(amax == 0.0f || isinf(amax) || isnan(amax))) {
    scale = __fdiv_rn(448.0f, amax);
    if (isinf(scale)) scale = FLT_MAX;
  }
  return __uint_as_float(__float_as_uint(scale) & 0xff800000u);
}

__device__ __forceinline__ float f8e4m3_to_float(std::uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(b, __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float f8e5m2_to_float(std::uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(b, __NV_E5M2);
  return __half2float(__half(h));
}

// E2M1 bits (sign 0x8, magnitude 0 ... 7) as f32.
__device__ __forceinline__ float f4e2m1_to_float(std::uint8_t b) {
  const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = magnitude[b & 0x7];
  return (b & 0x8) ? -m : m;
}

// E8M0 bits as f32: 2^(b − 127), 0xFF NaN; b = 0 is the subnormal 2^-127 (as the CPU's ldexp).
__device__ __forceinline__ float f8e8m0_to_float(std::uint8_t b) {
  if (b == 0xff) return __uint_as_float(0x7fc00000u);
  if (b == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(static_cast<std::uint32_t>(b) << 23);
}

__device__ __forceinline__ float decode_element(std::uint8_t b, DType format) {
  switch (format) {
    case DType::kF8E4M3: return f8e4m3_to_float(b);
    case DType::kF8E5M2: return f8e5m2_to_float(b);
    default: return f4e2m1_to_float(b);
  }
}

// ---- kernels -----------------------------------------------------------------------------

// 16-byte loads: kVec<T> elements of T widened exactly to f32.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ void load_vec(const float* p, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
template <typename H2>
__device__ __forceinline__ float2 widen2(std::uint32_t bits);
template <>
__device__ __forceinline__ float2 widen2<__nv_bfloat162>(std::uint32_t bits) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}
template <>
__device__ __forceinline__ float2 widen2<__half2>(std::uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[8]) {
  using H2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const std::uint32_t w[4] = {q.x, q.y, q.z, q.w};
  for (int i = 0; i < 4; ++i) {
    const float2 f = widen2<H2>(w[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// max |x| as f32 bits: non-negative floats order like their bits, and every NaN (sign
// cleared) is above inf, so a NaN anywhere wins, as on the CPU. A grid-stride loop of
// 16-byte loads (the tail, fewer than kVec elements, by the first threads), a warp and
// then a block reduction, one atomic per block (max is exact in any order).
// REQUIRES: x 16-byte aligned.
constexpr int kAmaxThreads = 256;
template <typename T>
__global__ void amax_kernel(const T* x, long long n, unsigned* out) {
  constexpr int V = kVec<T>;
  unsigned local = 0;
  const long long vectors = n / V;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  // Four loads in flight per thread, then the rest one at a time.
  long long i = first;
  for (; i + 3 * stride < vectors; i += 4 * stride) {
    float v[4][V];
    for (int u = 0; u < 4; ++u) load_vec(x + (i + u * stride) * V, v[u]);
    for (int u = 0; u < 4; ++u) {
      for (int j = 0; j < V; ++j) local = max(local, __float_as_uint(fabsf(v[u][j])));
    }
  }
  for (; i < vectors; i += stride) {
    float v[V];
    load_vec(x + i * V, v);
    for (int j = 0; j < V; ++j) local = max(local, __float_as_uint(fabsf(v[j])));
  }
  if (first < n - vectors * V) {
    local = max(local, __float_as_uint(fabsf(to_float(x[vectors * V + first]))));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    local = max(local, __shfl_xor_sync(0xffffffffu, local, offset));
  }
  __shared__ unsigned warp_max[kAmaxThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned m = 0;
    for (int w = 0; w < kAmaxThreads / 32; ++w) m = max(m, warp_max[w]);
    atomicMax(out, m);
  }
}

// The per-tensor FP8 scale, on the device (one thread): the device twin of the CPU's
// fp8_current_scale and scale_reciprocal (src/quant/fp8_current.cpp), operation for
// operation. `amax_bits` is amax_kernel's result; `given_amax` (a group-reduced amax) is
// used instead when has_given_amax; delayed scaling passes its scale (has_fixed_scale).
// Writes the tensor's own amax, the amax the scale came from, the scale and scale_inv.
__global__ void fp8_scale_kernel(const unsigned* amax_bits, bool has_given_amax, float given_amax,
                                 bool has_fixed_scale, float fixed_scale, float fmax,
                                 float* own_amax, float* global_amax, float* scale,
                                 float* scale_inv) {
  const float own = __uint_as_float(*amax_bits);
  const float amax = has_given_amax ? given_amax : own;
  float s = fixed_scale;
  if (!has_fixed_scale) {
    s = 1.0f;
    if (!(amax == 0.0f || isinf(amax) || isnan(amax))) {
      s = __fdiv_rn(fmax, amax);
      if (isinf(s)) s = FLT_MAX;
    }
  }
  *own_amax = own;
  *global_amax = amax;
  *scale = s;
  *scale_inv = __fdiv_rn(1.0f, s);
}

// The per-tensor cast: rowwise [rows, cols] and its transpose [cols, rows] (either may
// be null), each element x · scale cast to FP8 (RNE, saturating), `scale` read from the
// device. One 256-thread block per tile of 128 rows x 128 columns:
//   load   each thread reads 16 bytes of a row at once (kVec elements), casts them and
//          writes its bytes of the rowwise copy (a row's 128 bytes by consecutive
//          threads), keeping them in shared memory;
//   store  the transpose: warp w, lane l takes transposed row c = 32 · (w % 4) + l and
//          16 consecutive bytes of it (16 tile rows, segment s), so the 32 lanes read one
//          row of shared memory at 32 consecutive bytes (8 banks, no conflict) and each
//          writes 16 bytes; the 8 segments of a 128-byte transposed row come from
//          different warps and meet in L2.
// REQUIRES: x 16-byte aligned, cols a multiple of 16 and, for the transpose, rows a
// multiple of 16 (check_quantizable).
constexpr int kCastTile = 128, kCastThreads = 256, kCastPad = 8;  // rows stay 8-byte aligned

template <typename T>
__global__ void __launch_bounds__(kCastThreads)
    per_tensor_kernel(const T* x, long long rows, long long cols, const float* scale_ptr,
                      bool e5m2, std::uint8_t* row_out, std::uint8_t* col_out) {
  constexpr int V = kVec<T>;
  constexpr int kThreadsPerRow = kCastTile / V;
  constexpr int kRowsPerPass = kCastThreads / kThreadsPerRow;
  __shared__ __align__(16) std::uint8_t tile[kCastTile][kCastTile + kCastPad];
  const float scale = *scale_ptr;
  // Row tiles on x (up to 2³¹ − 1), column tiles on y (cols ≤ 65535 · 128).
  const long long r0 = static_cast<long long>(blockIdx.x) * kCastTile;
  const long long c0 = static_cast<long long>(blockIdx.y) * kCastTile;
  const int tid = threadIdx.x;
  const int col_in_tile = (tid % kThreadsPerRow) * V;
  const long long c = c0 + col_in_tile;
#pragma unroll
  for (int pass = 0; pass < kCastTile / kRowsPerPass; ++pass) {
    const int row_in_tile = pass * kRowsPerPass + tid / kThreadsPerRow;
    const long long r = r0 + row_in_tile;
    if (r < rows && c < cols) {
      float v[V];
      load_vec(x + r * cols + c, v);
      std::uint32_t words[V / 4];
      for (int w = 0; w < V / 4; ++w) {
        words[w] = 0;
        for (int b = 0; b < 4; ++b) {
          words[w] |= static_cast<std::uint32_t>(sat_fp8(v[4 * w + b] * scale, e5m2)) << (8 * b);
        }
      }
      if constexpr (V == 8) {
        const uint2 out = make_uint2(words[0], words[1]);
        if (row_out) *reinterpret_cast<uint2*>(row_out + r * cols + c) = out;
        *reinterpret_cast<uint2*>(&tile[row_in_tile][col_in_tile]) = out;
      } else {
        if (row_out) *reinterpret_cast<std::uint32_t*>(row_out + r * cols + c) = words[0];
        *reinterpret_cast<std::uint32_t*>(&tile[row_in_tile][col_in_tile]) = words[0];
      }
    }
  }
  if (col_out == nullptr) return;
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32;
  const int tc = 32 * (warp % 4) + lane;  // transposed row (tile column)
  const long long ct = c0 + tc;
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int segment = warp / 4 + 2 * pass;  // 16 tile rows each: 0 ... 7
    const long long rb = r0 + 16 * segment;
    if (ct < cols && rb < rows) {
      alignas(16) std::uint8_t b[16];
      for (int i = 0; i < 16; ++i) b[i] = tile[16 * segment + i][tc];
      std::uint8_t* dst = col_out + ct * rows + rb;
      if (rb + 16 <= rows) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(b);
      } else {
        for (int i = 0; rb + i < rows; ++i) dst[i] = b[i];
      }
    }
  }
}

// A block's multiplier (the factor its elements are multiplied by before the cast) from
// its amax, its scale_inv written at scale_inv[index]: the device twins of the CPU's
// fp8_block_scale, MXFP8's E8M0 scale and NVFP4's E4M3 block scale.
template <BlockRecipe R>
__device__ __forceinline__ float block_factor(float amax, float s_enc, void* scale_inv,
                                              long long index) {
  if constexpr (R == BlockRecipe::kFp8Block) {
    const float factor = fp8_block_scale_dev(amax);
    static_cast<float*>(scale_inv)[index] = __fdiv_rn(1.0f, factor);
    return factor;
  } else if constexpr (R == BlockRecipe::kMxfp8) {
    const std::uint8_t e = e8m0_round_up_dev(amax * (1.0f / 448.0f));
    static_cast<std::uint8_t*>(scale_inv)[index] = e;
    return e8m0_reciprocal_dev(e);
  } else {
    const float s_enc_over_6 = s_enc * (1.0f / 6.0f);
    const float decode = amax * s_enc_over_6;
    const std::uint8_t sb = sat_fp8(fminf(decode, FLT_MAX), false);
    static_cast<std::uint8_t*>(scale_inv)[index] = sb;
    const float s_dec = __fdiv_rn(1.0f, s_enc);
    return fminf(__fdiv_rn(1.0f, f8e4m3_to_float(sb) * s_dec), FLT_MAX);
  }
}

template <BlockRecipe R>
__device__ __forceinline__ std::uint8_t block_cast(float v) {
  return R == BlockRecipe::kNvfp4 ? sat_e2m1(v) : sat_fp8(v, false);
}

// The block amax as on the CPU: the largest |v|, NaN when any element is NaN.
struct BlockAmax {
  float amax = 0.0f;
  bool nan = false;
  __device__ __forceinline__ void add(float v) {
    nan = nan || isnan(v);
    amax = fmaxf(amax, fabsf(v));
  }
  __device__ __forceinline__ float value() const {
    return nan ? __uint_as_float(0x7fc00000u) : amax;
  }
};

// N bytes from a thread-local array to global memory: 16-byte stores when N is a multiple
// of 16 (dst then 16-byte aligned), else byte by byte.
template <int N>
__device__ __forceinline__ void store_bytes(std::uint8_t* dst, const std::uint8_t (&b)[N]) {
  if constexpr (N % 16 == 0) {
    for (int i = 0; i < N; i += 16) {
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(b + i);
    }
  } else {
    for (int i = 0; i < N; ++i) dst[i] = b[i];
  }
}

// The block recipes' quantization, one 256-thread block per tile of 128 x 128 elements of
// the tensor, held in shared memory as f32 (exact widening). Each copy is quantized from
// the tile, as on the CPU from high precision:
//   1-D blocks (1 x B rowwise; B x 1 of the tensor for the columnwise copy, which is
//   stored transposed): one thread per block. Rowwise, the 32 lanes of a warp take 32
//   consecutive tile rows at the same column (the row pitch of 129 floats puts them in 32
//   banks); columnwise, 32 consecutive columns. Each thread computes its block's amax and
//   factor, writes the scale_inv, casts its B elements and stores them as 16-byte words.
//   2-D blocks (128 x 128, FP8 block scaling's weights): the tile is the block; its amax
//   by a block reduction, then each thread casts a half row (rowwise copy) and a half
//   column (columnwise copy) with the one factor.
// Tiles are aligned to 128 and every block lies in one tile (B divides 128). REQUIRES:
// cols a multiple of BC and, for the columnwise copy or 2-D blocks, rows a multiple of the
// rows of a block (check_quantizable); x 16-byte aligned.
constexpr int kBlockTile = 128, kBlockThreads = 256, kBlockPitch = kBlockTile + 1;
constexpr std::size_t kBlockSharedBytes = sizeof(float) * kBlockTile * kBlockPitch;

template <typename T, BlockRecipe R, int BC, bool kTwoD>
__global__ void __launch_bounds__(kBlockThreads)
    block_tile_kernel(const T* x, long long rows, long long cols, float s_enc,
                      std::uint8_t* row_data, void* row_scale_inv, std::uint8_t* col_data,
                      void* col_scale_inv, unsigned* amax_bits) {
  extern __shared__ float tile_storage[];
  auto tile = [&](int r, int c) -> float& { return tile_storage[r * kBlockPitch + c]; };
  constexpr int V = kVec<T>;
  constexpr int kThreadsPerRow = kBlockTile / V;
  constexpr int kRowsPerPass = kBlockThreads / kThreadsPerRow;
  const long long r0 = static_cast<long long>(blockIdx.x) * kBlockTile;
  const long long c0 = static_cast<long long>(blockIdx.y) * kBlockTile;
  const int tid = threadIdx.x;
  const int tile_rows = static_cast<int>(rows - r0 < kBlockTile ? rows - r0 : kBlockTile);
  const int tile_cols = static_cast<int>(cols - c0 < kBlockTile ? cols - c0 : kBlockTile);
  {  // load (16-byte reads; cols is a multiple of 16, so a vector never straddles the end)
    const int cc = (tid % kThreadsPerRow) * V;
    unsigned local = 0;  // the tensor's amax as f32 bits (amax_kernel's rule), if asked
    for (int rr = tid / kThreadsPerRow; rr < tile_rows; rr += kRowsPerPass) {
      if (cc < tile_cols) {
        float v[V];
        load_vec(x + (r0 + rr) * cols + c0 + cc, v);
        for (int j = 0; j < V; ++j) {
          tile(rr, cc + j) = v[j];
          local = max(local, __float_as_uint(fabsf(v[j])));
        }
      }
    }
    if (amax_bits != nullptr) {
      for (int offset = 16; offset > 0; offset >>= 1) {
        local = max(local, __shfl_xor_sync(0xffffffffu, local, offset));
      }
      if (tid % 32 == 0) atomicMax(amax_bits, local);
    }
  }
  __syncthreads();

  if constexpr (kTwoD) {  // FP8 block scaling's 128 x 128 weight blocks (tile = block)
    BlockAmax partial;
    for (int i = tid; i < kBlockTile * kBlockTile; i += kBlockThreads) {
      partial.add(tile(i / kBlockTile, i % kBlockTile));
    }
    __shared__ float warp_amax[kBlockThreads / 32];
    __shared__ bool warp_nan[kBlockThreads / 32];
    float m = partial.amax;
    bool nan = partial.nan;
    for (int offset = 16; offset > 0; offset >>= 1) {
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
      nan = __any_sync(0xffffffffu, nan);
    }
    if (tid % 32 == 0) {
      warp_amax[tid / 32] = m;
      warp_nan[tid / 32] = nan;
    }
    __syncthreads();
    __shared__ float factor_shared;
    if (tid == 0) {
      BlockAmax block;
      for (int w = 0; w < kBlockThreads / 32; ++w) {
        block.amax = fmaxf(block.amax, warp_amax[w]);
        block.nan = block.nan || warp_nan[w];
      }
      const float amax = block.value();
      const long long bi = r0 / kBlockTile, bj = c0 / kBlockTile;
      float factor = 0.0f;
      if (row_data) factor = block_factor<R>(amax, s_enc, row_scale_inv, bi * (cols / kBlockTile) + bj);
      if (col_data) factor = block_factor<R>(amax, s_enc, col_scale_inv, bj * (rows / kBlockTile) + bi);
      factor_shared = factor;
    }
    __syncthreads();
    const float factor = factor_shared;
    const int line = tid % kBlockTile, half = tid / kBlockTile;  // 2 threads per line
    std::uint8_t b[kBlockTile / 2];
    if (row_data) {
      for (int i = 0; i < kBlockTile / 2; ++i) b[i] = block_cast<R>(tile(line, 64 * half + i) * factor);
      store_bytes(row_data + (r0 + line) * cols + c0 + 64 * half, b);
    }
    if (col_data) {
      for (int i = 0; i < kBlockTile / 2; ++i) b[i] = block_cast<R>(tile(64 * half + i, line) * factor);
      store_bytes(col_data + (c0 + line) * rows + r0 + 64 * half, b);
    }
  } else {  // 1-D blocks of BC elements
    constexpr int kBlocksPerLine = kBlockTile / BC;
    if (row_data) {  // block (line, j): tile row `line`, columns j·BC ...
      for (int i = tid; i < kBlockTile * kBlocksPerLine; i += kBlockThreads) {
        const int line = i % kBlockTile, j = i / kBlockTile;
        if (line >= tile_rows || j * BC >= tile_cols) continue;
        BlockAmax a;
        for (int e = 0; e < BC; ++e) a.add(tile(line, j * BC + e));
        const long long r = r0 + line, c = c0 + j * BC;
        const float factor = block_factor<R>(a.value(), s_enc, row_scale_inv, r * (cols / BC) + c / BC);
        std::uint8_t b[BC];
        for (int e = 0; e < BC; ++e) b[e] = block_cast<R>(tile(line, j * BC + e) * factor);
        store_bytes(row_data + r * cols + c, b);
      }
    }
    if (col_data) {  // block (line, j): tile column `line`, rows j·BC ... (whole: rows % BC == 0)
      for (int i = tid; i < kBlockTile * kBlocksPerLine; i += kBlockThreads) {
        const int line = i % kBlockTile, j = i / kBlockTile;
        if (line >= tile_cols || j * BC >= tile_rows) continue;
        BlockAmax a;
        for (int e = 0; e < BC; ++e) a.add(tile(j * BC + e, line));
        const long long c = c0 + line, r = r0 + j * BC;
        const float factor = block_factor<R>(a.value(), s_enc, col_scale_inv, c * (rows / BC) + r / BC);
        std::uint8_t b[BC];
        for (int e = 0; e < BC; ++e) b[e] = block_cast<R>(tile(j * BC + e, line) * factor);
        store_bytes(col_data + c * rows + r, b);
      }
    }
  }
}

// values[i] = element i of the copy decoded, times its block's scale_inv (none for a
// per-tensor copy: scale_inv null). Exact in f32, as quantized_values on the CPU.
__global__ void decode_kernel(const std::uint8_t* data, long long rows, long long cols,
                              DType format, const void* scale_inv, DType scale_dtype, int br,
                              int bc, float* values) {
  const long long n = rows * cols;
  const long long scale_cols = scale_inv ? cols / bc : 1;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float v = decode_element(data[i], format);
    if (scale_inv) {
      const long long r = i / cols, c = i % cols;
      const long long s = (r / br) * scale_cols + c / bc;
      const std::uint8_t* bytes = static_cast<const std::uint8_t*>(scale_inv);
      switch (scale_dtype) {
        case DType::kF32: v *= static_cast<const float*>(scale_inv)[s]; break;
        case DType::kF8E8M0: v *= f8e8m0_to_float(bytes[s]); break;
        default: v *= f8e4m3_to_float(bytes[s]); break;  // NVFP4's E4M3 block scales
      }
    }
    values[i] = v;
  }
}

// The amax of x as f32 bits in a device word (amax_kernel), no host round trip.
// REQUIRES: x 16-byte aligned.
Tensor gpu_amax_bits(const Tensor& x) {
  Tensor bits({1}, DType::kF32, Device::kCuda);  // read as unsigned by the kernels
  TPCHECK_CUDA_CHECK(cudaMemsetAsync(bits.raw(), 0, sizeof(unsigned), current_stream()));
  const long long n = x.numel();
  if (n == 0) return bits;
  auto* out = static_cast<unsigned*>(bits.raw());
  // Enough blocks to fill the GPU (8 per SM of an H200's 132) and keep the atomics few.
  const auto launch = [&](auto* typed) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(typed)>>;
    const unsigned blocks = std::min(grid_for(n / kVec<T> + 1, kAmaxThreads), 132u * 8u);
    amax_kernel<T><<<blocks, kAmaxThreads, 0, current_stream()>>>(typed, n, out);
  };
  switch (x.dtype()) {
    case DType::kF32: launch(static_cast<const float*>(x.raw())); break;
    case DType::kF16: launch(static_cast<const __half*>(x.raw())); break;
    default: launch(static_cast<const __nv_bfloat16*>(x.raw())); break;
  }
  TPCHECK_LAUNCH_CHECK();
  return bits;
}

Tensor scalar(float v) { return Tensor::from_f32(std::span<const float>(&v, 1), {1}, DType::kF32); }

// Both copies of a block recipe's quantization in one pass over x (block_tile_kernel).
// amax_bits: where the kernel max-reduces the tensor's amax (f32 bits), or null.
template <BlockRecipe R, int BC, bool kTwoD, typename T>
void launch_block_tiles(const T* x, std::int64_t rows, std::int64_t cols, float s_enc,
                        QuantizedData& q, unsigned* amax_bits) {
  auto kernel = block_tile_kernel<T, R, BC, kTwoD>;
  // The tile is 66 KB: above the 48 KB a kernel gets without asking.
  TPCHECK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kBlockSharedBytes)));
  const long long row_tiles = (rows + kBlockTile - 1) / kBlockTile;
  const long long col_tiles = (cols + kBlockTile - 1) / kBlockTile;
  TPCHECK_CHECK_INPUT(col_tiles <= 65535 && row_tiles <= 0x7fffffffLL,
                      "[{}, {}]: too large for the GPU block quantization kernel", rows, cols);
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
  auto* row_data = static_cast<std::uint8_t*>(q.rowwise_data.defined() ? q.rowwise_data.raw() : nullptr);
  auto* col_data = static_cast<std::uint8_t*>(q.columnwise_data.defined() ? q.columnwise_data.raw() : nullptr);
  kernel<<<grid, kBlockThreads, kBlockSharedBytes, current_stream()>>>(
      x, rows, cols, s_enc, row_data, q.rowwise_scale_inv.defined() ? q.rowwise_scale_inv.raw() : nullptr,
      col_data, q.columnwise_scale_inv.defined() ? q.columnwise_scale_inv.raw() : nullptr,
      amax_bits);
  TPCHECK_LAUNCH_CHECK();
}

template <BlockRecipe R, int BC, bool kTwoD>
void launch_block_tiles(const Tensor& x, std::int64_t rows, std::int64_t cols, float s_enc,
                        QuantizedData& q, unsigned* amax_bits) {
  switch (x.dtype()) {
    case DType::kF32:
      launch_block_tiles<R, BC, kTwoD>(static_cast<const float*>(x.raw()), rows, cols, s_enc, q,
                                       amax_bits);
      break;
    case DType::kF16:
      launch_block_tiles<R, BC, kTwoD>(static_cast<const __half*>(x.raw()), rows, cols, s_enc, q,
                                       amax_bits);
      break;
    default:
      launch_block_tiles<R, BC, kTwoD>(static_cast<const __nv_bfloat16*>(x.raw()), rows, cols,
                                       s_enc, q, amax_bits);
      break;
  }
}

}  // namespace
}  // namespace cuda

std::shared_ptr<QuantizedData> quantize_on_gpu(const Tensor& x, const QuantizeOptions& o,
                                               std::string_view what) {
  using namespace cuda;
  check_cuda_operand("quantize_on_gpu", what, x);
  TPCHECK_CHECK_INPUT(x.dtype() != DType::kF64,
                      "{} {}: recipes quantize f32, f16 or bf16 tensors, got f64", what,
                      x.describe());
  TPCHECK_CHECK_INPUT(o.usage.rowwise || o.usage.columnwise,
                      "{}: quantization asked for neither a rowwise nor a columnwise copy", what);
  check_quantizable(what, x.shape(), o.recipe, o.role, o.usage);
  const std::int64_t cols = x.dim(-1);
  const std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;

  auto q = std::make_shared<QuantizedData>();
  q->recipe = std::string(recipe_name(o.recipe));
  q->format = quant_data_dtype(o.recipe, o.role);
  q->rows = rows;
  q->cols = cols;
  q->block = quant_block(o.recipe, o.role);
  // The kernels read 16 bytes at once: a view that does not start on 16 bytes is read from
  // an aligned copy (the allocator's blocks are 256-byte aligned).
  const Tensor aligned = reinterpret_cast<std::uintptr_t>(x.raw()) % 16 == 0 ? x : x.clone();

  if (o.recipe == Recipe::kFp8Delayed || o.recipe == Recipe::kFp8Current) {
    const Tensor amax_bits = gpu_amax_bits(aligned);  // f32 bits of max |x|, on the GPU
    // Amax, scale and scale_inv stay on the GPU: no host round trip (the delayed-scaling
    // bookkeeping reads the amax when it records it). One scale_inv tensor serves both
    // copies (they share the scale; nothing writes it after this).
    q->amax = Tensor({1}, DType::kF32, Device::kCuda);
    q->global_amax = Tensor({1}, DType::kF32, Device::kCuda);
    q->scale = Tensor({1}, DType::kF32, Device::kCuda);
    Tensor scale_inv({1}, DType::kF32, Device::kCuda);
    const bool delayed = o.recipe == Recipe::kFp8Delayed;
    fp8_scale_kernel<<<1, 1, 0, current_stream()>>>(
        static_cast<const unsigned*>(amax_bits.raw()), o.amax.has_value(), o.amax.value_or(0.0f),
        delayed, o.scale, static_cast<float>(dtype_max_finite(q->format)),
        static_cast<float*>(q->amax.raw()), static_cast<float*>(q->global_amax.raw()),
        static_cast<float*>(q->scale.raw()), static_cast<float*>(scale_inv.raw()));
    TPCHECK_LAUNCH_CHECK();
    if (o.usage.rowwise) {
      q->rowwise_data = Tensor({rows, cols}, q->format, Device::kCuda);
      q->rowwise_scale_inv = scale_inv;
    }
    if (o.usage.columnwise) {
      q->columnwise_data = Tensor({cols, rows}, q->format, Device::kCuda);
      q->columnwise_scale_inv = scale_inv;
    }
    if (rows * cols > 0) {
      const long long row_tiles = (rows + kCastTile - 1) / kCastTile;
      const long long col_tiles = (cols + kCastTile - 1) / kCastTile;
      TPCHECK_CHECK_INPUT(col_tiles <= 65535 && row_tiles <= 0x7fffffffLL,
                          "{} {}: too large for the GPU cast kernel ({} x {} tiles of 128)", what,
                          x.describe(), row_tiles, col_tiles);
      const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
      const bool e5m2 = q->format == DType::kF8E5M2;
      const auto* scale_ptr = static_cast<const float*>(q->scale.raw());
      std::uint8_t* row_out = o.usage.rowwise ? static_cast<std::uint8_t*>(q->rowwise_data.raw()) : nullptr;
      std::uint8_t* col_out = o.usage.columnwise ? static_cast<std::uint8_t*>(q->columnwise_data.raw()) : nullptr;
      const void* xp = aligned.raw();
      switch (x.dtype()) {
        case DType::kF32:
          per_tensor_kernel<<<grid, kCastThreads, 0, current_stream()>>>(
              static_cast<const float*>(xp), rows, cols, scale_ptr, e5m2, row_out, col_out);
          break;
        case DType::kF16:
          per_tensor_kernel<<<grid, kCastThreads, 0, current_stream()>>>(
              static_cast<const __half*>(xp), rows, cols, scale_ptr, e5m2, row_out, col_out);
          break;
        default:
          per_tensor_kernel<<<grid, kCastThreads, 0, current_stream()>>>(
              static_cast<const __nv_bfloat16*>(xp), rows, cols, scale_ptr, e5m2, row_out, col_out);
          break;
      }
      TPCHECK_LAUNCH_CHECK();
    }
    return q;
  }

  // The block recipes. Their blocks carry their own scales; the tensor's amax is kept
  // (FP8 block scaling and MXFP8: max-reduced by the block kernel as it reads the tiles;
  // NVFP4 needs it before the first cast, for its global scale: a pass of its own, read
  // back, the scale computed on the host).
  const bool amax_first = o.recipe == Recipe::kNvfp4;
  Tensor amax_bits;  // the f32 bits of max |x|
  if (amax_first) {
    amax_bits = gpu_amax_bits(aligned);
  } else {
    amax_bits = Tensor({1}, DType::kF32, Device::kCuda);
    TPCHECK_CUDA_CHECK(cudaMemsetAsync(amax_bits.raw(), 0, sizeof(unsigned), current_stream()));
  }
  unsigned* fused_amax = amax_first ? nullptr : static_cast<unsigned*>(amax_bits.raw());
  q->amax = amax_bits;
  q->global_amax = o.amax ? scalar(*o.amax) : amax_bits;
  const std::int64_t br = q->block[0], bc = q->block[1];
  // Each copy in its own layout: [rows/br, cols/bc] rowwise, [cols/br, rows/bc] columnwise.
  const DType scale_dtype = o.recipe == Recipe::kFp8Block ? DType::kF32
                            : o.recipe == Recipe::kMxfp8  ? DType::kF8E8M0
                                                          : DType::kF8E4M3;
  if (o.usage.rowwise) {
    q->rowwise_data = Tensor({rows, cols}, q->format, Device::kCuda);
    q->rowwise_scale_inv = Tensor({rows / br, cols / bc}, scale_dtype, Device::kCuda);
  }
  if (o.usage.columnwise) {
    q->columnwise_data = Tensor({cols, rows}, q->format, Device::kCuda);
    q->columnwise_scale_inv = Tensor({cols / br, rows / bc}, scale_dtype, Device::kCuda);
  }
  if (rows * cols == 0) {
    if (o.recipe == Recipe::kNvfp4) q->scale = scalar(nvfp4_global_encode_scale(o.amax.value_or(0.0f)));
    return q;
  }
  switch (o.recipe) {
    case Recipe::kFp8Block:
      if (br == 1) {
        launch_block_tiles<BlockRecipe::kFp8Block, 128, false>(aligned, rows, cols, 0.0f, *q, fused_amax);
      } else {
        launch_block_tiles<BlockRecipe::kFp8Block, 128, true>(aligned, rows, cols, 0.0f, *q, fused_amax);
      }
      break;
    case Recipe::kMxfp8:
      launch_block_tiles<BlockRecipe::kMxfp8, 32, false>(aligned, rows, cols, 0.0f, *q, fused_amax);
      break;
    default: {  // kNvfp4 (check_quantizable rejected kNone)
      const float amax = o.amax.value_or(static_cast<float>(amax_bits.at(0)));
      const float s_enc = nvfp4_global_encode_scale(amax);
      q->scale = scalar(s_enc);
      launch_block_tiles<BlockRecipe::kNvfp4, 16, false>(aligned, rows, cols, s_enc, *q, nullptr);
      break;
    }
  }
  return q;
}

QuantizedValues quantized_values_on_gpu(const QuantizedData& q, bool columnwise) {
  using namespace cuda;
  const Tensor& data = columnwise ? q.columnwise_data : q.rowwise_data;
  const Tensor& scale_inv = columnwise ? q.columnwise_scale_inv : q.rowwise_scale_inv;
  TPCHECK_CHECK_INPUT(data.defined(), "quantized {} tensor [{}, {}] has no {} copy", q.recipe,
                      q.rows, q.cols, columnwise ? "columnwise" : "rowwise");
  TPCHECK_CHECK_INPUT(data.device() == Device::kCuda && is_quantized_format(data.dtype()),
                      "quantized_values_on_gpu: the {} copy is {}; expected quantized data on "
                      "the GPU (Backend::quantize of the CUDA backend)",
                      columnwise ? "columnwise" : "rowwise", data.describe());
  const std::int64_t rows = data.dim(0), cols = data.dim(1);
  QuantizedValues out;
  out.values = Tensor({rows, cols}, DType::kF32, Device::kCuda);
  const bool per_tensor = q.block.empty();
  Tensor block_scales;
  if (per_tensor) {
    out.tensor_factor = static_cast<float>(scale_inv.at(0));  // the GEMM's factor
  } else {
    block_scales = scale_inv.to_device(Device::kCuda);
  }
  const long long n = rows * cols;
  if (n > 0) {
    decode_kernel<<<grid_for(n), 256, 0, current_stream()>>>(
        static_cast<const std::uint8_t*>(data.raw()), rows, cols, q.format,
        per_tensor ? nullptr : block_scales.raw(), per_tensor ? DType::kF32 : block_scales.dtype(),
        per_tensor ? 1 : static_cast<int>(q.block[0]), per_tensor ? 1 : static_cast<int>(q.block[1]),
        static_cast<float*>(out.values.raw()));
    TPCHECK_LAUNCH_CHECK();
  }
  return out;
}

}  // namespace tpcheck

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
// Speed: every kernel reads 16 bytes per load; the rowwise copies are written by warps
// storing whole consecutive rows, the transposed ones in 16-byte pieces; the block kernel
// reduces each block's amax across the lanes that loaded it (shuffles), never by one
// thread walking a block; the tiled kernels walk the tensor from its end, where the L2
// still holds what the pass before read last (tile_from_the_end). bench/gpu_layer_bench
// measures them against the copy bandwidth.
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

// 16-byte loads: kVec<T> elements of T widened exactly to f32. load_raw keeps the bits
// (the block kernel stages them in shared memory in T), widen_vec widens them.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ uint4 load_raw(const T* p) {
  return *reinterpret_cast<const uint4*>(p);
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
__device__ __forceinline__ void widen_vec(const uint4& q, float (&v)[kVec<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    v[0] = __uint_as_float(q.x); v[1] = __uint_as_float(q.y);
    v[2] = __uint_as_float(q.z); v[3] = __uint_as_float(q.w);
  } else {
    using H2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    const std::uint32_t w[4] = {q.x, q.y, q.z, q.w};
    for (int i = 0; i < 4; ++i) {
      const float2 f = widen2<H2>(w[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVec<T>]) {
  widen_vec<T>(load_raw(p), v);
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

// Where a block of a tiled kernel (per_tensor_kernel, block_tile_kernel) works: the grid
// is one-dimensional, one block per tile of 128 x 128 (up to 2³¹ − 1 tiles), and walks
// the tiles from the END of the tensor backwards — block 0 takes the last column tile of
// the last row tile, column tiles fastest. Why backwards: the pass before read or wrote
// the tensor's tail last — amax_kernel (the per-tensor scales and NVFP4's need the whole
// amax first) is a grid-stride loop whose blocks move through x together from front to
// back; otherwise x's producer usually wrote it front to back — so the L2 (50 MB on an
// H200) still holds that tail, and the first waves of blocks, which start together, read
// it from there instead of from DRAM. The order changes no result: each tile is
// quantized on its own.
struct TileOrigin {
  long long r0, c0;  // the tile's first row and column
};
__device__ __forceinline__ TileOrigin tile_from_the_end(long long col_tiles, int tile_size) {
  const long long t = static_cast<long long>(gridDim.x) - 1 - blockIdx.x;
  return {(t / col_tiles) * tile_size, (t % col_tiles) * tile_size};
}

// The per-tensor cast: rowwise [rows, cols] and its transpose [cols, rows] (either may
// be null), each element x · scale cast to FP8 (RNE, saturating), `scale` read from the
// device. One 256-thread block per tile of 128 rows x 128 columns (tile_from_the_end):
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
    per_tensor_kernel(const T* x, long long rows, long long cols, long long col_tiles,
                      const float* scale_ptr, bool e5m2, std::uint8_t* row_out,
                      std::uint8_t* col_out) {
  constexpr int V = kVec<T>;
  constexpr int kThreadsPerRow = kCastTile / V;
  constexpr int kRowsPerPass = kCastThreads / kThreadsPerRow;
  __shared__ __align__(16) std::uint8_t tile[kCastTile][kCastTile + kCastPad];
  const float scale = *scale_ptr;
  const TileOrigin origin = tile_from_the_end(col_tiles, kCastTile);
  const long long r0 = origin.r0, c0 = origin.c0;
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

// A block's scale from its amax: the factor its elements are multiplied by before the
// cast, and the scale_inv its copy stores (f32 for FP8 block scaling, E8M0 bits for MXFP8,
// E4M3 bits for NVFP4) — the device twins of the CPU's fp8_block_scale, MXFP8's E8M0
// scale and NVFP4's E4M3 block scale, operation for operation. NVFP4's two per-tensor
// terms (S_enc / 6 and s_dec = 1 / S_enc) are computed once, by the same operations the
// CPU repeats per block, so their values are the CPU's.
template <BlockRecipe R>
struct BlockScale {
  using ScaleInv = std::conditional_t<R == BlockRecipe::kFp8Block, float, std::uint8_t>;
  float factor;
  ScaleInv scale_inv;
  __device__ __forceinline__ void write_scale_inv(void* scale_invs, long long index) const {
    static_cast<ScaleInv*>(scale_invs)[index] = scale_inv;
  }
};

template <BlockRecipe R>
struct BlockScaler {
  float s_enc_over_6 = 0.0f, s_dec = 0.0f;  // NVFP4 only
  __device__ __forceinline__ explicit BlockScaler(float s_enc) {
    if constexpr (R == BlockRecipe::kNvfp4) {
      s_enc_over_6 = s_enc * (1.0f / 6.0f);
      s_dec = __fdiv_rn(1.0f, s_enc);
    }
  }
  __device__ __forceinline__ BlockScale<R> of(float amax) const {
    if constexpr (R == BlockRecipe::kFp8Block) {
      const float factor = fp8_block_scale_dev(amax);
      return {factor, __fdiv_rn(1.0f, factor)};
    } else if constexpr (R == BlockRecipe::kMxfp8) {
      const std::uint8_t e = e8m0_round_up_dev(amax * (1.0f / 448.0f));
      return {e8m0_reciprocal_dev(e), e};
    } else {
      const float decode = amax * s_enc_over_6;
      const std::uint8_t sb = sat_fp8(fminf(decode, FLT_MAX), false);
      return {fminf(__fdiv_rn(1.0f, f8e4m3_to_float(sb) * s_dec), FLT_MAX), sb};
    }
  }
};

template <BlockRecipe R>
__device__ __forceinline__ std::uint8_t block_cast(float v) {
  return R == BlockRecipe::kNvfp4 ? sat_e2m1(v) : sat_fp8(v, false);
}

// Block amaxes are reduced as magnitude keys: the bits of |v| in T's own format (sign bit
// cleared), two to a 32-bit word for f16 / bf16 (the words of a 16-byte load masked, no
// widening; __vmaxu2 takes two keys at once). In each format non-negative values order
// like their bits and every NaN lies above inf; widening is exact and keeps that order
// (a NaN stays a NaN). So the largest key, widened, is max |v| — or a NaN when any element
// is NaN, the CPU's block_amax rule — and, as f32 bits (amax_bits_of), the value
// amax_kernel's max over the elements' f32 |v| bits gives (a NaN's payload aside).
template <typename T>
struct MagnitudeKeys {
  static constexpr bool kPacked = sizeof(T) == 2;
  static constexpr std::uint32_t kMask = kPacked ? 0x7fff7fffu : 0x7fffffffu;
  using Key = std::conditional_t<kPacked, std::uint16_t, std::uint32_t>;  // in shared memory
  __device__ static __forceinline__ std::uint32_t max_of(std::uint32_t a, std::uint32_t b) {
    if constexpr (kPacked) {
      return __vmaxu2(a, b);  // each 16-bit half on its own
    } else {
      return max(a, b);
    }
  }
  // The largest key of a word.
  __device__ static __forceinline__ std::uint32_t top(std::uint32_t word) {
    if constexpr (kPacked) {
      return max(word & 0xffffu, word >> 16);
    } else {
      return word;
    }
  }
  // The f32 bits of |v| for the element whose key this is.
  __device__ static __forceinline__ unsigned amax_bits_of(std::uint32_t key) {
    const auto bits = static_cast<unsigned short>(key);
    if constexpr (std::is_same_v<T, float>) {
      return key;
    } else if constexpr (std::is_same_v<T, __half>) {
      return __float_as_uint(fabsf(__half2float(__ushort_as_half(bits))));
    } else {
      return __float_as_uint(fabsf(__bfloat162float(__ushort_as_bfloat16(bits))));
    }
  }
};

// The amax the scale functions see, from f32 |v| bits: that value, or the canonical NaN
// when they are a NaN's (whose payload no scale function looks at: each asks only isnan,
// or lets fminf drop it).
__device__ __forceinline__ float amax_of_bits(unsigned bits) {
  return bits > 0x7f800000u ? __uint_as_float(0x7fc00000u) : __uint_as_float(bits);
}

// N values (4, 8 or 16) times `factor`, cast, stored as N consecutive bytes in one store.
// REQUIRES: dst aligned to N bytes.
template <BlockRecipe R, int N>
__device__ __forceinline__ void cast_store(std::uint8_t* dst, const float (&v)[N], float factor) {
  std::uint32_t words[N / 4];
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    words[w] = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      words[w] |= static_cast<std::uint32_t>(block_cast<R>(v[4 * w + b] * factor)) << (8 * b);
    }
  }
  if constexpr (N == 16) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
  } else if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
  } else {
    static_assert(N == 4);
    *reinterpret_cast<std::uint32_t*>(dst) = words[0];
  }
}

// The block recipes' quantization, one 256-thread block per tile of 128 x 128 elements of
// the tensor (tile_from_the_end), each copy quantized from high precision as on the CPU.
// V = kVec<T> (8 for f16 / bf16, 4 for f32) elements make one 16-byte load; a tile row is
// read by 128 / V threads, and the 256 threads form 256 / (128 / V) row groups (16 or 8)
// of 128 / groups (8 or 16) consecutive tile rows each: thread t reads the V columns
// (t mod 128/V) · V ... of every row of its group's chunk.
//   load     each thread keeps its loads in registers; where a columnwise copy or a 2-D
//            block needs the whole tile, it also stores the raw bits in shared memory in
//            T (32 KB for f16 / bf16, 64 KB for f32; exact either way), and it keeps the
//            max |v| of each of its V columns over its chunk (the columnwise partials).
//   rowwise  (1 x BC blocks) a block's BC elements are the loads of BC / V consecutive
//            threads of one row (2 to 32, aligned in the warp): their amax is a
//            butterfly of __shfl_xor_sync over those lanes, every lane computes the
//            factor, one writes the scale_inv, and each casts and stores its V bytes
//            straight to global memory (a warp writes whole 128-byte rows).
//   columnwise (BC x 1 blocks of the tensor, stored transposed) the partials go to shared
//            memory [groups][128]; a block of BC rows covers BC / chunk groups (BC is a
//            multiple of the chunk), so one thread per (tile column, block) reduces them,
//            computes the factor, writes the scale_inv and leaves the factor in shared
//            memory. Then, as per_tensor_kernel, warp w, lane l takes transposed row
//            (tile column) 32 · (w % 4) + l and four segments of 16 tile rows
//            (4 · (w / 4) ... + 3, i.e. 64 consecutive bytes of the transposed row): it
//            reads the 16 values from the staged tile (the 32 lanes read consecutive
//            elements of one tile row: no bank conflict), multiplies them by the factor
//            of the block they lie in (a segment never straddles two: BC is a multiple
//            of 16), casts them and writes 16 bytes.
//   2-D      (128 x 128 blocks, FP8 block scaling's weights: tile = block) one amax for
//            the tile by a block reduction, one factor for both copies; the rowwise copy
//            from the staged tile (each thread its own loads), the columnwise as above.
// The tensor's amax (amax_bits, if not null): the same bits max-reduced over the tile, one
// atomicMax per block (max is exact in any order).
// Tiles are aligned to 128 and every block lies in one tile (BC divides 128); in a tile
// cut by the tensor's edge, a thread whose load lies outside reads zeros, which change no
// amax, and stores nothing. REQUIRES: cols a multiple of BC and of 16 and, for the
// columnwise copy or 2-D blocks, rows a multiple of the rows of a block (check_quantizable:
// so a partial tile holds whole blocks only); x 16-byte aligned.
constexpr int kBlockTile = 128, kBlockThreads = 256;
template <typename T>
constexpr std::size_t kBlockTileBytes = sizeof(T) * kBlockTile * kBlockTile;
// Blocks per SM the registers must allow: 4 for f16 / bf16 (64 registers a thread; the
// shared memory would allow 5: a 32 KB tile and up to 8 KB of partials and factors), 3
// for f32 (80 registers; 64 KB + 8 KB of shared memory allow 3). Before sm_89 the FP8
// casts are emulated in software and need more registers: 3 there (80), so nothing spills.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
constexpr bool kSoftwareFp8Cast = true;
#else
constexpr bool kSoftwareFp8Cast = false;
#endif
template <typename T>
constexpr int kBlockMinBlocksPerSm = sizeof(T) == 4 || kSoftwareFp8Cast ? 3 : 4;

template <typename T, BlockRecipe R, int BC, bool kTwoD>
__global__ void __launch_bounds__(kBlockThreads, kBlockMinBlocksPerSm<T>)
    block_tile_kernel(const T* __restrict__ x, long long rows, long long cols,
                      long long col_tiles, float s_enc, std::uint8_t* row_data,
                      void* row_scale_inv, std::uint8_t* col_data, void* col_scale_inv,
                      unsigned* amax_bits) {
  constexpr int V = kVec<T>;
  constexpr int kThreadsPerRow = kBlockTile / V;              // 16 or 32
  constexpr int kGroups = kBlockThreads / kThreadsPerRow;     // 16 or 8
  constexpr int kChunk = kBlockTile / kGroups;                // 8 or 16 rows per thread
  constexpr int kLanesPerBlock = BC / V;                      // a rowwise block's threads
  constexpr int kGroupsPerBlock = BC / kChunk;                // a columnwise block's groups
  constexpr int kBlocksPerLine = kBlockTile / BC;
  constexpr int kSegments = kBlockTile / 16;                  // of a transposed tile row
  static_assert(kBlockTile % BC == 0 && BC % 16 == 0, "a block lies in one tile, in whole segments");
  static_assert(kThreadsPerRow <= 32 && 32 % kThreadsPerRow == 0, "a warp holds whole tile rows");
  static_assert(kLanesPerBlock >= 1 && kLanesPerBlock <= 32 &&
                    (kLanesPerBlock & (kLanesPerBlock - 1)) == 0 &&
                    kThreadsPerRow % kLanesPerBlock == 0,
                "a rowwise block is a power-of-two group of lanes, aligned in its warp");
  static_assert(BC % kChunk == 0, "a row group's chunk lies in one columnwise block");
  static_assert(kBlockThreads == 256 && kSegments == 8, "the transposed store's warp layout");
  static_assert(!kTwoD || BC == kBlockTile, "a 2-D block is the tile");

  // The staged tile, [128][128] of T without padding: the 16-byte stores of the load are
  // conflict-free (8 lanes cover 128 consecutive bytes) and so are the transposed reads.
  extern __shared__ uint4 block_tile_storage[];
  T* const tile = reinterpret_cast<T*>(block_tile_storage);
  // The columnwise partials: [group][tile column], the largest key of the group's chunk.
  __shared__ __align__(16) typename MagnitudeKeys<T>::Key col_partial[kTwoD ? 1 : kGroups][kBlockTile];
  __shared__ float col_factor[kTwoD ? 1 : kBlocksPerLine][kBlockTile];  // the blocks' factors
  __shared__ std::uint32_t warp_key[kBlockThreads / 32];

  const TileOrigin origin = tile_from_the_end(col_tiles, kBlockTile);
  const long long r0 = origin.r0, c0 = origin.c0;
  const int tile_rows = static_cast<int>(rows - r0 < kBlockTile ? rows - r0 : kBlockTile);
  const int tile_cols = static_cast<int>(cols - c0 < kBlockTile ? cols - c0 : kBlockTile);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int group = tid / kThreadsPerRow;
  const int cc = (tid % kThreadsPerRow) * V;  // the thread's first column in the tile
  const long long c = c0 + cc;
  const bool in_cols = cc < tile_cols;  // cols is a multiple of 16: a load is in or out
  const bool staged = kTwoD || col_data != nullptr;
  const BlockScaler<R> scaler(s_enc);

  using Keys = MagnitudeKeys<T>;
  // The largest key of each of the thread's V columns over its chunk, in the words of its
  // loads; and of all its elements.
  std::uint32_t col_keys[4] = {0u, 0u, 0u, 0u};
  std::uint32_t thread_key = 0;
  // The thread's chunk: tile rows chunk_row ... + kChunk − 1, of which rows_inside lie in
  // the tensor (none, some or all: only the tile at the bottom edge is cut), and where its
  // first row starts in x, in the rowwise copy and in the rowwise scale_inv.
  const int chunk_row = group * kChunk;
  const int rows_inside = in_cols ? tile_rows - chunk_row : 0;
  const long long chunk_start = (r0 + chunk_row) * cols + c;
  const long long chunk_scale_index = (r0 + chunk_row) * (cols / BC) + c / BC;
  // Up to 8 loads in flight per thread, the batches one after the other (f32 has two:
  // all 16 at once would take 64 registers).
  constexpr int kBatch = kChunk < 8 ? kChunk : 8;
#pragma unroll 1
  for (int first = 0; first < kChunk; first += kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      raw[b] = make_uint4(0u, 0u, 0u, 0u);
      if (first + b < rows_inside) raw[b] = load_raw(x + chunk_start + (first + b) * cols);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int p = first + b;  // the row in the chunk
      const bool inside = p < rows_inside;
      if (staged && inside) *reinterpret_cast<uint4*>(tile + (chunk_row + p) * kBlockTile + cc) = raw[b];
      const std::uint32_t keys[4] = {raw[b].x & Keys::kMask, raw[b].y & Keys::kMask,
                                     raw[b].z & Keys::kMask, raw[b].w & Keys::kMask};
#pragma unroll
      for (int i = 0; i < 4; ++i) col_keys[i] = Keys::max_of(col_keys[i], keys[i]);
      std::uint32_t row_key =
          Keys::top(Keys::max_of(Keys::max_of(keys[0], keys[1]), Keys::max_of(keys[2], keys[3])));
      thread_key = max(thread_key, row_key);
      if constexpr (!kTwoD) {
        if (row_data != nullptr) {  // uniform: every lane takes part in the shuffles
#pragma unroll
          for (int offset = kLanesPerBlock / 2; offset > 0; offset >>= 1) {
            row_key = max(row_key, __shfl_xor_sync(0xffffffffu, row_key, offset));
          }
          const BlockScale<R> s = scaler.of(amax_of_bits(Keys::amax_bits_of(row_key)));
          if (inside) {
            if (tid % kLanesPerBlock == 0) {
              s.write_scale_inv(row_scale_inv, chunk_scale_index + p * (cols / BC));
            }
            float v[V];
            widen_vec<T>(raw[b], v);
            cast_store<R>(row_data + chunk_start + p * cols, v, s.factor);
          }
        }
      }
    }
  }
  if (!kTwoD && col_data == nullptr && amax_bits == nullptr) return;  // rowwise 1-D done

  if (!kTwoD && col_data != nullptr) {  // the V keys of [group][cc ...], as the tile holds them
    *reinterpret_cast<uint4*>(&col_partial[group][cc]) =
        make_uint4(col_keys[0], col_keys[1], col_keys[2], col_keys[3]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    thread_key = max(thread_key, __shfl_xor_sync(0xffffffffu, thread_key, offset));
  }
  if (lane == 0) warp_key[warp] = thread_key;
  __syncthreads();  // the staged tile, the partials and the warps' keys
  std::uint32_t tile_key = 0;
#pragma unroll
  for (int w = 0; w < kBlockThreads / 32; ++w) tile_key = max(tile_key, warp_key[w]);
  const unsigned tile_amax_bits = Keys::amax_bits_of(tile_key);
  if (amax_bits != nullptr && tid == 0) atomicMax(amax_bits, tile_amax_bits);

  float tile_factor = 0.0f;  // 2-D: the block's factor, both copies
  if constexpr (kTwoD) {  // full tiles: check_quantizable asks for multiples of 128
    const BlockScale<R> s = scaler.of(amax_of_bits(tile_amax_bits));
    tile_factor = s.factor;
    const long long bi = r0 / kBlockTile, bj = c0 / kBlockTile;
    if (tid == 0) {
      if (row_data != nullptr) s.write_scale_inv(row_scale_inv, bi * (cols / kBlockTile) + bj);
      if (col_data != nullptr) s.write_scale_inv(col_scale_inv, bj * (rows / kBlockTile) + bi);
    }
    if (row_data != nullptr) {
#pragma unroll
      for (int p = 0; p < kChunk; ++p) {
        const int rr = group * kChunk + p;
        float v[V];
        widen_vec<T>(*reinterpret_cast<const uint4*>(tile + rr * kBlockTile + cc), v);
        cast_store<R>(row_data + (r0 + rr) * cols + c, v, tile_factor);
      }
    }
    if (col_data == nullptr) return;
  } else {
    if (col_data == nullptr) return;
    // Block (column `col`, rows j·BC ...): partials of groups j·BC/chunk ... (whole blocks:
    // tile_rows is a multiple of BC).
    for (int i = tid; i < kBlockTile * kBlocksPerLine; i += kBlockThreads) {
      const int col = i % kBlockTile, j = i / kBlockTile;
      if (col >= tile_cols || j * BC >= tile_rows) continue;
      std::uint32_t key = 0;
#pragma unroll
      for (int g = 0; g < kGroupsPerBlock; ++g) {
        key = max(key, static_cast<std::uint32_t>(col_partial[j * kGroupsPerBlock + g][col]));
      }
      const BlockScale<R> s = scaler.of(amax_of_bits(Keys::amax_bits_of(key)));
      s.write_scale_inv(col_scale_inv, (c0 + col) * (rows / BC) + r0 / BC + j);
      col_factor[j][col] = s.factor;
    }
    __syncthreads();
  }

  const int tc = 32 * (warp % 4) + lane;  // transposed row (tile column)
  if (tc >= tile_cols) return;
  std::uint8_t* const dst = col_data + (c0 + tc) * rows + r0;
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int segment = 4 * (warp / 4) + pass;  // tile rows 16 · segment ...
    if (16 * segment >= tile_rows) break;  // whole segments: rows is a multiple of BC
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = to_float(tile[(16 * segment + i) * kBlockTile + tc]);
    const float factor = kTwoD ? tile_factor : col_factor[kTwoD ? 0 : 16 * segment / BC][tc];
    cast_store<R>(dst + 16 * segment, v, factor);
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
  // The f32 tile is 64 KB: above the 48 KB a kernel gets without asking.
  TPCHECK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kBlockTileBytes<T>)));
  const long long row_tiles = (rows + kBlockTile - 1) / kBlockTile;
  const long long col_tiles = (cols + kBlockTile - 1) / kBlockTile;
  TPCHECK_CHECK_INPUT(row_tiles * col_tiles <= 0x7fffffffLL,
                      "[{}, {}]: too large for the GPU block quantization kernel ({} x {} tiles "
                      "of 128)",
                      rows, cols, row_tiles, col_tiles);
  auto* row_data = static_cast<std::uint8_t*>(q.rowwise_data.defined() ? q.rowwise_data.raw() : nullptr);
  auto* col_data = static_cast<std::uint8_t*>(q.columnwise_data.defined() ? q.columnwise_data.raw() : nullptr);
  kernel<<<static_cast<unsigned>(row_tiles * col_tiles), kBlockThreads, kBlockTileBytes<T>,
           current_stream()>>>(
      x, rows, cols, col_tiles, s_enc, row_data,
      q.rowwise_scale_inv.defined() ? q.rowwise_scale_inv.raw() : nullptr, col_data,
      q.columnwise_scale_inv.defined() ? q.columnwise_scale_inv.raw() : nullptr, amax_bits);
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
      TPCHECK_CHECK_INPUT(row_tiles * col_tiles <= 0x7fffffffLL,
                          "{} {}: too large for the GPU cast kernel ({} x {} tiles of 128)", what,
                          x.describe(), row_tiles, col_tiles);
      const unsigned grid = static_cast<unsigned>(row_tiles * col_tiles);  // tile_from_the_end
      const bool e5m2 = q->format == DType::kF8E5M2;
      const auto* scale_ptr = static_cast<const float*>(q->scale.raw());
      std::uint8_t* row_out = o.usage.rowwise ? static_cast<std::uint8_t*>(q->rowwise_data.raw()) : nullptr;
      std::uint8_t* col_out = o.usage.columnwise ? static_cast<std::uint8_t*>(q->columnwise_data.raw()) : nullptr;
      const void* xp = aligned.raw();
      switch (x.dtype()) {
        case DType::kF32:
          per_tensor_kernel<<<grid, kCastThreads, 0, current_stream()>>>(
              static_cast<const float*>(xp), rows, cols, col_tiles, scale_ptr, e5m2, row_out, col_out);
          break;
        case DType::kF16:
          per_tensor_kernel<<<grid, kCastThreads, 0, current_stream()>>>(
              static_cast<const __half*>(xp), rows, cols, col_tiles, scale_ptr, e5m2, row_out, col_out);
          break;
        default:
          per_tensor_kernel<<<grid, kCastThreads, 0, current_stream()>>>(
              static_cast<const __nv_bfloat16*>(xp), rows, cols, col_tiles, scale_ptr, e5m2, row_out, col_out);
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

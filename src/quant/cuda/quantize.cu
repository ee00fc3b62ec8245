// quantize.cu — the recipes' quantization on the GPU (quantize_on_gpu, cuda_backend.h),
// bit for bit the CPU's (src/quant, docs/QUANTIZATION.md): an amax kernel, the per-tensor
// FP8 cast (delayed and current scaling) writing the rowwise copy and its transpose, and a
// tiled block kernel for FP8 block scaling, MXFP8 and NVFP4 (each copy from high
// precision, both in one pass over the tensor). The per-tensor FP8 scale is computed on the
// device from the amax (Fp8TensorScale, the device twin of fp8_current_scale), so a
// quantization makes no host round trip: the amax, the scale and scale_inv stay on the
// GPU, where the cast and cuBLASLt's FP8 GEMM read them; NVFP4's S_enc likewise
// (Nvfp4GlobalScale). Both are computed by the kernel that casts, which follows the amax
// pass as its programmatic dependent: no kernel and no gap between the two. The per-block
// formulas are device twins of the CPU's, operation for operation (the products below
// have no additions, so nvcc's FMA contraction cannot change them; division is IEEE).
// Speed: every kernel reads 16 bytes per load; the rowwise copies are written by warps
// storing whole consecutive rows, the transposed ones in 16-byte pieces, each lane four
// columns at once and each warp whole 32-byte sectors; FP8 casts go two values an
// instruction and E2M1 / E8M0 without branches; the block kernel copies its tile into
// shared memory with cp.async (all of a thread's loads in flight, no registers held) and
// reduces each block's amax across the lanes that loaded it (shuffles), never by one
// thread walking a block; the tiled kernels walk the tensor from its end, where the L2
// still holds what the pass before read last (tile_from_the_end); outputs are allocated
// without a zero fill (Tensor::empty).
// bench/gpu_layer_bench measures them against the copy bandwidth (H200, 2026-12-03T01:38Z,
// bf16 8192², both copies: FP8 block scaling 72 %, MXFP8 73 %, per-tensor FP8 58 % — 87 %
// counting its amax pass —, NVFP4 49 % — 73 % with its amax pass); each warp store of a
// transposed copy writes whole 32-byte sectors (TransposedSlice: half sectors ran at two
// thirds of the speed in bench/transpose_cast_bench.cu); E2M1, which has no hardware cast
// before sm_100, is rounded by three FFMAs and a 3-input integer min (e2m1_code_bits)
// instead of ~15 integer instructions (NVFP4 0.201 → 0.129 ms).
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

// cast_satfinite for E4M3 / E5M2: `cvt.rn.satfinite` itself (round to nearest even, every
// magnitude beyond the largest finite one, ±inf included, to ±max; NaN to NaN). Before
// sm_89 cuda_fp8.hpp emulates it in software, with the same results.
__device__ __forceinline__ std::uint8_t sat_fp8(float v, bool e5m2) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// cast_satfinite for E2M1 (no instruction before sm_100), for any value, NaN included:
// the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6, ties to the even pattern, larger magnitudes
// (inf included) to 6, NaN to the zero of the opposite sign (dtype.h's rule). Two
// roundings, one chosen by the magnitude m:
//   m < 1   the grid is 0, 0.5, 1 (codes 0, 1, 2): code = rint(2m), by the FFMA that adds
//           1.5 · 2^23 (one rounding of the exact sum, to an integer, ties to even);
//   m >= 1  one significand bit, codes 2 ... 7 in order: round the f32 bits to nearest
//           even at bit 22 (add 0x1FFFFF plus the kept bit), the bits above are then
//           exponent and kept bit, i.e. 254 for 1.0 ... 259 for 6.0: code = that − 252,
//           at most 7 (what rounds past 6, inf included, saturates).
// About 15 integer instructions an element, which run at half the FP32 rate on sm_90:
// the quantization kernels use e2m1_pack4_no_nan below and come here only for values
// whose block holds a NaN.
__device__ __forceinline__ std::uint32_t sat_e2m1(float v) {
  const std::uint32_t bits = __float_as_uint(v);
  const std::uint32_t sign = (bits >> 28) & 0x8u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  const float m = __uint_as_float(magnitude);
  const std::uint32_t below_one = __float_as_uint(fmaf(m, 2.0f, 12582912.0f)) - 0x4b400000u;
  // (magnitude + 0x1FFFFF + kept bit) >> 22, minus 252 folded into the sum (for m >= 1
  // the magnitude is at least 254 << 22: no wrap).
  const std::uint32_t from_one =
      min((magnitude + ((magnitude >> 22) & 1u) + (0x1fffffu - (252u << 22))) >> 22, 7u);
  const std::uint32_t code = m < 1.0f ? below_one : from_one;
  // sign ^ code is sign | code for the codes 0 ... 7, and the opposite zero for a NaN (8).
  return sign ^ (magnitude > 0x7f800000u ? 0x8u : code);
}

// The E2M1 magnitude code (0 ... 7) of a value that is not NaN, in floating-point
// instructions, as the bits of the float 2^23 + code (the floats of [2^23, 2^24) are the
// integers, one ulp apart, and order like their bits: 0x4B000000 + code). With m = |t|,
// the code is
//   min(rint(2m), rint(m) + 2, rint(m / 2) + 4)      for m < 7,
// with rint rounding to nearest even: on m < 2 the grid is 0.5 apart and the code 2m
// (first term); on [2, 4) it is 1 apart and the code m + 2 (second); on [4, 6] 2 apart and
// the code m / 2 + 4 (third). Each term is the smallest on its own range, because rint is
// monotonic and 2m <= m + 2 exactly when m <= 2, m + 2 <= m / 2 + 4 when m <= 4, and
// 2m <= m / 2 + 4 when m <= 8/3; and each rounds ties to the even code, because the
// code is the rounded integer itself (adding an even 2 or 4 keeps parity). From 6 up to 7
// the third term is rint(3 ... 3.5) + 4 = 7, the saturated code, by itself. Each term is
// one FFMA (or FADD) adding 2^23 (+ 2, + 4): the exact sum rounded once to an integer,
// ties to even (2^23 is even). The min of the three is a min of their bits (one 3-input
// integer min, VIMNMX3, on sm_90). From 7 up (inf included) the terms pass 2^23 + 7:
// kSaturate adds that to the min. Three FP32-pipe instructions and one or two ALU ones an
// element, against sat_e2m1's ~15 integer instructions; the ALU pipe, half the FP32 rate,
// is what an NVFP4 quantization runs out of first (Nsight Compute, H200, 2026-12-03).
template <bool kSaturate>
__device__ __forceinline__ std::uint32_t e2m1_code_bits(float t) {
  constexpr float kBase = 8388608.0f;  // 2^23
  const float m = fabsf(t);            // an operand modifier, not an instruction
  const std::uint32_t by_half = __float_as_uint(fmaf(m, 2.0f, kBase));
  const std::uint32_t by_one = __float_as_uint(m + (kBase + 2.0f));
  const std::uint32_t by_two = __float_as_uint(fmaf(m, 0.5f, kBase + 4.0f));
  const std::uint32_t code = min(min(by_half, by_one), by_two);
  return kSaturate ? min(code, __float_as_uint(kBase + 7.0f)) : code;
}

// prmt.b32 in its default mode: a selector nibble of 8 ... 15 picks byte (nibble & 7) and
// replicates its top bit over the result byte (__byte_perm ignores that bit).
__device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
  std::uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Four values none of which is NaN (and, unless kSaturate, each below 7 in magnitude),
// cast to E2M1 as sat_e2m1 does, packed a byte each (value 0 in the low byte). The codes:
// b's bits · 256 + a's bits is a in byte 0, b in byte 1, 0 and 0x4B above (2^23's bits
// times 256 wrap to 0), one IMAD on the FP32 pipe; the two pairs' low halves joined. The
// signs: each value's top byte replicated from its sign bit (prmt), masked to 0x8, merged.
template <bool kSaturate>
__device__ __forceinline__ std::uint32_t e2m1_pack4_no_nan(float a, float b, float c, float d) {
  const std::uint32_t codes_ab = e2m1_code_bits<kSaturate>(b) * 256u + e2m1_code_bits<kSaturate>(a);
  const std::uint32_t codes_cd = e2m1_code_bits<kSaturate>(d) * 256u + e2m1_code_bits<kSaturate>(c);
  const std::uint32_t signs_ab = prmt(__float_as_uint(a), __float_as_uint(b), 0x00fbu);  // a.3, b.3
  const std::uint32_t signs_cd = prmt(__float_as_uint(c), __float_as_uint(d), 0x00fbu);
  const std::uint32_t codes = __byte_perm(codes_ab, codes_cd, 0x5410);
  const std::uint32_t signs = __byte_perm(signs_ab, signs_cd, 0x5410);
  return codes | (signs & 0x08080808u);
}

// The element formats of the casts below: the FP8 ones through the paired conversion
// (two values an instruction), E2M1 in FP32 arithmetic (e2m1_pack4_no_nan), or sat_e2m1
// per value when a NaN may be among them.
enum class CastFormat : int { kE4M3, kE5M2, kE2M1 };

// What cast4 may assume of the values it casts to E2M1 (the FP8 conversions need nothing:
// they saturate and keep NaN themselves), worst last: kBelow7, none is NaN and each is
// below 7 in magnitude (no clamp); kNoNan, none is NaN; kAny. The block kernel knows it
// per block, from the block's amax times its factor (BlockScale::range): kBelow7 for
// every block of a finite tensor whose E4M3 block scale is normal.
enum class CastRange : int { kBelow7, kNoNan, kAny };
__device__ __forceinline__ CastRange worst(CastRange a, CastRange b) { return a > b ? a : b; }

// Four values cast and packed into a word, value 0 in the low byte. `range` matters to
// E2M1 only; it is warp-uniform in practice.
template <CastFormat F>
__device__ __forceinline__ std::uint32_t cast4(float a, float b, float c, float d,
                                               CastRange range) {
  if constexpr (F == CastFormat::kE2M1) {
    if (range == CastRange::kBelow7) return e2m1_pack4_no_nan<false>(a, b, c, d);
    if (range == CastRange::kNoNan) return e2m1_pack4_no_nan<true>(a, b, c, d);
    const std::uint32_t ab = __byte_perm(sat_e2m1(a), sat_e2m1(b), 0x7740);  // a, b, 0, 0
    const std::uint32_t cd = __byte_perm(sat_e2m1(c), sat_e2m1(d), 0x7740);
    return __byte_perm(ab, cd, 0x5410);
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    // Two paired conversions (the second operand goes to the low byte) and one move that
    // joins the halves: what __nv_cvt_float2_to_fp8x2 does, without masking its 16-bit
    // results before the join.
    std::uint32_t word;
    if constexpr (F == CastFormat::kE5M2) {
      asm("{.reg .b16 lo, hi;\n"
          " cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n"
          " cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n"
          " mov.b32 %0, {lo, hi};}\n"
          : "=r"(word) : "f"(a), "f"(b), "f"(c), "f"(d));
    } else {
      asm("{.reg .b16 lo, hi;\n"
          " cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
          " cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
          " mov.b32 %0, {lo, hi};}\n"
          : "=r"(word) : "f"(a), "f"(b), "f"(c), "f"(d));
    }
    return word;
#else
    constexpr __nv_fp8_interpretation_t kFormat = F == CastFormat::kE5M2 ? __NV_E5M2 : __NV_E4M3;
    // __nv_cvt_float2_to_fp8x2 puts .x in the low byte.
    const std::uint32_t ab = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);
    const std::uint32_t cd = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kFormat);
    return __byte_perm(ab, cd, 0x5410);
#endif
  }
}

// The words of N values (a multiple of 4) times `factor`, cast (range: cast4).
template <CastFormat F, int N>
__device__ __forceinline__ void cast_words(const float (&v)[N], float factor, CastRange range,
                                           std::uint32_t (&words)[N / 4]) {
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    words[w] = cast4<F>(v[4 * w] * factor, v[4 * w + 1] * factor, v[4 * w + 2] * factor,
                        v[4 * w + 3] * factor, range);
  }
}

// N words (1, 2 or 4) stored at once. REQUIRES: dst aligned to 4·N bytes.
template <int N>
__device__ __forceinline__ void store_words(std::uint8_t* dst, const std::uint32_t (&words)[N]) {
  if constexpr (N == 4) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
  } else {
    static_assert(N == 1);
    *reinterpret_cast<std::uint32_t*>(dst) = words[0];
  }
}

// N values (4, 8 or 16) times `factor`, cast, stored as N consecutive bytes in one store.
// REQUIRES: dst aligned to N bytes.
template <CastFormat F, int N>
__device__ __forceinline__ void cast_store(std::uint8_t* dst, const float (&v)[N], float factor,
                                           CastRange range) {
  std::uint32_t words[N / 4];
  cast_words<F>(v, factor, range, words);
  store_words(dst, words);
}

// The E8M0 exponent of v rounded up (the CPU's e8m0_round_up), with selects, not
// branches: NaN → 0xFF, inf → 0xFE, 0 → 0; otherwise v's exponent field, plus one when
// v is not a power of two — except at 0xFE (no room left) and for subnormals up to
// 2^-127, which 2^-127 (field 0) covers.
__device__ __forceinline__ std::uint32_t e8m0_round_up_dev(float v) {
  const std::uint32_t bits = __float_as_uint(v) & 0x7fffffffu;
  const std::uint32_t exponent = bits >> 23;
  const std::uint32_t mantissa = bits & 0x7fffffu;
  const bool subnormal_covered = exponent == 0 && mantissa <= 0x400000u;
  const bool up = mantissa != 0 && exponent != 0xfe && !subnormal_covered;
  const std::uint32_t finite = exponent + (up ? 1u : 0u);
  return bits < 0x7f800000u ? finite : (bits == 0x7f800000u ? 0xfeu : 0xffu);
}

// The factor an MXFP8 block's elements are multiplied by, 2^(127 − e) for E8M0 bits e
// (the CPU's e8m0_reciprocal): 0xFF → NaN, 0 → 1; 0xFE → 2^-127, an f32 subnormal the
// exponent-field shift below cannot make (it would give 0, and an inf element × 0 = NaN;
// the CPU's ldexp gives 2^-127; see docs/QUANTIZATION.md, MXFP8).
__device__ __forceinline__ float e8m0_reciprocal_dev(std::uint32_t e) {
  const std::uint32_t normal = (254u - e) << 23;
  const std::uint32_t bits = e == 0xffu   ? 0x7fc00000u
                             : e == 0u    ? 0x3f800000u
                             : e == 0xfeu ? 0x00400000u
                                          : normal;
  return __uint_as_float(bits);
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

// 1 / p for a power of two p = fp8_block_scale_dev's result (2^-126 ... 2^127, normal),
// exactly what __fdiv_rn(1, p) gives: the exponent field 254 − E, and for p = 2^127 the
// subnormal 2^-127.
__device__ __forceinline__ float power_of_two_reciprocal(float p) {
  const std::uint32_t e = __float_as_uint(p) >> 23;
  return __uint_as_float(e == 254u ? 0x00400000u : (254u - e) << 23);
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

// 16 bytes from global to shared memory without passing through registers (cp.async,
// sm_80+), or 16 zero bytes when !valid (a source size of 0; `src` is not read).
__device__ __forceinline__ void copy_async_16(void* dst_shared, const void* src, bool valid) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
// Waits until this thread's cp.async copies have landed; they are then visible to it.
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// 16-byte loads: kVec<T> elements of T widened exactly to f32. load_raw keeps the bits,
// widen_vec widens them (the block kernel widens the rows it copied to shared memory).
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ uint4 load_raw(const T* p) {
  return *reinterpret_cast<const uint4*>(p);
}
// The two 16-bit elements of a word as f32, the low one first. bf16 is the top half of
// an f32: a shift and a mask (one instruction each).
template <typename T>
__device__ __forceinline__ float2 widen2(std::uint32_t bits) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>);
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
  }
}
// The words of a load, widened: 4 words of f32, or 2 · W elements of f16 / bf16.
template <typename T, int W>
__device__ __forceinline__ void widen_words(const std::uint32_t (&w)[W],
                                            float (&v)[W * (sizeof(T) == 4 ? 1 : 2)]) {
#pragma unroll
  for (int i = 0; i < W; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      v[i] = __uint_as_float(w[i]);
    } else {
      const float2 f = widen2<T>(w[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}
template <typename T>
__device__ __forceinline__ void widen_vec(const uint4& q, float (&v)[kVec<T>]) {
  const std::uint32_t w[4] = {q.x, q.y, q.z, q.w};
  widen_words<T>(w, v);
}
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVec<T>]) {
  widen_vec<T>(load_raw(p), v);
}
// Four consecutive elements of shared memory widened (8 bytes for f16 / bf16, 16 for f32).
// REQUIRES: p aligned to 4 elements.
template <typename T>
__device__ __forceinline__ void load4_widened(const T* p, float (&v)[4]) {
  if constexpr (std::is_same_v<T, float>) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const std::uint32_t w[4] = {q.x, q.y, q.z, q.w};
    widen_words<T>(w, v);
  } else {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    const std::uint32_t w[2] = {q.x, q.y};
    widen_words<T>(w, v);
  }
}

// Two consecutive elements of shared memory widened (4 bytes for f16 / bf16, 8 for f32).
// REQUIRES: p aligned to 2 elements.
template <typename T>
__device__ __forceinline__ void load2_widened(const T* p, float (&v)[2]) {
  if constexpr (std::is_same_v<T, float>) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = __uint_as_float(q.x), v[1] = __uint_as_float(q.y);
  } else {
    const float2 f = widen2<T>(*reinterpret_cast<const std::uint32_t*>(p));
    v[0] = f.x, v[1] = f.y;
  }
}

// max |x| as f32 bits: non-negative floats order like their bits, and every NaN (sign
// cleared) is above inf, so a NaN anywhere wins, as on the CPU. A grid-stride loop of
// 16-byte loads (the tail, fewer than kVec elements, by the first threads), a warp and
// then a block reduction, one atomic per block (max is exact in any order).
// REQUIRES: x 16-byte aligned.
constexpr int kAmaxThreads = 256;

// Programmatic dependent launch (sm_90): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization after one that calls
// allow_dependent_launch() may start its blocks while that one's last blocks still run;
// it must call wait_for_prerequisite_grid() before it reads anything the other writes
// (the wait returns once that grid has finished and its writes are visible). Without the
// attribute both are no-ops. The per-tensor FP8 cast and NVFP4's tile kernel follow the
// amax pass so (NVFP4's copying its tiles while the pass ends).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The launch attribute that makes a kernel the programmatic dependent of the kernel before
// it in the stream.
cudaLaunchAttribute programmatic_dependent_launch() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

template <typename T>
__global__ void amax_kernel(const T* x, long long n, unsigned* out) {
  constexpr int V = kVec<T>;
  // The whole grid is resident at once (gpu_amax_bits sizes it so), so a dependent
  // kernel's blocks can only take the SMs that this grid's finished blocks leave.
  allow_dependent_launch();
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

// The per-tensor FP8 scale on the device, the twin of the CPU's fp8_current_scale and
// scale_reciprocal (src/quant/fp8_current.cpp), operation for operation. `amax_bits` is
// amax_kernel's result; `given_amax` (a group-reduced amax) is used instead when
// has_given_amax; delayed scaling passes its scale (has_fixed_scale). Computed by every
// block of the cast kernel (per_tensor_kernel); one thread writes the tensor's own amax,
// the amax the scale came from, the scale and scale_inv. A kernel of its own for this
// (and a zero fill of each output) cost a launch each between the amax pass and the cast.
struct Fp8TensorScale {
  const unsigned* amax_bits = nullptr;
  bool has_given_amax = false;
  float given_amax = 0.0f;
  bool has_fixed_scale = false;
  float fixed_scale = 1.0f;
  float fmax = 448.0f;
  float* own_amax = nullptr;
  float* global_amax = nullptr;
  float* scale = nullptr;
  float* scale_inv = nullptr;

  __device__ __forceinline__ float amax() const {
    return has_given_amax ? given_amax : __uint_as_float(*amax_bits);
  }
  __device__ __forceinline__ float compute_scale() const {
    if (has_fixed_scale) return fixed_scale;
    const float a = amax();
    float s = 1.0f;
    if (!(a == 0.0f || isinf(a) || isnan(a))) {
      s = __fdiv_rn(fmax, a);
      if (isinf(s)) s = FLT_MAX;
    }
    return s;
  }
  __device__ __forceinline__ void write(float s) const {
    *own_amax = __uint_as_float(*amax_bits);
    *global_amax = amax();
    *scale = s;
    *scale_inv = __fdiv_rn(1.0f, s);
  }
};

// The outputs of Fp8TensorScale for a tensor with no elements (no cast kernel runs).
__global__ void fp8_scale_kernel(Fp8TensorScale f) { f.write(f.compute_scale()); }

// NVFP4's global encode scale S_enc, the device twin of the CPU's
// nvfp4_global_encode_scale: min(448 · 6 / amax, FLT_MAX) (fminf: a NaN amax gives
// FLT_MAX), 1 when amax is 0 or the quotient is 0 (amax inf). Computed by every block of
// the tile kernel from amax_kernel's bits, or from `given_amax` (a group-reduced amax)
// when has_given_amax; block 0 stores it in `s_enc` (QuantizedData::scale). A kernel of
// its own for this one division cost a launch between the amax pass and the tiles.
struct Nvfp4GlobalScale {
  const unsigned* amax_bits = nullptr;
  bool has_given_amax = false;
  float given_amax = 0.0f;
  float* s_enc = nullptr;

  __device__ __forceinline__ float encode_scale() const {
    const float amax = has_given_amax ? given_amax : __uint_as_float(*amax_bits);
    const float s = fminf(__fdiv_rn(448.0f * 6.0f, amax), FLT_MAX);
    return amax == 0.0f || s == 0.0f ? 1.0f : s;
  }
};

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

// The part of a 128 x 128 tile's transposed store a thread of a 256-thread block takes:
// tile columns tc ... tc + 3 (four transposed rows) of the 16 tile rows of `segment`
// (16 · segment ...), 16 bytes a column. Half-warps take neighbouring segments of the same
// 64 columns — lanes l and l + 16 write the two halves of one 32-byte sector of every
// transposed row — so each warp store writes 16 whole sectors. (Lane l taking columns
// 4l ... of segment w, the simpler layout, writes 32 half sectors a store whose other
// halves come from another warp: bench/transpose_cast_bench.cu measures it at about two
// thirds of the whole-sector layout's speed on an H200.)
struct TransposedSlice {
  int tc, segment;
};
__device__ __forceinline__ TransposedSlice transposed_slice(int tid) {
  const int warp = tid / 32, lane = tid % 32;
  return {64 * (warp % 2) + 4 * (lane % 16), 2 * (warp / 2) + lane / 16};
}

// The per-tensor cast: rowwise [rows, cols] and its transpose [cols, rows] (either may
// be null), each element x · scale cast to FP8 (RNE, saturating), `scale` read from the
// device. One 256-thread block per tile of 128 rows x 128 columns (tile_from_the_end):
//   load   each thread reads 16 bytes of a row at once (kVec elements), casts them and
//          writes its bytes of the rowwise copy (a row's 128 bytes by consecutive
//          threads), keeping them in shared memory;
//   store  the transpose, each lane four tile columns (four transposed rows) of one
//          16-row segment (TransposedSlice: a warp's stores write whole 32-byte sectors).
//          It reads the four columns' bytes of a row as one word, transposes 4 x 4 bytes
//          at a time with byte permutes, and writes each column's 16 bytes at once.
// REQUIRES: x 16-byte aligned, cols a multiple of 16 and, for the transpose, rows a
// multiple of 16 (check_quantizable).
// The tile's rows are padded by one word (132 bytes apart), so that rows 16 apart — the two
// halves of a warp in the transposed reads — fall in different banks (16 rows · 33 words
// ≡ 16 banks); a row is then only 4-byte aligned, so the load writes it a word at a time.
constexpr int kCastTile = 128, kCastThreads = 256, kCastPad = 4;

template <typename T, CastFormat F>
__global__ void __launch_bounds__(kCastThreads)
    per_tensor_kernel(const T* x, long long rows, long long cols, long long col_tiles,
                      Fp8TensorScale fp8, std::uint8_t* row_out, std::uint8_t* col_out) {
  constexpr int V = kVec<T>;
  constexpr int kThreadsPerRow = kCastTile / V;
  constexpr int kRowsPerPass = kCastThreads / kThreadsPerRow;
  __shared__ __align__(16) std::uint8_t tile[kCastTile][kCastTile + kCastPad];
  // Launched as the amax pass's dependent: its blocks may start before the pass ends.
  wait_for_prerequisite_grid();
  const float scale = fp8.compute_scale();
  if (blockIdx.x == 0 && threadIdx.x == 0) fp8.write(scale);
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
      cast_words<F>(v, scale, CastRange::kAny, words);  // FP8: no E2M1 here
      if (row_out) store_words(row_out + r * cols + c, words);
#pragma unroll
      for (int w = 0; w < V / 4; ++w) {  // a word at a time: tile rows are 4-byte aligned
        *reinterpret_cast<std::uint32_t*>(&tile[row_in_tile][col_in_tile + 4 * w]) = words[w];
      }
    }
  }
  if (col_out == nullptr) return;
  __syncthreads();
  const auto [tc, segment] = transposed_slice(tid);
  if (c0 + tc >= cols || r0 + 16 * segment >= rows) return;  // whole segments (REQUIRES)
  std::uint32_t words[4][4];  // [column][four rows each]
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    std::uint32_t w[4];  // rows 4g ... 4g + 3, the four columns' bytes each
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = *reinterpret_cast<const std::uint32_t*>(&tile[16 * segment + 4 * g + i][tc]);
    }
    // The 4 x 4 byte transpose: word k gets byte k of w[0] ... w[3].
    const std::uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), lo23 = __byte_perm(w[2], w[3], 0x5140);
    const std::uint32_t hi01 = __byte_perm(w[0], w[1], 0x7362), hi23 = __byte_perm(w[2], w[3], 0x7362);
    words[0][g] = __byte_perm(lo01, lo23, 0x5410);
    words[1][g] = __byte_perm(lo01, lo23, 0x7632);
    words[2][g] = __byte_perm(hi01, hi23, 0x5410);
    words[3][g] = __byte_perm(hi01, hi23, 0x7632);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) store_words(col_out + (c0 + tc + k) * rows + r0 + 16 * segment, words[k]);
}

// A block's scale from its amax: the factor its elements are multiplied by before the
// cast, and the scale_inv its copy stores (f32 for FP8 block scaling, E8M0 bits for MXFP8,
// E4M3 bits for NVFP4) — the device twins of the CPU's fp8_block_scale, MXFP8's E8M0
// scale and NVFP4's E4M3 block scale, operation for operation. NVFP4's two per-tensor
// terms (S_enc / 6 and s_dec = 1 / S_enc) are computed once, by the same operations the
// CPU repeats per block, so their values are the CPU's; and so is its factor,
// min(1 / (sb · s_dec), FLT_MAX), which depends on the block only through its E4M3 scale
// sb (0 ... 0x7E: a non-negative amax, saturated): a kernel computes the 127 factors once
// into shared memory (nvfp4_factor_table) and each block looks its own up, instead of an
// IEEE division per block.
template <BlockRecipe R>
struct BlockScale {
  using ScaleInv = std::conditional_t<R == BlockRecipe::kFp8Block, float, std::uint8_t>;
  float factor;
  ScaleInv scale_inv;
  CastRange range;  // what cast4 may assume of the block's values times `factor`
  __device__ __forceinline__ void write_scale_inv(void* scale_invs, long long index) const {
    static_cast<ScaleInv*>(scale_invs)[index] = scale_inv;
  }
};

constexpr int kNvfp4Factors = 128;  // one per E4M3 block scale 0 ... 0x7E (and 0x7F, unused)

template <BlockRecipe R>
struct BlockScaler {
  float s_enc_over_6 = 0.0f;                   // NVFP4 only
  const float* nvfp4_factor_table = nullptr;   // NVFP4 only: [kNvfp4Factors], shared memory
  __device__ __forceinline__ BlockScaler(float s_enc, const float* factor_table) {
    if constexpr (R == BlockRecipe::kNvfp4) {
      s_enc_over_6 = s_enc * (1.0f / 6.0f);
      nvfp4_factor_table = factor_table;
    }
  }
  // NVFP4: the factor of E4M3 block scale sb, for s_dec = 1 / S_enc (the table's entries).
  __device__ static __forceinline__ float nvfp4_factor(std::uint32_t sb, float s_dec) {
    return fminf(__fdiv_rn(1.0f, f8e4m3_to_float(static_cast<std::uint8_t>(sb)) * s_dec), FLT_MAX);
  }
  __device__ __forceinline__ BlockScale<R> of(float amax) const {
    if constexpr (R == BlockRecipe::kFp8Block) {
      const float factor = fp8_block_scale_dev(amax);
      return {factor, power_of_two_reciprocal(factor), CastRange::kAny};  // FP8: unused
    } else if constexpr (R == BlockRecipe::kMxfp8) {
      const std::uint32_t e = e8m0_round_up_dev(amax * (1.0f / 448.0f));
      return {e8m0_reciprocal_dev(e), static_cast<std::uint8_t>(e), CastRange::kAny};
    } else {
      const float decode = amax * s_enc_over_6;
      const std::uint8_t sb = sat_fp8(fminf(decode, FLT_MAX), false);
      const float factor = nvfp4_factor_table[sb & (kNvfp4Factors - 1)];
      // Every |v| <= amax, and rounding is monotonic: fl(|v| · factor) <= fl(amax · factor).
      // Below 7 unless sb is subnormal or 0 (or saturated by a given amax below the
      // block's), or amax is inf; a NaN amax (an element is NaN) compares false.
      const float largest = amax * factor;
      const CastRange range = largest < 7.0f   ? CastRange::kBelow7
                              : isnan(largest) ? CastRange::kAny
                                               : CastRange::kNoNan;
      return {factor, sb, range};
    }
  }
};

// A block recipe's element format: E2M1 for NVFP4, E4M3 for the others.
template <BlockRecipe R>
constexpr CastFormat kBlockFormat = R == BlockRecipe::kNvfp4 ? CastFormat::kE2M1 : CastFormat::kE4M3;

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
  // Four consecutive elements of shared memory (REQUIRES: aligned to 4 elements): their
  // keys max-accumulated into acc, kept as loaded (two to a word for f16 / bf16).
  static constexpr int kWordsPer4 = kPacked ? 2 : 4;
  __device__ static __forceinline__ void accumulate4(const T* p, std::uint32_t (&acc)[kWordsPer4]) {
    if constexpr (kPacked) {
      const uint2 q = *reinterpret_cast<const uint2*>(p);
      acc[0] = max_of(acc[0], q.x & kMask);
      acc[1] = max_of(acc[1], q.y & kMask);
    } else {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      acc[0] = max(acc[0], q.x & kMask), acc[1] = max(acc[1], q.y & kMask);
      acc[2] = max(acc[2], q.z & kMask), acc[3] = max(acc[3], q.w & kMask);
    }
  }
  // Element k's key (k = 0 ... 3) of accumulate4's words.
  __device__ static __forceinline__ std::uint32_t key_of(const std::uint32_t (&acc)[kWordsPer4],
                                                         int k) {
    if constexpr (kPacked) {
      return (acc[k / 2] >> (16 * (k % 2))) & 0xffffu;
    } else {
      return acc[k];
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

// The block recipes' quantization, one 256-thread block per tile of 128 x 128 elements of
// the tensor (tile_from_the_end), each copy quantized from high precision as on the CPU.
// V = kVec<T> (8 for f16 / bf16, 4 for f32) elements make one 16-byte load; a tile row is
// read by 128 / V threads, and the 256 threads form 256 / (128 / V) row groups (16 or 8)
// of 128 / groups (8 or 16) consecutive tile rows each: thread t reads the V columns
// (t mod 128/V) · V ... of every row of its group's chunk.
//   load     each thread copies its chunk's rows into the tile in shared memory, in T
//            (32 KB for f16 / bf16, 64 KB for f32; exact either way), with cp.async, all
//            of them in flight at once; then it reads its own rows back one at a time and
//            keeps the max |v| of each of its V columns over its chunk (the columnwise
//            partials, for 128-row blocks).
//   rowwise  (1 x BC blocks) a block's BC elements are the loads of BC / V consecutive
//            threads of one row (2 to 32, aligned in the warp): their amax is a
//            butterfly of __shfl_xor_sync over those lanes, every lane computes the
//            factor, one writes the scale_inv, and each casts and stores its V bytes
//            straight to global memory (a warp writes whole 128-byte rows).
//   columnwise (BC x 1 blocks of the tensor, stored transposed) each thread takes four
//            tile columns of one 16-row segment (TransposedSlice; a segment never
//            straddles two blocks: BC is a multiple of 16). The blocks' factors: for
//            BC = 16 or 32 (NVFP4, MXFP8) the thread reduces its segment's four column
//            keys itself, and for 32 with lane ^ 16, which holds the block's other
//            segment (one shuffle), computes the four factors and writes the scale_invs;
//            for BC = 128 (FP8 block scaling) the load's partials go to shared memory
//            [groups][128], one thread per (tile column, block) reduces the BC / chunk
//            groups' partials, computes the factor, writes the scale_inv and leaves the
//            factor in shared memory. Then the thread reads the four columns of a row at
//            once (a half-warp reads 64 or 128 bytes of one tile row), multiplies each
//            value by its block's factor, casts four rows of a column into a word, and
//            writes each column's 16 bytes at once.
//   2-D      (128 x 128 blocks, FP8 block scaling's weights: tile = block) one amax for
//            the tile by a block reduction, one factor for both copies; the rowwise copy
//            from the tile (each thread its own rows), the columnwise as above.
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
// Blocks per SM the registers must allow: 5 for f16 / bf16 (48 registers a thread, none
// spilled on sm_90; what the shared memory allows too: a 32 KB tile and up to 8 KB of
// partials and factors), 3 for f32 (80 registers; 64 KB + 8 KB of shared memory allow 3).
// More blocks keep more of the tile copies in flight. Before sm_89 the FP8
// casts are emulated in software and need more registers: 3 there (80), so nothing spills.
// NVFP4 spills in 48 registers (16-20 bytes from f16 / bf16: its E2M1 cast keeps more
// values live than the FP8 conversions): 4 blocks there (64 registers; it uses 56), and 2
// from f32 (up to 128; it uses 72, so 3 still fit).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
constexpr bool kSoftwareFp8Cast = true;
#else
constexpr bool kSoftwareFp8Cast = false;
#endif
template <typename T, BlockRecipe R>
constexpr int kBlockMinBlocksPerSm = sizeof(T) == 4 || kSoftwareFp8Cast
                                         ? (sizeof(T) == 4 && R == BlockRecipe::kNvfp4 ? 2 : 3)
                                         : (R == BlockRecipe::kNvfp4 ? 4 : 5);

template <typename T, BlockRecipe R, int BC, bool kTwoD>
__global__ void __launch_bounds__(kBlockThreads, kBlockMinBlocksPerSm<T, R>)
    block_tile_kernel(const T* __restrict__ x, long long rows, long long cols,
                      long long col_tiles, Nvfp4GlobalScale nvfp4, std::uint8_t* row_data,
                      void* row_scale_inv, std::uint8_t* col_data, void* col_scale_inv,
                      unsigned* amax_bits) {
  constexpr int V = kVec<T>;
  constexpr int kThreadsPerRow = kBlockTile / V;              // 16 or 32
  constexpr int kGroups = kBlockThreads / kThreadsPerRow;     // 16 or 8
  constexpr int kChunk = kBlockTile / kGroups;                // 8 or 16 rows per thread
  constexpr int kLanesPerBlock = BC / V;                      // a rowwise block's threads
  // Columnwise blocks of 16 or 32 rows (NVFP4, MXFP8) are one or two of the transposed
  // store's 16-row segments, held by one thread or by lanes l and l + 16: their amax is
  // reduced there, in registers. FP8 block scaling's 128-row blocks span four warps: their
  // amaxes come from the load's per-group partials, through shared memory.
  constexpr bool kColumnAmaxInStore = !kTwoD && BC <= 32;
  constexpr bool kColumnPartials = !kTwoD && !kColumnAmaxInStore;
  constexpr int kGroupsPerBlock = kColumnPartials ? BC / kChunk : 1;  // a columnwise block's groups
  constexpr int kBlocksPerLine = kBlockTile / BC;
  constexpr int kSegments = kBlockTile / 16;                  // of a transposed tile row
  static_assert(kBlockTile % BC == 0 && BC % 16 == 0, "a block lies in one tile, in whole segments");
  static_assert(kThreadsPerRow <= 32 && 32 % kThreadsPerRow == 0, "a warp holds whole tile rows");
  static_assert(kLanesPerBlock >= 1 && kLanesPerBlock <= 32 &&
                    (kLanesPerBlock & (kLanesPerBlock - 1)) == 0 &&
                    kThreadsPerRow % kLanesPerBlock == 0,
                "a rowwise block is a power-of-two group of lanes, aligned in its warp");
  static_assert(!kColumnPartials || BC % kChunk == 0,
                "a row group's chunk lies in one columnwise block");
  static_assert(kBlockThreads == 256 && kSegments == 8, "the transposed store's warp layout");
  static_assert(!kTwoD || BC == kBlockTile, "a 2-D block is the tile");

  // The staged tile, [128][128] of T without padding: the 16-byte stores of the load are
  // conflict-free (8 lanes cover 128 consecutive bytes) and so are the transposed reads.
  extern __shared__ uint4 block_tile_storage[];
  T* const tile = reinterpret_cast<T*>(block_tile_storage);
  // The columnwise partials: [group][tile column], the largest key of the group's chunk.
  __shared__ __align__(16)
      typename MagnitudeKeys<T>::Key col_partial[kColumnPartials ? kGroups : 1][kBlockTile];
  __shared__ __align__(16) float col_factor[kColumnPartials ? kBlocksPerLine : 1][kBlockTile];
  // The columnwise scale_invs of a tile's column, gathered (BC <= 32: E8M0 or E4M3 bytes)
  // and stored as one 4- or 8-byte run per column: scattered byte stores, one per block,
  // cost MXFP8's transposed copy ~15 µs of an 8192² tensor (H200, 2026-12-02).
  constexpr int kScaleRun = kBlockTile / BC;
  __shared__ __align__(8)
      std::uint8_t col_scale_run[kColumnAmaxInStore ? kBlockTile : 1][kScaleRun];
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
  __shared__ float nvfp4_factor_table[R == BlockRecipe::kNvfp4 ? kNvfp4Factors : 1];

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
  // The chunk's rows go straight from global to shared memory (cp.async: all of them in
  // flight at once, 128 or 256 bytes a thread, without holding registers, so that five
  // blocks fit an SM); rows outside the tensor are zero-filled. Each thread then reads back its own rows
  // (visible to it once it has waited: no barrier needed).
#pragma unroll
  for (int p = 0; p < kChunk; ++p) {
    const bool inside = p < rows_inside;
    copy_async_16(tile + (chunk_row + p) * kBlockTile + cc, inside ? x + chunk_start + p * cols : x,
                  inside);
  }
  // NVFP4 runs after its amax pass, launched as its dependent: the copies above read only
  // x, and may start before the pass ends; S_enc needs its result.
  float s_enc = 0.0f;
  if constexpr (R == BlockRecipe::kNvfp4) {  // while the copies fly
    wait_for_prerequisite_grid();
    s_enc = nvfp4.encode_scale();
    if (blockIdx.x == 0 && tid == 0) *nvfp4.s_enc = s_enc;
    if (tid < kNvfp4Factors) {
      nvfp4_factor_table[tid] = BlockScaler<R>::nvfp4_factor(tid, __fdiv_rn(1.0f, s_enc));
    }
    __syncthreads();
  }
  const BlockScaler<R> scaler(s_enc, nvfp4_factor_table);
  copy_async_wait_all();
#pragma unroll 2
  for (int p = 0; p < kChunk; ++p) {  // the row in the chunk
    const bool inside = p < rows_inside;
    const uint4 raw = *reinterpret_cast<const uint4*>(tile + (chunk_row + p) * kBlockTile + cc);
    const std::uint32_t keys[4] = {raw.x & Keys::kMask, raw.y & Keys::kMask,
                                   raw.z & Keys::kMask, raw.w & Keys::kMask};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kColumnPartials) col_keys[i] = Keys::max_of(col_keys[i], keys[i]);
    }
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
          widen_vec<T>(raw, v);
          cast_store<kBlockFormat<R>>(row_data + chunk_start + p * cols, v, s.factor, s.range);
        }
      }
    }
  }
  if (!kTwoD && col_data == nullptr && amax_bits == nullptr) return;  // rowwise 1-D done

  // The V keys of [group][cc ...], as the tile holds them.
  if (kColumnPartials && col_data != nullptr) {
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
        cast_store<kBlockFormat<R>>(row_data + (r0 + rr) * cols + c, v, tile_factor,
                                    CastRange::kAny);  // FP8: the range is E2M1's
      }
    }
    if (col_data == nullptr) return;
  } else if constexpr (kColumnPartials) {
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
  } else {
    if (col_data == nullptr) return;
  }

  // The transposed store: four tile columns of one segment (it lies in one block).
  const auto [tc, segment] = transposed_slice(tid);
  const bool segment_inside = tc < tile_cols && 16 * segment < tile_rows;  // whole segments
  float factor[4];
  // The four columns' blocks' worst: cast4's path (E2M1 only; the FP8 casts ignore it).
  CastRange range = R == BlockRecipe::kNvfp4 ? CastRange::kBelow7 : CastRange::kAny;
  if constexpr (kTwoD) {
    factor[0] = factor[1] = factor[2] = factor[3] = tile_factor;
  } else if constexpr (kColumnPartials) {
    const float4 f = *reinterpret_cast<const float4*>(&col_factor[16 * segment / BC][tc]);
    factor[0] = f.x, factor[1] = f.y, factor[2] = f.z, factor[3] = f.w;
  } else {
    // The four columns' keys over the segment's 16 rows (the tile is zero outside the
    // tensor: every thread can read its segment), then over the block's other segment —
    // lane ^ 16, the same columns — when a block is 32 rows; every lane takes part in the
    // shuffle, so nothing returns before it.
    constexpr int W = Keys::kWordsPer4;
    std::uint32_t acc[W] = {};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      Keys::accumulate4(tile + (16 * segment + i) * kBlockTile + tc, acc);
    }
    if constexpr (BC == 32) {
#pragma unroll
      for (int w = 0; w < W; ++w) {
        acc[w] = Keys::max_of(acc[w], __shfl_xor_sync(0xffffffffu, acc[w], 16));
      }
    }
    // The block's scale_inv, into the tile's runs: each thread of a 16-row block, the
    // even segment's lane of a 32-row one.
    const bool writes_scales = segment_inside && (BC == 16 || segment % 2 == 0);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const BlockScale<R> s = scaler.of(amax_of_bits(Keys::amax_bits_of(Keys::key_of(acc, k))));
      factor[k] = s.factor;
      range = worst(range, s.range);
      if (writes_scales) col_scale_run[tc + k][16 * segment / BC] = s.scale_inv;
    }
  }
  if constexpr (kColumnAmaxInStore) {
    __syncthreads();  // the runs
    // Column tid's run: tile_rows / BC scale_invs at [c0 + tid][r0 / BC ...], at once when
    // the tile is whole and the run aligned (rows a multiple of 128), else byte by byte.
    if (tid < tile_cols) {
      const int run = tile_rows / BC;
      auto* dst = static_cast<std::uint8_t*>(col_scale_inv) + (c0 + tid) * (rows / BC) + r0 / BC;
      if (run == kScaleRun && reinterpret_cast<std::uintptr_t>(dst) % kScaleRun == 0) {
        if constexpr (kScaleRun == 8) {
          *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(col_scale_run[tid]);
        } else {
          static_assert(kScaleRun == 4);
          *reinterpret_cast<std::uint32_t*>(dst) =
              *reinterpret_cast<const std::uint32_t*>(col_scale_run[tid]);
        }
      } else {
        for (int j = 0; j < run; ++j) dst[j] = col_scale_run[tid][j];
      }
    }
  }
  if (!segment_inside) return;
  // Two columns at a time (fewer values live: the block kernels hold 48 registers).
#pragma unroll
  for (int pair = 0; pair < 2; ++pair) {
    std::uint32_t words[2][4];  // [column of the pair][four rows each]
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      float v[4][2];  // [row][column of the pair]
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        load2_widened(tile + (16 * segment + 4 * g + i) * kBlockTile + tc + 2 * pair, v[i]);
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float f = factor[2 * pair + k];
        words[k][g] = cast4<kBlockFormat<R>>(v[0][k] * f, v[1][k] * f, v[2][k] * f, v[3][k] * f,
                                             range);
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      store_words(col_data + (c0 + tc + 2 * pair + k) * rows + r0 + 16 * segment, words[k]);
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

// cast_satfinite_on_gpu's kernel: four elements a thread, through cast4 as the
// quantization kernels call it. E2M1 goes through each of its paths on every value that
// path takes: the values that are not NaN through the saturating FP32 one (NaNs replaced by
// 0 there), each NaN through sat_e2m1, and the values below 7 in magnitude through the
// unclamped FP32 one too (the others replaced by 0), which must give the same bytes — a
// byte where it does not is written as 0xFF, no E2M1 pattern. So a test over every f32
// pattern checks each path on every value it takes.
template <CastFormat F>
__global__ void cast_satfinite_kernel(const float* x, long long n, std::uint8_t* out) {
  const long long groups = (n + 3) / 4;
  for (long long g = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<long long>(gridDim.x) * blockDim.x) {
    float v[4];
    for (int k = 0; k < 4; ++k) v[k] = 4 * g + k < n ? x[4 * g + k] : 0.0f;
    std::uint32_t word;
    if constexpr (F == CastFormat::kE2M1) {
      const auto below7 = [](float x) { return fabsf(x) < 7.0f; };  // false for NaN
      word = cast4<F>(isnan(v[0]) ? 0.0f : v[0], isnan(v[1]) ? 0.0f : v[1],
                      isnan(v[2]) ? 0.0f : v[2], isnan(v[3]) ? 0.0f : v[3], CastRange::kNoNan);
      const std::uint32_t unclamped =
          cast4<F>(below7(v[0]) ? v[0] : 0.0f, below7(v[1]) ? v[1] : 0.0f,
                   below7(v[2]) ? v[2] : 0.0f, below7(v[3]) ? v[3] : 0.0f, CastRange::kBelow7);
      for (int k = 0; k < 4; ++k) {
        const std::uint32_t byte = 0xffu << (8 * k);
        if (isnan(v[k])) word = (word & ~byte) | (sat_e2m1(v[k]) << (8 * k));
        if (below7(v[k]) && (word & byte) != (unclamped & byte)) word |= byte;
      }
    } else {
      word = cast4<F>(v[0], v[1], v[2], v[3], CastRange::kAny);
    }
    for (int k = 0; k < 4; ++k) {
      if (4 * g + k < n) out[4 * g + k] = static_cast<std::uint8_t>(word >> (8 * k));
    }
  }
}

// The amax of x as f32 bits in a device word (amax_kernel), no host round trip.
// REQUIRES: x 16-byte aligned.
Tensor gpu_amax_bits(const Tensor& x) {
  // Zero-filled on the current stream (the constructor), read as unsigned by the kernels.
  Tensor bits({1}, DType::kF32, Device::kCuda);
  const long long n = x.numel();
  if (n == 0) return bits;
  auto* out = static_cast<unsigned*>(bits.raw());
  // As many blocks as the GPU holds at once (8 of 256 threads per SM), no more: one wave,
  // few atomics, and a dependent kernel (NVFP4's tiles) waits on no unscheduled block.
  int device = 0, sms = 0;
  TPCHECK_CUDA_CHECK(cudaGetDevice(&device));
  TPCHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto launch = [&](auto* typed) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(typed)>>;
    int resident = 0;
    TPCHECK_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, amax_kernel<T>, kAmaxThreads, 0));
    const unsigned blocks = std::min(grid_for(n / kVec<T> + 1, kAmaxThreads),
                                     static_cast<unsigned>(sms * std::max(1, resident)));
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
// amax_bits: where the kernel max-reduces the tensor's amax (f32 bits), or null. NVFP4
// (nvfp4.amax_bits set) follows its amax pass, the kernel just before it in the stream,
// as its programmatic dependent: the tiles' copies start while the pass's last blocks run.
template <BlockRecipe R, int BC, bool kTwoD, typename T>
void launch_block_tiles(const T* x, std::int64_t rows, std::int64_t cols,
                        Nvfp4GlobalScale nvfp4, QuantizedData& q, unsigned* amax_bits) {
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
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(row_tiles * col_tiles));
  config.blockDim = dim3(kBlockThreads);
  config.dynamicSmemBytes = kBlockTileBytes<T>;
  config.stream = current_stream();
  cudaLaunchAttribute after_amax_pass = programmatic_dependent_launch();
  if (nvfp4.amax_bits != nullptr) {
    config.attrs = &after_amax_pass;
    config.numAttrs = 1;
  }
  TPCHECK_CUDA_CHECK(cudaLaunchKernelEx(
      &config, kernel, x, static_cast<long long>(rows), static_cast<long long>(cols), col_tiles,
      nvfp4, row_data, q.rowwise_scale_inv.defined() ? q.rowwise_scale_inv.raw() : nullptr,
      col_data, q.columnwise_scale_inv.defined() ? q.columnwise_scale_inv.raw() : nullptr,
      amax_bits));
}

template <BlockRecipe R, int BC, bool kTwoD>
void launch_block_tiles(const Tensor& x, std::int64_t rows, std::int64_t cols,
                        Nvfp4GlobalScale nvfp4, QuantizedData& q, unsigned* amax_bits) {
  switch (x.dtype()) {
    case DType::kF32:
      launch_block_tiles<R, BC, kTwoD>(static_cast<const float*>(x.raw()), rows, cols, nvfp4, q,
                                       amax_bits);
      break;
    case DType::kF16:
      launch_block_tiles<R, BC, kTwoD>(static_cast<const __half*>(x.raw()), rows, cols, nvfp4, q,
                                       amax_bits);
      break;
    default:
      launch_block_tiles<R, BC, kTwoD>(static_cast<const __nv_bfloat16*>(x.raw()), rows, cols,
                                       nvfp4, q, amax_bits);
      break;
  }
}

}  // namespace
}  // namespace cuda

namespace {

// The per-tensor FP8 cast kernel over `aligned` (x or its 16-byte-aligned copy), launched
// as the dependent of the amax pass before it.
// REQUIRES: rows * cols > 0; q's copies allocated for o.usage.
void launch_per_tensor_cast(const Tensor& x, const Tensor& aligned, std::string_view what,
                            std::int64_t rows, std::int64_t cols, const cuda::Fp8TensorScale& fp8,
                            const QuantUsage& usage, QuantizedData& q) {
  using namespace cuda;
  const long long row_tiles = (rows + kCastTile - 1) / kCastTile;
  const long long col_tiles = (cols + kCastTile - 1) / kCastTile;
  TPCHECK_CHECK_INPUT(row_tiles * col_tiles <= 0x7fffffffLL,
                      "{} {}: too large for the GPU cast kernel ({} x {} tiles of 128)", what,
                      x.describe(), row_tiles, col_tiles);
  const unsigned grid = static_cast<unsigned>(row_tiles * col_tiles);  // tile_from_the_end
  std::uint8_t* row_out =
      usage.rowwise ? static_cast<std::uint8_t*>(q.rowwise_data.raw()) : nullptr;
  std::uint8_t* col_out =
      usage.columnwise ? static_cast<std::uint8_t*>(q.columnwise_data.raw()) : nullptr;
  cudaLaunchAttribute after_amax_pass = programmatic_dependent_launch();
  const auto launch = [&](auto* typed, auto format) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(typed)>>;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kCastThreads);
    config.stream = current_stream();
    config.attrs = &after_amax_pass;
    config.numAttrs = 1;
    auto* kernel = per_tensor_kernel<T, decltype(format)::value>;
    TPCHECK_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, typed, static_cast<long long>(rows),
                                          static_cast<long long>(cols), col_tiles, fp8, row_out,
                                          col_out));
  };
  const auto launch_typed = [&](auto format) {
    switch (x.dtype()) {
      case DType::kF32:
        launch(static_cast<const float*>(aligned.raw()), format);
        break;
      case DType::kF16:
        launch(static_cast<const __half*>(aligned.raw()), format);
        break;
      default:
        launch(static_cast<const __nv_bfloat16*>(aligned.raw()), format);
        break;
    }
  };
  if (q.format == DType::kF8E5M2) {
    launch_typed(std::integral_constant<CastFormat, CastFormat::kE5M2>{});
  } else {
    launch_typed(std::integral_constant<CastFormat, CastFormat::kE4M3>{});
  }
  TPCHECK_LAUNCH_CHECK();
}

// Per-tensor FP8 (delayed and current scaling) into q (its rows, cols and format set).
void quantize_per_tensor_on_gpu(const Tensor& x, const Tensor& aligned, const QuantizeOptions& o,
                                std::string_view what, QuantizedData& q) {
  using namespace cuda;
  const std::int64_t rows = q.rows, cols = q.cols;
  // Amax, scale and scale_inv stay on the GPU: no host round trip (the delayed-scaling
  // bookkeeping reads the amax when it records it). One scale_inv tensor serves both
  // copies (they share the scale; nothing writes it after this). Every output is
  // allocated before the amax pass, so that nothing the allocator may queue comes
  // between the pass and the cast kernel, which runs as its dependent.
  q.amax = Tensor::empty({1}, DType::kF32, Device::kCuda);
  q.global_amax = Tensor::empty({1}, DType::kF32, Device::kCuda);
  q.scale = Tensor::empty({1}, DType::kF32, Device::kCuda);
  Tensor scale_inv = Tensor::empty({1}, DType::kF32, Device::kCuda);
  if (o.usage.rowwise) {
    q.rowwise_data = Tensor::empty({rows, cols}, q.format, Device::kCuda);
    q.rowwise_scale_inv = scale_inv;
  }
  if (o.usage.columnwise) {
    q.columnwise_data = Tensor::empty({cols, rows}, q.format, Device::kCuda);
    q.columnwise_scale_inv = scale_inv;
  }
  const Tensor amax_bits = gpu_amax_bits(aligned);  // f32 bits of max |x|, on the GPU
  Fp8TensorScale fp8;
  fp8.amax_bits = static_cast<const unsigned*>(amax_bits.raw());
  fp8.has_given_amax = o.amax.has_value();
  fp8.given_amax = o.amax.value_or(0.0f);
  fp8.has_fixed_scale = o.recipe == Recipe::kFp8Delayed;
  fp8.fixed_scale = o.scale;
  fp8.fmax = static_cast<float>(dtype_max_finite(q.format));
  fp8.own_amax = static_cast<float*>(q.amax.raw());
  fp8.global_amax = static_cast<float*>(q.global_amax.raw());
  fp8.scale = static_cast<float*>(q.scale.raw());
  fp8.scale_inv = static_cast<float*>(scale_inv.raw());
  if (rows * cols == 0) {
    fp8_scale_kernel<<<1, 1, 0, current_stream()>>>(fp8);
    TPCHECK_LAUNCH_CHECK();
  } else {
    launch_per_tensor_cast(x, aligned, what, rows, cols, fp8, o.usage, q);
  }
}

// The block recipes (FP8 block scaling, MXFP8, NVFP4) into q (its rows, cols, format and
// block set). Their blocks carry their own scales; the tensor's amax is kept
// (FP8 block scaling and MXFP8: max-reduced by the block kernel as it reads the tiles;
// NVFP4 needs it before the first cast, for its global scale: a pass of its own, S_enc
// computed on the device by the tile kernel). The outputs are allocated first, so that
// nothing the allocator may queue (a wait for another stream's event) comes between
// NVFP4's amax pass and its tile kernel, which runs as that pass's dependent.
void quantize_blocks_on_gpu(const Tensor& aligned, const QuantizeOptions& o, QuantizedData& q) {
  using namespace cuda;
  const std::int64_t rows = q.rows, cols = q.cols;
  const std::int64_t br = q.block[0], bc = q.block[1];
  // Each copy in its own layout: [rows/br, cols/bc] rowwise, [cols/br, rows/bc] columnwise.
  const DType scale_dtype = o.recipe == Recipe::kFp8Block ? DType::kF32
                            : o.recipe == Recipe::kMxfp8  ? DType::kF8E8M0
                                                          : DType::kF8E4M3;
  if (o.usage.rowwise) {
    q.rowwise_data = Tensor::empty({rows, cols}, q.format, Device::kCuda);
    q.rowwise_scale_inv = Tensor::empty({rows / br, cols / bc}, scale_dtype, Device::kCuda);
  }
  if (o.usage.columnwise) {
    q.columnwise_data = Tensor::empty({cols, rows}, q.format, Device::kCuda);
    q.columnwise_scale_inv = Tensor::empty({cols / br, rows / bc}, scale_dtype, Device::kCuda);
  }
  if (rows * cols == 0) {
    q.amax = Tensor({1}, DType::kF32, Device::kCuda);  // zero-filled: the amax of nothing
    q.global_amax = o.amax ? scalar(*o.amax) : q.amax;
    if (o.recipe == Recipe::kNvfp4)
      q.scale = scalar(nvfp4_global_encode_scale(o.amax.value_or(0.0f)));
    return;
  }
  if (o.recipe == Recipe::kNvfp4) q.scale = Tensor::empty({1}, DType::kF32, Device::kCuda);
  // The f32 bits of max |x|: NVFP4's amax pass, or zeros (the constructor's fill) that
  // the other recipes' tile kernels max-reduce into.
  const bool amax_pass = o.recipe == Recipe::kNvfp4;
  q.amax = amax_pass ? gpu_amax_bits(aligned) : Tensor({1}, DType::kF32, Device::kCuda);
  q.global_amax = o.amax ? scalar(*o.amax) : q.amax;
  unsigned* fused_amax = amax_pass ? nullptr : static_cast<unsigned*>(q.amax.raw());
  switch (o.recipe) {
    case Recipe::kFp8Block:
      if (br == 1) {
        launch_block_tiles<BlockRecipe::kFp8Block, 128, false>(aligned, rows, cols, {}, q,
                                                               fused_amax);
      } else {
        launch_block_tiles<BlockRecipe::kFp8Block, 128, true>(aligned, rows, cols, {}, q,
                                                              fused_amax);
      }
      break;
    case Recipe::kMxfp8:
      launch_block_tiles<BlockRecipe::kMxfp8, 32, false>(aligned, rows, cols, {}, q, fused_amax);
      break;
    default: {  // kNvfp4 (check_quantizable rejected kNone)
      // S_enc on the device, from the amax pass or the given amax: no host round trip.
      Nvfp4GlobalScale nvfp4;
      nvfp4.amax_bits = static_cast<const unsigned*>(q.amax.raw());
      nvfp4.has_given_amax = o.amax.has_value();
      nvfp4.given_amax = o.amax.value_or(0.0f);
      nvfp4.s_enc = static_cast<float*>(q.scale.raw());
      launch_block_tiles<BlockRecipe::kNvfp4, 16, false>(aligned, rows, cols, nvfp4, q, nullptr);
      break;
    }
  }
}

}  // namespace

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
    quantize_per_tensor_on_gpu(x, aligned, o, what, *q);
  } else {
    quantize_blocks_on_gpu(aligned, o, *q);
  }
  return q;
}

Tensor cast_satfinite_on_gpu(const Tensor& x, DType format) {
  using namespace cuda;
  check_cuda_operand("cast_satfinite_on_gpu", "x", x);
  TPCHECK_CHECK_INPUT(x.dtype() == DType::kF32, "cast_satfinite_on_gpu: x is {}; expected f32",
                      x.describe());
  TPCHECK_CHECK_INPUT(format == DType::kF8E4M3 || format == DType::kF8E5M2 ||
                          format == DType::kF4E2M1,
                      "cast_satfinite_on_gpu: format {}; expected f8e4m3, f8e5m2 or f4e2m1",
                      dtype_name(format));
  Tensor out = Tensor::empty(x.shape(), format, Device::kCuda);
  const long long n = x.numel();
  if (n == 0) return out;
  const auto* in = static_cast<const float*>(x.raw());
  auto* bytes = static_cast<std::uint8_t*>(out.raw());
  const unsigned grid = grid_for((n + 3) / 4);
  switch (format) {
    case DType::kF8E4M3:
      cast_satfinite_kernel<CastFormat::kE4M3><<<grid, 256, 0, current_stream()>>>(in, n, bytes);
      break;
    case DType::kF8E5M2:
      cast_satfinite_kernel<CastFormat::kE5M2><<<grid, 256, 0, current_stream()>>>(in, n, bytes);
      break;
    default:
      cast_satfinite_kernel<CastFormat::kE2M1><<<grid, 256, 0, current_stream()>>>(in, n, bytes);
      break;
  }
  TPCHECK_LAUNCH_CHECK();
  return out;
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

// quantize.cu — the recipes' quantization on the GPU (quantize_on_gpu, cuda_backend.h),
// bit for bit the CPU's (src/quant, docs/QUANTIZATION.md): an amax kernel, the per-tensor
// FP8 cast (delayed and current scaling) writing the rowwise copy and its transpose, and a
// block kernel for FP8 block scaling, MXFP8 and NVFP4 (one thread per block, each copy
// from high precision). The per-tensor scales (FP8 current scale, NVFP4's S_enc) are
// computed on the host from the amax by the CPU's own functions; the per-block formulas
// are device twins of the CPU's, operation for operation (the products below have no
// additions, so nvcc's FMA contraction cannot change them; division is IEEE).
// Correctness first: the block kernel is simple, not yet tuned for bandwidth.
// Thread safety: kernels run on the calling thread's stream (current_stream()).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <memory>
#include <string>

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

// max |x| as f32 bits: non-negative floats order like their bits, and every NaN (sign
// cleared) is above inf, so a NaN anywhere wins, as on the CPU. A grid-stride loop, a
// warp and then a block reduction, one atomic per block (max is exact in any order).
constexpr int kAmaxThreads = 256;
__global__ void amax_kernel(const void* x, DType dtype, long long n, unsigned* out) {
  unsigned local = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    local = max(local, __float_as_uint(fabsf(load_as<float>(x, dtype, i))));
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

// The per-tensor cast: rowwise [rows, cols] and its transpose [cols, rows] (either may
// be null). Tiles of 32 rows x 128 columns, 32 x 8 threads: each thread loads 4
// consecutive elements of a row at once, casts them, writes its 4 rowwise bytes as one
// word and leaves them in shared memory; then each thread writes 16 bytes of one row of
// the transpose (two threads per 32-byte run). REQUIRES: cols a multiple of 4 (the
// recipes need 16) and, for the transpose, rows a multiple of 16 (check_quantizable).
constexpr int kTileRowsPer = 32, kTileCols = 128, kThreadsX = 32, kThreadsY = 8;

__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
  v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
}
__device__ __forceinline__ void load4(const __half* p, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&q.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&q.y));
  v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
}

template <typename T>
__global__ void per_tensor_kernel(const T* x, long long rows, long long cols, float scale,
                                  bool e5m2, std::uint8_t* row_out, std::uint8_t* col_out) {
  __shared__ __align__(16) std::uint8_t tile[kTileRowsPer][kTileCols + 16];
  const long long c0 = static_cast<long long>(blockIdx.x) * kTileCols;
  const long long row_tiles = (rows + kTileRowsPer - 1) / kTileRowsPer;
  const int tid = threadIdx.y * kThreadsX + threadIdx.x;
  for (long long rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const long long r0 = rt * kTileRowsPer;
    for (int j = threadIdx.y; j < kTileRowsPer; j += kThreadsY) {
      const long long r = r0 + j, c = c0 + 4 * threadIdx.x;
      if (r < rows && c < cols) {
        float v[4];
        load4(x + r * cols + c, v);
        const std::uint32_t word = sat_fp8(v[0] * scale, e5m2) |
                                   (static_cast<std::uint32_t>(sat_fp8(v[1] * scale, e5m2)) << 8) |
                                   (static_cast<std::uint32_t>(sat_fp8(v[2] * scale, e5m2)) << 16) |
                                   (static_cast<std::uint32_t>(sat_fp8(v[3] * scale, e5m2)) << 24);
        if (row_out) *reinterpret_cast<std::uint32_t*>(row_out + r * cols + c) = word;
        *reinterpret_cast<std::uint32_t*>(&tile[j][4 * threadIdx.x]) = word;
      }
    }
    if (col_out) {
      __syncthreads();
      // Thread tid writes transpose row c0 + tid / 2, bytes for rows r0 + 16 · (tid % 2) ...
      const int half = tid % 2;
      const long long c = c0 + tid / 2, rb = r0 + 16 * half;
      if (c < cols && rb < rows) {
        alignas(16) std::uint8_t b[16];  // read back as one uint4
        for (int i = 0; i < 16; ++i) b[i] = tile[16 * half + i][tid / 2];
        std::uint8_t* dst = col_out + c * rows + rb;
        if (rb + 16 <= rows) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(b);
        } else {
          for (int i = 0; rb + i < rows; ++i) dst[i] = b[i];
        }
      }
      __syncthreads();
    }
  }
}

// One thread per block of one copy. The copy is the tensor (columnwise = false: [rows,
// cols]) or its transpose ([cols, rows]); in the copy's layout a block is br x bc at block
// row bi, block column bj, index bi · (copy cols / bc) + bj, as on the CPU.
template <BlockRecipe R>
__global__ void block_kernel(const void* x, DType dtype, long long rows, long long cols,
                             bool columnwise, int br, int bc, float s_enc, std::uint8_t* data,
                             void* scale_inv) {
  const long long crows = columnwise ? cols : rows;  // the copy's shape
  const long long ccols = columnwise ? rows : cols;
  const long long blocks_per_row = ccols / bc;
  const long long nblocks = (crows / br) * blocks_per_row;
  for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; t < nblocks;
       t += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long bi = t / blocks_per_row, bj = t % blocks_per_row;
    // Element (r, c) of the copy is x[r, c] (rowwise) or x[c, r] (columnwise).
    auto at = [&](long long r, long long c) {
      return load_as<float>(x, dtype, columnwise ? c * cols + r : r * cols + c);
    };
    float amax = 0.0f;
    bool nan = false;
    for (long long r = bi * br; r < (bi + 1) * br; ++r) {
      for (long long c = bj * bc; c < (bj + 1) * bc; ++c) {
        const float v = at(r, c);
        nan = nan || isnan(v);
        amax = fmaxf(amax, fabsf(v));
      }
    }
    if (nan) amax = __uint_as_float(0x7fc00000u);
    float factor;
    if constexpr (R == BlockRecipe::kFp8Block) {
      factor = fp8_block_scale_dev(amax);
      static_cast<float*>(scale_inv)[t] = __fdiv_rn(1.0f, factor);
    } else if constexpr (R == BlockRecipe::kMxfp8) {
      const std::uint8_t e = e8m0_round_up_dev(amax * (1.0f / 448.0f));
      static_cast<std::uint8_t*>(scale_inv)[t] = e;
      factor = e8m0_reciprocal_dev(e);
    } else {
      const float s_enc_over_6 = s_enc * (1.0f / 6.0f);
      const float decode = amax * s_enc_over_6;
      const std::uint8_t sb = sat_fp8(fminf(decode, FLT_MAX), false);
      static_cast<std::uint8_t*>(scale_inv)[t] = sb;
      const float s_dec = __fdiv_rn(1.0f, s_enc);
      factor = fminf(__fdiv_rn(1.0f, f8e4m3_to_float(sb) * s_dec), FLT_MAX);
    }
    for (long long r = bi * br; r < (bi + 1) * br; ++r) {
      for (long long c = bj * bc; c < (bj + 1) * bc; ++c) {
        const float v = at(r, c) * factor;
        data[r * ccols + c] = R == BlockRecipe::kNvfp4 ? sat_e2m1(v) : sat_fp8(v, false);
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

float gpu_amax(const Tensor& x) {
  Tensor bits({1}, DType::kF32, Device::kCuda);
  TPCHECK_CUDA_CHECK(cudaMemsetAsync(bits.raw(), 0, sizeof(unsigned), current_stream()));
  const long long n = x.numel();
  if (n > 0) {
    // A few blocks per SM is enough for a bandwidth-bound loop (and keeps the atomics few).
    const unsigned blocks = std::min(grid_for(n, kAmaxThreads), 132u * 8u);
    amax_kernel<<<blocks, kAmaxThreads, 0, current_stream()>>>(x.raw(), x.dtype(), n,
                                                              static_cast<unsigned*>(bits.raw()));
    TPCHECK_LAUNCH_CHECK();
  }
  return static_cast<float>(bits.at(0));  // copies to the host and waits
}

Tensor scalar(float v) { return Tensor::from_f32(std::span<const float>(&v, 1), {1}, DType::kF32); }

// A per-tensor scale_inv on the GPU: cuBLASLt's FP8 GEMM reads it through a device pointer.
Tensor device_scalar(float v) { return scalar(v).to_device(Device::kCuda); }

template <BlockRecipe R>
void launch_blocks(const Tensor& x, std::int64_t rows, std::int64_t cols, bool columnwise, int br,
                   int bc, float s_enc, DType format, DType scale_dtype, Tensor& data,
                   Tensor& scale_inv) {
  const std::int64_t crows = columnwise ? cols : rows, ccols = columnwise ? rows : cols;
  data = Tensor({crows, ccols}, format, Device::kCuda);
  scale_inv = Tensor({crows / br, ccols / bc}, scale_dtype, Device::kCuda);
  const long long nblocks = (crows / br) * (ccols / bc);
  if (nblocks == 0) return;
  block_kernel<R><<<grid_for(nblocks, 128), 128, 0, current_stream()>>>(
      x.raw(), x.dtype(), rows, cols, columnwise, br, bc, s_enc,
      static_cast<std::uint8_t*>(data.raw()), scale_inv.raw());
  TPCHECK_LAUNCH_CHECK();
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
  const float own_amax = gpu_amax(x);
  const float amax = o.amax.value_or(own_amax);
  q->amax = scalar(own_amax);
  q->global_amax = scalar(amax);

  if (o.recipe == Recipe::kFp8Delayed || o.recipe == Recipe::kFp8Current) {
    const float s = o.recipe == Recipe::kFp8Delayed ? o.scale : fp8_current_scale(amax, q->format);
    q->scale = scalar(s);
    if (o.usage.rowwise) {
      q->rowwise_data = Tensor({rows, cols}, q->format, Device::kCuda);
      q->rowwise_scale_inv = device_scalar(scale_reciprocal(s));
    }
    if (o.usage.columnwise) {
      q->columnwise_data = Tensor({cols, rows}, q->format, Device::kCuda);
      q->columnwise_scale_inv = device_scalar(scale_reciprocal(s));
    }
    const long long n = rows * cols;
    if (n > 0) {
      // The kernel reads 4 elements at once: a view that does not start on 16 bytes is
      // read from an aligned copy (the allocator's blocks are 256-byte aligned).
      const Tensor aligned = reinterpret_cast<std::uintptr_t>(x.raw()) % 16 == 0 ? x : x.clone();
      const void* xp = aligned.raw();
      const dim3 threads(kThreadsX, kThreadsY);
      const dim3 grid(static_cast<unsigned>((cols + kTileCols - 1) / kTileCols),
                      static_cast<unsigned>(std::min<long long>((rows + kTileRowsPer - 1) / kTileRowsPer, 65535)));
      const bool e5m2 = q->format == DType::kF8E5M2;
      std::uint8_t* row_out = o.usage.rowwise ? static_cast<std::uint8_t*>(q->rowwise_data.raw()) : nullptr;
      std::uint8_t* col_out = o.usage.columnwise ? static_cast<std::uint8_t*>(q->columnwise_data.raw()) : nullptr;
      switch (x.dtype()) {
        case DType::kF32:
          per_tensor_kernel<<<grid, threads, 0, current_stream()>>>(
              static_cast<const float*>(xp), rows, cols, s, e5m2, row_out, col_out);
          break;
        case DType::kF16:
          per_tensor_kernel<<<grid, threads, 0, current_stream()>>>(
              static_cast<const __half*>(xp), rows, cols, s, e5m2, row_out, col_out);
          break;
        default:
          per_tensor_kernel<<<grid, threads, 0, current_stream()>>>(
              static_cast<const __nv_bfloat16*>(xp), rows, cols, s, e5m2, row_out, col_out);
          break;
      }
      TPCHECK_LAUNCH_CHECK();
    }
    return q;
  }

  const int br = static_cast<int>(q->block[0]), bc = static_cast<int>(q->block[1]);
  for (bool columnwise : {false, true}) {
    if (columnwise ? !o.usage.columnwise : !o.usage.rowwise) continue;
    Tensor& data = columnwise ? q->columnwise_data : q->rowwise_data;
    Tensor& scale_inv = columnwise ? q->columnwise_scale_inv : q->rowwise_scale_inv;
    switch (o.recipe) {
      case Recipe::kFp8Block:
        launch_blocks<BlockRecipe::kFp8Block>(x, rows, cols, columnwise, br, bc, 0.0f, q->format,
                                              DType::kF32, data, scale_inv);
        break;
      case Recipe::kMxfp8:
        launch_blocks<BlockRecipe::kMxfp8>(x, rows, cols, columnwise, br, bc, 0.0f, q->format,
                                           DType::kF8E8M0, data, scale_inv);
        break;
      default: {  // kNvfp4 (check_quantizable rejected kNone)
        const float s_enc = nvfp4_global_encode_scale(amax);
        q->scale = scalar(s_enc);
        launch_blocks<BlockRecipe::kNvfp4>(x, rows, cols, columnwise, br, bc, s_enc, q->format,
                                           DType::kF8E4M3, data, scale_inv);
        break;
      }
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

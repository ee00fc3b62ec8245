// nvfp4.cpp — NVFP4 (TE's NVFP4BlockScaling recipe as the reference suite runs it: no
// random Hadamard transform, no stochastic rounding, 1x16 blocks everywhere): E2M1 data,
// an E4M3 decode scale per 16 consecutive values and an f32 per-tensor encode scale S_enc
// from the tensor's (possibly group-reduced) amax. Formulas and their order are those of
// TE's transformer_engine/common/cast/nvfp4/core_nvfp4.cuh (docs/QUANTIZATION.md).
// Thread safety: pure functions.
#include <cmath>
#include <cstdint>
#include <limits>

#include "quant/recipes.h"

namespace tpcheck {
namespace {
constexpr float kFltMax = std::numeric_limits<float>::max();
}  // namespace

float nvfp4_global_encode_scale(float tensor_amax) {
  constexpr float kFp8Max = 448.0f;
  constexpr float kFp4Max = 6.0f;
  // fminf: a NaN quotient (NaN amax) gives FLT_MAX, as on the GPU.
  const float s = std::fmin(kFp8Max * kFp4Max / tensor_amax, kFltMax);
  if (tensor_amax == 0.0f || s == 0.0f) return 1.0f;
  return s;
}

std::uint8_t nvfp4_block_decode_scale(float block_amax, float s_enc) {
  constexpr float kFp4MaxInv = 1.0f / 6.0f;  // an f32 constant, rounded
  const float s_enc_over_6 = s_enc * kFp4MaxInv;
  const float decode = block_amax * s_enc_over_6;
  return cast_satfinite(DType::kF8E4M3, std::fmin(decode, kFltMax));
}

float nvfp4_encode_factor(std::uint8_t sb_bits, float s_enc) {
  const float s_dec = 1.0f / s_enc;
  const float sb = f8e4m3_bits_to_f32(sb_bits);
  // A block scale of 0 (the block's amax rounds below E4M3's smallest subnormal): 1/0 = inf
  // → FLT_MAX, and the block's values (all tiny) are multiplied by it.
  return std::fmin(1.0f / (sb * s_dec), kFltMax);
}

float nvfp4_gemm_alpha(float amax_a, float amax_b) {
  // TE nvfp4_recipe: alpha *= amax_A * amax_B * factor_inv, factor_inv = (float)(1 / (6² · 448²)).
  constexpr float kFactorInv = static_cast<float>(1.0 / (6.0 * 6.0 * 448.0 * 448.0));
  const float product = amax_a * amax_b;
  return product * kFactorInv;
}

namespace quant_detail {
namespace {

constexpr std::int64_t kBlock = 16;

void quantize_copy(const Matrix& m, float s_enc, Tensor& data, Tensor& scale_inv) {
  scale_inv = Tensor({m.rows, m.cols / kBlock}, DType::kF8E4M3);
  std::uint8_t* s = scale_inv.data<std::uint8_t>();
  data = quantize_blocks(m, 1, kBlock, DType::kF4E2M1, [&](float amax, std::int64_t index) {
    const std::uint8_t sb = nvfp4_block_decode_scale(amax, s_enc);
    s[index] = sb;
    return nvfp4_encode_factor(sb, s_enc);
  });
}

}  // namespace

void quantize_nvfp4(const Matrix& m, float s_enc, QuantUsage usage, QuantizedData& out) {
  out.block = {1, kBlock};
  out.scale = scalar_tensor(s_enc);
  if (usage.rowwise) quantize_copy(m, s_enc, out.rowwise_data, out.rowwise_scale_inv);
  if (usage.columnwise) {
    quantize_copy(m.transposed(), s_enc, out.columnwise_data, out.columnwise_scale_inv);
  }
}

}  // namespace quant_detail
}  // namespace tpcheck

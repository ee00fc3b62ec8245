// fp8_block.cpp — FP8 block scaling (TE's Float8BlockScaling recipe): E4M3 data, one
// power-of-two scale per 1x128 block (activations, gradients; the columnwise copy is the
// transpose requantized from high precision, i.e. 128x1 blocks of the original) or per
// 128x128 block (weights; the columnwise copy holds the same blocks transposed).
// Thread safety: pure functions.
#include <bit>
#include <cmath>
#include <cstdint>

#include "quant/recipes.h"

namespace tpcheck {

float fp8_block_scale(float block_amax) {
  // TE compute_scale_from_amax with force_pow_2_scales: the current scale, then its
  // mantissa bits dropped (448 / amax >= 448 / FLT_MAX is a normal f32, so the exponent
  // field is never zero). amax 0 / inf / NaN give 1, an overflowing quotient FLT_MAX →
  // 2^127.
  const float scale = fp8_current_scale(block_amax, DType::kF8E4M3);
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(scale) & 0xff800000u);
}

namespace quant_detail {
namespace {

constexpr std::int64_t kBlock = 128;

// One copy of m: data and f32 scale_inv [rows / br, cols / bc].
void quantize_copy(const Matrix& m, std::int64_t br, std::int64_t bc, Tensor& data,
                   Tensor& scale_inv) {
  scale_inv = Tensor({m.rows / br, m.cols / bc}, DType::kF32);
  float* s = scale_inv.data<float>();
  data = quantize_blocks(m, br, bc, DType::kF8E4M3, [&](float amax, std::int64_t index) {
    const float scale = fp8_block_scale(amax);
    s[index] = scale_reciprocal(scale);  // exact: a power of two
    return scale;
  });
}

}  // namespace

void quantize_fp8_block(const Matrix& m, QuantRole role, QuantUsage usage, QuantizedData& out) {
  const std::int64_t br = role == QuantRole::kWeight ? kBlock : 1;
  out.block = {br, kBlock};
  if (usage.rowwise) quantize_copy(m, br, kBlock, out.rowwise_data, out.rowwise_scale_inv);
  if (usage.columnwise) {
    quantize_copy(m.transposed(), br, kBlock, out.columnwise_data, out.columnwise_scale_inv);
  }
}

}  // namespace quant_detail
}  // namespace tpcheck

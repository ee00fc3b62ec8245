// mxfp8.cpp — MXFP8 (TE's MXFP8BlockScaling recipe): E4M3 data, one E8M0 scale per 32
// consecutive values — 1x32 blocks for the rowwise copy, 32x1 for the columnwise one, each
// quantized from high precision. The scale is amax · (1/448) rounded up to a power of two
// (e8m0_round_up), and the values are multiplied by its reciprocal 2^(127 − e).
// Thread safety: pure functions.
#include <cstdint>

#include "quant/recipes.h"

namespace tpcheck {

std::uint8_t mxfp8_scale_exponent(float block_amax) {
  // TE: float_to_e8m0(amax * Quantized_Limits<fp8e4m3>::max_reciprocal()), the reciprocal
  // an f32 constant (1/448 rounded), the product one f32 rounding.
  constexpr float kMaxReciprocal = 1.0f / 448.0f;
  return e8m0_round_up(block_amax * kMaxReciprocal);
}

namespace quant_detail {
namespace {

constexpr std::int64_t kBlock = 32;

void quantize_copy(const Matrix& m, Tensor& data, Tensor& scale_inv) {
  scale_inv = Tensor({m.rows, m.cols / kBlock}, DType::kF8E8M0);
  std::uint8_t* s = scale_inv.data<std::uint8_t>();
  data = quantize_blocks(m, 1, kBlock, DType::kF8E4M3, [&](float amax, std::int64_t index) {
    const std::uint8_t e = mxfp8_scale_exponent(amax);
    s[index] = e;
    return e8m0_reciprocal(e);
  });
}

}  // namespace

void quantize_mxfp8(const Matrix& m, QuantUsage usage, QuantizedData& out) {
  out.block = {1, kBlock};
  if (usage.rowwise) quantize_copy(m, out.rowwise_data, out.rowwise_scale_inv);
  if (usage.columnwise)
    quantize_copy(m.transposed(), out.columnwise_data, out.columnwise_scale_inv);
}

}  // namespace quant_detail
}  // namespace tpcheck

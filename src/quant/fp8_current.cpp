// fp8_current.cpp — FP8 per-tensor scaling: the current-scaling scale (TE's
// compute_scale_from_amax) and the per-tensor cast that delayed and current scaling share.
// Thread safety: pure functions.
#include <cmath>
#include <limits>

#include "quant/recipes.h"
#include "tpcheck/error.h"

namespace tpcheck {

float fp8_current_scale(float amax, DType format) {
  // TE: amax 0, inf or NaN keep scale 1; the quotient is one f32 division (__fdiv_rn);
  // an amax so small that the quotient overflows gets FLT_MAX.
  if (amax == 0.0f || std::isinf(amax) || std::isnan(amax)) return 1.0f;
  const float fmax = static_cast<float>(dtype_max_finite(format));
  const float scale = fmax / amax;
  if (std::isinf(scale)) return std::numeric_limits<float>::max();
  return scale;
}

float scale_reciprocal(float scale) { return 1.0f / scale; }

namespace quant_detail {

void quantize_fp8_per_tensor(const Matrix& m, DType format, float scale, QuantUsage usage,
                             QuantizedData& out) {
  out.block = {};
  out.scale = scalar_tensor(scale);
  const float scale_inv = scale_reciprocal(scale);
  auto with_scale = [&](float, std::int64_t) { return scale; };
  if (usage.rowwise) {
    out.rowwise_data = quantize_blocks(m, m.rows, m.cols, format, with_scale);
    out.rowwise_scale_inv = scalar_tensor(scale_inv);
  }
  if (usage.columnwise) {
    // TE transposes the quantized bytes; with one scale that is the same as quantizing the
    // transpose.
    const Matrix t = m.transposed();
    out.columnwise_data = quantize_blocks(t, t.rows, t.cols, format, with_scale);
    out.columnwise_scale_inv = scalar_tensor(scale_inv);
  }
}

}  // namespace quant_detail
}  // namespace tpcheck

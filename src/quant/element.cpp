// element.cpp — the per-value operations every recipe shares: amax, the saturating cast
// the GPU's `cvt.rn.satfinite` performs, and the E8M0 rounding MXFP8 uses.
// Thread safety: pure functions.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {

float amax_of(const Tensor& x) {
  const std::vector<float> v = x.to_f32();
  float m = 0.0f;
  for (float f : v) {
    if (std::isnan(f)) return f;  // a NaN anywhere makes the amax NaN
    m = std::max(m, std::fabs(f));
  }
  return m;
}

std::uint8_t cast_satfinite(DType format, float v) {
  // dtype.cpp's kSaturate keeps ±inf as inf (NaN for E4M3); `cvt.rn.satfinite` sends
  // every magnitude beyond the largest finite value, infinity included, to ±max.
  if (std::isinf(v)) v = std::copysign(std::numeric_limits<float>::max(), v);
  switch (format) {
    case DType::kF8E4M3:
      return f32_to_f8e4m3_bits(v, CastMode::kSaturate);
    case DType::kF8E5M2:
      return f32_to_f8e5m2_bits(v, CastMode::kSaturate);
    case DType::kF4E2M1:
      return f32_to_f4e2m1_bits(v, CastMode::kSaturate);
    default:
      break;
  }
  TPCHECK_CHECK(false, "cast_satfinite: {} is not a quantized data format", dtype_name(format));
  return 0;
}

std::uint8_t e8m0_round_up(float v) {
  if (std::isnan(v)) return 0xff;
  if (std::isinf(v)) return 0xfe;
  if (v == 0.0f) return 0x00;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
  std::uint32_t exponent = (bits >> 23) & 0xffu;
  const std::uint32_t mantissa = bits & 0x7fffffu;
  // Not a power of two: the next exponent up, except at the top (0xFE stays: 0xFF is NaN)
  // and for f32 subnormals at or below 2^-127 (= mantissa 0x400000), which 2^-127 covers.
  const bool subnormal_covered = exponent == 0 && mantissa <= 0x400000u;
  if (mantissa > 0 && exponent != 0xfe && !subnormal_covered) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

float e8m0_reciprocal(std::uint8_t e) {
  if (e == 0xff) return std::numeric_limits<float>::quiet_NaN();
  // TE's exp2f_rcp returns 1 for e = 0 (a block whose amax is 0 or tiny), not 2^127.
  if (e == 0) return 1.0f;
  return std::ldexp(1.0f, 127 - static_cast<int>(e));
}

}  // namespace tpcheck

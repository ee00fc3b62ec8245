// dtype_test — readable unit tests for number formats (include/tpcheck/dtype.h).
//
// The exhaustive bit-for-bit comparison with ml_dtypes lives in
// tests/python/test_dtype_conformance.py; these tests pin down properties and a few
// examples worked out by hand, so a failure here reads as a sentence.
#include "tpcheck/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

TEST(DTypeNames, RoundTripThroughParse) {
  for (DType d :
       {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
  }
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "f8e4m3");
}

TEST(DTypeNames, UnknownNameIsAnInputErrorNamingTextAndChoices) {
  try {
    parse_dtype("fp16");
    FAIL() << "parse_dtype(\"fp16\") did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'fp16'"), std::string::npos) << msg;
    for (const char* name : {"f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2"}) {
      EXPECT_NE(msg.find(name), std::string::npos) << "message lacks " << name << ": " << msg;
    }
  }
  // Case matters and there is no trimming: these are file/CLI spellings.
  EXPECT_THROW(parse_dtype("F32"), Error);
  EXPECT_THROW(parse_dtype(" f32"), Error);
  EXPECT_THROW(parse_dtype(""), Error);
}

TEST(DTypeProperties, SizesMaxAndRoundoff) {
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E5M2), 1u);
  EXPECT_EQ(dtype_max_finite(DType::kF16), 65504.0);
  EXPECT_EQ(dtype_max_finite(DType::kF8E4M3), 448.0);
  EXPECT_EQ(dtype_max_finite(DType::kF8E5M2), 57344.0);
  // bf16 max: (2 - 2^-7) * 2^127.
  EXPECT_EQ(dtype_max_finite(DType::kBF16), std::ldexp(2.0 - std::ldexp(1.0, -7), 127));
  EXPECT_EQ(dtype_max_finite(DType::kF32), std::numeric_limits<float>::max());
  EXPECT_EQ(dtype_unit_roundoff(DType::kF32), std::ldexp(1.0, -24));
  EXPECT_EQ(dtype_unit_roundoff(DType::kBF16), std::ldexp(1.0, -8));
  EXPECT_EQ(dtype_unit_roundoff(DType::kF8E4M3), std::ldexp(1.0, -4));
  EXPECT_TRUE(is_fp8(DType::kF8E5M2));
  EXPECT_FALSE(is_fp8(DType::kBF16));
}

// Every non-NaN bit pattern decodes to a value that encodes back to the same pattern
// (representable values are fixed points of rounding), from f32 and from f64.
TEST(DTypeConversions, RepresentableValuesRoundTrip) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float h = f16_bits_to_f32(bits);
    if (!std::isnan(h)) {
      ASSERT_EQ(f32_to_f16_bits(h), bits) << std::hex << b;
      ASSERT_EQ(f64_to_f16_bits(h), bits) << std::hex << b;
    }
    const float bf = bf16_bits_to_f32(bits);
    if (!std::isnan(bf)) {
      ASSERT_EQ(f32_to_bf16_bits(bf), bits) << std::hex << b;
      ASSERT_EQ(f64_to_bf16_bits(bf), bits) << std::hex << b;
    }
  }
  for (std::uint32_t b = 0; b < 0x100; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    const float e4 = f8e4m3_bits_to_f32(bits);
    if (!std::isnan(e4)) {
      ASSERT_EQ(f32_to_f8e4m3_bits(e4), bits) << std::hex << b;
      ASSERT_EQ(f64_to_f8e4m3_bits(e4), bits) << std::hex << b;
      ASSERT_EQ(round_to(DType::kF8E4M3, e4), e4);
    }
    const float e5 = f8e5m2_bits_to_f32(bits);
    if (!std::isnan(e5)) {
      ASSERT_EQ(f32_to_f8e5m2_bits(e5), bits) << std::hex << b;
      ASSERT_EQ(f64_to_f8e5m2_bits(e5), bits) << std::hex << b;
    }
  }
}

TEST(DTypeConversions, SaturateVersusPlainOnOverflow) {
  // 1e6 is far above f8e4m3's max 448. The "fn" format has no inf, so a plain cast gives
  // NaN (S.1111.111 = 0x7f), a saturating cast gives ±448 (S.1111.110 = 0x7e).
  EXPECT_EQ(f32_to_f8e4m3_bits(1e6f, CastMode::kPlain), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3_bits(1e6f, CastMode::kSaturate), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3_bits(-1e6f, CastMode::kSaturate), 0xfe);
  EXPECT_EQ(round_to(DType::kF8E4M3, 1e6f, CastMode::kSaturate), 448.0f);
  EXPECT_TRUE(std::isnan(round_to(DType::kF8E4M3, 1e6f, CastMode::kPlain)));
  // Saturation only clamps finite values: inf stays inf (NaN for f8e4m3).
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f8e5m2_bits(inf, CastMode::kSaturate), 0x7c);
  EXPECT_EQ(f32_to_f8e4m3_bits(-inf, CastMode::kSaturate), 0xff);
  // 464 is halfway between 448 (mantissa 110, even) and the NaN slot 480 (111): ties to
  // even keep it at 448 even in a plain cast; just above 464 overflows.
  EXPECT_EQ(f32_to_f8e4m3_bits(464.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3_bits(std::nextafter(464.0f, 1e9f)), 0x7f);
  // f16: 65520 is halfway between max 65504 (odd mantissa) and 65536 → inf (0x7c00).
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(65520.0f, CastMode::kSaturate), 0x7bff);
}

TEST(DTypeConversions, F64RoundsOnceNotThroughF32) {
  // x = 1 + 2^-8 + 2^-30. bf16 has 7 mantissa bits: neighbours 1 and 1 + 2^-7, midpoint
  // 1 + 2^-8. x is above the midpoint, so one rounding gives 1 + 2^-7 (0x3f81). Rounding
  // to f32 first would land exactly on the midpoint (2^-30 < half an f32 ulp), and
  // ties-to-even would then give 1.0 (0x3f80).
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(f64_to_bf16_bits(x), 0x3f81);
  EXPECT_EQ(f32_to_bf16_bits(static_cast<float>(x)), 0x3f80);
  EXPECT_EQ(round_to(DType::kBF16, x), 1.0 + std::ldexp(1.0, -7));
}

TEST(DTypeConversions, Tf32Examples) {
  // TF32 keeps 10 mantissa bits: near 1 the spacing is 2^-10.
  const float one = 1.0f;
  const float ulp = std::ldexp(1.0f, -10);
  // 1 + 2^-11 is exactly halfway between 1 (even) and 1 + 2^-10 (odd): → 1.
  EXPECT_EQ(round_tf32(1.0f + ulp / 2), one);
  // 1 + 3·2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): → 1 + 2^-9.
  EXPECT_EQ(round_tf32(1.0f + 3 * ulp / 2), 1.0f + 2 * ulp);
  // One f32 ulp (2^-23) above the halfway point rounds up.
  EXPECT_EQ(round_tf32(1.0f + ulp / 2 + std::ldexp(1.0f, -23)), 1.0f + ulp);
  // Truncation drops the low 13 bits: just below 1 + 2^-10 → 1.
  EXPECT_EQ(round_tf32(1.0f + ulp - std::ldexp(1.0f, -23), Tf32Rounding::kTruncate), one);
  // The largest f32 is above TF32's largest finite value (2 - 2^-10)·2^127 by more than
  // half a TF32 ulp, so nearest-even overflows to inf, truncation does not.
  const float fmax = std::numeric_limits<float>::max();
  EXPECT_TRUE(std::isinf(round_tf32(fmax)));
  EXPECT_EQ(round_tf32(fmax, Tf32Rounding::kTruncate), std::ldexp(2.0f - ulp, 127));
  // Negative values round symmetrically; NaN stays NaN (a sNaN with a low payload must
  // not become inf by masking).
  EXPECT_EQ(round_tf32(-(1.0f + 3 * ulp / 2)), -(1.0f + 2 * ulp));
  const float snan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(round_tf32(snan, Tf32Rounding::kTruncate)));
  EXPECT_TRUE(std::isnan(round_tf32(snan)));
}

}  // namespace
}  // namespace tpcheck

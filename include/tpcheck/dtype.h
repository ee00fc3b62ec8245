// tpcheck/dtype.h — number formats and their conversions.
//
// Storage formats: f64, f32, f16 (IEEE binary16), bf16, f8e4m3 (the finite "fn"
// variant: no inf, one NaN pattern per sign, max 448), f8e5m2 (IEEE-like, max 57344).
// All conversions round to nearest, ties to even, and agree bit for bit with the
// `ml_dtypes` Python package (tests/python/test_dtype_conformance.py checks this).
// Two kinds of narrowing cast exist:
//   * plain (kPlain): out-of-range values become ±inf, or NaN for f8e4m3 which has no inf;
//   * saturating (kSaturate), as FP8 quantization uses: finite out-of-range values
//     become ±max finite; inf stays inf (NaN for f8e4m3) and NaN stays NaN.
// TF32 is not a storage format: `round_tf32` rounds an f32 to 10 mantissa bits (kept in
// an f32), as tensor cores read TF32 inputs.
// Thread safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tpcheck {

enum class DType { kF64, kF32, kF16, kBF16, kF8E4M3, kF8E5M2 };

// "f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2".
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; throws Error(kInput) naming the text and the accepted names.
DType parse_dtype(std::string_view name);
// Bytes per element: 8, 4, 2, 2, 1, 1.
std::size_t dtype_size(DType dtype);
// Largest finite value of the format.
double dtype_max_finite(DType dtype);
// Unit roundoff u = 2^-(mantissa bits + 1): 2^-53, 2^-24, 2^-11, 2^-8, 2^-4, 2^-3.
double dtype_unit_roundoff(DType dtype);
bool is_fp8(DType dtype);

enum class CastMode { kPlain, kSaturate };

// Bit-pattern conversions (bits are the format's own encoding).
float f16_bits_to_f32(std::uint16_t bits);
float bf16_bits_to_f32(std::uint16_t bits);
float f8e4m3_bits_to_f32(std::uint8_t bits);
float f8e5m2_bits_to_f32(std::uint8_t bits);
std::uint16_t f32_to_f16_bits(float value, CastMode mode = CastMode::kPlain);
std::uint16_t f32_to_bf16_bits(float value, CastMode mode = CastMode::kPlain);
std::uint8_t f32_to_f8e4m3_bits(float value, CastMode mode = CastMode::kPlain);
std::uint8_t f32_to_f8e5m2_bits(float value, CastMode mode = CastMode::kPlain);

// From f64 directly (one rounding, no double rounding through f32).
std::uint16_t f64_to_f16_bits(double value, CastMode mode = CastMode::kPlain);
std::uint16_t f64_to_bf16_bits(double value, CastMode mode = CastMode::kPlain);
std::uint8_t f64_to_f8e4m3_bits(double value, CastMode mode = CastMode::kPlain);
std::uint8_t f64_to_f8e5m2_bits(double value, CastMode mode = CastMode::kPlain);

// The value `value` takes once stored in `dtype` (rounded), returned in a wider type.
float round_to(DType dtype, float value, CastMode mode = CastMode::kPlain);
double round_to(DType dtype, double value, CastMode mode = CastMode::kPlain);

enum class Tf32Rounding { kNearestEven, kTruncate };
// f32 → TF32 (1 sign, 8 exponent, 10 mantissa bits), returned as an f32 whose low 13
// mantissa bits are zero. inf and NaN pass through (NaN stays NaN).
float round_tf32(float value, Tf32Rounding mode = Tf32Rounding::kNearestEven);

}  // namespace tpcheck

// tpcheck/dtype.h — number formats and their conversions.
//
// Storage formats: f64, f32, f16 (IEEE binary16), bf16, f8e4m3 (the finite "fn"
// variant: no inf, one NaN pattern per sign, max 448), f8e5m2 (IEEE-like, max 57344),
// and the two formats of the block-scaled recipes (docs/QUANTIZATION.md):
//   f4e2m1 (float4_e2m1fn: 1 sign, 2 exponent, 1 mantissa bit; no inf, no NaN; max 6),
//     stored one value per byte in the low nibble (not packed two per byte);
//   f8e8m0 (float8_e8m0fnu: an unsigned power of two 2^(bits − 127), 2^-127 ... 2^127;
//     0xFF is NaN; no zero, no sign), the MXFP8 block scale.
// All conversions round to nearest, ties to even, and agree bit for bit with the
// `ml_dtypes` Python package (tests/python/test_dtype_conformance.py checks this).
// Two kinds of narrowing cast exist:
//   * plain (kPlain): out-of-range values become ±inf, or NaN for f8e4m3 which has no inf;
//   * saturating (kSaturate), as FP8 quantization uses: finite out-of-range values
//     become ±max finite; inf stays inf (NaN for f8e4m3) and NaN stays NaN.
// f4e2m1 has neither inf nor NaN: both casts saturate (±inf → ±6), and a NaN becomes a
// zero of the opposite sign (ml_dtypes' convention; quantization never feeds it a NaN).
// f8e8m0 follows ml_dtypes (≥ 0.7) too, which does not round ties to even there (it has
// no mantissa to be even): a positive value rounds to the nearer power of two, ties up,
// values below 2^-127 go to 2^-127;
// zero, negatives and NaN give NaN (0xFF); overflow gives NaN (plain) or 2^127 (0xFE,
// saturating). MXFP8's scale is not this cast but a rounding up (quant.h).
// TF32 is not a storage format: `round_tf32` rounds an f32 to 10 mantissa bits (kept in
// an f32), as tensor cores read TF32 inputs.
// Thread safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tpcheck {

enum class DType { kF64, kF32, kF16, kBF16, kF8E4M3, kF8E5M2, kF4E2M1, kF8E8M0 };

// "f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "f4e2m1", "f8e8m0".
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; throws Error(kInput) naming the text and the accepted names.
DType parse_dtype(std::string_view name);
// Bytes per element: 8, 4, 2, 2, 1, 1, 1 (f4e2m1 unpacked), 1.
std::size_t dtype_size(DType dtype);
// Largest finite value of the format.
double dtype_max_finite(DType dtype);
// Unit roundoff u = 2^-(mantissa bits + 1): 2^-53, 2^-24, 2^-11, 2^-8, 2^-4, 2^-3, 2^-2,
// 2^-1 (f8e8m0: powers of two only).
double dtype_unit_roundoff(DType dtype);
// f8e4m3 or f8e5m2 (the FP8 data formats; f8e8m0 is a scale format, not counted).
bool is_fp8(DType dtype);
// The formats that hold quantized data or block scales: fp8, f4e2m1, f8e8m0. Tensors of
// these dtypes are storage only: backends' ops other than the quantized GEMM reject them.
bool is_quantized_format(DType dtype);

enum class CastMode { kPlain, kSaturate };

// Bit-pattern conversions (bits are the format's own encoding).
float f16_bits_to_f32(std::uint16_t bits);
float bf16_bits_to_f32(std::uint16_t bits);
float f8e4m3_bits_to_f32(std::uint8_t bits);
float f8e5m2_bits_to_f32(std::uint8_t bits);
float f4e2m1_bits_to_f32(std::uint8_t bits);  // low nibble; the high one is ignored
float f8e8m0_bits_to_f32(std::uint8_t bits);
std::uint16_t f32_to_f16_bits(float value, CastMode mode = CastMode::kPlain);
std::uint16_t f32_to_bf16_bits(float value, CastMode mode = CastMode::kPlain);
std::uint8_t f32_to_f8e4m3_bits(float value, CastMode mode = CastMode::kPlain);
std::uint8_t f32_to_f8e5m2_bits(float value, CastMode mode = CastMode::kPlain);
std::uint8_t f32_to_f4e2m1_bits(float value, CastMode mode = CastMode::kPlain);
std::uint8_t f32_to_f8e8m0_bits(float value, CastMode mode = CastMode::kPlain);

// From f64 directly (one rounding, no double rounding through f32).
std::uint16_t f64_to_f16_bits(double value, CastMode mode = CastMode::kPlain);
std::uint16_t f64_to_bf16_bits(double value, CastMode mode = CastMode::kPlain);
std::uint8_t f64_to_f8e4m3_bits(double value, CastMode mode = CastMode::kPlain);
std::uint8_t f64_to_f8e5m2_bits(double value, CastMode mode = CastMode::kPlain);
std::uint8_t f64_to_f4e2m1_bits(double value, CastMode mode = CastMode::kPlain);
std::uint8_t f64_to_f8e8m0_bits(double value, CastMode mode = CastMode::kPlain);

// The value `value` takes once stored in `dtype` (rounded), returned in a wider type.
float round_to(DType dtype, float value, CastMode mode = CastMode::kPlain);
double round_to(DType dtype, double value, CastMode mode = CastMode::kPlain);

enum class Tf32Rounding { kNearestEven, kTruncate };
// f32 → TF32 (1 sign, 8 exponent, 10 mantissa bits), returned as an f32 whose low 13
// mantissa bits are zero. inf and NaN pass through (NaN stays NaN).
float round_tf32(float value, Tf32Rounding mode = Tf32Rounding::kNearestEven);

}  // namespace tpcheck

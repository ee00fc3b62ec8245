// dtype.cpp — number formats: names, sizes, and bit-exact conversions.
//
// Every narrow format (f16, bf16, f8e4m3, f8e5m2) is described by one `Format` value
// (exponent bits, mantissa bits, how it spells inf and NaN), and two generic routines do
// all the work: `narrow` rounds an f32 or f64 to a format (round to nearest, ties to
// even, one rounding straight from the source) and `widen` decodes a format's bits to an
// f32 (always exact). The per-format public functions are one-line wrappers.
//
// NaN bits follow what the `ml_dtypes` Python package (and numpy, for float16) produce,
// because the conformance test compares bit patterns:
//   * f32/f64 → f16 keeps the sign and the top 10 payload bits (numpy's rule), and turns
//     a payload that truncates to zero into 1 so the result stays a NaN;
//   * f32/f64 → bf16/fp8 gives the format's canonical NaN with the input's sign;
//   * f16/bf16 → f32 keep sign and payload (a plain shift); fp8 → f32 gives the
//     canonical quiet f32 NaN with the sign.
// Note: ml_dtypes' own float64 → bf16/fp8 array cast rounds twice (through float32); we
// round once, as the header promises. The conformance test checks us against an exact
// single-rounding reference there and shows each disagreement with ml_dtypes is a
// double-rounding case.
// Thread safety: all functions are pure.
#include "tpcheck/dtype.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// How a format encodes NaN when we produce one by narrowing.
enum class NanOut {
  kTruncatePayload,  // sign | all-ones exponent | top payload bits (never zero): f16
  kCanonical,        // sign | `canonical_nan` bits: bf16, fp8
};

// A binary floating-point format with 1 sign bit, `exp_bits` exponent bits (bias
// 2^(exp_bits-1) - 1) and `man_bits` stored mantissa bits, gradual underflow.
struct Format {
  int exp_bits;
  int man_bits;
  // false for f8e4m3 ("fn"): the all-ones exponent is an ordinary binade and only
  // S.1111.111 is NaN; there is no infinity.
  bool has_inf;
  // false for f4e2m1: every pattern is a finite number.
  bool has_nan;
  NanOut nan_out;
  // Magnitude bits of the NaN we produce for kCanonical (and for inf / overflow into a
  // format without inf).
  std::uint32_t canonical_nan;
  // true: decoding a NaN keeps its payload (f16, bf16); false: decoding gives the
  // canonical f32 quiet NaN (fp8, as ml_dtypes does).
  bool widen_keeps_payload;

  constexpr int bias() const { return (1 << (exp_bits - 1)) - 1; }
  constexpr int min_normal_exp() const { return 1 - bias(); }
  constexpr std::uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  constexpr std::uint32_t exp_all_ones() const { return ((1u << exp_bits) - 1) << man_bits; }
  constexpr std::uint32_t man_mask() const { return (1u << man_bits) - 1; }
  // Magnitude bits of the largest finite value.
  constexpr std::uint32_t max_finite() const {
    if (!has_nan) return exp_all_ones() | man_mask();
    return has_inf ? exp_all_ones() - 1 : exp_all_ones() | (man_mask() - 1);
  }
  // Magnitude bits of what a (plain) overflow produces: inf, else NaN, else (f4e2m1,
  // which has neither) the largest finite value.
  constexpr std::uint32_t overflow() const {
    return has_inf ? exp_all_ones() : has_nan ? canonical_nan : max_finite();
  }
  // Is the magnitude `mag` (sign bit cleared) a NaN?
  constexpr bool is_nan(std::uint32_t mag) const {
    if (!has_nan) return false;
    return has_inf ? mag > exp_all_ones() : mag == (exp_all_ones() | man_mask());
  }
  constexpr bool is_inf(std::uint32_t mag) const { return has_inf && mag == exp_all_ones(); }
};

constexpr Format kF16Format{5, 10, true, true, NanOut::kTruncatePayload, 0x7e00, true};
constexpr Format kBF16Format{8, 7, true, true, NanOut::kCanonical, 0x7fc0, true};
constexpr Format kF8E4M3Format{4, 3, false, true, NanOut::kCanonical, 0x7f, false};
constexpr Format kF8E5M2Format{5, 2, true, true, NanOut::kCanonical, 0x7e, false};
// No NaN: narrowing a NaN gives a zero of the opposite sign (NanOut is not used).
constexpr Format kF4E2M1Format{2, 1, false, false, NanOut::kCanonical, 0, false};

static_assert(kF8E4M3Format.max_finite() == 0x7e);  // 448
static_assert(kF8E5M2Format.max_finite() == 0x7b);  // 57344
static_assert(kF16Format.max_finite() == 0x7bff);   // 65504
static_assert(kF4E2M1Format.max_finite() == 0x7);   // 6

// The source side of a narrowing: f32 or f64, described by its bit layout.
template <typename T>
struct Source;
template <>
struct Source<float> {
  using Bits = std::uint32_t;
  static constexpr int kExpBits = 8;
  static constexpr int kManBits = 23;
};
template <>
struct Source<double> {
  using Bits = std::uint64_t;
  static constexpr int kExpBits = 11;
  static constexpr int kManBits = 52;
};

// Rounds `value` to `f` (nearest, ties to even, one rounding) and returns f's bits.
//
// The idea: a finite source value is sig · 2^e (integers, sig < 2^53). In the format, the
// representable values near it are the multiples of a quantum 2^q, where q is fixed by
// the value's binade (q = exponent of its leading bit − man_bits), but never below the
// subnormal quantum (min_normal_exp − man_bits). Rounding is then integer rounding of
// sig · 2^(e−q) to k quanta. Encoding needs no case split either: with
// biased_q = q − (min_normal_exp − man_bits), the bits are (biased_q << man_bits) + k — for
// subnormals biased_q = 0 and the bits are k; for normals k carries the implicit leading
// 1, which adds exactly one to the exponent field, and a carry out of the mantissa on
// rounding up moves into the exponent field by itself. We round as if the exponent range
// were unbounded above and compare with max_finite afterwards, which also gets
// f8e4m3's ties right (464 lies halfway between 448 and the NaN slot 480 and rounds to
// 448, whose mantissa is even).
//
// The format is a template argument so that its shifts and masks fold into constants:
// this runs on every f16/bf16 tensor store.
template <Format f, typename T>
std::uint32_t narrow(T value, CastMode mode) {
  using S = Source<T>;
  using Bits = typename S::Bits;
  constexpr int kSrcBias = (1 << (S::kExpBits - 1)) - 1;
  constexpr Bits kSrcManMask = (Bits{1} << S::kManBits) - 1;
  constexpr Bits kSrcExpMask = ((Bits{1} << S::kExpBits) - 1) << S::kManBits;

  const Bits bits = std::bit_cast<Bits>(value);
  const std::uint32_t sign = (bits >> (S::kExpBits + S::kManBits)) ? f.sign_bit() : 0u;
  const Bits exp_field = (bits & kSrcExpMask) >> S::kManBits;
  const Bits man = bits & kSrcManMask;

  if ((bits & kSrcExpMask) == kSrcExpMask) {  // inf or NaN
    if (man == 0) {  // inf stays inf (NaN where there is no inf), even when saturating
      return sign | f.overflow();
    }
    // A format without NaN: ml_dtypes gives the zero of the opposite sign.
    if (!f.has_nan) return sign ^ f.sign_bit();
    if (f.nan_out == NanOut::kCanonical) return sign | f.canonical_nan;
    std::uint32_t payload = static_cast<std::uint32_t>(man >> (S::kManBits - f.man_bits));
    if (payload == 0) payload = 1;  // a zero payload would spell inf
    return sign | f.exp_all_ones() | payload;
  }

  // value = sig · 2^e exactly.
  const std::uint64_t sig = exp_field ? (man | (Bits{1} << S::kManBits)) : man;
  if (sig == 0) return sign;  // ±0
  const int e = (exp_field ? static_cast<int>(exp_field) : 1) - kSrcBias - S::kManBits;
  const int lead = e + std::bit_width(sig) - 1;  // exponent of the leading bit
  const int min_q = f.min_normal_exp() - f.man_bits;
  // Far above the largest binade: overflow (also keeps the shift below in range).
  if (lead > f.bias() + 1) {
    return sign | (mode == CastMode::kSaturate ? f.max_finite() : f.overflow());
  }
  const int q = (lead - f.man_bits > min_q) ? lead - f.man_bits : min_q;

  std::uint64_t k;
  const int shift = q - e;  // low bits of sig below the quantum
  if (shift <= 0) {
    k = sig << -shift;  // exact (the format is at least as fine here as the source)
  } else if (shift > 63) {
    k = 0;  // less than half a quantum: rounds to zero (sig < 2^53 < 2^(shift-1))
  } else {
    k = sig >> shift;
    const std::uint64_t rest = sig & ((std::uint64_t{1} << shift) - 1);
    const std::uint64_t half = std::uint64_t{1} << (shift - 1);
    // Round up above half, and at exactly half when k is odd (ties to even). Written
    // without a branch: for typical data it would be a coin flip for the predictor.
    k += static_cast<std::uint64_t>(rest > half) | (static_cast<std::uint64_t>(rest == half) & k);
  }

  const std::uint64_t mag = (static_cast<std::uint64_t>(q - min_q) << f.man_bits) + k;
  if (mag > f.max_finite()) {
    return sign | (mode == CastMode::kSaturate ? f.max_finite() : f.overflow());
  }
  return sign | static_cast<std::uint32_t>(mag);
}

// Decodes the bits of format `f` to an f32 (exact: every format here fits in f32).
template <Format f>
float widen(std::uint32_t bits) {
  const std::uint32_t sign32 = (bits & f.sign_bit()) ? 0x80000000u : 0u;
  const std::uint32_t mag = bits & (f.sign_bit() - 1);
  const int shift = 23 - f.man_bits;  // mantissa position in f32
  if (f.is_nan(mag)) {
    if (!f.widen_keeps_payload) return std::bit_cast<float>(sign32 | 0x7fc00000u);
    return std::bit_cast<float>(sign32 | 0x7f800000u | ((mag & f.man_mask()) << shift));
  }
  if (f.is_inf(mag)) return std::bit_cast<float>(sign32 | 0x7f800000u);
  const std::uint32_t exp_field = mag >> f.man_bits;
  const std::uint32_t man = mag & f.man_mask();
  if (exp_field == 0) {
    // Subnormal (or zero): man · 2^(min_normal_exp − man_bits). The scale is a power of
    // two that f32 represents (2^-133 for bf16 is an f32 subnormal), and the product is
    // a representable f32, so the multiplication is exact.
    const float scale = std::ldexp(1.0f, f.min_normal_exp() - f.man_bits);
    const float v = static_cast<float>(man) * scale;
    return sign32 ? -v : v;
  }
  const std::uint32_t exp32 = exp_field - f.bias() + 127;
  return std::bit_cast<float>(sign32 | (exp32 << 23) | (man << shift));
}

// Calls `fn.template operator()<F>()` with the Format F of a narrow dtype, so generic
// code over DType still gets the format as a compile-time constant.
template <typename Fn>
decltype(auto) visit_format(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF16:
      return fn.template operator()<kF16Format>();
    case DType::kBF16:
      return fn.template operator()<kBF16Format>();
    case DType::kF8E4M3:
      return fn.template operator()<kF8E4M3Format>();
    case DType::kF8E5M2:
      return fn.template operator()<kF8E5M2Format>();
    case DType::kF4E2M1:
      return fn.template operator()<kF4E2M1Format>();
    default:
      break;
  }
  TPCHECK_CHECK(false, "dtype {} is not a narrow format", dtype_name(dtype));
  __builtin_unreachable();
}

struct NameEntry {
  DType dtype;
  std::string_view name;
};
constexpr NameEntry kNames[] = {
    {DType::kF64, "f64"},   {DType::kF32, "f32"},       {DType::kF16, "f16"},
    {DType::kBF16, "bf16"}, {DType::kF8E4M3, "f8e4m3"}, {DType::kF8E5M2, "f8e5m2"},
    {DType::kF4E2M1, "f4e2m1"}, {DType::kF8E8M0, "f8e8m0"},
};

// f8e8m0 (float8_e8m0fnu): bits b stand for 2^(b − 127), b = 0 ... 254; 0xFF is NaN.
// Narrowing follows ml_dtypes ≥ 0.7 (checked against it in test_quant_conformance.py): the
// nearer power of two, ties up (1.5 · 2^e → 2^(e+1)), over the whole range, f32
// subnormals included (ml_dtypes 0.6 sent every value in (2^-127, 2^-126) up to 2^-126;
// 0.7 rounds them like any other value, and so does tpcheck); below 2^-127 to 2^-127;
// zero, negatives and NaN to NaN; above the largest finite value to NaN (plain) or 2^127
// (saturating; inf stays NaN). One rounding from either source: the input is widened
// exactly to double.
constexpr std::uint8_t kE8M0Nan = 0xff;
constexpr std::uint8_t kE8M0Max = 0xfe;

std::uint8_t narrow_e8m0(double value, CastMode mode) {
  if (std::isnan(value) || value <= 0.0) return kE8M0Nan;
  if (std::isinf(value)) return kE8M0Nan;
  int e = 0;
  const double m = std::frexp(value, &e);  // value = m · 2^e, m in [0.5, 1)
  // value = 2m · 2^(e−1) with 2m in [1, 2): round up from 1.5 on.
  const int biased = (e - 1) + 127 + (m >= 0.75 ? 1 : 0);
  if (biased < 0) return 0x00;  // below 2^-127: the smallest value
  if (biased > 254) return mode == CastMode::kSaturate ? kE8M0Max : kE8M0Nan;
  return static_cast<std::uint8_t>(biased);
}

// f64 → f32 as a cast mode asks: the hardware cast rounds to nearest even and overflows
// to ±inf; saturating clamps finite overflow to ±FLT_MAX.
float f64_to_f32(double value, CastMode mode) {
  const float r = static_cast<float>(value);
  if (mode == CastMode::kSaturate && std::isinf(r) && std::isfinite(value)) {
    return std::copysign(std::numeric_limits<float>::max(), r);
  }
  return r;
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  for (const NameEntry& e : kNames) {
    if (e.dtype == dtype) return e.name;
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  for (const NameEntry& e : kNames) {
    if (e.name == name) return e.dtype;
  }
  TPCHECK_CHECK_INPUT(false,
                      "unknown dtype '{}'; expected one of: f64, f32, f16, bf16, f8e4m3, f8e5m2, "
                      "f4e2m1, f8e8m0",
                      name);
  __builtin_unreachable();
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return 8;
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF4E2M1:  // unpacked: one value per byte
    case DType::kF8E8M0:
      return 1;
  }
  return 0;
}

double dtype_max_finite(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return std::numeric_limits<double>::max();
    case DType::kF32:
      return std::numeric_limits<float>::max();
    case DType::kF8E8M0:
      return std::ldexp(1.0, 127);
    default:
      return visit_format(dtype, []<Format f>() { return widen<f>(f.max_finite()); });
  }
}

double dtype_unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return std::ldexp(1.0, -53);
    case DType::kF32:
      return std::ldexp(1.0, -24);
    case DType::kF8E8M0:
      return 0.5;
    default:
      return std::ldexp(1.0, -(visit_format(dtype, []<Format f>() { return f.man_bits; }) + 1));
  }
}

bool is_fp8(DType dtype) { return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2; }
bool is_quantized_format(DType dtype) {
  return is_fp8(dtype) || dtype == DType::kF4E2M1 || dtype == DType::kF8E8M0;
}

float f16_bits_to_f32(std::uint16_t bits) { return widen<kF16Format>(bits); }
float bf16_bits_to_f32(std::uint16_t bits) { return widen<kBF16Format>(bits); }
float f8e4m3_bits_to_f32(std::uint8_t bits) { return widen<kF8E4M3Format>(bits); }
float f8e5m2_bits_to_f32(std::uint8_t bits) { return widen<kF8E5M2Format>(bits); }
float f4e2m1_bits_to_f32(std::uint8_t bits) { return widen<kF4E2M1Format>(bits & 0xfu); }
float f8e8m0_bits_to_f32(std::uint8_t bits) {
  if (bits == kE8M0Nan) return std::numeric_limits<float>::quiet_NaN();
  // 2^-127 is an f32 subnormal; ldexp gives it exactly.
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

std::uint16_t f32_to_f16_bits(float value, CastMode mode) {
  return static_cast<std::uint16_t>(narrow<kF16Format>(value, mode));
}
std::uint16_t f32_to_bf16_bits(float value, CastMode mode) {
  return static_cast<std::uint16_t>(narrow<kBF16Format>(value, mode));
}
std::uint8_t f32_to_f8e4m3_bits(float value, CastMode mode) {
  return static_cast<std::uint8_t>(narrow<kF8E4M3Format>(value, mode));
}
std::uint8_t f32_to_f8e5m2_bits(float value, CastMode mode) {
  return static_cast<std::uint8_t>(narrow<kF8E5M2Format>(value, mode));
}
std::uint8_t f32_to_f4e2m1_bits(float value, CastMode mode) {
  return static_cast<std::uint8_t>(narrow<kF4E2M1Format>(value, mode));
}
std::uint8_t f32_to_f8e8m0_bits(float value, CastMode mode) { return narrow_e8m0(value, mode); }

std::uint16_t f64_to_f16_bits(double value, CastMode mode) {
  return static_cast<std::uint16_t>(narrow<kF16Format>(value, mode));
}
std::uint16_t f64_to_bf16_bits(double value, CastMode mode) {
  return static_cast<std::uint16_t>(narrow<kBF16Format>(value, mode));
}
std::uint8_t f64_to_f8e4m3_bits(double value, CastMode mode) {
  return static_cast<std::uint8_t>(narrow<kF8E4M3Format>(value, mode));
}
std::uint8_t f64_to_f8e5m2_bits(double value, CastMode mode) {
  return static_cast<std::uint8_t>(narrow<kF8E5M2Format>(value, mode));
}
std::uint8_t f64_to_f4e2m1_bits(double value, CastMode mode) {
  return static_cast<std::uint8_t>(narrow<kF4E2M1Format>(value, mode));
}
std::uint8_t f64_to_f8e8m0_bits(double value, CastMode mode) { return narrow_e8m0(value, mode); }

float round_to(DType dtype, float value, CastMode mode) {
  switch (dtype) {
    case DType::kF64:
    case DType::kF32:
      return value;  // f32 values are exact in both
    case DType::kF8E8M0:
      return f8e8m0_bits_to_f32(narrow_e8m0(value, mode));
    default:
      return visit_format(dtype, [&]<Format f>() { return widen<f>(narrow<f>(value, mode)); });
  }
}

double round_to(DType dtype, double value, CastMode mode) {
  switch (dtype) {
    case DType::kF64:
      return value;
    case DType::kF32:
      return f64_to_f32(value, mode);
    case DType::kF8E8M0:
      return f8e8m0_bits_to_f32(narrow_e8m0(value, mode));
    default:
      return visit_format(dtype, [&]<Format f>() { return widen<f>(narrow<f>(value, mode)); });
  }
}

float round_tf32(float value, Tf32Rounding mode) {
  // TF32 keeps f32's sign and exponent and the top 10 of its 23 mantissa bits, so
  // rounding works on the f32 bits directly: drop the low 13 bits.
  constexpr std::uint32_t kDropped = (1u << 13) - 1;
  if (std::isnan(value)) return value;  // bit tricks below could turn a NaN into inf
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (mode == Tf32Rounding::kNearestEven) {
    // Adding half a TF32 ulp minus one (0xFFF), plus 1 when the kept lsb is odd, carries
    // into the kept bits exactly when the dropped part is above half, or at half with an
    // odd lsb. A carry out of the mantissa bumps the exponent, and past the largest
    // finite value gives the inf pattern, as rounding should. inf itself is unchanged.
    bits += 0xFFFu + ((bits >> 13) & 1u);
  }
  return std::bit_cast<float>(bits & ~kDropped);
}

}  // namespace tpcheck

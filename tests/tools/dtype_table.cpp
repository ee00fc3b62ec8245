// dtype_table — applies one of tpcheck's number-format conversions to every element of
// a raw binary file, so tests/python/test_dtype_conformance.py can feed it arrays and
// compare the results with ml_dtypes.
//
// Usage: dtype_table <conversion> <mode> <in.bin> <out.bin>
//   <conversion>  <narrow>_to_f32          input: the narrow format's bits (u16 or u8)
//                 f32_to_<narrow>          input: f32; output: the narrow format's bits
//                 f64_to_<narrow>          input: f64; output: the narrow format's bits
//                 f64_to_f32               input: f64; output: round_to(f32, double) as f32
//                 f32_round_<dtype>        input: f32; output: round_to(dtype, float) as f32
//                 f64_round_<dtype>        input: f64; output: round_to(dtype, double) as f64
//                 f32_to_tf32              input: f32; output: round_tf32 as f32
//   <narrow>      f16, bf16, f8e4m3, f8e5m2, f4e2m1, f8e8m0 (parsed by tpcheck::parse_dtype)
//   <mode>        plain | saturate (narrowing), nearest | truncate (tf32), - (widening)
// Files are native-endian arrays with no header; the element count is the file size over
// the input element size. Exit status: 0 done, 2 bad arguments or files.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/dtype.h"
#include "tpcheck/error.h"

namespace {

using tpcheck::CastMode;
using tpcheck::DType;

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TPCHECK_CHECK_INPUT(in.good(), "cannot open input file '{}'", path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  TPCHECK_CHECK_INPUT(out.good(), "cannot write output file '{}'", path);
}

// Reinterprets the bytes as an array of In, applies `fn`, writes the array of Out.
template <typename In, typename Out, typename Fn>
void apply(const std::vector<char>& bytes, const std::string& out_path, Fn fn) {
  TPCHECK_CHECK_INPUT(bytes.size() % sizeof(In) == 0,
                      "input size {} is not a multiple of the element size {}", bytes.size(),
                      sizeof(In));
  const std::size_t n = bytes.size() / sizeof(In);
  std::vector<In> in(n);
  std::memcpy(in.data(), bytes.data(), bytes.size());
  std::vector<Out> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = fn(in[i]);
  write_file(out_path, out.data(), n * sizeof(Out));
}

CastMode parse_cast_mode(std::string_view mode) {
  if (mode == "plain") return CastMode::kPlain;
  TPCHECK_CHECK_INPUT(mode == "saturate", "unknown cast mode '{}'; expected plain or saturate",
                      mode);
  return CastMode::kSaturate;
}

void run(std::string_view conv, std::string_view mode_text, const std::string& in_path,
         const std::string& out_path) {
  const std::vector<char> bytes = read_file(in_path);
  auto starts = [&](std::string_view p) { return conv.substr(0, p.size()) == p; };
  auto ends = [&](std::string_view s) {
    return conv.size() >= s.size() && conv.substr(conv.size() - s.size()) == s;
  };

  if (conv == "f32_to_tf32") {
    TPCHECK_CHECK_INPUT(mode_text == "nearest" || mode_text == "truncate",
                        "unknown tf32 mode '{}'; expected nearest or truncate", mode_text);
    const auto mode = mode_text == "nearest" ? tpcheck::Tf32Rounding::kNearestEven
                                             : tpcheck::Tf32Rounding::kTruncate;
    apply<float, float>(bytes, out_path, [&](float v) { return tpcheck::round_tf32(v, mode); });
  } else if (conv == "f64_to_f32") {
    // round_to(kF32, double) returns an f32 value widened to f64, so narrowing it back
    // is exact; the f32 bits (sign of zero, NaN payload) are what the test compares.
    const CastMode mode = parse_cast_mode(mode_text);
    apply<double, float>(bytes, out_path, [&](double v) {
      return static_cast<float>(tpcheck::round_to(DType::kF32, v, mode));
    });
  } else if (starts("f32_round_")) {
    const DType dt = tpcheck::parse_dtype(conv.substr(10));
    const CastMode mode = parse_cast_mode(mode_text);
    apply<float, float>(bytes, out_path, [&](float v) { return tpcheck::round_to(dt, v, mode); });
  } else if (starts("f64_round_")) {
    const DType dt = tpcheck::parse_dtype(conv.substr(10));
    const CastMode mode = parse_cast_mode(mode_text);
    apply<double, double>(bytes, out_path,
                          [&](double v) { return tpcheck::round_to(dt, v, mode); });
  } else if (ends("_to_f32")) {
    switch (tpcheck::parse_dtype(conv.substr(0, conv.size() - 7))) {
      case DType::kF16:
        apply<std::uint16_t, float>(bytes, out_path, tpcheck::f16_bits_to_f32);
        return;
      case DType::kBF16:
        apply<std::uint16_t, float>(bytes, out_path, tpcheck::bf16_bits_to_f32);
        return;
      case DType::kF8E4M3:
        apply<std::uint8_t, float>(bytes, out_path, tpcheck::f8e4m3_bits_to_f32);
        return;
      case DType::kF8E5M2:
        apply<std::uint8_t, float>(bytes, out_path, tpcheck::f8e5m2_bits_to_f32);
        return;
      case DType::kF4E2M1:
        apply<std::uint8_t, float>(bytes, out_path, tpcheck::f4e2m1_bits_to_f32);
        return;
      case DType::kF8E8M0:
        apply<std::uint8_t, float>(bytes, out_path, tpcheck::f8e8m0_bits_to_f32);
        return;
      default:
        TPCHECK_CHECK_INPUT(false, "'{}': the source must be a narrow format", conv);
    }
  } else if (starts("f32_to_") || starts("f64_to_")) {
    const DType dt = tpcheck::parse_dtype(conv.substr(7));
    const CastMode mode = parse_cast_mode(mode_text);
    const bool f32 = starts("f32_");
    auto go = [&](auto from32, auto from64, auto out_tag) {
      using Out = decltype(out_tag);
      if (f32) {
        apply<float, Out>(bytes, out_path, [&](float v) { return from32(v, mode); });
      } else {
        apply<double, Out>(bytes, out_path, [&](double v) { return from64(v, mode); });
      }
    };
    switch (dt) {
      case DType::kF16:
        go(tpcheck::f32_to_f16_bits, tpcheck::f64_to_f16_bits, std::uint16_t{});
        return;
      case DType::kBF16:
        go(tpcheck::f32_to_bf16_bits, tpcheck::f64_to_bf16_bits, std::uint16_t{});
        return;
      case DType::kF8E4M3:
        go(tpcheck::f32_to_f8e4m3_bits, tpcheck::f64_to_f8e4m3_bits, std::uint8_t{});
        return;
      case DType::kF8E5M2:
        go(tpcheck::f32_to_f8e5m2_bits, tpcheck::f64_to_f8e5m2_bits, std::uint8_t{});
        return;
      case DType::kF4E2M1:
        go(tpcheck::f32_to_f4e2m1_bits, tpcheck::f64_to_f4e2m1_bits, std::uint8_t{});
        return;
      case DType::kF8E8M0:
        go(tpcheck::f32_to_f8e8m0_bits, tpcheck::f64_to_f8e8m0_bits, std::uint8_t{});
        return;
      default:
        TPCHECK_CHECK_INPUT(false, "'{}': the target must be a narrow format", conv);
    }
  } else {
    TPCHECK_CHECK_INPUT(false, "unknown conversion '{}' (see the usage in dtype_table.cpp)", conv);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <conversion> <mode> <in.bin> <out.bin>\n", argv[0]);
    return 2;
  }
  try {
    run(argv[1], argv[2], argv[3], argv[4]);
  } catch (const tpcheck::Error& e) {
    std::fprintf(stderr, "dtype_table: %s\n", e.what());
    return 2;
  }
  return 0;
}

// quant_table — drives tpcheck's quantization (quant.h) and quantized GEMM on raw binary
// files, so tests/python/test_quant_conformance.py can compare them bit for bit with an
// independent numpy implementation (tests/python/quant_reference.py) and ml_dtypes.
//
// Usage (files are native-endian arrays without a header):
//   quant_table cast <format> <in.f32> <out.u8>        cast_satfinite; format f8e4m3 |
//                                                      f8e5m2 | f4e2m1
//   quant_table scale <kind> <in> <out>                per input value:
//       fp8_current_<format>  f32 amax → f32 scale       fp8_block     f32 amax → f32 scale
//       scale_reciprocal      f32 scale → f32            mxfp8         f32 amax → u8 exponent
//       e8m0_round_up         f32 → u8                   e8m0_reciprocal  u8 → f32
//       nvfp4_global          f32 amax → f32 S_enc
//       nvfp4_block           f32 pairs (block amax, S_enc) → u8 E4M3 decode scale
//       nvfp4_factor          f32 pairs (sb as the E4M3 bits' value, S_enc) → f32
//       nvfp4_alpha           f32 pairs (amax_a, amax_b) → f32
//   quant_table delayed <format> <amax.f32> <out.f32>  one DelayedScaling over the steps:
//                                                      per step the scale used, then
//                                                      record(amax), update()
//   quant_table quantize <recipe> <role> <rows> <cols> <in.f32> <out_prefix> [amax|-] [scale]
//       writes <prefix>rowwise_data, rowwise_scale_inv, columnwise_data,
//       columnwise_scale_inv (raw storage bytes), amax, global_amax, scale (f32, if set)
//   quant_table gemm <recipe> <role_a> <trans_a> <a_rows> <a_cols> <role_b> <trans_b>
//                    <b_rows> <b_cols> <a.f32> <b.f32> <out.f32> [<math_class.txt>]
//       C = op(A) · op(B) on the CPU backend's gemm_quantized, f32 output; the ledger's
//       class name goes to the text file.
// Exit status: 0 done, 2 bad arguments or files (the message on stderr).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/dtype.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace {

using namespace tpcheck;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TPCHECK_CHECK_INPUT(in.good(), "cannot open input file '{}'", path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
std::vector<T> read_array(const std::string& path) {
  const std::vector<char> bytes = read_bytes(path);
  TPCHECK_CHECK_INPUT(bytes.size() % sizeof(T) == 0, "'{}': size {} is not a multiple of {}", path,
                      bytes.size(), sizeof(T));
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

void write_bytes(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  TPCHECK_CHECK_INPUT(out.good(), "cannot write output file '{}'", path);
}

template <typename T>
void write_array(const std::string& path, const std::vector<T>& v) {
  write_bytes(path, v.data(), v.size() * sizeof(T));
}

template <typename In, typename Out, typename Fn>
void map_file(const std::string& in, const std::string& out, Fn fn) {
  const std::vector<In> x = read_array<In>(in);
  std::vector<Out> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = fn(x[i]);
  write_array(out, y);
}

template <typename Out, typename Fn>
void map_pairs(const std::string& in, const std::string& out, Fn fn) {
  const std::vector<float> x = read_array<float>(in);
  TPCHECK_CHECK_INPUT(x.size() % 2 == 0, "'{}': expected pairs of f32", in);
  std::vector<Out> y(x.size() / 2);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = fn(x[2 * i], x[2 * i + 1]);
  write_array(out, y);
}

QuantRole parse_role(std::string_view s) {
  for (QuantRole r : {QuantRole::kInput, QuantRole::kWeight, QuantRole::kGradOutput}) {
    if (quant_role_name(r) == s) return r;
  }
  TPCHECK_CHECK_INPUT(false, "unknown role '{}'; expected input, weight or grad_output", s);
  return QuantRole::kInput;
}

std::int64_t parse_int(std::string_view s) { return std::stoll(std::string(s)); }

void write_tensor(const std::string& path, const Tensor& t) {
  if (t.defined()) write_bytes(path, t.raw(), t.nbytes());
}

void scale(std::string_view kind, const std::string& in, const std::string& out) {
  if (kind.starts_with("fp8_current_")) {
    const DType f = parse_dtype(kind.substr(12));
    map_file<float, float>(in, out, [&](float a) { return fp8_current_scale(a, f); });
  } else if (kind == "fp8_block") {
    map_file<float, float>(in, out, fp8_block_scale);
  } else if (kind == "scale_reciprocal") {
    map_file<float, float>(in, out, scale_reciprocal);
  } else if (kind == "mxfp8") {
    map_file<float, std::uint8_t>(in, out, mxfp8_scale_exponent);
  } else if (kind == "e8m0_round_up") {
    map_file<float, std::uint8_t>(in, out, e8m0_round_up);
  } else if (kind == "e8m0_reciprocal") {
    map_file<std::uint8_t, float>(in, out, e8m0_reciprocal);
  } else if (kind == "nvfp4_global") {
    map_file<float, float>(in, out, nvfp4_global_encode_scale);
  } else if (kind == "nvfp4_block") {
    map_pairs<std::uint8_t>(in, out, nvfp4_block_decode_scale);
  } else if (kind == "nvfp4_factor") {
    map_pairs<float>(in, out, [](float sb, float s_enc) {
      return nvfp4_encode_factor(f32_to_f8e4m3_bits(sb), s_enc);
    });
  } else if (kind == "nvfp4_alpha") {
    map_pairs<float>(in, out, nvfp4_gemm_alpha);
  } else {
    TPCHECK_CHECK_INPUT(false, "unknown scale kind '{}' (see the usage in quant_table.cpp)", kind);
  }
}

Tensor load_matrix(const std::string& path, std::int64_t rows, std::int64_t cols) {
  const std::vector<float> v = read_array<float>(path);
  TPCHECK_CHECK_INPUT(static_cast<std::int64_t>(v.size()) == rows * cols,
                      "'{}': {} values; expected {} x {}", path, v.size(), rows, cols);
  return Tensor::from_f32(v, {rows, cols}, DType::kF32);
}

int run(int argc, char** argv) {
  TPCHECK_CHECK_INPUT(argc >= 2, "usage: see quant_table.cpp");
  const std::string_view cmd = argv[1];
  auto arg = [&](int i) -> std::string {
    TPCHECK_CHECK_INPUT(i < argc, "{}: missing argument {}", cmd, i);
    return argv[i];
  };
  if (cmd == "cast") {
    const DType f = parse_dtype(arg(2));
    map_file<float, std::uint8_t>(arg(3), arg(4), [&](float v) { return cast_satfinite(f, v); });
  } else if (cmd == "scale") {
    scale(arg(2), arg(3), arg(4));
  } else if (cmd == "delayed") {
    DelayedScaling ds(parse_dtype(arg(2)));
    map_file<float, float>(arg(3), arg(4), [&](float amax) {
      const float s = ds.scale();
      ds.record(amax);
      ds.update();
      return s;
    });
  } else if (cmd == "quantize") {
    QuantizeOptions o;
    o.recipe = parse_recipe(arg(2));
    o.role = parse_role(arg(3));
    const Tensor x = load_matrix(arg(6), parse_int(arg(4)), parse_int(arg(5)));
    // strtof, not stof: a subnormal amax is a valid input (stof throws on underflow).
    if (argc > 8 && std::string_view(argv[8]) != "-") o.amax = std::strtof(argv[8], nullptr);
    if (argc > 9) o.scale = std::strtof(argv[9], nullptr);
    const auto q = quantize(x, o);
    const std::string prefix = arg(7);
    write_tensor(prefix + "rowwise_data", q->rowwise_data);
    write_tensor(prefix + "rowwise_scale_inv", q->rowwise_scale_inv);
    write_tensor(prefix + "columnwise_data", q->columnwise_data);
    write_tensor(prefix + "columnwise_scale_inv", q->columnwise_scale_inv);
    write_tensor(prefix + "amax", q->amax);
    write_tensor(prefix + "global_amax", q->global_amax);
    write_tensor(prefix + "scale", q->scale);
  } else if (cmd == "gemm") {
    const Recipe recipe = parse_recipe(arg(2));
    auto operand = [&](int first, const std::string& path) {
      QuantizeOptions o;
      o.recipe = recipe;
      o.role = parse_role(arg(first));
      Tensor t = load_matrix(path, parse_int(arg(first + 2)), parse_int(arg(first + 3)));
      t.set_quantized(quantize(t, o));
      return t;
    };
    const Tensor a = operand(3, arg(11));
    const Tensor b = operand(7, arg(12));
    const bool trans_a = arg(4) == "1", trans_b = arg(8) == "1";
    const std::int64_t m = trans_a ? a.dim(1) : a.dim(0);
    const std::int64_t n = trans_b ? b.dim(0) : b.dim(1);
    Tensor c({m, n}, DType::kF32);
    auto backend = make_cpu_backend();
    backend->gemm_quantized("quant_table/gemm", a, trans_a, b, trans_b, c, false);
    write_array(arg(13), c.to_f32());
    if (argc > 14) {
      const std::string name(math_class_name(backend->ledger().records().back().math_class));
      write_bytes(argv[14], name.data(), name.size());
    }
  } else {
    TPCHECK_CHECK_INPUT(false, "unknown command '{}' (see the usage in quant_table.cpp)", cmd);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tpcheck::Error& e) {
    std::fprintf(stderr, "quant_table: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quant_table: %s\n", e.what());
    return 2;
  }
}

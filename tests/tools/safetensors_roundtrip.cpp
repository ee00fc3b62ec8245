// safetensors_roundtrip — the C++ side of tests/python/test_safetensors_interop.py.
//
//   safetensors_roundtrip write OUT.safetensors OUT.json
//       writes a file with tpcheck (every dtype; every bit pattern of the 8- and 16-bit
//       formats; RNG-generated tensors; a scalar; an empty tensor; metadata) and a JSON
//       description of what it meant to write.
//   safetensors_roundtrip dump IN.safetensors OUT.json
//       reads a file with tpcheck and writes the JSON description of what it read.
// The JSON: {"metadata": {..}, "tensors": {name: {"dtype": "F32", "shape": [..],
// "hex": raw little-endian bytes, "values": each element decoded by tpcheck to f64,
// as the shortest round-trip decimal text ("nan", "inf", "-0" included)}}}.
// Exit code 0 on success, 2 with a message on bad input.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tpcheck/error.h"
#include "tpcheck/rng.h"
#include "tpcheck/safetensors.h"

namespace tpcheck {
namespace {

nlohmann::json describe(const SafetensorsFile& file) {
  nlohmann::json out;
  out["metadata"] = file.metadata;
  out["tensors"] = nlohmann::json::object();
  for (const auto& [name, t] : file.tensors) {
    std::string hex;
    hex.reserve(2 * t.nbytes());
    const auto* bytes = static_cast<const unsigned char*>(t.raw());
    for (std::size_t i = 0; i < t.nbytes(); ++i) hex += fmt::format("{:02x}", bytes[i]);
    nlohmann::json values = nlohmann::json::array();
    for (std::int64_t i = 0; i < t.numel(); ++i) values.push_back(fmt::format("{}", t.at(i)));
    out["tensors"][name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                            {"shape", t.shape()},
                            {"hex", hex},
                            {"values", values}};
  }
  return out;
}

// Every bit pattern of an 8- or 16-bit format, in pattern order.
Tensor all_patterns(DType dtype, Shape shape) {
  Tensor t(std::move(shape), dtype);
  if (dtype_size(dtype) == 1) {
    for (int i = 0; i < 256; ++i) t.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i);
  } else {
    for (int i = 0; i < 65536; ++i) t.data<std::uint16_t>()[i] = static_cast<std::uint16_t>(i);
  }
  return t;
}

SafetensorsFile sample_file() {
  SafetensorsFile file;
  const std::uint64_t seed = 42;
  file.tensors["f64_normal"] =
      generate(FillSpec::normal(0.0, 1.0), seed, "f64_normal", {3, 4}, DType::kF64);
  file.tensors["f32_normal"] =
      generate(FillSpec::normal(0.0, 0.023), seed, "f32_normal", {2, 3, 4}, DType::kF32);
  file.tensors["f16_uniform"] =
      generate(FillSpec::uniform(-8, 8), seed, "f16_uniform", {5, 7}, DType::kF16);
  file.tensors["bf16_normal"] =
      generate(FillSpec::normal(1.0, 3.0), seed, "bf16_normal", {4, 1, 4}, DType::kBF16);
  file.tensors["f8e4m3_normal"] =
      generate(FillSpec::normal(0.0, 50.0), seed, "f8e4m3_normal", {9}, DType::kF8E4M3);
  file.tensors["f8e5m2_uniform"] =
      generate(FillSpec::uniform(-1000, 1000), seed, "f8e5m2_uniform", {3, 3}, DType::kF8E5M2);
  file.tensors["f16_all"] = all_patterns(DType::kF16, {256, 256});
  file.tensors["bf16_all"] = all_patterns(DType::kBF16, {65536});
  file.tensors["f8e4m3_all"] = all_patterns(DType::kF8E4M3, {16, 16});
  file.tensors["f8e5m2_all"] = all_patterns(DType::kF8E5M2, {2, 2, 64});
  Tensor f64_special({6}, DType::kF64);
  const double specials[] = {0.0, -0.0, 5e-324, -1.7976931348623157e308, 1.0 / 3.0, 1e300 * 1e10};
  for (int i = 0; i < 6; ++i) f64_special.set(i, specials[i]);
  file.tensors["f64_special"] = f64_special;
  file.tensors["f32_scalar"] = Tensor::full({}, DType::kF32, 0.1);
  file.tensors["f16_empty"] = Tensor({0, 3}, DType::kF16);
  file.metadata["producer"] = "tpcheck";
  file.metadata["seed"] = "42";
  return file;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  TPCHECK_CHECK_INPUT(out.good(), "{}: cannot open for writing", path);
  out << j.dump();
}

int run(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  TPCHECK_CHECK_INPUT(argc == 4 && (mode == "write" || mode == "dump"),
                      "usage: safetensors_roundtrip write|dump FILE.safetensors OUT.json");
  if (mode == "write") {
    SafetensorsFile file = sample_file();
    write_safetensors(argv[2], file);
    write_json(argv[3], describe(file));
  } else {
    write_json(argv[3], describe(read_safetensors(argv[2])));
  }
  return 0;
}

}  // namespace
}  // namespace tpcheck

int main(int argc, char** argv) {
  try {
    return tpcheck::run(argc, argv);
  } catch (const tpcheck::Error& e) {
    std::fprintf(stderr, "safetensors_roundtrip: %s\n", e.what());
    return e.kind() == tpcheck::ErrorKind::kInput ? 2 : 3;
  }
}

// Tests for safetensors reading and writing: bitwise round trips in every dtype, the
// on-disk layout the format prescribes (checked by decoding the bytes here, not with the
// reader under test), and one test per malformed-file check, each asserting that the
// message names the file, the tensor and the offending value.
#include "tpcheck/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tpcheck_safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a file with the given header text (unpadded) and data bytes.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        std::uint64_t header_length_override = 0) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    std::uint64_t n = header_length_override ? header_length_override : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << data;
    return p;
  }

  // Reading `p` throws Error(kInput) whose message contains every one of `parts`.
  void expect_input_error(const std::string& p, const std::vector<std::string>& parts) {
    try {
      read_safetensors(p);
      ADD_FAILURE() << "reading " << p << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
      std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << "message does not name the file: " << msg;
      for (const std::string& part : parts) {
        EXPECT_NE(msg.find(part), std::string::npos) << "message lacks '" << part << "': " << msg;
      }
    }
  }

  fs::path dir_;
};

Tensor random_bits(const Shape& shape, DType dtype, std::mt19937& gen) {
  Tensor t(shape, dtype);
  auto* bytes = static_cast<unsigned char*>(t.raw());
  for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] = gen() & 0xff;
  return t;
}

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(SafetensorsTest, RoundTripIsBitwiseInEveryDtype) {
  std::mt19937 gen(3);
  SafetensorsFile file;
  // Odd element counts in narrow dtypes first by name, so a naive layout would misalign
  // the wider tensors after them.
  file.tensors["a_f8e4m3"] = random_bits({3}, DType::kF8E4M3, gen);
  file.tensors["b_f8e5m2"] = random_bits({1, 5}, DType::kF8E5M2, gen);
  file.tensors["c_f16"] = random_bits({3, 1, 1}, DType::kF16, gen);
  file.tensors["d_bf16"] = random_bits({2, 3, 1, 3}, DType::kBF16, gen);
  file.tensors["e_f32"] = random_bits({4, 3}, DType::kF32, gen);
  file.tensors["f_f64"] = random_bits({5}, DType::kF64, gen);
  file.tensors["g_scalar"] = random_bits({}, DType::kF32, gen);
  file.tensors["h_empty"] = Tensor({0, 4}, DType::kF16);
  file.metadata["format"] = "np";
  file.metadata["note"] = "quotes \" and unicode \u00e9";
  write_safetensors(path("x.safetensors"), file);
  SafetensorsFile back = read_safetensors(path("x.safetensors"));
  EXPECT_EQ(back.metadata, file.metadata);
  ASSERT_EQ(back.tensors.size(), file.tensors.size());
  for (const auto& [name, t] : file.tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    EXPECT_TRUE(bitwise_equal(back.tensors.at(name), t)) << name;
  }
}

// Decodes the file by hand: header length little-endian and a multiple of 8, padding is
// spaces, offsets contiguous from 0, each tensor aligned to its element size, data bytes
// equal to the tensor's storage.
TEST_F(SafetensorsTest, LayoutFollowsTheFormat) {
  std::mt19937 gen(4);
  SafetensorsFile file;
  file.tensors["a"] = random_bits({3}, DType::kF16, gen);
  file.tensors["b"] = random_bits({2}, DType::kF64, gen);
  file.tensors["c"] = random_bits({5}, DType::kF8E5M2, gen);
  file.tensors["d"] = random_bits({3}, DType::kF32, gen);
  write_safetensors(path("y.safetensors"), file);
  std::string bytes = read_bytes(path("y.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  std::string header = bytes.substr(8, n);
  std::size_t end_of_json = header.find_last_not_of(' ') + 1;
  EXPECT_LT(header.size() - end_of_json, 8u);
  nlohmann::json j = nlohmann::json::parse(header.substr(0, end_of_json));
  EXPECT_FALSE(j.contains("__metadata__"));  // none given, none written
  std::string data = bytes.substr(8 + n);
  std::uint64_t total = 0;
  for (const auto& [name, t] : file.tensors) {
    const auto& info = j.at(name);
    std::uint64_t begin = info["data_offsets"][0], end = info["data_offsets"][1];
    EXPECT_EQ(end - begin, t.nbytes()) << name;
    EXPECT_EQ(begin % dtype_size(t.dtype()), 0u) << name << " is misaligned";
    EXPECT_EQ(info["shape"].get<Shape>(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(data.data() + begin, t.raw(), t.nbytes()), 0) << name;
    total += t.nbytes();
  }
  EXPECT_EQ(data.size(), total);  // packed: no gaps, nothing trailing
  EXPECT_EQ(j.at("a")["dtype"], "F16");
  EXPECT_EQ(j.at("b")["dtype"], "F64");
  EXPECT_EQ(j.at("c")["dtype"], "F8_E5M2");
  EXPECT_EQ(j.at("d")["dtype"], "F32");
}

TEST_F(SafetensorsTest, MissingFile) {
  expect_input_error(path("does_not_exist.safetensors"), {"cannot open"});
}

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
  std::string p = path("short.safetensors");
  std::ofstream(p, std::ios::binary) << "abcde";
  expect_input_error(p, {"5 bytes", "shorter than the 8-byte"});
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
  std::string p = write_raw("long.safetensors", "{}", "", 1000);
  expect_input_error(p, {"header length 1000", "2 bytes"});
}

TEST_F(SafetensorsTest, InvalidJson) {
  expect_input_error(write_raw("bad.safetensors", "{\"w\": {\"dtype\": ", ""), {"not valid JSON"});
  // A number beyond double's range: nlohmann throws out_of_range (406), not parse_error.
  expect_input_error(write_raw("huge.safetensors", "{\"w\": 1e999}", ""),
                     {"not valid JSON", "number overflow"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  expect_input_error(write_raw("arr.safetensors", "[1, 2]", ""), {"array", "expected an object"});
}

TEST_F(SafetensorsTest, MissingDtype) {
  expect_input_error(
      write_raw("nodtype.safetensors", R"({"w": {"shape": [2], "data_offsets": [0, 8]}})",
                std::string(8, '\0')),
      {"\"w\"", "missing \"dtype\"", "F8_E4M3"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_input_error(write_raw("i64.safetensors",
                               R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})",
                               std::string(8, '\0')),
                     {"\"w\"", "unknown dtype \"I64\""});
}

TEST_F(SafetensorsTest, ShapeNotAList) {
  expect_input_error(write_raw("shape.safetensors",
                               R"({"w": {"dtype": "F32", "shape": 3, "data_offsets": [0, 12]}})",
                               std::string(12, '\0')),
                     {"\"w\"", "shape 3 is not a list"});
}

TEST_F(SafetensorsTest, ShapeWithNegativeEntry) {
  expect_input_error(
      write_raw("neg.safetensors",
                R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})",
                std::string(8, '\0')),
      {"\"w\"", "[2,-1]", "entry -1"});
}

TEST_F(SafetensorsTest, ShapeWithFractionalEntry) {
  expect_input_error(write_raw("frac.safetensors",
                               R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",
                               std::string(8, '\0')),
                     {"\"w\"", "entry 2.5"});
}

TEST_F(SafetensorsTest, ShapeOfTooHighRank) {
  expect_input_error(
      write_raw("rank5.safetensors",
                R"({"w": {"dtype": "F8_E4M3", "shape": [1,1,1,1,1], "data_offsets": [0, 1]}})",
                std::string(1, '\0')),
      {"\"w\"", "[1,1,1,1,1]", "5 dimensions"});
}

TEST_F(SafetensorsTest, DataOffsetsNotAPair) {
  expect_input_error(
      write_raw("pair.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})",
                std::string(4, '\0')),
      {"\"w\"", "data_offsets [0]", "[begin, end]"});
}

TEST_F(SafetensorsTest, DataOffsetsEndBeforeBegin) {
  expect_input_error(write_raw("order.safetensors",
                               R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})",
                               std::string(8, '\0')),
                     {"\"w\"", "[8,4]", "end before begin"});
}

// A real file with its last bytes cut off.
TEST_F(SafetensorsTest, TruncatedFile) {
  SafetensorsFile file;
  file.tensors["fc1_weight"] = Tensor::full({4, 4}, DType::kF32, 1.5);
  std::string p = path("trunc.safetensors");
  write_safetensors(p, file);
  fs::resize_file(p, fs::file_size(p) - 10);
  expect_input_error(p, {"\"fc1_weight\"", "end 64", "54 data bytes", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLiesAboutSizes) {
  expect_input_error(write_raw("lies.safetensors",
                               R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})",
                               std::string(16, '\0')),
                     {"\"w\"", "span 12 bytes", "need 16 bytes", "lies"});
}

TEST_F(SafetensorsTest, ShapeWhoseSizeOverflows) {
  expect_input_error(
      write_raw(
          "huge.safetensors",
          R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
          std::string(8, '\0')),
      {"\"w\"", "overflows"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  expect_input_error(write_raw("overlap.safetensors",
                               R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                   "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                               std::string(24, '\0')),
                     {"\"a\"", "\"b\"", "[8, 24]", "[0, 16]", "overlap"});
}

TEST_F(SafetensorsTest, MetadataValueNotAString) {
  expect_input_error(write_raw("meta.safetensors", R"({"__metadata__": {"step": 3}})", ""),
                     {"__metadata__", "\"step\"", "is 3"});
}

// Gaps are legal in the format (only overlaps are not), and empty tensors may share an
// offset with anything.
TEST_F(SafetensorsTest, GapsAndEmptyTensorsAreAccepted) {
  std::string data(24, '\0');
  float v = 2.5f;
  std::memcpy(data.data() + 20, &v, 4);
  SafetensorsFile f =
      read_safetensors(write_raw("gap.safetensors",
                                 R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]},
                    "e": {"dtype": "F16", "shape": [0, 3], "data_offsets": [20, 20]}})",
                                 data));
  EXPECT_EQ(f.tensors.at("a").at(0), 2.5);
  EXPECT_EQ(f.tensors.at("e").shape(), (Shape{0, 3}));
}

}  // namespace
}  // namespace tpcheck

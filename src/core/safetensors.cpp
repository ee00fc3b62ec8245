// safetensors reading and writing (https://github.com/huggingface/safetensors).
//
// Layout: u64 little-endian header length N | N bytes of JSON | data bytes. Writing follows
// the reference implementation: tensors laid out by decreasing element size, then by
// name (so every tensor's data is aligned to its element size), and the JSON padded with
// spaces so that N is a multiple of 8 (the data starts 8-byte aligned).
// Reading trusts nothing: every field of the header is checked before any data is
// touched, and each failure throws Error(kInput) naming the file, the tensor and the
// offending value. Gaps between tensors' data are accepted (the format does not need
// them to be packed); overlaps are not.
// Tensor data is stored in the host's byte order, which must be little-endian (checked
// at compile time) — the format's order.
// Thread safety: free functions, no shared state.
#include "tpcheck/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tpcheck/error.h"

namespace tpcheck {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; tpcheck stores tensors in host order");

namespace {

constexpr std::size_t kHeaderLengthBytes = 8;
constexpr std::size_t kHeaderAlignment = 8;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kKnownDtypes = "F64, F32, F16, BF16, F8_E4M3, F8_E5M2";


bool parse_safetensors_dtype(const std::string& name, DType* out) {
  for (DType d :
       {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2}) {
    if (safetensors_dtype_name(d) == name) {
      *out = d;
      return true;
    }
  }
  return false;
}

// Non-negative integer that fits in 64 bits (JSON numbers may be negative, fractional, ...).
bool as_size(const nlohmann::json& value, std::uint64_t* out) {
  if (!value.is_number_integer()) return false;
  if (value.is_number_unsigned()) {
    *out = value.get<std::uint64_t>();
    return true;
  }
  std::int64_t v = value.get<std::int64_t>();
  if (v < 0) return false;
  *out = static_cast<std::uint64_t>(v);
  return true;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  std::uint64_t begin;
  std::uint64_t end;
};

// Validates one tensor's header entry against a data section of `data_size` bytes.
Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& info,
                  std::uint64_t data_size) {
  std::string where = fmt::format("{}: tensor \"{}\"", path, name);
  TPCHECK_CHECK_INPUT(info.is_object(), "{}: header entry {} is not an object", where, info.dump());
  Entry e;
  e.name = name;

  TPCHECK_CHECK_INPUT(info.contains("dtype"), "{}: missing \"dtype\" (expected one of {})", where,
                      kKnownDtypes);
  const nlohmann::json& dtype = info["dtype"];
  TPCHECK_CHECK_INPUT(
      dtype.is_string() && parse_safetensors_dtype(dtype.get<std::string>(), &e.dtype),
      "{}: unknown dtype {} (expected one of {})", where, dtype.dump(), kKnownDtypes);

  TPCHECK_CHECK_INPUT(info.contains("shape"), "{}: missing \"shape\"", where);
  const nlohmann::json& shape = info["shape"];
  TPCHECK_CHECK_INPUT(shape.is_array(),
                      "{}: shape {} is not a list (expected a list of non-negative integers)",
                      where, shape.dump());
  TPCHECK_CHECK_INPUT(shape.size() <= static_cast<std::size_t>(kMaxRank),
                      "{}: shape {} has {} dimensions (tpcheck tensors have at most {})", where,
                      shape.dump(), shape.size(), kMaxRank);
  // numel · element size, checked for overflow as it is built.
  std::uint64_t nbytes = dtype_size(e.dtype);
  for (const nlohmann::json& d : shape) {
    std::uint64_t size = 0;
    TPCHECK_CHECK_INPUT(as_size(d, &size) && size <= static_cast<std::uint64_t>(INT64_MAX),
                        "{}: shape {} has the entry {} (expected a non-negative integer)", where,
                        shape.dump(), d.dump());
    TPCHECK_CHECK_INPUT(!__builtin_mul_overflow(nbytes, size, &nbytes),
                        "{}: shape {} is too large (its byte size overflows 64 bits)", where,
                        shape.dump());
    e.shape.push_back(static_cast<std::int64_t>(size));
  }

  TPCHECK_CHECK_INPUT(info.contains("data_offsets"), "{}: missing \"data_offsets\"", where);
  const nlohmann::json& offsets = info["data_offsets"];
  TPCHECK_CHECK_INPUT(offsets.is_array() && offsets.size() == 2 && as_size(offsets[0], &e.begin) &&
                          as_size(offsets[1], &e.end),
                      "{}: data_offsets {} (expected [begin, end], two non-negative integers)",
                      where, offsets.dump());
  TPCHECK_CHECK_INPUT(e.end >= e.begin, "{}: data_offsets {} end before begin", where,
                      offsets.dump());
  TPCHECK_CHECK_INPUT(e.end <= data_size,
                      "{}: data_offsets {} end {} is beyond the {} data bytes of the file "
                      "(truncated file?)",
                      where, offsets.dump(), e.end, data_size);
  TPCHECK_CHECK_INPUT(e.end - e.begin == nbytes,
                      "{}: data_offsets {} span {} bytes, but dtype {} and shape {} need {} bytes "
                      "(the header lies about its sizes)",
                      where, offsets.dump(), e.end - e.begin, dtype.get<std::string>(),
                      shape.dump(), nbytes);
  return e;
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TPCHECK_CHECK_INPUT(in.good(), "{}: cannot open the file for reading", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TPCHECK_CHECK_INPUT(!in.bad(), "{}: error while reading the file", path);
  return bytes;
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return "F64";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
    case DType::kF4E2M1:
    case DType::kF8E8M0:
      // tpcheck stores f4e2m1 unpacked (one value per byte); safetensors' F4 is packed.
      // Neither is written: quantized copies are derived data, not checkpoints.
      TPCHECK_CHECK_INPUT(false, "safetensors: dtype {} is not supported (expected one of {})",
                          dtype_name(dtype), kKnownDtypes);
      return {};
  }
  TPCHECK_CHECK(false, "unknown DType {}", static_cast<int>(dtype));
  return {};
}

void write_safetensors(const std::string& path, const SafetensorsFile& file) {
  // Data order of the reference implementation: larger elements first, then by name.
  std::vector<const std::pair<const std::string, Tensor>*> order;
  for (const auto& item : file.tensors) {
    const Tensor& t = item.second;
    TPCHECK_CHECK(t.defined(), "write_safetensors({}): tensor \"{}\" is undefined", path,
                  item.first);
    TPCHECK_CHECK(t.device() == Device::kCpu,
                  "write_safetensors({}): tensor \"{}\" is not on the CPU", path, item.first);
    TPCHECK_CHECK_INPUT(item.first != kMetadataKey,
                        "write_safetensors({}): a tensor may not be named \"{}\"", path,
                        kMetadataKey);
    order.push_back(&item);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_size(a->second.dtype()) > dtype_size(b->second.dtype());
  });

  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header[kMetadataKey] = file.metadata;
  std::uint64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    header[item->first] = {{"dtype", safetensors_dtype_name(t.dtype())},
                           {"shape", t.shape()},
                           {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((kHeaderAlignment - text.size() % kHeaderAlignment) % kHeaderAlignment, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TPCHECK_CHECK_INPUT(out.good(), "{}: cannot open the file for writing", path);
  std::uint64_t n = text.size();
  unsigned char length[kHeaderLengthBytes];
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i) length[i] = (n >> (8 * i)) & 0xff;
  out.write(reinterpret_cast<const char*>(length), kHeaderLengthBytes);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto* item : order) {
    const Tensor& t = item->second;
    out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  }
  out.close();
  TPCHECK_CHECK_INPUT(!out.fail(), "{}: error while writing the file", path);
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::vector<char> bytes = read_all(path);
  TPCHECK_CHECK_INPUT(bytes.size() >= kHeaderLengthBytes,
                      "{}: file is {} bytes, shorter than the {}-byte header length "
                      "(not a safetensors file)",
                      path, bytes.size(), kHeaderLengthBytes);
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i) {
    n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  std::uint64_t after_length = bytes.size() - kHeaderLengthBytes;
  TPCHECK_CHECK_INPUT(n <= after_length,
                      "{}: header length {} is larger than the {} bytes that follow it "
                      "(truncated or not a safetensors file)",
                      path, n, after_length);
  const char* header_begin = bytes.data() + kHeaderLengthBytes;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + n);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number beyond double (1e999): found by
    // safetensors_fuzz in a 600 s run, 2026-12-01.
    TPCHECK_CHECK_INPUT(false, "{}: the {}-byte header is not valid JSON ({})", path, n, e.what());
  }
  TPCHECK_CHECK_INPUT(header.is_object(), "{}: the header is JSON {} (expected an object)", path,
                      header.type_name());

  SafetensorsFile file;
  const char* data = header_begin + n;
  std::uint64_t data_size = after_length - n;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      TPCHECK_CHECK_INPUT(info.is_object(), "{}: \"{}\" is {} (expected an object of strings)",
                          path, kMetadataKey, info.dump());
      for (const auto& [key, value] : info.items()) {
        TPCHECK_CHECK_INPUT(value.is_string(), "{}: \"{}\" entry \"{}\" is {} (expected a string)",
                            path, kMetadataKey, key, value.dump());
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, info, data_size));
  }

  // Overlap: sorted by begin, each non-empty tensor must start at or after the end of the
  // previous non-empty one (empty tensors occupy no bytes and cannot overlap).
  std::vector<const Entry*> by_begin;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_begin.push_back(&e);
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_begin.size(); ++i) {
    const Entry& prev = *by_begin[i - 1];
    const Entry& cur = *by_begin[i];
    TPCHECK_CHECK_INPUT(cur.begin >= prev.end,
                        "{}: tensor \"{}\" data_offsets [{}, {}] overlap tensor \"{}\" "
                        "data_offsets [{}, {}]",
                        path, cur.name, cur.begin, cur.end, prev.name, prev.begin, prev.end);
  }

  for (const Entry& e : entries) {
    Tensor t(e.shape, e.dtype);
    if (t.nbytes() > 0) std::memcpy(t.raw(), data + e.begin, t.nbytes());
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

}  // namespace tpcheck

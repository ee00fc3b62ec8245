// tpcheck/safetensors.h — read and write the safetensors format.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]}, "__metadata__": {str: str}}, then the data bytes. Dtypes: F64 F32 F16
// BF16 F8_E4M3 F8_E5M2. Reading validates everything (header length within the file,
// JSON well-formed, known dtype, offsets inside the data and matching shape × dtype
// size, no overlap) and throws Error(kInput) naming the file, the tensor and the value.
// Thread safety: free functions, no shared state.
#pragma once

#include <map>
#include <string>

#include "tpcheck/tensor.h"

namespace tpcheck {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;            // sorted by name
  std::map<std::string, std::string> metadata;      // "__metadata__"
};

void write_safetensors(const std::string& path, const SafetensorsFile& file);
// The format's name of a dtype: "F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2".
std::string safetensors_dtype_name(DType dtype);
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace tpcheck

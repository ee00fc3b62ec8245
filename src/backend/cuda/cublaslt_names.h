// cublaslt_names.h — cuBLASLt's tile, stages, cluster-shape and reduction-scheme enums by
// name and back, for the GEMM records (gemm.cu: value → name) and the log queries
// (cublaslt_query.cu: name → value). The tables are generated from cublasLt.h
// (cublaslt_names.inc, scripts/gen_cublaslt_names.py); names have no common prefix
// ("128x64", not "CUBLASLT_MATMUL_TILE_128x64").
// Thread safety: constant tables and pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "tpcheck/error.h"

namespace tpcheck::cuda {

struct NamedValue {
  int value;
  const char* name;
};
#include "backend/cuda/cublaslt_names.inc"

// The table's name of `value`; "<what>_<value>" for a value the table does not list (a
// newer cuBLASLt than the headers the tables were generated from).
template <std::size_t N>
std::string name_of(const NamedValue (&table)[N], int value, const char* what) {
  for (const NamedValue& v : table) {
    if (v.value == value) return v.name;
  }
  return TPCHECK_FORMAT("{}_{}", what, value);
}

// Sets `out` to the value the table names `name`; false (out unchanged) when it has none.
template <std::size_t N>
bool value_of(const NamedValue (&table)[N], std::string_view name, int& out) {
  for (const NamedValue& v : table) {
    if (name == v.name) {
      out = v.value;
      return true;
    }
  }
  return false;
}

}  // namespace tpcheck::cuda

// gemm_record_stamp.h — the part of a GemmRecord every recording site fills the same way
// (Backend::gemm_front_end, gemm_quantized, record_fused_product): site, rank, shape and
// transposes. Each site then adds what it knows (dtypes, class, epilogue, engine part).
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tpcheck/gemm_record.h"

namespace tpcheck {

inline GemmRecord stamped_gemm_record(std::string_view site, int rank, std::int64_t m,
                                      std::int64_t n, std::int64_t k, bool trans_a,
                                      bool trans_b) {
  GemmRecord record;
  record.site = std::string(site);
  record.rank = rank;
  record.m = m;
  record.n = n;
  record.k = k;
  record.trans_a = trans_a;
  record.trans_b = trans_b;
  return record;
}

}  // namespace tpcheck

// tpcheck/forensics.h — lining up the GEMM ledgers of two runs.
//
// Records are matched by (site, occurrence): the n-th "mlp.fc1/fwd" of one run with the
// n-th of the other (a checkpointed layer runs its forward GEMMs twice). A site whose
// numerical class differs between the single and the sharded run is the first suspect
// when their results differ: the story in README.md ("Where it came from") is one such
// site (K = 8 sharded ran a full-FP32 FMA kernel, K = 32 unsharded a TF32 tensor-core
// kernel).
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "tpcheck/gemm_record.h"

namespace tpcheck {

struct GemmClassDiff {
  std::string site;
  int occurrence = 0;
  GemmRecord single;
  GemmRecord sharded;
  bool class_differs = false;      // numerical class (what changes the rounding)
  bool algorithm_differs = false;  // cuBLASLt algorithm or configuration (same_algorithm)
};

// Sites present in both ledgers whose math class or algorithm differs.
std::vector<GemmClassDiff> diff_gemm_classes(const std::vector<GemmRecord>& single,
                                             const std::vector<GemmRecord>& sharded);

}  // namespace tpcheck

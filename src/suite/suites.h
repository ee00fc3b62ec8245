// suites.h — the suites make_suite knows (private to src/suite).
//   te:   TransformerEngine's distributed numerics matrix, exactly (te_suite.cpp)
//   full: every option value that changes the sharded code, pairwise (full_suite.cpp)
// Both REQUIRE tp >= 1 (make_suite checks) and throw Error(kInput) on bad sizes.
#pragma once

#include "tpcheck/suite.h"

namespace tpcheck {

Suite make_te_suite(int tp, const SuiteSizes& sizes);
Suite make_full_suite(int tp, const SuiteSizes& sizes);

}  // namespace tpcheck

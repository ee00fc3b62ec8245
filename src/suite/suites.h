// suites.h — the suites make_suite knows (private to src/suite).
//   te:   TransformerEngine's distributed numerics matrix, exactly (te_suite.cpp)
//   full: every option value that changes the sharded code, pairwise (full_suite.cpp)
// Both REQUIRE tp >= 1 (make_suite checks) and throw Error(kInput) on bad sizes.
#pragma once

#include "tpcheck/suite.h"

namespace tpcheck {

// recipe: the reference's case changes under a quantized recipe (te_suite.cpp).
Suite make_te_suite(int tp, const SuiteSizes& sizes, Recipe recipe = Recipe::kNone);
Suite make_full_suite(int tp, const SuiteSizes& sizes);

}  // namespace tpcheck

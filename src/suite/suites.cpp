// suites.cpp — suite_names and make_suite: the name → suite dispatch.
#include "suite/suites.h"

#include "tpcheck/error.h"

namespace tpcheck {

std::vector<std::string> suite_names() { return {"full", "te"}; }

Suite make_suite(const std::string& name, int tp, const SuiteSizes& sizes) {
  TPCHECK_CHECK_INPUT(name == "full" || name == "te",
                      "unknown suite '{}'; expected one of: full, te", name);
  TPCHECK_CHECK_INPUT(tp >= 1, "--tp must be at least 1, got {}", tp);
  return name == "te" ? make_te_suite(tp, sizes) : make_full_suite(tp, sizes);
}

}  // namespace tpcheck

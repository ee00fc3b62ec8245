// --query on the GPU: algorithms from the H200 logs (tests/data/cublaslt) rebuilt with
// cublasLtMatmulAlgoInit and asked for their numerical implementation. The expectations
// are what the CUDA backend's own records said for these algorithms on the H200
// (tests/data/cublaslt, the lead's recording notes): algo 21 a TF32 tensor-core (HMMA)
// kernel, algo 55 a full-FP32 FMA kernel, f64 algorithms DMMA or FMA with 64F inputs.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gpu/gpu_test_support.h"
#include "tpcheck/cublaslt_log.h"

namespace tpcheck {
namespace {

// The recorded logs: under $TPCHECK_SOURCE_DIR, else the current directory (tests/gpu/run.sh
// runs from the repository root), else the source tree this was built from.
std::string data_path(const std::string& name) {
  const std::string rel = "tests/data/cublaslt/" + name;
  if (const char* root = std::getenv("TPCHECK_SOURCE_DIR")) return std::string(root) + "/" + rel;
  if (std::ifstream(rel).good()) return rel;
  return std::string(TPCHECK_SOURCE_DIR) + "/" + rel;
}

std::vector<CublasLtCall> calls_of(const std::string& name) {
  const std::string path = data_path(name);
  CublasLtLog log = read_cublaslt_log(path);
  EXPECT_TRUE(log.problems.empty()) << path;
  return log.calls;
}

TEST(CublasLtQuery, AlgorithmsOfTheH200Logs) {
  TPCHECK_REQUIRE_GPU();
  std::vector<CublasLtCall> calls = calls_of("tpcheck_tp1_level2.log");
  ASSERT_EQ(calls.size(), 72u);
  query_numerical_impls(calls);
  int seen21 = 0, seen55 = 0, seen64 = 0;
  for (const CublasLtCall& c : calls) {
    ASSERT_TRUE(c.numerical_impl_flags.has_value()) << c.line << ": " << c.numerical_impl;
    if (c.compute_type == "32F_FAST_TF32" && c.algo_id == 21) {
      EXPECT_EQ(c.numerical_impl.rfind("HMMA", 0), 0u) << c.numerical_impl;
      EXPECT_EQ(c.math_class, "tf32") << c.numerical_impl;
      ++seen21;
    }
    if (c.compute_type == "32F_FAST_TF32" && c.algo_id == 55) {
      EXPECT_EQ(c.numerical_impl.rfind("FMA", 0), 0u) << c.numerical_impl;
      ++seen55;
    }
    if (c.compute_type == "64F") {
      EXPECT_NE(c.numerical_impl.find("input 64F"), std::string::npos) << c.numerical_impl;
      EXPECT_EQ(c.math_class, "fp64");
      ++seen64;
    }
  }
  EXPECT_GT(seen21, 0);
  EXPECT_GT(seen55, 0);
  EXPECT_GT(seen64, 0);
}

TEST(CublasLtQuery, UnknownNamesAreReportedNotThrown) {
  TPCHECK_REQUIRE_GPU();
  std::vector<CublasLtCall> calls = calls_of("torch_f32_tp1.log");
  ASSERT_FALSE(calls.empty());
  calls[0].tile = "999x999";
  query_numerical_impls(calls);
  EXPECT_FALSE(calls[0].numerical_impl_flags.has_value());
  EXPECT_NE(calls[0].numerical_impl.find("not queried"), std::string::npos) << calls[0].numerical_impl;
}

}  // namespace
}  // namespace tpcheck

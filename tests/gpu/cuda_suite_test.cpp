// cuda_suite_test.cpp — run_case on the CUDA backend with the truth run and its rounding
// probe on threads of their own (Execution::concurrent_unsharded_runs, what `tpcheck run
// --backend cuda` does for small cases) gives the bits it gives with one run at a time:
// every compared tensor of every run (single, sharded, truth, rounding noise) and the
// ledgers' algorithms, for a Linear, a LayerNormMLP (the fused bias + gelu) and an f16
// TransformerLayer case (attention, both attention paths) of the te suite at TP 2.
// Skips when no GPU is present.
// Thread safety: test code; run_case runs its own threads.
#include <gtest/gtest.h>

#include "gpu/gpu_test_support.h"

#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "tpcheck/cuda_backend.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/suite.h"

namespace tpcheck {
namespace {

Execution cuda_emulated(bool concurrent, bool fused_attention) {
  Execution e;
  e.backend = BackendKind::kCuda;
  e.communicator = "emulated on GPU 0";
  CudaBackendOptions options;
  options.fused_attention = fused_attention;
  e.make_backend = [options](int) { return make_cuda_backend(options); };
  e.launch_group = [](int world, const std::function<void(Communicator&)>& body) {
    run_device_group(world, body);
  };
  e.concurrent_unsharded_runs = concurrent;
  return e;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.to_host(), y = b.to_host();
  return std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

TEST(CudaSuite, ConcurrentTruthRunsGiveTheSameBits) {
  TPCHECK_REQUIRE_GPU();
  const Suite suite = make_suite("te", 2, {});
  const std::regex ids("^(Linear\\.column\\.sp0\\.default|LayerNormMLP\\.sp1\\.default|"
                       "TransformerLayer\\.sp0\\.params_dtype=f16)$");
  int checked = 0;
  for (const SuiteCase& c : suite.cases) {
    if (!std::regex_match(c.id, ids)) continue;
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(c.id + (fused ? " fused attention" : ""));
      RunConfig config;
      config.tp = 2;
      config.execution = cuda_emulated(false, fused);
      const CaseRun serial = run_case(c, config);
      config.execution = cuda_emulated(true, fused);
      const CaseRun concurrent = run_case(c, config);
      ASSERT_EQ(serial.steps.size(), concurrent.steps.size());
      ASSERT_FALSE(serial.steps.empty());
      const std::vector<ComparedTensor>& a = serial.steps[0];
      const std::vector<ComparedTensor>& b = concurrent.steps[0];
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        SCOPED_TRACE(a[i].name);
        ASSERT_TRUE(a[i].truth.defined());  // the truth runs did run
        EXPECT_TRUE(same_bits(a[i].single, b[i].single)) << "single";
        EXPECT_TRUE(same_bits(a[i].sharded, b[i].sharded)) << "sharded";
        EXPECT_TRUE(same_bits(a[i].truth, b[i].truth)) << "truth";
        EXPECT_TRUE(same_bits(a[i].rounding_noise, b[i].rounding_noise)) << "rounding noise";
      }
      ASSERT_EQ(serial.truth_gemms.size(), concurrent.truth_gemms.size());
      for (std::size_t i = 0; i < serial.truth_gemms.size(); ++i) {
        EXPECT_TRUE(serial.truth_gemms[i].same_algorithm(concurrent.truth_gemms[i]))
            << serial.truth_gemms[i].site;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

}  // namespace
}  // namespace tpcheck

// norm_layer_test.cpp — LayerNorm and RMSNorm as layers: gradients vs finite differences,
// sequence-parallel equivalence at 2 and 4 thread ranks, the norm-gradient mutation,
// bad input.
#include <gtest/gtest.h>

#include "layers/layer_test_support.h"
#include "tpcheck/layers/layernorm.h"

namespace tpcheck::testing {
namespace {

const Shape kInput = {8, 8};  // [T, hidden]; T divisible by 4 for SP at tp 4

nlohmann::json norm_options(bool zero_centered, bool sp) {
  return {{"hidden_size", 8},
          {"params_dtype", "f64"},
          {"zero_centered_gamma", zero_centered},
          {"sequence_parallel", sp}};
}

TEST(Norm, GradientsMatchFiniteDifferences) {
  for (const std::string kind : {"LayerNorm", "RMSNorm"}) {
    for (bool zc : {false, true}) {
      expect_gradients_match_finite_differences(kind, norm_options(zc, false), kInput);
    }
  }
  nlohmann::json eps = norm_options(false, false);
  eps["eps"] = 0.5;  // a large eps changes the numbers: the option is really used
  expect_gradients_match_finite_differences("LayerNorm", eps, kInput);
  const GlobalRun a = run_layer("LayerNorm", eps, 1, kInput);
  const GlobalRun b = run_layer("LayerNorm", norm_options(false, false), 1, kInput);
  EXPECT_GT(relative_error(a.outputs.output.to_f64(), b.outputs.output.to_f64()), 1e-3);
}

TEST(Norm, ParameterNamesAndInit) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  LayerNorm ln("ln.", LayerNorm::Options::from_json(norm_options(false, false)), ctx);
  ASSERT_EQ(ln.parameters().size(), 2u);
  EXPECT_EQ(ln.parameters()[0]->name, "ln.weight");
  EXPECT_EQ(ln.parameters()[1]->name, "ln.bias");
  LayerNorm::Options ro = LayerNorm::Options::from_json(norm_options(true, false));
  ro.norm.normalization = NormKind::kRMSNorm;
  LayerNorm rms("", ro, ctx);
  ASSERT_EQ(rms.parameters().size(), 1u);
  // gamma ~ 1 + N(0, 0.1), or N(0, 0.1) zero-centered: the mean tells them apart.
  auto mean = [](const Tensor& t) {
    double s = 0;
    for (double v : t.to_f64()) s += v;
    return s / t.numel();
  };
  EXPECT_NEAR(mean(ln.parameters()[0]->value), 1.0, 0.2);
  EXPECT_NEAR(mean(rms.parameters()[0]->value), 0.0, 0.2);
}

TEST(Norm, SequenceParallelEqualsUnsharded) {
  for (int tp : {2, 4}) {
    for (const std::string kind : {"LayerNorm", "RMSNorm"}) {
      for (bool zc : {false, true}) {
        for (bool sp : {false, true}) {
          expect_tp_equivalent(kind, norm_options(zc, sp), kInput, tp);
        }
      }
    }
  }
}

TEST(Norm, GradientNotReducedIsCaught) {
  for (int tp : {2, 4}) {
    for (const std::string kind : {"LayerNorm", "RMSNorm"}) {
      expect_mutation_caught(kind, norm_options(false, true), kInput, tp,
                             Mutation::kNormGradNotReduced);
    }
  }
}

TEST(Norm, BadInput) {
  expect_input_error(
      [] {
        run_layer("LayerNorm", norm_options(false, false), 1, {8, 6});
      },
      {"f64[8, 6]", "expected [..., 8]"});
  nlohmann::json bad = norm_options(false, false);
  bad["normalization"] = "BatchNorm";
  expect_input_error([&] { LayerNorm::Options::from_json(bad); },
                     {"normalization", "BatchNorm", "LayerNorm | RMSNorm"});
  bad = norm_options(false, false);
  bad["eps"] = -1;
  expect_input_error([&] { LayerNorm::Options::from_json(bad); }, {"eps", "-1", "positive"});
  bad = norm_options(false, false);
  bad["normalization"] = "LayerNorm";
  expect_input_error([&] { run_layer("RMSNorm", bad, 1, kInput); },
                     {"RMSNorm", "normalization", "contradicts"});
  bad = norm_options(false, false);
  bad["hidden"] = 8;
  expect_input_error([&] { LayerNorm::Options::from_json(bad); },
                     {"unknown option hidden", "hidden_size"});
}

}  // namespace
}  // namespace tpcheck::testing

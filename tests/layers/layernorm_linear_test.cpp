// layernorm_linear_test.cpp — LayerNormLinear: gradients vs finite differences,
// column-parallel / SP equivalence at 2 and 4 thread ranks for every option, mutations
// caught, bad input (row mode).
#include "tpcheck/layers/layernorm_linear.h"

#include <gtest/gtest.h>

#include "layers/layer_test_support.h"

namespace tpcheck::testing {
namespace {

const Shape kInput = {8, 8};  // [T, in]

nlohmann::json lnl_options(const std::string& mode, bool sp, const nlohmann::json& extra) {
  nlohmann::json j = {{"in_features", 8},
                      {"out_features", 12},
                      {"params_dtype", "f64"},
                      {"parallel_mode", mode},
                      {"sequence_parallel", sp}};
  if (extra.is_object()) j.update(extra);
  return j;
}

// The reference suite's LayerNormLinear option sets, plus RMSNorm and combinations.
std::vector<nlohmann::json> option_sets() {
  return {nlohmann::json::object(),
          {{"bias", false}},
          {{"init_method", "constant"}},
          {{"fuse_wgrad_accumulation", true}},
          {{"return_bias", true}},
          {{"zero_centered_gamma", true}},
          {{"return_layernorm_output", true}},
          {{"delay_wgrad_compute", true}},
          {{"normalization", "RMSNorm"}},
          {{"normalization", "RMSNorm"},
           {"return_layernorm_output", true},
           {"return_bias", true},
           {"delay_wgrad_compute", true}}};
}

TEST(LayerNormLinear, GradientsMatchFiniteDifferences) {
  for (const std::string mode : {"none", "column"}) {
    for (const nlohmann::json& extra : option_sets()) {
      expect_gradients_match_finite_differences("LayerNormLinear", lnl_options(mode, false, extra),
                                                kInput);
    }
  }
}

TEST(LayerNormLinear, ParameterNames) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  LayerNormLinear layer("layernorm_qkv.",
                        LayerNormLinear::Options::from_json(lnl_options("none", false, {})), ctx);
  std::vector<std::string> names;
  for (Parameter* p : layer.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"layernorm_qkv.layer_norm_weight",
                                             "layernorm_qkv.layer_norm_bias",
                                             "layernorm_qkv.weight", "layernorm_qkv.bias"}));
}

TEST(LayerNormLinear, ShardedEqualsUnsharded) {
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      for (const nlohmann::json& extra : option_sets()) {
        expect_tp_equivalent("LayerNormLinear", lnl_options("column", sp, extra), kInput, tp);
      }
    }
  }
}

TEST(LayerNormLinear, MutationsAreCaught) {
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      for (Mutation m : {Mutation::kShardOffByOne, Mutation::kColumnBiasNotSharded,
                         Mutation::kDgradAveraged, Mutation::kNoDgradAllReduce}) {
        expect_mutation_caught("LayerNormLinear", lnl_options("column", sp, {}), kInput, tp, m);
      }
    }
    expect_mutation_caught("LayerNormLinear", lnl_options("column", true, {}), kInput, tp,
                           Mutation::kReversedGather);
    expect_mutation_caught("LayerNormLinear", lnl_options("column", true, {}), kInput, tp,
                           Mutation::kNormGradNotReduced);
  }
}

TEST(LayerNormLinear, BadInput) {
  expect_input_error([] { LayerNormLinear::Options::from_json(lnl_options("row", false, {})); },
                     {"parallel_mode", "\"row\"", "none | column"});
  LayerNormLinear::Options o = LayerNormLinear::Options::from_json(lnl_options("none", false, {}));
  o.parallel_mode = ParallelMode::kRow;
  expect_input_error(
      [&] {
        std::unique_ptr<Communicator> comm = make_single_communicator();
        std::unique_ptr<Backend> backend = make_cpu_backend();
        LayerNormLinear layer("", o, ModuleContext{backend.get(), comm.get(), kSeed});
      },
      {"row", "expected none or column"});
  expect_input_error(
      [] {
        run_layer("LayerNormLinear", lnl_options("none", false, {}), 1, {8, 5});
      },
      {"f64[8, 5]", "expected [..., 8]"});
  expect_input_error(
      [] {
        LayerNormLinear::Options::from_json(lnl_options("none", false, {{"normalization", "L2"}}));
      },
      {"normalization", "L2"});
  expect_input_error(
      [] {
        LayerNormLinear::Options::from_json(
            lnl_options("none", false, {{"save_original_input", true}}));
      },
      {"unknown option save_original_input"});
}

}  // namespace
}  // namespace tpcheck::testing

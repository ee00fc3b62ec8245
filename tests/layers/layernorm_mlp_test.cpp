// layernorm_mlp_test.cpp — LayerNormMLP: gradients vs finite differences for every
// activation and option, TP (fc1 column, fc2 row) and SP equivalence at 2 and 4
// thread ranks, mutations caught, bad input, GEMM sites and parameter names.
#include "tpcheck/layers/layernorm_mlp.h"

#include <gtest/gtest.h>

#include "layers/layer_test_support.h"

namespace tpcheck::testing {
namespace {

const Shape kInput = {8, 8};  // [T, hidden]; ffn 12 (divisible by 2 and 4)

nlohmann::json mlp_options(bool sp, const nlohmann::json& extra) {
  nlohmann::json j = {{"hidden_size", 8},
                      {"ffn_hidden_size", 12},
                      {"params_dtype", "f64"},
                      {"sequence_parallel", sp}};
  if (extra.is_object()) j.update(extra);
  return j;
}

// The reference suite's LayerNormMLP option sets, every activation, and combinations.
std::vector<nlohmann::json> option_sets() {
  return {nlohmann::json::object(),
          {{"init_method", "constant"}},
          {{"output_layer_init_method", "constant"}},
          {{"normalization", "RMSNorm"}},
          {{"zero_centered_gamma", true}},
          {{"bias", false}},
          {{"activation", "relu"}},
          {{"activation", "srelu"}},
          {{"activation", "qgelu"}},
          {{"activation", "geglu"}},
          {{"activation", "swiglu"}},
          {{"fuse_wgrad_accumulation", true}},
          {{"return_bias", true}},
          {{"return_layernorm_output", true}},
          {{"delay_wgrad_compute", true}},
          {{"checkpoint", true}},
          {{"checkpoint", true},
           {"delay_wgrad_compute", true},
           {"activation", "swiglu"},
           {"return_bias", true},
           {"return_layernorm_output", true}}};
}

TEST(LayerNormMLP, GradientsMatchFiniteDifferences) {
  for (const nlohmann::json& extra : option_sets()) {
    expect_gradients_match_finite_differences("LayerNormMLP", mlp_options(false, extra), kInput);
  }
}

TEST(LayerNormMLP, ShardedEqualsUnsharded) {
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      for (const nlohmann::json& extra : option_sets()) {
        expect_tp_equivalent("LayerNormMLP", mlp_options(sp, extra), kInput, tp);
      }
    }
  }
}

TEST(LayerNormMLP, MutationsAreCaught) {
  const std::vector<Mutation> any_sp = {
      Mutation::kNoRowAllReduce,       Mutation::kDoubleAllReduce, Mutation::kShardOffByOne,
      Mutation::kColumnBiasNotSharded, Mutation::kDgradAveraged,   Mutation::kNoDgradAllReduce,
      Mutation::kRowBiasBeforeReduce};
  const std::vector<Mutation> sp_only = {Mutation::kReversedGather, Mutation::kNormGradNotReduced,
                                         Mutation::kRowBiasGradNotReduced};
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      for (Mutation m : any_sp)
        expect_mutation_caught("LayerNormMLP", mlp_options(sp, {}), kInput, tp, m);
    }
    for (Mutation m : sp_only)
      expect_mutation_caught("LayerNormMLP", mlp_options(true, {}), kInput, tp, m);
    // Gated fc1: shard-off-by-one must move both halves.
    expect_mutation_caught("LayerNormMLP", mlp_options(false, {{"activation", "swiglu"}}), kInput,
                           tp, Mutation::kShardOffByOne);
  }
}

TEST(LayerNormMLP, NamesAndSites) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  LayerNormMLP mlp("layernorm_mlp.",
                   LayerNormMLP::Options::from_json(mlp_options(false, {{"activation", "geglu"}})),
                   ctx);
  std::vector<std::string> names;
  for (Parameter* p : mlp.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "layernorm_mlp.layer_norm_weight", "layernorm_mlp.layer_norm_bias",
                       "layernorm_mlp.fc1_weight", "layernorm_mlp.fc1_bias",
                       "layernorm_mlp.fc2_weight", "layernorm_mlp.fc2_bias"}));
  EXPECT_EQ(mlp.parameters()[2]->global_shape, (Shape{24, 8}));  // gated: [2·ffn, hidden]
  EXPECT_EQ(mlp.parameters()[4]->global_shape, (Shape{8, 12}));
  LayerNormMLP::Saved saved;
  const LayerOutputs out = mlp.forward(random_f64(kInput, "x"), saved);
  OutputGrads g;
  g.output = random_f64(out.output.shape(), "dy");
  mlp.backward(g, saved);
  std::vector<std::string> sites;
  for (const GemmRecord& r : backend->ledger().records()) sites.push_back(r.site);
  EXPECT_EQ(sites, (std::vector<std::string>{"mlp.fc1/fwd", "mlp.fc2/fwd", "mlp.fc2/dgrad",
                                             "mlp.fc2/wgrad", "mlp.fc1/dgrad", "mlp.fc1/wgrad"}));
}

TEST(LayerNormMLP, BadInput) {
  expect_input_error(
      [] {
        run_layer("LayerNormMLP", mlp_options(false, {{"ffn_hidden_size", 10}}), 4, kInput);
      },
      {"ffn_hidden_size 10", "tensor-parallel size 4"});
  expect_input_error(
      [] {
        LayerNormMLP::Options::from_json(mlp_options(false, {{"activation", "tanh"}}));
      },
      {"activation", "tanh", "gelu | relu | srelu | qgelu | geglu | swiglu"});
  expect_input_error(
      [] {
        LayerNormMLP::Options::from_json(
            mlp_options(false, {{"output_layer_init_method", "xavier"}}));
      },
      {"output_layer_init_method", "xavier", "normal | constant"});
  expect_input_error(
      [] {
        run_layer("LayerNormMLP", mlp_options(false, {}), 1, {8, 12});
      },
      {"f64[8, 12]", "expected [..., 8]"});
  expect_input_error(
      [] {
        LayerNormMLP::Options::from_json({{"hidden_size", 8}});
      },
      {"ffn_hidden_size", "required"});
}

}  // namespace
}  // namespace tpcheck::testing

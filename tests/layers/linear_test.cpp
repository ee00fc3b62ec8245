// linear_test.cpp — Linear: gradients vs finite differences, TP equivalence (column,
// row, sequence parallel, every option) at 2 and 4 thread ranks, mutations caught,
// bad input, and the mutation names.
#include "tpcheck/layers/linear.h"

#include <gtest/gtest.h>

#include "layers/layer_test_support.h"

namespace tpcheck::testing {
namespace {

const Shape kInput = {8, 8};  // [T, in]; T and in divisible by 4 (SP and row at tp 4)

nlohmann::json linear_options(const std::string& mode, bool sp, nlohmann::json extra) {
  nlohmann::json j = {{"in_features", 8},
                      {"out_features", 12},
                      {"params_dtype", "f64"},
                      {"parallel_mode", mode},
                      {"sequence_parallel", sp}};
  if (extra.is_object()) j.update(extra);
  return j;
}

// The option sets of the reference suite's Linear cases, plus two combinations.
std::vector<nlohmann::json> option_sets() {
  return {
      nlohmann::json::object(),
      {{"bias", false}},
      {{"init_method", "constant"}},
      {{"fuse_wgrad_accumulation", true}},
      {{"return_bias", true}},
      {{"delay_wgrad_compute", true}},
      {{"save_original_input", true}},
      {{"return_bias", true}, {"delay_wgrad_compute", true}, {"fuse_wgrad_accumulation", true}}};
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  for (const std::string mode : {"none", "column", "row"}) {
    for (const nlohmann::json& extra : option_sets()) {
      expect_gradients_match_finite_differences("Linear", linear_options(mode, false, extra),
                                                kInput);
    }
  }
}

// [s, b, h] input (how attention uses Linear): tokens are the sequence, dim 0.
struct Run3d {
  Tensor y, dx, dw;
};
Run3d run_3d(const std::string& mode, bool sp, bool save_original, int tp) {
  const Shape in_shape = {4, 2, 8};
  std::vector<Run3d> ranks(tp);
  ShardSpec in_spec, out_spec, w_spec;
  auto body = [&](Communicator& comm) {
    std::unique_ptr<Backend> backend = make_cpu_backend();
    ModuleContext ctx{backend.get(), &comm, kSeed, Mutation::kNone};
    Linear layer("",
                 Linear::Options::from_json(
                     linear_options(mode, sp, {{"save_original_input", save_original}})),
                 ctx);
    const int r = comm.rank(), n = comm.size();
    const Tensor x = generate(FillSpec::normal(0, 1), kSeed, "input", in_shape, DType::kF64,
                              layer.input_layout(3), r, n);
    Linear::Saved saved;
    Run3d out;
    out.y = layer.forward(x, saved).output;
    OutputGrads g;
    g.output = loss_weight("w", out.y, layer.output_layout(3).output, r, n);
    out.dx = layer.backward(g, saved);
    out.dw = layer.weight().grad;
    ranks[r] = out;
    if (r == 0) {
      in_spec = layer.input_layout(3);
      out_spec = layer.output_layout(3).output;
      w_spec = layer.weight().shard;
    }
  };
  if (tp == 1) {
    body(*make_single_communicator());
  } else {
    run_thread_group(tp, body);
  }
  std::vector<Tensor> y, dx, dw;
  for (const Run3d& r : ranks) {
    y.push_back(r.y);
    dx.push_back(r.dx);
    dw.push_back(r.dw);
  }
  return {assemble_shards(y, out_spec), assemble_shards(dx, in_spec), assemble_shards(dw, w_spec)};
}

// fuse_wgrad_accumulation: the weight gradient goes to main_grad (f32, whatever the
// params dtype), grad stays zero, and main_grad holds the gradient the unfused layer
// puts in grad (for f16 params: the same value before its rounding to f16).
TEST(Linear, FuseWgradAccumulationFillsMainGradOnly) {
  for (const std::string dtype : {"f32", "f16"}) {
    auto run = [&](bool fuse) {
      std::unique_ptr<Communicator> comm = make_single_communicator();
      std::unique_ptr<Backend> backend = make_cpu_backend();
      ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
      auto layer = std::make_unique<Linear>(
          "", Linear::Options::from_json(linear_options(
                  "none", false, {{"params_dtype", dtype}, {"fuse_wgrad_accumulation", fuse}})),
          ctx);
      const DType dt = parse_dtype(dtype);
      const Tensor x = generate(FillSpec::normal(0, 1), kSeed, "x", kInput, dt);
      Linear::Saved saved;
      const LayerOutputs y = layer->forward(x, saved);
      OutputGrads g;
      g.output = generate(FillSpec::normal(0, 1), kSeed, "dy", y.output.shape(), dt);
      layer->backward(g, saved);
      return std::make_pair(std::move(layer), std::move(backend));
    };
    auto [fused, b1] = run(true);
    auto [plain, b2] = run(false);
    const Parameter& w = fused->weight();
    ASSERT_TRUE(w.main_grad.defined()) << dtype;
    EXPECT_EQ(w.main_grad.dtype(), DType::kF32) << dtype;
    EXPECT_EQ(w.main_grad.shape(), w.value.shape());
    for (double v : w.grad.to_f64()) ASSERT_EQ(v, 0.0) << dtype << ": grad was written";
    EXPECT_EQ(&w.gradient(), &w.main_grad);
    const std::vector<double> main = w.main_grad.to_f64();
    const std::vector<double> want = plain->weight().grad.to_f64();
    EXPECT_FALSE(plain->weight().main_grad.defined());
    double norm = 0;
    for (std::size_t i = 0; i < main.size(); ++i) {
      norm += main[i] * main[i];
      // Rounded to the params dtype, main_grad is what the unfused layer stored.
      EXPECT_EQ(round_to(parse_dtype(dtype), main[i]), want[i]) << dtype << " element " << i;
    }
    EXPECT_GT(norm, 0.0) << dtype << ": main_grad holds no gradient";
  }
}

TEST(Linear, ThreeDimensionalInput) {
  expect_gradients_match_finite_differences("Linear", linear_options("none", false, {}), {2, 3, 8});
  for (const std::string mode : {"column", "row"}) {
    const Run3d single = run_3d(mode, false, false, 1);
    for (bool sp : {false, true}) {
      for (bool save_original : {false, true}) {
        SCOPED_TRACE(mode + (sp ? " sp" : "") + (save_original ? " save_original_input" : ""));
        const Run3d sharded = run_3d(mode, sp, save_original, 2);
        ASSERT_EQ(sharded.y.shape(), single.y.shape());
        // f64: only the reductions' order of additions differs (~1e-16).
        EXPECT_LE(relative_error(sharded.y.to_f64(), single.y.to_f64()), 1e-12);
        EXPECT_LE(relative_error(sharded.dx.to_f64(), single.dx.to_f64()), 1e-12);
        EXPECT_LE(relative_error(sharded.dw.to_f64(), single.dw.to_f64()), 1e-12);
      }
    }
  }
}

TEST(Linear, ShardedEqualsUnsharded) {
  for (int tp : {2, 4}) {
    for (const std::string mode : {"column", "row"}) {
      for (bool sp : {false, true}) {
        for (const nlohmann::json& extra : option_sets()) {
          expect_tp_equivalent("Linear", linear_options(mode, sp, extra), kInput, tp);
        }
      }
    }
  }
}

TEST(Linear, MutationsAreCaught) {
  const std::vector<Mutation> column = {Mutation::kShardOffByOne, Mutation::kColumnBiasNotSharded,
                                        Mutation::kDgradAveraged, Mutation::kNoDgradAllReduce};
  const std::vector<Mutation> row = {Mutation::kNoRowAllReduce, Mutation::kDoubleAllReduce,
                                     Mutation::kRowBiasBeforeReduce};
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      for (Mutation m : column) {
        expect_mutation_caught("Linear", linear_options("column", sp, {}), kInput, tp, m);
      }
      for (Mutation m : row) {
        expect_mutation_caught("Linear", linear_options("row", sp, {}), kInput, tp, m);
      }
    }
    expect_mutation_caught("Linear", linear_options("column", true, {}), kInput, tp,
                           Mutation::kReversedGather);
    expect_mutation_caught("Linear", linear_options("row", true, {}), kInput, tp,
                           Mutation::kReversedGather);
    expect_mutation_caught("Linear", linear_options("row", true, {}), kInput, tp,
                           Mutation::kRowBiasGradNotReduced);
  }
}

TEST(Linear, GemmSites) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  Linear::Options o = Linear::Options::from_json(linear_options("none", false, {}));
  o.site = "attn.proj";
  Linear layer("proj.", o, ctx);
  EXPECT_EQ(layer.parameters()[0]->name, "proj.weight");
  EXPECT_EQ(layer.parameters()[1]->name, "proj.bias");
  Linear::Saved saved;
  const Tensor x = random_f64(kInput, "x");
  const LayerOutputs out = layer.forward(x, saved);
  OutputGrads g;
  g.output = random_f64(out.output.shape(), "dy");
  layer.backward(g, saved);
  std::vector<std::string> sites;
  for (const GemmRecord& r : backend->ledger().records()) sites.push_back(r.site);
  EXPECT_EQ(sites,
            (std::vector<std::string>{"attn.proj/fwd", "attn.proj/dgrad", "attn.proj/wgrad"}));
}

TEST(Linear, ConstantInitAndDefaults) {
  const Linear::Options d = Linear::Options::from_json({{"in_features", 4}, {"out_features", 2}});
  EXPECT_TRUE(d.params.bias);
  EXPECT_FALSE(d.return_bias);
  EXPECT_EQ(d.parallel_mode, ParallelMode::kNone);
  EXPECT_EQ(d.params.params_dtype, DType::kF32);
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  ModuleContext ctx{backend.get(), comm.get(), kSeed, Mutation::kNone};
  Linear layer(
      "", Linear::Options::from_json(linear_options("none", false, {{"init_method", "constant"}})),
      ctx);
  for (double v : layer.weight().value.to_f64()) EXPECT_EQ(v, kConstantInitValue);
}

TEST(Linear, BadOptions) {
  expect_input_error(
      [] {
        Linear::Options::from_json(linear_options("none", false, {{"foo", 1}}));
      },
      {"unknown option foo", "in_features"});
  expect_input_error([] { Linear::Options::from_json(linear_options("diagonal", false, {})); },
                     {"parallel_mode", "\"diagonal\"", "none | column | row"});
  expect_input_error(
      [] {
        Linear::Options::from_json(linear_options("none", false, {{"params_dtype", "f8e4m3"}}));
      },
      {"params_dtype", "f8e4m3", "f32 | f16 | bf16 | f64"});
  expect_input_error(
      [] {
        Linear::Options::from_json({{"out_features", 4}});
      },
      {"in_features", "required"});
  expect_input_error(
      [] {
        Linear::Options::from_json(linear_options("none", false, {{"out_features", -3}}));
      },
      {"out_features", "-3", "positive integer"});
  expect_input_error(
      [] {
        Linear::Options::from_json(linear_options("none", false, {{"bias", "yes"}}));
      },
      {"bias", "\"yes\"", "true or false"});
  expect_input_error([] { Linear::Options::from_json(nlohmann::json::array()); },
                     {"expected a JSON object"});
}

TEST(Linear, BadShapes) {
  // Row-parallel in_features 6 at tp 4; column-parallel out_features 10 at tp 4.
  expect_input_error(
      [] {
        run_layer("Linear", linear_options("row", false, {{"in_features", 6}}), 4, {8, 6});
      },
      {"in_features 6", "tensor-parallel size 4"});
  expect_input_error(
      [] {
        run_layer("Linear", linear_options("column", false, {{"out_features", 10}}), 4, kInput);
      },
      {"out_features 10", "tensor-parallel size 4"});
  // Input whose last dimension is not in_features.
  expect_input_error(
      [] {
        run_layer("Linear", linear_options("none", false, {}), 1, {8, 7});
      },
      {"f64[8, 7]", "expected [..., 8]"});
  expect_input_error([] { run_layer("Conv2d", {}, 1, kInput); },
                     {"Conv2d", "Linear, LayerNorm, RMSNorm, LayerNormLinear, LayerNormMLP"});
}

TEST(Mutation, NamesRoundTrip) {
  EXPECT_GE(all_mutations().size(), 10u);
  for (const MutationInfo& info : all_mutations()) {
    EXPECT_EQ(parse_mutation(info.name), info.mutation);
    EXPECT_EQ(mutation_name(info.mutation), info.name);
    EXPECT_FALSE(info.description.empty());
  }
  EXPECT_EQ(parse_mutation("none"), Mutation::kNone);
  EXPECT_EQ(parse_mutation("no-row-allreduce"), Mutation::kNoRowAllReduce);
  expect_input_error([] { parse_mutation("no-such-bug"); },
                     {"no-such-bug", "no-row-allreduce", "row-bias-grad-not-reduced"});
}

}  // namespace
}  // namespace tpcheck::testing

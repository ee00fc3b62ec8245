// tests/suite/full_suite_test.cpp — the `full` suite reaches what issue 9 lists: every
// layer in f32, f16 and bf16 with sequence parallel off and on; all six activations in
// LayerNormMLP and TransformerLayer; fused/separate, interleaved or not QKV × MHA/GQA
// (groups tp, 2·tp, heads)/MQA × causal, no_mask and sliding windows; the option pairs
// that interact in the sharded code; stable ids; every case builds at its TP (the
// reference's rules hold). The values are read back from each case's JSON options, not
// from the generator's tables. make_suite and layer construction only: instant.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "tpcheck/error.h"
#include "tpcheck/layers/any_layer.h"
#include "tpcheck/suite.h"

namespace tpcheck::testing {
namespace {

using nlohmann::json;

// What a case does along one dimension, read from its options.
std::string value_of(const SuiteCase& c, const std::string& dim, int tp) {
  const json& o = c.options;
  if (dim == "dtype") return std::string(dtype_name(c.dtype));
  if (dim == "sp") return c.sequence_parallel ? "1" : "0";
  if (dim == "activation") return o.value("activation", "gelu");
  if (dim == "qkv") {
    if (!o.value("fuse_qkv_params", false)) return "separate";
    return o.value("qkv_weight_interleaved", true) ? "fused_interleaved" : "fused_blocks";
  }
  if (dim == "groups") {
    const std::int64_t g = o.value("num_gqa_groups", std::int64_t{0});
    if (g == 0 || g == o.at("num_attention_heads").get<std::int64_t>()) return "heads";
    if (g == 1) return "mqa";
    if (g == tp) return "tp";
    if (g == 2 * tp) return "2tp";
    return "other";
  }
  if (dim == "mask") {
    const std::string type = o.value("self_attn_mask_type", "causal");
    if (!o.contains("window_size")) return type;
    return type + o.at("window_size").dump();
  }
  if (dim == "residual") {
    return std::string(o.value("parallel_attention_mlp", false) ? "parallel" : "") +
           (o.value("apply_residual_connection_post_layernorm", false) ? "post_ln" : "") +
           (o.value("output_layernorm", false) ? "output_ln" : "");
  }
  if (dim == "mode") return o.value("parallel_mode", "");
  if (dim == "normalization") return o.value("normalization", "LayerNorm");
  // A boolean option: "true" / "false" (absent: the layer's default, given as "default").
  return o.contains(dim) ? o.at(dim).dump() : "default";
}

// Every (value of a, value of b) pair seen in `module`'s cases.
std::set<std::pair<std::string, std::string>> pairs(const Suite& s, const std::string& module,
                                                     const std::string& a, const std::string& b,
                                                     int tp) {
  std::set<std::pair<std::string, std::string>> out;
  for (const SuiteCase& c : s.cases) {
    if (c.module == module) out.insert({value_of(c, a, tp), value_of(c, b, tp)});
  }
  return out;
}

std::set<std::pair<std::string, std::string>> product(const std::vector<std::string>& a,
                                                      const std::vector<std::string>& b) {
  std::set<std::pair<std::string, std::string>> out;
  for (const auto& x : a)
    for (const auto& y : b) out.insert({x, y});
  return out;
}

const std::vector<std::string> kDtypes = {"f32", "f16", "bf16"};
const std::vector<std::string> kSp = {"0", "1"};
const std::vector<std::string> kActivations = {"gelu",  "relu",  "srelu",
                                               "qgelu", "geglu", "swiglu"};

TEST(FullSuite, IsTheDefaultAndNamedSo) {
  EXPECT_EQ(suite_names(), (std::vector<std::string>{"full", "te"}));
  const Suite s = make_suite("full", 4, SuiteSizes{});
  EXPECT_EQ(s.name, "full");
  EXPECT_NE(s.description.find("full"), std::string::npos);
  EXPECT_NE(make_suite("te", 4, SuiteSizes{}).description.find("118"), std::string::npos);
}

TEST(FullSuite, IdsAreUniqueAndTheSameAtTp2To8) {
  std::vector<std::string> first;
  for (int tp : {2, 4, 8}) {
    const Suite s = make_suite("full", tp, SuiteSizes{});
    std::vector<std::string> ids;
    std::set<std::string> unique;
    for (const SuiteCase& c : s.cases) {
      ids.push_back(c.id);
      EXPECT_TRUE(unique.insert(c.id).second) << "duplicate id " << c.id << " at tp " << tp;
      EXPECT_EQ(c.id.rfind(c.module, 0), 0u) << c.id;
      EXPECT_NE(c.id.find(c.sequence_parallel ? ".sp1." : ".sp0."), std::string::npos) << c.id;
      EXPECT_NE(c.id.find(std::string(".") + std::string(dtype_name(c.dtype)) + "."),
                std::string::npos)
          << c.id;
      EXPECT_EQ(c.loss, SuiteLoss::kExtended) << c.id;
    }
    if (first.empty()) first = ids;
    EXPECT_EQ(ids, first) << "ids at tp " << tp << " differ from tp 2";
    EXPECT_GT(ids.size(), 118u);
  }
}

TEST(FullSuite, EveryLayerInEveryDtypeWithAndWithoutSequenceParallel) {
  const Suite s = make_suite("full", 2, SuiteSizes{});
  for (std::string_view kind : layer_kinds()) {
    const std::string module(kind);
    EXPECT_EQ(pairs(s, module, "dtype", "sp", 2), product(kDtypes, kSp)) << module;
  }
}

TEST(FullSuite, AllSixActivationsShardedInMlpAndTransformerLayer) {
  const Suite s = make_suite("full", 4, SuiteSizes{});
  for (const std::string module : {"LayerNormMLP", "TransformerLayer"}) {
    EXPECT_EQ(pairs(s, module, "activation", "sp", 4), product(kActivations, kSp)) << module;
    EXPECT_EQ(pairs(s, module, "activation", "dtype", 4), product(kActivations, kDtypes))
        << module;
  }
}

TEST(FullSuite, AttentionLayoutsGroupsAndMasks) {
  const std::vector<std::string> qkv = {"separate", "fused_interleaved", "fused_blocks"};
  const std::vector<std::string> masks = {"causal", "no_mask", "causal[3,0]", "no_mask[2,3]"};
  for (int tp : {1, 2, 4, 8}) {
    const Suite s = make_suite("full", tp, SuiteSizes{});
    // MQA where TP allows it (groups must be a multiple of TP): TP 1 only.
    const std::vector<std::string> groups =
        tp == 1 ? std::vector<std::string>{"heads", "2tp", "mqa"}
                : std::vector<std::string>{"heads", "2tp", "tp"};
    for (const std::string module : {"MultiheadAttention", "TransformerLayer"}) {
      EXPECT_EQ(pairs(s, module, "qkv", "groups", tp), product(qkv, groups)) << module << tp;
      EXPECT_EQ(pairs(s, module, "mask", "sp", tp), product(masks, kSp)) << module << tp;
      EXPECT_EQ(pairs(s, module, "groups", "sp", tp), product(groups, kSp)) << module << tp;
      EXPECT_EQ(pairs(s, module, "qkv", "mask", tp), product(qkv, masks)) << module << tp;
    }
    EXPECT_EQ(pairs(s, "TransformerLayer", "residual", "sp", tp),
              product({"", "post_ln", "output_ln", "post_lnoutput_ln", "parallel"}, kSp));
  }
}

TEST(FullSuite, OptionPairsThatInteractInTheShardedCode) {
  const Suite s = make_suite("full", 2, SuiteSizes{});
  const std::vector<std::string> tf = {"true", "false"};
  for (const std::string module : {"Linear", "LayerNormLinear", "LayerNormMLP"}) {
    EXPECT_EQ(pairs(s, module, "fuse_wgrad_accumulation", "delay_wgrad_compute", 2),
              product(tf, tf))
        << module;
    EXPECT_EQ(pairs(s, module, "bias", "sp", 2), product(tf, kSp)) << module;
  }
  EXPECT_EQ(pairs(s, "Linear", "mode", "sp", 2),
            (std::set<std::pair<std::string, std::string>>{
                {"column", "0"}, {"column", "1"}, {"row", "0"}, {"row", "1"}, {"none", "0"}}));
  EXPECT_EQ(pairs(s, "Linear", "save_original_input", "mode", 2),
            product(tf, {"column", "row", "none"}));
  EXPECT_EQ(pairs(s, "LayerNormMLP", "checkpoint", "activation", 2), product(tf, kActivations));
  for (const std::string module : {"LayerNormLinear", "LayerNormMLP", "MultiheadAttention"}) {
    EXPECT_EQ(pairs(s, module, "return_layernorm_output", "sp", 2), product(tf, kSp)) << module;
    EXPECT_EQ(pairs(s, module, "return_bias", "sp", 2), product(tf, kSp)) << module;
  }
  for (const std::string module :
       {"LayerNormLinear", "LayerNormMLP", "MultiheadAttention", "TransformerLayer"}) {
    EXPECT_EQ(pairs(s, module, "normalization", "zero_centered_gamma", 2),
              product({"LayerNorm", "RMSNorm"}, tf))
        << module;
  }
  EXPECT_EQ(pairs(s, "TransformerLayer", "fuse_wgrad_accumulation", "sp", 2), product(tf, kSp));
}

TEST(FullSuite, EveryCaseBuildsAtItsTp) {
  // The reference's rules (parallel_attention_mlp without output_layernorm, fused QKV for
  // fuse_wgrad_accumulation, groups divisible by TP, ...) hold for every case: building
  // the unsharded and the rank-0 sharded layers throws nothing.
  for (int tp : {1, 2, 4, 8}) {
    for (const SuiteCase& c : make_suite("full", tp, SuiteSizes{}).cases) {
      RunConfig config;
      config.tp = tp;
      EXPECT_NO_THROW(check_case(c, config)) << c.id << " at tp " << tp;
    }
  }
}

TEST(FullSuite, SizesFollowTheTpAndExplicitOnesAreKept) {
  const Suite s = make_suite("full", 8, SuiteSizes{});
  for (const SuiteCase& c : s.cases) {
    if (c.module != "TransformerLayer") continue;
    EXPECT_EQ(c.options.at("num_attention_heads"), 32) << c.id;  // 4·tp: 2tp groups of 2
    EXPECT_EQ(c.input_shape, (Shape{8 * 8, 8, 128})) << c.id;
  }
  SuiteSizes sizes;
  sizes.heads = 6;
  EXPECT_THROW(make_suite("full", 4, sizes), Error);
}

}  // namespace
}  // namespace tpcheck::testing

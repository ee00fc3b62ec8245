// The `te` suite: the case matrix of TransformerEngine's distributed numerics test
// (tests/pytorch/distributed/run_numerics.py), unquantized recipe — 118 cases.
//
//   Linear           × {column, row} × SP {off, on} × 8 variants      = 32
//   LayerNorm/RMSNorm × 2 variants × SP                                =  8
//   LayerNormLinear  (column) × SP × 9 variants                        = 18
//   LayerNormMLP     × SP × 13 variants                                = 26
//   TransformerLayer × SP × 17 variants (the reference lists
//                    fuse_qkv_params twice; we keep both, as ".2")     = 34
//
// Inputs as there: [batch, hidden] for Linear and the norms, [seq, hidden] for
// LayerNormLinear/LayerNormMLP, [N·seq, batch, hidden] for TransformerLayer. Under
// sequence parallel each rank holds a token slice of the single run's input, so the
// token count is multiplied by N (row-parallel Linear splits features instead, and its
// output is token-split).

#include "suite/suites.h"
#include "tpcheck/error.h"
#include "tpcheck/suite.h"

namespace tpcheck {
namespace {

using nlohmann::json;

struct Variant {
  std::string label;  // "default", "bias=false", ...
  json options;
};

std::string label_of(const json& options) {
  if (options.empty()) return "default";
  std::string out;
  for (const auto& [key, value] : options.items()) {
    if (!out.empty()) out += "+";
    std::string v = value.is_string() ? value.get<std::string>() : value.dump();
    std::erase(v, ' ');
    out += key + "=" + v;
  }
  return out;
}

std::vector<Variant> variants(std::initializer_list<json> list) {
  std::vector<Variant> out;
  for (const json& o : list) {
    std::string label = label_of(o);
    for (const Variant& v : out) {
      if (v.label == label) label += ".2";  // the reference repeats a variant; keep both
    }
    out.push_back({label, o});
  }
  return out;
}

DType dtype_of(const json& options) {
  return options.contains("params_dtype") ? parse_dtype(options["params_dtype"].get<std::string>())
                                          : DType::kF32;
}

struct Resolved {
  std::int64_t hidden, ffn, heads, seq, batch;
};

// Applies defaults, checks divisibility by tp. Defaults made for TP ≤ 4: heads and GQA
// groups are raised to tp when tp exceeds them (and noted); explicit sizes never change.
Resolved resolve_sizes(int tp, const SuiteSizes& s, std::vector<std::string>& notes) {
  Resolved r{s.hidden.value_or(64), s.ffn.value_or(32), s.heads.value_or(4), s.seq.value_or(16),
             s.batch.value_or(16)};
  if (!s.heads && r.heads % tp != 0) {
    notes.push_back(fmt::format("heads and num_gqa_groups raised from {} to {} to fit tp={}",
                                r.heads, tp, tp));
    r.heads = tp;
  }
  auto check = [&](const char* flag, std::int64_t value, bool given) {
    TPCHECK_CHECK_INPUT(value > 0, "--{} must be positive, got {}", flag, value);
    TPCHECK_CHECK_INPUT(value % tp == 0, "--tp {} does not divide {} {}{}", tp, flag, value,
                        given ? "" : " (default; pass a multiple of the tp size)");
  };
  // Sizes the user gave are checked first, so the message names the one they typed.
  // (batch: row-parallel Linear under SP splits its tokens.)
  const std::pair<const char*, std::pair<std::int64_t, bool>> sizes[] = {
      {"hidden", {r.hidden, s.hidden.has_value()}},
      {"ffn", {r.ffn, s.ffn.has_value()}},
      {"heads", {r.heads, s.heads.has_value()}},
      {"batch", {r.batch, s.batch.has_value()}}};
  for (bool explicit_pass : {true, false}) {
    for (const auto& [flag, value_given] : sizes) {
      if (value_given.second == explicit_pass) check(flag, value_given.first, value_given.second);
    }
  }
  TPCHECK_CHECK_INPUT(r.hidden % r.heads == 0, "--heads {} does not divide --hidden {}", r.heads,
                      r.hidden);
  TPCHECK_CHECK_INPUT(r.seq > 0, "--seq must be positive, got {}", r.seq);
  return r;
}

}  // namespace

Suite make_te_suite(int tp, const SuiteSizes& sizes, Recipe recipe) {
  Suite suite;
  suite.name = "te";
  suite.description =
      recipe == Recipe::kNone
          ? "te: TransformerEngine's distributed numerics matrix, exactly (run_numerics.py, "
            "unquantized recipe, 118 cases)"
          : fmt::format("te: TransformerEngine's distributed numerics matrix under recipe {} "
                        "(run_numerics.py's case changes for it)",
                        recipe_name(recipe));
  const Resolved z = resolve_sizes(tp, sizes, suite.notes);
  // The reference's case changes under a quantized recipe: its params_dtype case is bf16
  // under NVFP4 (f16 otherwise), and delayed scaling does not offer save_original_input.
  const std::string low_precision = recipe == Recipe::kNvfp4 ? "bf16" : "f16";
  const bool drop_save_original_input = recipe == Recipe::kFp8Delayed;

  auto add = [&](const std::string& module, const std::string& mode, bool sp,
                 const Variant& v, json options, Shape input) {
    if (drop_save_original_input && v.options.contains("save_original_input")) return;
    SuiteCase c;
    c.module = module;
    c.variant = v.label;
    c.sequence_parallel = sp;
    for (const auto& [key, value] : v.options.items()) options[key] = value;
    options["sequence_parallel"] = sp;
    c.dtype = dtype_of(options);
    c.options = std::move(options);
    c.input_shape = std::move(input);
    c.loss = SuiteLoss::kReference;  // the reference's loss: MSE(output, target) only
    c.id = fmt::format("{}{}.sp{}.{}", module, mode.empty() ? "" : "." + mode, sp ? 1 : 0, v.label);
    suite.cases.push_back(std::move(c));
  };

  const auto linear_variants = variants({json::object(), {{"bias", false}},
                                         {{"init_method", "constant"}},
                                         {{"fuse_wgrad_accumulation", true}},
                                         {{"return_bias", true}}, {{"params_dtype", low_precision}},
                                         {{"delay_wgrad_compute", true}},
                                         {{"save_original_input", true}}});
  for (const Variant& v : linear_variants) {
    for (const char* mode : {"column", "row"}) {
      for (bool sp : {false, true}) {
        const std::int64_t tokens = (sp && std::string(mode) == "column") ? tp * z.batch : z.batch;
        add("Linear", mode, sp, v,
            {{"in_features", z.hidden}, {"out_features", z.hidden}, {"parallel_mode", mode}},
            {tokens, z.hidden});
      }
    }
  }

  const auto norm_variants = variants({{{"zero_centered_gamma", true}}, {{"params_dtype", low_precision}}});
  for (const char* norm : {"LayerNorm", "RMSNorm"}) {
    for (const Variant& v : norm_variants) {
      for (bool sp : {false, true}) {
        add(norm, "", sp, v, {{"hidden_size", z.hidden}}, {sp ? tp * z.batch : z.batch, z.hidden});
      }
    }
  }

  const auto lnl_variants = variants(
      {json::object(), {{"bias", false}}, {{"init_method", "constant"}},
       {{"fuse_wgrad_accumulation", true}}, {{"return_bias", true}}, {{"params_dtype", low_precision}},
       {{"zero_centered_gamma", false}}, {{"return_layernorm_output", true}},
       {{"delay_wgrad_compute", true}}});
  for (const Variant& v : lnl_variants) {
    for (bool sp : {false, true}) {
      add("LayerNormLinear", "column", sp, v,
          {{"in_features", z.hidden}, {"out_features", z.hidden}, {"parallel_mode", "column"}},
          {sp ? tp * z.seq : z.seq, z.hidden});
    }
  }

  const auto mlp_variants = variants(
      {json::object(), {{"init_method", "constant"}}, {{"output_layer_init_method", "constant"}},
       {{"normalization", "RMSNorm"}}, {{"zero_centered_gamma", true}}, {{"bias", false}},
       {{"params_dtype", low_precision}}, {{"activation", "relu"}}, {{"fuse_wgrad_accumulation", true}},
       {{"return_bias", true}}, {{"return_layernorm_output", true}},
       {{"delay_wgrad_compute", true}}, {{"checkpoint", true}}});
  for (const Variant& v : mlp_variants) {
    for (bool sp : {false, true}) {
      add("LayerNormMLP", "", sp, v, {{"hidden_size", z.hidden}, {"ffn_hidden_size", z.ffn}},
          {sp ? tp * z.seq : z.seq, z.hidden});
    }
  }

  // num_gqa_groups: the reference uses 4 (= its heads). Where 4 does not divide the heads
  // or is not divisible by tp, the groups follow the heads (noted).
  std::int64_t gqa = 4;
  if (z.heads % 4 != 0 || 4 % tp != 0) {
    gqa = z.heads;
    suite.notes.push_back(fmt::format("num_gqa_groups variant uses {} groups (4 does not fit heads={}, tp={})", gqa, z.heads, tp));
  }
  const auto tl_variants = variants(
      {json::object(), {{"num_gqa_groups", gqa}}, {{"init_method", "constant"}},
       {{"output_layer_init_method", "constant"}},
       {{"apply_residual_connection_post_layernorm", true}}, {{"output_layernorm", true}},
       {{"parallel_attention_mlp", true}}, {{"window_size", {2, 2}}},
       {{"normalization", "RMSNorm"}}, {{"zero_centered_gamma", true}},
       {{"fuse_qkv_params", true}}, {{"fuse_qkv_params", true}, {"fuse_wgrad_accumulation", true}},
       {{"qkv_weight_interleaved", false}}, {{"bias", false}}, {{"params_dtype", low_precision}},
       {{"fuse_qkv_params", true}}, {{"activation", "relu"}}});
  for (const Variant& v : tl_variants) {
    for (bool sp : {false, true}) {
      add("TransformerLayer", "", sp, v,
          {{"hidden_size", z.hidden}, {"ffn_hidden_size", z.ffn}, {"num_attention_heads", z.heads}},
          {tp * z.seq, z.batch, z.hidden});
    }
  }
  return suite;
}

}  // namespace tpcheck

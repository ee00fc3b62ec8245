// The `full` suite: every layer with every option value that changes what the sharded
// code does, at any TP size, with and without sequence parallel, in f32, f16 and bf16 —
// the paths the `te` matrix never reaches (gated fc1 halves sharded per rank, fused QKV
// not interleaved, GQA with fused QKV, no_mask and sliding windows, bf16, ...).
//
// Each module's options are factors (pairwise.h); the matrix is every pair of values of
// two options in some case, built by pairwise_rows, never by hand, and every such
// configuration runs with sequence parallel off and on (as in te; not where the mode is
// "none", which shards nothing). A module's rule
// rejects the combinations the reference library rejects (or that mean nothing: a
// returned bias without a bias). Factor values are symbolic where they depend on the TP
// size (GQA groups "tp", "2tp"), so the case ids are the same at TP 2, 4 and 8 (TP 1
// swaps "tp" groups for MQA).
//
// Case ids: Module[.mode].sp{0|1}.dtype.option=value+option=value (the options that
// differ from their default; "default" when none do), e.g.
//   TransformerLayer.sp1.bf16.activation=swiglu+qkv=fused_blocks+groups=2tp
// Inputs: [tokens, hidden] for Linear, the norms, LayerNormLinear and LayerNormMLP
// (tokens ×N under sequence parallel, as in te), [N·seq, batch, hidden] for
// MultiheadAttention and TransformerLayer. The loss is the extended one (SuiteLoss), so a
// returned bias and a returned layernorm output are differentiated too.
#include <algorithm>

#include "suite/pairwise.h"
#include "suite/suites.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using nlohmann::json;

struct Sizes {
  int tp = 1;
  std::int64_t hidden, ffn, heads, seq, batch;
};

// Defaults per TP: heads 4·tp (so GQA with 2·tp groups still has two query heads per
// local group, the case where a wrong group mapping shows), hidden at least 4 per head,
// batch a multiple of tp (row-parallel Linear splits its tokens under SP).
Sizes resolve_sizes(int tp, const SuiteSizes& s, std::vector<std::string>& notes) {
  Sizes z;
  z.tp = tp;
  z.heads = s.heads.value_or(4 * std::int64_t{tp});
  z.hidden = s.hidden.value_or(std::max<std::int64_t>(64, 4 * z.heads));
  z.ffn = s.ffn.value_or(std::max<std::int64_t>(32, 4 * std::int64_t{tp}));
  z.seq = s.seq.value_or(8);
  z.batch = s.batch.value_or(std::max<std::int64_t>(8, tp));
  const std::pair<const char*, std::pair<std::int64_t, bool>> sizes[] = {
      {"hidden", {z.hidden, s.hidden.has_value()}},
      {"ffn", {z.ffn, s.ffn.has_value()}},
      {"heads", {z.heads, s.heads.has_value()}},
      {"batch", {z.batch, s.batch.has_value()}}};
  // Sizes the user gave are checked first, so the message names the one they typed.
  for (bool explicit_pass : {true, false}) {
    for (const auto& [flag, value_given] : sizes) {
      const auto [value, given] = value_given;
      if (given != explicit_pass) continue;
      TPCHECK_CHECK_INPUT(value > 0, "--{} must be positive, got {}", flag, value);
      TPCHECK_CHECK_INPUT(value % tp == 0, "--tp {} does not divide {} {}{}", tp, flag, value,
                          given ? "" : " (default; pass a multiple of the tp size)");
    }
  }
  TPCHECK_CHECK_INPUT(z.hidden % z.heads == 0, "--heads {} does not divide --hidden {}", z.heads,
                      z.hidden);
  TPCHECK_CHECK_INPUT(z.seq > 0, "--seq must be positive, got {}", z.seq);
  notes.push_back(fmt::format(
      "full suite sizes at tp {}: hidden {}, ffn {}, heads {}, seq {} per rank, batch {}", tp,
      z.hidden, z.ffn, z.heads, z.seq, z.batch));
  return z;
}

const std::vector<std::string> kBool = {"false", "true"};
const std::vector<std::string> kBoolDefaultTrue = {"true", "false"};
const std::vector<std::string> kDtypes = {"f32", "f16", "bf16"};

// One module's matrix: its factors and the rule over them.
struct Matrix {
  std::string module;  // for the norms: the `normalization` factor names the module
  std::vector<Factor> factors;
  // Rejects a (partial) row; `has(name, value)` is true only when that factor is set to
  // that value, so a rule never rejects for a factor not chosen yet.
  std::function<bool(const std::function<bool(const char*, const char*)>& has)> rejects;
};

// Factors that are not plain options, and what they set.
//   mode       parallel_mode (column | row | none)
//   dtype      params_dtype
//   qkv        separate: fuse_qkv_params false; fused_interleaved: true (the reference's
//              default layout, one shard block); fused_blocks: qkv_weight_interleaved
//              false (Q, K, V sharded as separate blocks)
//   groups     num_gqa_groups: heads (MHA), 2tp, tp (GQA), mqa (1: TP 1 only)
//   mask       self_attn_mask_type and window_size: causal, no_mask, causal_left3
//              (causal, window (3, 0)), window2_3 (no_mask, sliding window (2, 3))
//   residual   TransformerLayer's arrangement: pre_ln (default), post_ln
//              (apply_residual_connection_post_layernorm), output_ln (output_layernorm),
//              post_ln_output_ln (both), parallel (parallel_attention_mlp)
// Every other factor is the option of that name, "true"/"false" or a string value.
void apply(const std::string& factor, const std::string& value, const Sizes& z, json& o) {
  if (factor == "mode") {
    o["parallel_mode"] = value;
  } else if (factor == "sp") {
    o["sequence_parallel"] = value == "1";
  } else if (factor == "dtype") {
    if (value != "f32") o["params_dtype"] = value;
  } else if (factor == "qkv") {
    if (value != "separate") o["fuse_qkv_params"] = true;
    if (value == "fused_blocks") o["qkv_weight_interleaved"] = false;
  } else if (factor == "groups") {
    if (value == "2tp") o["num_gqa_groups"] = 2 * z.tp;
    if (value == "tp") o["num_gqa_groups"] = z.tp;
    if (value == "mqa") o["num_gqa_groups"] = 1;
  } else if (factor == "mask") {
    o["self_attn_mask_type"] = value == "no_mask" || value == "window2_3" ? "no_mask" : "causal";
    if (value == "causal_left3") o["window_size"] = {3, 0};
    if (value == "window2_3") o["window_size"] = {2, 3};
  } else if (factor == "residual") {
    if (value == "post_ln" || value == "post_ln_output_ln")
      o["apply_residual_connection_post_layernorm"] = true;
    if (value == "output_ln" || value == "post_ln_output_ln") o["output_layernorm"] = true;
    if (value == "parallel") o["parallel_attention_mlp"] = true;
  } else if (factor == "normalization" && (value == "LayerNorm" || value == "RMSNorm")) {
    o["normalization"] = value;
  } else if (value == "true" || value == "false") {
    o[factor] = value == "true";
  } else {
    o[factor] = value;
  }
}

std::vector<Matrix> matrices(const Sizes& z) {
  using Has = std::function<bool(const char*, const char*)>;
  const Factor dtype{"dtype", kDtypes};
  const Factor normalization{"normalization", {"LayerNorm", "RMSNorm"}};
  const Factor zero_centered{"zero_centered_gamma", kBool};
  const Factor bias{"bias", kBoolDefaultTrue}, return_bias{"return_bias", kBool};
  const Factor fuse_wgrad{"fuse_wgrad_accumulation", kBool};
  const Factor delay_wgrad{"delay_wgrad_compute", kBool};
  const Factor return_ln{"return_layernorm_output", kBool};
  const Factor activation{"activation", {"gelu", "relu", "srelu", "qgelu", "geglu", "swiglu"}};
  const Factor qkv{"qkv", {"separate", "fused_interleaved", "fused_blocks"}};
  const Factor groups{"groups", {"heads", "2tp", "tp", "mqa"}};
  const Factor mask{"mask", {"causal", "no_mask", "causal_left3", "window2_3"}};
  // A returned bias needs a bias.
  auto bias_rule = [](const Has& has) {
    return has("return_bias", "true") && has("bias", "false");
  };
  // GQA groups the TP size allows: divisible by tp and dividing the heads; MQA only at
  // TP 1 (where "tp" groups would be MQA again).
  auto groups_rule = [z](const Has& has) {
    if (has("groups", "mqa")) return z.tp != 1;
    if (has("groups", "tp")) return z.tp == 1 || z.heads % z.tp != 0;
    if (has("groups", "2tp")) return z.heads % (2 * z.tp) != 0;
    return false;
  };
  std::vector<Matrix> out;
  out.push_back({"Linear",
                 {{"mode", {"column", "row", "none"}},
                  dtype,
                  bias,
                  return_bias,
                  fuse_wgrad,
                  delay_wgrad,
                  {"save_original_input", kBool}},
                 bias_rule});
  out.push_back({"", {normalization, dtype, zero_centered}, [](const Has&) { return false; }});
  out.push_back({"LayerNormLinear",
                 {{"mode", {"column", "none"}},
                  dtype,
                  normalization,
                  zero_centered,
                  return_ln,
                  bias,
                  return_bias,
                  fuse_wgrad,
                  delay_wgrad},
                 bias_rule});
  out.push_back({"LayerNormMLP",
                 {dtype,
                  activation,
                  normalization,
                  zero_centered,
                  bias,
                  return_bias,
                  return_ln,
                  {"checkpoint", kBool},
                  fuse_wgrad,
                  delay_wgrad},
                 bias_rule});
  out.push_back({"MultiheadAttention",
                 {dtype,
                  qkv,
                  groups,
                  mask,
                  {"input_layernorm", kBool},
                  normalization,
                  zero_centered,
                  return_ln,
                  bias,
                  return_bias,
                  fuse_wgrad},
                 [=](const Has& has) {
                   return bias_rule(has) || groups_rule(has) ||
                          (has("return_layernorm_output", "true") &&
                           has("input_layernorm", "false"));
                 }});
  out.push_back({"TransformerLayer",
                 {dtype,
                  activation,
                  qkv,
                  groups,
                  mask,
                  {"residual", {"pre_ln", "post_ln", "output_ln", "post_ln_output_ln", "parallel"}},
                  normalization,
                  zero_centered,
                  bias,
                  fuse_wgrad},
                 [=](const Has& has) {
                   // The reference: fuse_wgrad_accumulation needs fused QKV parameters.
                   return groups_rule(has) ||
                          (has("fuse_wgrad_accumulation", "true") && has("qkv", "separate"));
                 }});
  return out;
}

Shape input_shape(const std::string& module, const json& o, const Sizes& z) {
  const bool sp = o.value("sequence_parallel", false);
  const std::int64_t n = z.tp;
  if (module == "MultiheadAttention" || module == "TransformerLayer")
    return {n * z.seq, z.batch, z.hidden};
  if (module == "LayerNormLinear" || module == "LayerNormMLP")
    return {sp ? n * z.seq : z.seq, z.hidden};
  if (module == "Linear") {
    // Row-parallel splits features; under SP its output is token-split (batch % tp == 0).
    const bool column = o.value("parallel_mode", "") == "column";
    return {sp && column ? n * z.batch : z.batch, z.hidden};
  }
  return {sp ? n * z.batch : z.batch, z.hidden};  // the norms
}

json size_options(const std::string& module, const Sizes& z) {
  if (module == "Linear" || module == "LayerNormLinear")
    return {{"in_features", z.hidden}, {"out_features", z.hidden}};
  if (module == "LayerNormMLP") return {{"hidden_size", z.hidden}, {"ffn_hidden_size", z.ffn}};
  if (module == "MultiheadAttention")
    return {{"hidden_size", z.hidden}, {"num_attention_heads", z.heads}};
  if (module == "TransformerLayer")
    return {
        {"hidden_size", z.hidden}, {"ffn_hidden_size", z.ffn}, {"num_attention_heads", z.heads}};
  return {{"hidden_size", z.hidden}};  // the norms
}

}  // namespace

Suite make_full_suite(int tp, const SuiteSizes& sizes) {
  Suite suite;
  suite.name = "full";
  suite.description =
      "full: every option value that changes the sharded code, pairwise, every layer, "
      "f32/f16/bf16, sequence parallel off and on";
  const Sizes z = resolve_sizes(tp, sizes, suite.notes);

  for (const Matrix& m : matrices(z)) {
    const Admissible admissible = [&m](const Row& row) {
      auto has = [&](const char* name, const char* value) {
        for (std::size_t f = 0; f < m.factors.size(); ++f) {
          if (m.factors[f].name == name)
            return row[f] != kUnset && m.factors[f].values[row[f]] == value;
        }
        return false;
      };
      return !m.rejects(has);
    };
    for (const Row& row : pairwise_rows(m.factors, admissible)) {
      for (bool sp : {false, true}) {
        SuiteCase c;
        c.module = m.module;
        json options;
        std::string mode, variant;
        std::string dtype = "f32";
        for (std::size_t f = 0; f < m.factors.size(); ++f) {
          const std::string& name = m.factors[f].name;
          const std::string& value = m.factors[f].values[row[f]];
          apply(name, value, z, options);
          if (name == "dtype") {
            dtype = value;
          } else if (name == "mode") {
            mode = value;
          } else if (name == "normalization" && m.module.empty()) {
            c.module = value;  // LayerNorm or RMSNorm
            options.erase("normalization");
          } else if (row[f] != 0) {
            variant += (variant.empty() ? "" : "+") + name + "=" + value;
          }
        }
        // Sequence parallel means nothing without a sharded mode.
        if (sp && mode == "none") continue;
        options["sequence_parallel"] = sp;
        const json sizes_json = size_options(c.module, z);
        for (const auto& [key, value] : sizes_json.items()) options[key] = value;
        c.variant = variant.empty() ? "default" : variant;
        c.sequence_parallel = sp;
        c.dtype = parse_dtype(dtype);
        c.input_shape = input_shape(c.module, options, z);
        c.options = std::move(options);
        c.loss = SuiteLoss::kExtended;
        c.id = fmt::format("{}{}.sp{}.{}.{}", c.module, mode.empty() ? "" : "." + mode, sp ? 1 : 0,
                           dtype, c.variant);
        suite.cases.push_back(std::move(c));
      }
    }
  }
  return suite;
}

}  // namespace tpcheck

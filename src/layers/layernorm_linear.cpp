// layernorm_linear.cpp — LayerNormLinear = LayerNorm then Linear (layernorm_linear.h).
#include "tpcheck/layers/layernorm_linear.h"

#include <nlohmann/json.hpp>

#include "layers/child_options.h"
#include "layers/json_options.h"
#include "tpcheck/error.h"

namespace tpcheck {

LayerNormLinear::Options LayerNormLinear::Options::from_json(const nlohmann::json& j) {
  OptionReader r(j, "LayerNormLinear");
  Options o;
  o.in_features = r.get_size("in_features", true);
  o.out_features = r.get_size("out_features", true);
  o.norm = r.get_norm_options("eps");
  o.return_layernorm_output = r.get_bool("return_layernorm_output", o.return_layernorm_output);
  o.params = r.get_param_options();
  o.return_bias = r.get_bool("return_bias", o.return_bias);
  o.parallel_mode = r.get_parallel_mode(o.parallel_mode, /*allow_row=*/false);
  o.sequence_parallel = r.get_bool("sequence_parallel", o.sequence_parallel);
  o.wgrad = r.get_wgrad_options(/*delay_is_a_key=*/true);
  r.finish();
  return o;
}

LayerNorm::Options LayerNormLinear::norm_options(const Options& o) {
  // The reference rejects it too (its LayerNormLinear raises "Normalization does not
  // support tensor-parallel distribution" for parallel_mode="row").
  TPCHECK_CHECK_INPUT(
      o.parallel_mode != ParallelMode::kRow,
      "LayerNormLinear: parallel_mode row is not supported (as in the reference); expected "
      "none or column");
  LayerNorm::Options n;
  n.hidden_size = o.in_features;
  n.norm = o.norm;
  // The norm sees a token slice only when the Linear gathers after it.
  n.sequence_parallel = o.sequence_parallel && o.parallel_mode == ParallelMode::kColumn;
  n.params_dtype = o.params.params_dtype;
  return n;
}

Linear::Options LayerNormLinear::linear_options(const Options& o) {
  Linear::Options l;
  copy_linear_fields(o, l);
  return l;
}

LayerNormLinear::LayerNormLinear(std::string prefix, Options options, const ModuleContext& ctx)
    : options_(std::move(options)),
      ctx_(ctx),
      norm_(prefix + "layer_norm_", norm_options(options_), ctx),
      linear_(prefix, linear_options(options_), ctx) {}

LayerOutputs LayerNormLinear::forward(const Tensor& x, Saved& saved) {
  const Tensor ln = norm_.forward(x, saved.norm).output;
  LayerOutputs out = linear_.forward(ln, saved.linear);
  if (options_.return_layernorm_output) out.layernorm_output = ln;
  return out;
}

Tensor LayerNormLinear::backward(const OutputGrads& grads, Saved& saved) {
  Tensor dln = linear_.backward(grads, saved.linear);
  if (options_.return_layernorm_output) {
    TPCHECK_CHECK(grads.layernorm_output.defined(),
                  "LayerNormLinear: return_layernorm_output needs its gradient");
    ctx_.backend->accumulate(dln, grads.layernorm_output);
  }
  OutputGrads norm_grads;
  norm_grads.output = dln;
  return norm_.backward(norm_grads, saved.norm);
}

void LayerNormLinear::backward_dw(Saved& saved) { linear_.backward_dw(saved.linear); }

std::vector<Parameter*> LayerNormLinear::parameters() {
  std::vector<Parameter*> ps = norm_.parameters();
  for (Parameter* p : linear_.parameters()) ps.push_back(p);
  return ps;
}

ShardSpec LayerNormLinear::input_layout(int rank) const { return linear_.input_layout(rank); }

OutputLayout LayerNormLinear::output_layout(int rank) const {
  OutputLayout l = linear_.output_layout(rank);
  l.layernorm_output = norm_.output_layout(rank).output;
  return l;
}

}  // namespace tpcheck

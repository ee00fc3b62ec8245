// layernorm.cpp — LayerNorm / RMSNorm forward and backward (layernorm.h).
//
// The math is Backend::norm_forward / norm_backward; this file adds the parameters and
// the sequence-parallel rule: the gradients of the replicated weight and bias, computed
// from this rank's token slice, are partial sums and are all-reduced (tp_ops).
#include "tpcheck/layers/layernorm.h"

#include <nlohmann/json.hpp>

#include "layers/json_options.h"
#include "layers/tp_ops.h"
#include "tpcheck/error.h"

namespace tpcheck {

LayerNorm::Options LayerNorm::Options::from_json(const nlohmann::json& j) {
  OptionReader r(j, "LayerNorm");
  Options o;
  // The reference's key is normalized_shape; hidden_size is accepted as an alias.
  const std::int64_t normalized_shape = r.get_size("normalized_shape", false);
  const std::int64_t hidden_size = r.get_size("hidden_size", false);
  TPCHECK_CHECK_INPUT(normalized_shape > 0 || hidden_size > 0,
                      "LayerNorm option normalized_shape (or its alias hidden_size) is required "
                      "(a positive integer)");
  TPCHECK_CHECK_INPUT(normalized_shape == 0 || hidden_size == 0 || normalized_shape == hidden_size,
                      "LayerNorm options normalized_shape {} and hidden_size {} disagree; give one",
                      normalized_shape, hidden_size);
  o.hidden_size = normalized_shape > 0 ? normalized_shape : hidden_size;
  o.norm = r.get_norm_options("eps");
  o.sequence_parallel = r.get_bool("sequence_parallel", o.sequence_parallel);
  o.params_dtype = r.get_params_dtype(o.params_dtype);
  r.finish();
  return o;
}

LayerNorm::LayerNorm(std::string prefix, Options options, const ModuleContext& ctx)
    : options_(std::move(options)), ctx_(ctx) {
  const Options& o = options_;
  TPCHECK_CHECK_INPUT(o.hidden_size > 0, "{}: hidden_size {} must be positive",
                      norm_kind_name(o.norm.normalization), o.hidden_size);
  TPCHECK_CHECK_INPUT(o.norm.eps > 0, "{}: eps {} must be positive",
                      norm_kind_name(o.norm.normalization), o.norm.eps);
  weight_ = make_parameter(ctx_, prefix + "weight", {o.hidden_size}, ShardSpec::replicated(),
                           default_gamma_fill(o.norm.zero_centered_gamma), o.params_dtype);
  weight_.sequence_parallel_grad = o.sequence_parallel;
  if (o.norm.normalization == NormKind::kLayerNorm) {
    bias_ = make_parameter(ctx_, prefix + "bias", {o.hidden_size}, ShardSpec::replicated(),
                           default_beta_fill(), o.params_dtype);
    bias_.sequence_parallel_grad = o.sequence_parallel;
  }
}

LayerOutputs LayerNorm::forward(const Tensor& x, Saved& saved) {
  const Options& o = options_;
  TPCHECK_CHECK_INPUT(x.defined() && x.rank() >= 1 && x.dim(-1) == o.hidden_size,
                      "{}: input {} expected [..., {}] (hidden_size)",
                      norm_kind_name(o.norm.normalization),
                      x.defined() ? x.describe() : "undefined", o.hidden_size);
  TPCHECK_CHECK_INPUT(x.dtype() == o.params_dtype, "{}: input dtype {}, expected params_dtype {}",
                      norm_kind_name(o.norm.normalization), dtype_name(x.dtype()),
                      dtype_name(o.params_dtype));
  saved.input = x;
  saved.norm = ctx_.backend->norm_forward(o.norm.normalization, x, weight_.value, bias_.value,
                                          o.norm.eps, o.norm.zero_centered_gamma);
  LayerOutputs out;
  out.output = saved.norm.y;
  return out;
}

Tensor LayerNorm::backward(const OutputGrads& grads, Saved& saved) {
  const Options& o = options_;
  TPCHECK_CHECK(saved.input.defined(), "{}: backward before forward",
                norm_kind_name(o.norm.normalization));
  TPCHECK_CHECK(grads.output.defined() && grads.output.shape() == saved.input.shape(),
                "{}: output gradient does not match the input {}",
                norm_kind_name(o.norm.normalization), saved.input.describe());
  const bool layer_norm = o.norm.normalization == NormKind::kLayerNorm;
  if (!o.sequence_parallel) {
    return ctx_.backend->norm_backward(o.norm.normalization, grads.output, saved.input,
                                       weight_.value, saved.norm, o.norm.zero_centered_gamma,
                                       weight_.grad, bias_.grad);
  }
  // SP: this rank's slice gives partial sums; reduce them before accumulating, so
  // gradients accumulated earlier are not summed N times.
  Tensor dgamma = Tensor::zeros_like(weight_.grad);
  Tensor dbeta = layer_norm ? Tensor::zeros_like(bias_.grad) : Tensor();
  Tensor dx =
      ctx_.backend->norm_backward(o.norm.normalization, grads.output, saved.input, weight_.value,
                                  saved.norm, o.norm.zero_centered_gamma, dgamma, dbeta);
  reduce_replicated_grad(ctx_, dgamma, ReplicatedGrad::kNorm);
  ctx_.backend->accumulate(weight_.grad, dgamma);
  if (layer_norm) {
    reduce_replicated_grad(ctx_, dbeta, ReplicatedGrad::kNorm);
    ctx_.backend->accumulate(bias_.grad, dbeta);
  }
  return dx;
}

std::vector<Parameter*> LayerNorm::parameters() {
  std::vector<Parameter*> ps = {&weight_};
  if (options_.norm.normalization == NormKind::kLayerNorm) ps.push_back(&bias_);
  return ps;
}

ShardSpec LayerNorm::input_layout(int rank) const {
  return options_.sequence_parallel ? ShardSpec::along(0) : ShardSpec::replicated();
}

OutputLayout LayerNorm::output_layout(int rank) const {
  OutputLayout l;
  l.output = input_layout(rank);
  return l;
}

}  // namespace tpcheck

// transformer_layer.cpp — TransformerLayer (include/tpcheck/layers/transformer_layer.h):
// the residual wiring around MultiheadAttention and LayerNormMLP, forward and backward.
//
// Backward, not parallel (dy the output gradient, after the output norm's backward):
//   d m = dy, d m_b = Σ_rows dy, d ln_m = dy (post-LN residual) → dh = mlp' + (dy if r2 = h)
//   d a = dh, d a_b = Σ_rows dh, d ln_a = dh (post-LN residual) → dx = attn' + (dh if r1 = x)
// Parallel: dy feeds both branches and the residual: dx = dy + attn' + mlp'.
// Thread safety: a layer object belongs to one rank.
#include "tpcheck/layers/transformer_layer.h"

#include <nlohmann/json.hpp>

#include "layers/child_options.h"
#include "layers/json_options.h"
#include "layers/tp_ops.h"
#include "tpcheck/error.h"

namespace tpcheck {

TransformerLayer::Options TransformerLayer::Options::from_json(const nlohmann::json& j) {
  OptionReader r(j, "TransformerLayer");
  Options o;
  r.get_attention_shape(o);
  o.ffn_hidden_size = r.get_size("ffn_hidden_size", true);
  o.self_attn_mask_type =
      parse_attn_mask_type(r.get_choice("self_attn_mask_type", "causal", {"causal", "no_mask"}));
  o.apply_residual_connection_post_layernorm = r.get_bool(
      "apply_residual_connection_post_layernorm", o.apply_residual_connection_post_layernorm);
  o.output_layernorm = r.get_bool("output_layernorm", o.output_layernorm);
  o.parallel_attention_mlp = r.get_bool("parallel_attention_mlp", o.parallel_attention_mlp);
  o.norm = r.get_norm_options("layernorm_epsilon");
  o.fuse_qkv_params = r.get_bool("fuse_qkv_params", o.fuse_qkv_params);
  o.qkv_weight_interleaved = r.get_bool("qkv_weight_interleaved", o.qkv_weight_interleaved);
  o.params = r.get_param_options();
  o.activation = r.get_activation(o.activation);
  o.output_layer_init_method =
      r.get_init_method("output_layer_init_method", o.output_layer_init_method);
  o.wgrad = r.get_wgrad_options(/*delay_is_a_key=*/false);
  o.sequence_parallel = r.get_bool("sequence_parallel", o.sequence_parallel);
  r.finish();
  o.validate();
  normalize_window_size(o.self_attn_mask_type, o.window_left, o.window_right);
  o.attention().validate(1);
  return o;
}

void TransformerLayer::Options::validate() const {
  // The reference's constructor rules (transformer.py).
  TPCHECK_CHECK_INPUT(!(parallel_attention_mlp && output_layernorm),
                      "TransformerLayer: parallel_attention_mlp and output_layernorm cannot both "
                      "be true (the reference rejects the combination)");
  TPCHECK_CHECK_INPUT(!(parallel_attention_mlp && apply_residual_connection_post_layernorm),
                      "TransformerLayer: parallel_attention_mlp and "
                      "apply_residual_connection_post_layernorm cannot both be true (the "
                      "reference rejects the combination)");
  TPCHECK_CHECK_INPUT(!wgrad.fuse_wgrad_accumulation || fuse_qkv_params,
                      "TransformerLayer: fuse_wgrad_accumulation true requires fuse_qkv_params "
                      "true, got fuse_qkv_params false (the reference rejects it)");
  // Not a JSON key here, but settable in C++: backward_dw is a no-op, so sub-layers that
  // delayed their weight gradients would never compute them.
  TPCHECK_CHECK_INPUT(!wgrad.delay_wgrad_compute,
                      "TransformerLayer: delay_wgrad_compute is not supported (its backward "
                      "computes every weight gradient); expected false");
}

MultiheadAttention::Options TransformerLayer::Options::attention() const {
  MultiheadAttention::Options a;
  a.hidden_size = hidden_size;
  a.num_attention_heads = num_attention_heads;
  a.num_gqa_groups = num_gqa_groups;
  a.attn_mask_type = self_attn_mask_type;
  a.window_left = window_left;
  a.window_right = window_right;
  a.input_layernorm = !output_layernorm;
  a.return_bias = !parallel_attention_mlp;  // sequential: added here, with the residual
  // ln_a is the first residual only with an input norm.
  a.return_layernorm_output = apply_residual_connection_post_layernorm && !output_layernorm;
  a.norm = norm;
  a.fuse_qkv_params = fuse_qkv_params;
  a.qkv_weight_interleaved = qkv_weight_interleaved;
  a.params = params;
  a.output_layer_init_method = output_layer_init_method;
  a.wgrad = wgrad;
  a.sequence_parallel = sequence_parallel;
  return a;
}

LayerNormMLP::Options TransformerLayer::Options::mlp() const {
  LayerNormMLP::Options m;
  m.hidden_size = hidden_size;
  m.ffn_hidden_size = ffn_hidden_size;
  m.activation = activation;
  m.norm = norm;
  m.params = params;
  m.return_bias = !parallel_attention_mlp;  // sequential: added here, with the residual
  m.return_layernorm_output = apply_residual_connection_post_layernorm;
  m.output_layer_init_method = output_layer_init_method;
  m.wgrad = wgrad;
  m.sequence_parallel = sequence_parallel;
  m.site = "mlp";
  return m;
}

namespace {

LayerNorm::Options output_norm_options(const TransformerLayer::Options& o) {
  return hidden_norm_options(o);
}

}  // namespace

TransformerLayer::TransformerLayer(std::string prefix, Options options, const ModuleContext& ctx)
    : options_((options.validate(), std::move(options))),
      ctx_(ctx),
      attention_(prefix + "self_attention.", options_.attention(), ctx),
      mlp_(prefix + "layernorm_mlp.", options_.mlp(), ctx) {
  if (options_.output_layernorm) {
    output_norm_ =
        std::make_unique<LayerNorm>(prefix + "layernorm.", output_norm_options(options_), ctx_);
  }
}

ShardSpec TransformerLayer::input_layout() const { return attention_.input_layout(); }

OutputLayout TransformerLayer::output_layout() const {
  return OutputLayout{input_layout(), ShardSpec::replicated(), ShardSpec::replicated()};
}

std::vector<Parameter*> TransformerLayer::parameters() {
  std::vector<Parameter*> out = attention_.parameters();
  for (Parameter* p : mlp_.parameters()) out.push_back(p);
  if (output_norm_) {
    for (Parameter* p : output_norm_->parameters()) out.push_back(p);
  }
  return out;
}

Tensor TransformerLayer::combine(const Tensor& out, const Tensor& bias, const Tensor& residual) {
  // residual + (out + bias) in f32 (f64) with one rounding to the storage dtype: the
  // reference's fused bias_dropout_add (a compiled elementwise kernel; dropout is 0).
  if (ctx_.mutated(Mutation::kResidualBeforeReduce)) {
    // The bug: each rank added the (whole, SP: gathered) residual to its partial sum, so
    // the reduction carries Σ_ranks residual = N copies of it.
    Tensor copies = options_.sequence_parallel
                        ? ctx_.comm->reduce_scatter(ctx_.comm->all_gather(residual, 0), 0)
                        : residual.clone();
    if (!options_.sequence_parallel) ctx_.comm->all_reduce(copies);
    return ctx_.backend->bias_residual_add(out, bias, copies);
  }
  return ctx_.backend->bias_residual_add(out, bias, residual);
}

Tensor TransformerLayer::bias_output_grad(const Tensor& dy) {
  Tensor g = Tensor::zeros({options_.hidden_size}, dy.dtype(), dy.device());
  ctx_.backend->accumulate_bias_grad(dy, g);
  if (options_.sequence_parallel) reduce_replicated_grad(ctx_, g, ReplicatedGrad::kRowBias);
  return g;
}

LayerOutputs TransformerLayer::forward(const Tensor& x, Saved& saved) {
  const Options& o = options_;
  Backend& be = *ctx_.backend;
  const LayerOutputs a = attention_.forward(x, saved.attention);
  Tensor y;
  if (o.parallel_attention_mlp) {
    // The reference: both branches add their own bias (after their reductions), then
    // x + ((a + a_b) + (m + m_b)) in one fused kernel: formed in f32, rounded once.
    const LayerOutputs m = mlp_.forward(x, saved.mlp);
    const DType wide = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Tensor sum = a.output.to(wide);
    be.accumulate(sum, m.output);
    if (ctx_.mutated(Mutation::kResidualBeforeReduce)) {
      Tensor copies = o.sequence_parallel
                          ? ctx_.comm->reduce_scatter(ctx_.comm->all_gather(x, 0), 0)
                          : x.clone();
      if (!o.sequence_parallel) ctx_.comm->all_reduce(copies);
      be.accumulate(sum, copies);
    } else {
      be.accumulate(sum, x);
    }
    y = sum.to(x.dtype());
  } else {
    saved.residual_is_ln_a = a.layernorm_output.defined();
    const Tensor& r1 = saved.residual_is_ln_a ? a.layernorm_output : x;
    const Tensor h = combine(a.output, a.bias, r1);
    const LayerOutputs m = mlp_.forward(h, saved.mlp);
    const Tensor& r2 = o.apply_residual_connection_post_layernorm ? m.layernorm_output : h;
    TPCHECK_CHECK(r2.defined(), "TransformerLayer: the MLP did not return its layernorm output");
    y = combine(m.output, m.bias, r2);
  }
  if (output_norm_) y = output_norm_->forward(y, saved.output_norm).output;
  LayerOutputs out;
  out.output = y;
  return out;
}

Tensor TransformerLayer::backward(const OutputGrads& grads, Saved& saved) {
  const Options& o = options_;
  Backend& be = *ctx_.backend;
  TPCHECK_CHECK(grads.output.defined(), "TransformerLayer: backward needs the output gradient");
  Tensor dy = grads.output;
  if (output_norm_) {
    OutputGrads g;
    g.output = dy;
    dy = output_norm_->backward(g, saved.output_norm);
  }

  if (o.parallel_attention_mlp) {
    OutputGrads g;  // the biases were added inside the branches: no bias gradient here
    g.output = dy;
    Tensor dx = be.add(dy, attention_.backward(g, saved.attention));
    be.accumulate(dx, mlp_.backward(g, saved.mlp));
    return dx;
  }

  OutputGrads gm;
  gm.output = dy;
  if (o.params.bias) gm.bias = bias_output_grad(dy);
  if (o.apply_residual_connection_post_layernorm) gm.layernorm_output = dy;
  Tensor dh = mlp_.backward(gm, saved.mlp);
  if (!o.apply_residual_connection_post_layernorm) be.accumulate(dh, dy);

  OutputGrads ga;
  ga.output = dh;
  if (o.params.bias) ga.bias = bias_output_grad(dh);
  if (saved.residual_is_ln_a) ga.layernorm_output = dh;
  Tensor dx = attention_.backward(ga, saved.attention);
  if (!saved.residual_is_ln_a) be.accumulate(dx, dh);
  return dx;
}

}  // namespace tpcheck

// layernorm_mlp.cpp — LayerNormMLP: norm → fc1 (column) → activation → fc2 (row).
//
// fc1 and fc2 are always built column- and row-parallel: in a group of one rank every
// collective is the identity, so the unsharded twin runs the same code.
#include "tpcheck/layers/layernorm_mlp.h"

#include <nlohmann/json.hpp>

#include "layers/child_options.h"
#include "layers/json_options.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

LayerNorm::Options mlp_norm_options(const LayerNormMLP::Options& o, int tp) {
  TPCHECK_CHECK_INPUT(o.hidden_size > 0 && o.ffn_hidden_size > 0,
                      "LayerNormMLP: hidden_size {} and ffn_hidden_size {} must be positive",
                      o.hidden_size, o.ffn_hidden_size);
  TPCHECK_CHECK_INPUT(o.ffn_hidden_size % tp == 0,
                      "LayerNormMLP: ffn_hidden_size {} is not divisible by the tensor-parallel "
                      "size {}",
                      o.ffn_hidden_size, tp);
  return hidden_norm_options(o);
}

// gelu: the reference's default full-precision path (NVTE_BIAS_GELU_NVFUSION=1) runs the
// fc1 GEMM without bias and applies bias + gelu in one fused elementwise kernel (f32 math,
// one rounding); every other activation gets the bias in the GEMM epilogue.
bool bias_gelu_fusion(const LayerNormMLP::Options& o) { return o.activation == Activation::kGelu; }

Linear::Options fc1_options(const LayerNormMLP::Options& o) {
  const bool gated = is_gated(o.activation);
  Linear::Options l =
      block_linear_options(o, o.hidden_size, gated ? 2 * o.ffn_hidden_size : o.ffn_hidden_size,
                           ParallelMode::kColumn, o.site + ".fc1");
  if (gated) {
    l.weight_blocks = {o.ffn_hidden_size, o.ffn_hidden_size};  // a and b sharded separately
    l.one_block_mutation = Mutation::kGatedFc1OneBlock;
  }
  l.return_bias = o.params.bias && bias_gelu_fusion(o);  // kept out of the GEMM; added with gelu
  return l;
}

Linear::Options fc2_options(const LayerNormMLP::Options& o) {
  return output_linear_options(o, o.ffn_hidden_size, o.hidden_size, o.site + ".fc2");
}

}  // namespace

LayerNormMLP::Options LayerNormMLP::Options::from_json(const nlohmann::json& j) {
  OptionReader r(j, "LayerNormMLP");
  Options o;
  o.hidden_size = r.get_size("hidden_size", true);
  o.ffn_hidden_size = r.get_size("ffn_hidden_size", true);
  o.activation = r.get_activation(o.activation);
  o.norm = r.get_norm_options("eps");
  o.params = r.get_param_options();
  o.return_bias = r.get_bool("return_bias", o.return_bias);
  o.return_layernorm_output = r.get_bool("return_layernorm_output", o.return_layernorm_output);
  o.checkpoint = r.get_bool("checkpoint", o.checkpoint);
  o.output_layer_init_method =
      r.get_init_method("output_layer_init_method", o.output_layer_init_method);
  o.wgrad = r.get_wgrad_options(/*delay_is_a_key=*/true);
  o.sequence_parallel = r.get_bool("sequence_parallel", o.sequence_parallel);
  r.finish();
  return o;
}

LayerNormMLP::LayerNormMLP(std::string prefix, Options options, const ModuleContext& ctx)
    : options_(std::move(options)),
      ctx_(ctx),
      norm_(prefix + "layer_norm_", mlp_norm_options(options_, ctx.tp_size()), ctx),
      fc1_(prefix + "fc1_", fc1_options(options_), ctx),
      fc2_(prefix + "fc2_", fc2_options(options_), ctx) {}

Tensor LayerNormMLP::forward_to_activation(const Tensor& x, Saved& saved) {
  const Tensor ln = norm_.forward(x, saved.norm).output;
  const LayerOutputs fc1 = fc1_.forward(ln, saved.fc1);
  saved.fc1_output = fc1.output;
  saved.fc1_bias = fc1.bias;  // bias + gelu fusion only (else added in the GEMM)
  if (!bias_gelu_fusion(options_)) {
    return ctx_.backend->activation_forward(options_.activation, saved.fc1_output);
  }
  // gelu(h + b) in f32 (f64), rounded once to the storage dtype (Backend::bias_gelu_forward).
  return ctx_.backend->bias_gelu_forward(saved.fc1_output, saved.fc1_bias);
}

LayerOutputs LayerNormMLP::forward(const Tensor& x, Saved& saved) {
  Saved work;
  work.input = x;
  const Tensor a = forward_to_activation(x, work);
  LayerOutputs out = fc2_.forward(a, work.fc2);
  if (options_.return_layernorm_output) out.layernorm_output = work.norm.norm.y;
  if (options_.checkpoint) {
    saved = Saved();  // keep only the input; backward recomputes the rest
    saved.input = x;
  } else {
    saved = std::move(work);
  }
  return out;
}

Tensor LayerNormMLP::backward(const OutputGrads& grads, Saved& saved) {
  TPCHECK_CHECK(saved.input.defined(), "LayerNormMLP: backward before forward");
  if (options_.checkpoint) {
    const Tensor a = forward_to_activation(saved.input, saved);
    fc2_.save_input(a, saved.fc2);
  }
  OutputGrads fc2_grads;
  fc2_grads.output = grads.output;
  fc2_grads.bias = grads.bias;
  const Tensor da = fc2_.backward(fc2_grads, saved.fc2);
  OutputGrads fc1_grads;
  if (!bias_gelu_fusion(options_)) {
    fc1_grads.output = ctx_.backend->activation_backward(options_.activation, da, saved.fc1_output);
  } else {
    // The reference's fused bgrad + dgelu: gelu'(h + b) · da in f32 (f64), the input
    // gradient rounded once, the bias gradient summed over the tokens from the unrounded
    // values (and rounded once into the gradient).
    // (Backend::bias_gelu_backward; the bias gradient into a zeroed f32 (f64) buffer.)
    const DType wide = da.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    if (saved.fc1_bias.defined()) {
      fc1_grads.bias = Tensor::zeros({da.dim(-1)}, wide, da.device());
    }
    fc1_grads.output =
        ctx_.backend->bias_gelu_backward(da, saved.fc1_output, saved.fc1_bias, fc1_grads.bias);
  }
  Tensor dln = fc1_.backward(fc1_grads, saved.fc1);
  if (options_.return_layernorm_output) {
    TPCHECK_CHECK(grads.layernorm_output.defined(),
                  "LayerNormMLP: return_layernorm_output needs its gradient");
    ctx_.backend->accumulate(dln, grads.layernorm_output);
  }
  OutputGrads norm_grads;
  norm_grads.output = dln;
  return norm_.backward(norm_grads, saved.norm);
}

void LayerNormMLP::backward_dw(Saved& saved) {
  fc2_.backward_dw(saved.fc2);
  fc1_.backward_dw(saved.fc1);
}

std::vector<Parameter*> LayerNormMLP::parameters() {
  std::vector<Parameter*> ps = norm_.parameters();
  for (Parameter* p : fc1_.parameters()) ps.push_back(p);
  for (Parameter* p : fc2_.parameters()) ps.push_back(p);
  return ps;
}

ShardSpec LayerNormMLP::input_layout(int rank) const { return norm_.input_layout(rank); }

OutputLayout LayerNormMLP::output_layout(int rank) const {
  OutputLayout l = fc2_.output_layout(rank);
  l.layernorm_output = norm_.output_layout(rank).output;
  return l;
}

}  // namespace tpcheck

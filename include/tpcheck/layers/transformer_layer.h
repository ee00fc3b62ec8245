// tpcheck/layers/transformer_layer.h — TransformerLayer: self-attention and MLP with
// residual connections, in TransformerEngine's arrangement.
//
// docs/LAYERS.md ("TransformerLayer") is the contract:
//   a, a_b, ln_a = attention(x)
//   parallel_attention_mlp:  m, m_b = mlp(x);  y = x + ((a + a_b) + (m + m_b))
//   otherwise:               r1 = ln_a if apply_residual_connection_post_layernorm else x
//                            h = (a + a_b) + r1;  m, m_b, ln_m = mlp(h)
//                            r2 = ln_m if apply_residual_connection_post_layernorm else h
//                            y = (m + m_b) + r2
//   output_layernorm:        y = layernorm(y), and attention has no input norm (then
//                            r1 = x, as in TransformerEngine: there is no ln_a).
// Parameters, in order: `<prefix>self_attention.*` (MultiheadAttention),
// `<prefix>layernorm_mlp.*` (LayerNormMLP), `<prefix>layernorm.weight`,
// `<prefix>layernorm.bias` (output_layernorm; bias for LayerNorm only).
// Activations are [s, b, hidden] (SP: [s/N, b, hidden]); every addition happens after the
// row-parallel reductions, on full (or SP-local) tensors. Each residual addition is the
// reference's fused bias_dropout_add: residual + (out + bias) formed in f32, rounded once. Under SP the gradients of the
// returned biases (attention proj.bias, fc2_bias) are partial sums over the local tokens
// and are all-reduced here.
// Mutation::kResidualBeforeReduce (sharded runs only): every rank adds the residual to its
// partial sum before the attention-projection and fc2 reductions, so the output holds N
// copies of it. The reduction of the residual is done as its own collective (the sum of
// the ranks' (partial + r) equals the sum of partials plus the sum of N copies of r), so
// LayerNormMLP needs no hook for it.
// Thread safety: a layer object belongs to one rank.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tpcheck/layers/multihead_attention.h"
#include "tpcheck/layers/layernorm.h"
#include "tpcheck/layers/layernorm_mlp.h"
#include "tpcheck/layers/module.h"

namespace tpcheck {

class TransformerLayer {
 public:
  struct Options {
    std::int64_t hidden_size = 0;          // required (> 0)
    std::int64_t ffn_hidden_size = 0;      // required (> 0)
    std::int64_t num_attention_heads = 0;  // required (> 0)
    std::int64_t num_gqa_groups = 0;       // 0: one per head
    AttnMaskType self_attn_mask_type = AttnMaskType::kCausal;
    std::int64_t window_left = -1;
    std::int64_t window_right = -1;
    bool apply_residual_connection_post_layernorm = false;
    bool output_layernorm = false;
    bool parallel_attention_mlp = false;
    NormOptions norm;  // normalization, zero_centered_gamma, eps (key layernorm_epsilon)
    bool fuse_qkv_params = false;
    bool qkv_weight_interleaved = true;
    ParamOptions params;  // bias, init_method (QKV and fc1 weights), params_dtype
    Activation activation = Activation::kGelu;
    InitMethod output_layer_init_method = InitMethod::kNormal;  // proj and fc2 weights
    WgradOptions wgrad;  // fuse_wgrad_accumulation (delay_wgrad_compute must stay false)
    bool sequence_parallel = false;

    // Keys: hidden_size, ffn_hidden_size, num_attention_heads, num_gqa_groups,
    // self_attn_mask_type ("causal"|"no_mask"), window_size ([l, r]),
    // apply_residual_connection_post_layernorm, output_layernorm, parallel_attention_mlp,
    // normalization, zero_centered_gamma, layernorm_epsilon, fuse_qkv_params, qkv_weight_interleaved,
    // bias, activation, init_method, output_layer_init_method, fuse_wgrad_accumulation,
    // sequence_parallel, params_dtype. Throws Error(kInput) on an unknown key or a bad
    // value (naming it).
    static Options from_json(const nlohmann::json& j);
    // The reference's rules: parallel_attention_mlp excludes output_layernorm and
    // apply_residual_connection_post_layernorm; fuse_wgrad_accumulation requires
    // fuse_qkv_params. And wgrad.delay_wgrad_compute false (not a key here). Throws
    // Error(kInput) naming the options.
    void validate() const;
    // The attention's options for these.
    MultiheadAttention::Options attention() const;
    LayerNormMLP::Options mlp() const;
  };

  struct Saved {
    MultiheadAttention::Saved attention;
    LayerNormMLP::Saved mlp;
    LayerNorm::Saved output_norm;
    bool residual_is_ln_a = false;  // r1 = ln_a (else x)
  };

  // Throws Error(kInput) on inconsistent sizes (see MultiheadAttention, LayerNormMLP).
  TransformerLayer(std::string prefix, Options options, const ModuleContext& ctx);

  // x: [s, b, hidden] (SP: [s/N, b, hidden]); output the same shape.
  LayerOutputs forward(const Tensor& x, Saved& saved);
  Tensor backward(const OutputGrads& grads, Saved& saved);
  void backward_dw(Saved& saved) {}  // no delayed weight gradients here

  std::vector<Parameter*> parameters();
  const Options& options() const { return options_; }
  ShardSpec input_layout() const;
  OutputLayout output_layout() const;
  bool delays_wgrad() const { return false; }

 private:
  // Σ_rows dy as a bias gradient, all-reduced under SP (a partial sum over local tokens).
  Tensor bias_output_grad(const Tensor& dy);
  // (out + bias) + residual, with `out` a row-parallel output (already reduced) and
  // `bias` its returned bias (undefined without bias). Under kResidualBeforeReduce the
  // residual went into the reduction on every rank: (out + Σ_ranks residual) + bias.
  Tensor combine(const Tensor& out, const Tensor& bias, const Tensor& residual);

  Options options_;
  ModuleContext ctx_;
  MultiheadAttention attention_;
  LayerNormMLP mlp_;
  std::unique_ptr<LayerNorm> output_norm_;
};

}  // namespace tpcheck

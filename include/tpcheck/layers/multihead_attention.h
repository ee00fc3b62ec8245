// tpcheck/layers/multihead_attention.h — MultiheadAttention: input norm, QKV projection, scaled
// dot-product attention with GQA and masks, output projection.
//
// docs/LAYERS.md ("MultiheadAttention") is the contract. Parameters, in order (names are
// `<prefix>` + what follows; TransformerLayer uses the prefix "self_attention."):
//   layernorm_qkv.layer_norm_weight, layernorm_qkv.layer_norm_bias (LayerNorm only)
//       — absent without the input norm (the parent's output_layernorm);
//   fused (fuse_qkv_params): <qkv>.weight [(heads + 2g)·d, hidden], <qkv>.bias
//       interleaved (default): rows [g][heads/g + 2][d], sharded as one block (whole
//       groups per rank); not interleaved: [Q; K; V], shard blocks {heads·d, g·d, g·d};
//   separate (default): <qkv>.query_weight, key_weight, value_weight, then query_bias,
//       key_bias, value_bias, each sharded along dim 0;
//   proj.weight [hidden, heads·d] (row parallel), proj.bias [hidden] (replicated).
// where <qkv> is `layernorm_qkv` with the input norm and `qkv` without.
//
// Built from the generic layers: the QKV projection is one column-parallel
// LayerNormLinear (or Linear) either way — fused: one parameter whose shard blocks give
// the layout above; separate: the three parameters of Linear's parameters_split, run as
// one GEMM over their concatenated local shards [q; k; v], as the reference does. The
// output projection is a row-parallel Linear; with return_bias its bias is returned (the
// parent adds it), else added after the reduction. This class owns only the head split
// and the attention core. GEMM sites: `attn.qkv`, `attn.proj`.
//
// Tensor parallelism: each rank holds heads/N query heads and g/N key/value groups
// (query head i of a rank uses its local group i / (heads/g)). Sequence parallel: the
// input and output are token slices ([s/N, b, hidden]); the QKV Linears gather, the
// projection reduce-scatters.
// Mutation::kAttentionScaleLocal (sharded runs only) takes the softmax scale from the
// local head count, 1/sqrt(hidden / (heads/N)), instead of 1/sqrt(d).
// Mutation::kGqaWrongGroup (sharded, only where it can show: two or more local groups of
// two or more heads) maps local query head i to group i mod g/N instead of i / (heads/g).
// Mutation::kWindowOffset (sharded, ranks other than 0, no_mask sliding windows with a
// right bound) shifts the window one token: (l, r) → (l + 1, r − 1).
// Mutation::kQkvOneBlock (fused, not interleaved) takes the QKV rows as one block.
// Thread safety: a layer object belongs to one rank.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tpcheck/layers/layernorm.h"
#include "tpcheck/layers/layernorm_linear.h"
#include "tpcheck/layers/linear.h"
#include "tpcheck/layers/module.h"

namespace tpcheck {

enum class AttnMaskType { kCausal, kNoMask };
std::string_view attn_mask_type_name(AttnMaskType t);      // "causal", "no_mask"
AttnMaskType parse_attn_mask_type(std::string_view name);  // throws Error(kInput)

// The reference's window rule (check_set_window_size): causal: (-1, -1) → (-1, 0),
// (l >= 0, r) → (l, 0), (-1, 0) and (l >= 0, 0) kept, anything else rejected; no_mask:
// (-1, 0) → (-1, -1) (no mask), (-1, -1) and (>= 0, >= 0) kept, a single -1 rejected.
// Throws Error(kInput) naming the window and the mask type.
void normalize_window_size(AttnMaskType mask, std::int64_t& left, std::int64_t& right);

class MultiheadAttention {
 public:
  struct Options {
    std::int64_t hidden_size = 0;          // required (> 0)
    std::int64_t num_attention_heads = 0;  // required (> 0), divides hidden_size
    std::int64_t num_gqa_groups = 0;       // 0: = num_attention_heads; divides the heads
    AttnMaskType attn_mask_type = AttnMaskType::kCausal;
      // (left, right); -1 is unbounded. Normalized by normalize_window_size.
    std::int64_t window_left = -1;
    std::int64_t window_right = -1;
    bool input_layernorm = false;          // the reference's default; TransformerLayer: true
                                           // unless output_layernorm
    bool return_bias = false;              // TransformerLayer: true unless parallel_attention_mlp
    bool return_layernorm_output = false;  // returns ln (the local slice under SP)
    NormOptions norm;  // normalization, zero_centered_gamma, eps (key layernorm_epsilon)
    bool fuse_qkv_params = false;
    bool qkv_weight_interleaved = true;
    ParamOptions params;  // bias, init_method (QKV weights), params_dtype
    InitMethod output_layer_init_method = InitMethod::kNormal;  // proj.weight
    WgradOptions wgrad;  // fuse_wgrad_accumulation (delay_wgrad_compute must stay false)
    bool sequence_parallel = false;

    std::int64_t groups() const {
      return num_gqa_groups > 0 ? num_gqa_groups : num_attention_heads;
    }
    std::int64_t head_dim() const { return hidden_size / num_attention_heads; }

    // Keys: hidden_size, num_attention_heads, num_gqa_groups, self_attn_mask_type (or TE's
    // MultiheadAttention name attn_mask_type; "causal"|"no_mask"), window_size ([l, r]),
    // input_layernorm, return_bias, return_layernorm_output, normalization,
    // zero_centered_gamma, layernorm_epsilon,
    // fuse_qkv_params, qkv_weight_interleaved, bias, init_method, output_layer_init_method
    // ("normal"|"constant"), fuse_wgrad_accumulation, sequence_parallel, params_dtype.
    // Throws Error(kInput) on an unknown key or a bad value (naming it).
    static Options from_json(const nlohmann::json& j);
    // Sizes consistent with each other and with a TP group of `tp_size`, and
    // wgrad.delay_wgrad_compute false; throws Error(kInput) naming the value and what was
    // expected.
    void validate(int tp_size) const;
  };

  struct Saved {
    std::int64_t seq = 0;             // full sequence length (after the SP gather)
    LayerNormLinear::Saved qkv_ln;    // with input norm
    Linear::Saved qkv;                // without input norm
    Tensor q, k, v;                   // [s, b, heads/N, d], [s, b, g/N, d] x2
    AttentionForward attention;
    Linear::Saved proj;
  };

  // Creates the parameters (see the file comment). Throws Error(kInput) on inconsistent
  // sizes (heads not dividing hidden, groups not dividing heads, N not dividing heads
  // or groups, ...).
  MultiheadAttention(std::string prefix, Options options, const ModuleContext& ctx);
  ~MultiheadAttention();
  MultiheadAttention(MultiheadAttention&&) noexcept;

  // x: [s, b, hidden] (SP: [s/N, b, hidden]). Returns output (projection, reduced; the
  // bias added after the reduction unless returned) of x's shape, bias = proj.bias (with
  // bias and return_bias), layernorm_output (when asked).
  LayerOutputs forward(const Tensor& x, Saved& saved);
  // grads.output like the output; grads.bias the gradient of the returned bias (whole);
  // grads.layernorm_output when it was returned. Returns dx.
  Tensor backward(const OutputGrads& grads, Saved& saved);
  void backward_dw(Saved& saved) {}  // no delayed weight gradients here

  std::vector<Parameter*> parameters();
  const Options& options() const { return options_; }
  // For [s, b, hidden] tensors: SP → split along dim 0, else replicated.
  ShardSpec input_layout() const;
  OutputLayout output_layout() const;
  bool delays_wgrad() const { return false; }
  // The softmax scale this rank uses (1/sqrt(d), or the mutated local-head value).
  double softmax_scale() const;
  AttentionMask mask() const;

 private:
  Options options_;
  ModuleContext ctx_;
  std::string prefix_;
  std::int64_t local_heads_ = 0;
  std::int64_t local_groups_ = 0;
  // Exactly one exists: qkv_ln_ (with the input norm) or qkv_ (without).
  std::unique_ptr<LayerNormLinear> qkv_ln_;
  std::unique_ptr<Linear> qkv_;
  std::unique_ptr<Linear> proj_;
};

}  // namespace tpcheck

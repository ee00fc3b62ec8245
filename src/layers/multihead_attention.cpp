// multihead_attention.cpp — MultiheadAttention
// (include/tpcheck/layers/multihead_attention.h): the QKV head split, the attention core
// and the wiring of the generic layers around it.
//
// Buffers (T = s·b tokens, s outer; hl = heads/N, gl = g/N local heads and groups,
// hg = heads/g query heads per group, d = head dim):
//   x, dx       [s, b, hidden]       (SP: [s/N, b, hidden])
//   qkv         [s, b, gl·(hg+2)·d]  fused interleaved: per group hg query heads, k, v
//               [s, b, hl·d + 2·gl·d] fused, not interleaved: [q | k | v]
//   q, dq       [s, b, hl, d];  k, v, dk, dv [s, b, gl, d]
//   o, do       [s, b, hl, d] → viewed [s, b, hl·d] as the projection's features slice
// Thread safety: a layer object belongs to one rank.
#include "tpcheck/layers/multihead_attention.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "layers/child_options.h"
#include "layers/json_options.h"
#include "tpcheck/error.h"

namespace tpcheck {

std::string_view attn_mask_type_name(AttnMaskType t) {
  return t == AttnMaskType::kCausal ? "causal" : "no_mask";
}

AttnMaskType parse_attn_mask_type(std::string_view name) {
  if (name == "causal") return AttnMaskType::kCausal;
  if (name == "no_mask") return AttnMaskType::kNoMask;
  TPCHECK_CHECK_INPUT(false, "unknown attention mask type '{}'; expected 'causal' or 'no_mask'",
                      name);
  return AttnMaskType::kCausal;  // unreachable
}

void normalize_window_size(AttnMaskType mask, std::int64_t& left, std::int64_t& right) {
  // TransformerEngine's check_set_window_size: causal takes (-1, 0) or (>= 0, 0), no_mask
  // (-1, -1) or (>= 0, >= 0); the forms it corrects are corrected, the rest rejected.
  if (mask == AttnMaskType::kCausal) {
    if ((left == -1 && right == -1) || (left >= 0 && right != 0)) {
      right = 0;  // (-1, -1) → (-1, 0); (l, r) → (l, 0)
      return;
    }
    TPCHECK_CHECK_INPUT(
        (left == -1 || left >= 0) && right == 0,
        "window_size ({}, {}) with self_attn_mask_type causal: expected (-1, 0) or (>= 0, 0) "
        "(or (-1, -1), or (l >= 0, r), which become (-1, 0) and (l, 0))",
        left, right);
    return;
  }
  if (left == -1 && right == 0) {
    right = -1;  // (-1, 0) with no_mask means no mask at all
    return;
  }
  TPCHECK_CHECK_INPUT(
      (left == -1 && right == -1) || (left >= 0 && right >= 0),
      "window_size ({}, {}) with self_attn_mask_type no_mask: expected (-1, -1) or (>= 0, >= 0) "
      "(or (-1, 0), which means no mask); a single unbounded side is not supported",
      left, right);
}

MultiheadAttention::Options MultiheadAttention::Options::from_json(const nlohmann::json& j) {
  OptionReader r(j, "MultiheadAttention");
  Options o;
  r.get_attention_shape(o);
  const std::vector<std::string_view> masks = {"causal", "no_mask"};
  o.attn_mask_type = parse_attn_mask_type(
      r.get_choice("attn_mask_type", r.get_choice("self_attn_mask_type", "causal", masks), masks));
  o.input_layernorm = r.get_bool("input_layernorm", o.input_layernorm);
  o.return_bias = r.get_bool("return_bias", o.return_bias);
  o.return_layernorm_output = r.get_bool("return_layernorm_output", o.return_layernorm_output);
  o.norm = r.get_norm_options("layernorm_epsilon");
  o.fuse_qkv_params = r.get_bool("fuse_qkv_params", o.fuse_qkv_params);
  o.qkv_weight_interleaved = r.get_bool("qkv_weight_interleaved", o.qkv_weight_interleaved);
  o.params = r.get_param_options();
  o.output_layer_init_method =
      r.get_init_method("output_layer_init_method", o.output_layer_init_method);
  o.wgrad = r.get_wgrad_options(/*delay_is_a_key=*/false);
  o.sequence_parallel = r.get_bool("sequence_parallel", o.sequence_parallel);
  r.finish();
  normalize_window_size(o.attn_mask_type, o.window_left, o.window_right);
  o.validate(1);
  return o;
}

void MultiheadAttention::Options::validate(int tp_size) const {
  TPCHECK_CHECK_INPUT(hidden_size > 0, "hidden_size must be positive, got {}", hidden_size);
  TPCHECK_CHECK_INPUT(num_attention_heads > 0, "num_attention_heads must be positive, got {}",
                      num_attention_heads);
  TPCHECK_CHECK_INPUT(hidden_size % num_attention_heads == 0,
                      "num_attention_heads {} must divide hidden_size {}", num_attention_heads,
                      hidden_size);
  TPCHECK_CHECK_INPUT(num_gqa_groups >= 0,
                      "num_gqa_groups must be positive (or 0 for one per head), got {}",
                      num_gqa_groups);
  TPCHECK_CHECK_INPUT(num_attention_heads % groups() == 0,
                      "num_gqa_groups {} must divide num_attention_heads {}", groups(),
                      num_attention_heads);
  TPCHECK_CHECK_INPUT(window_left >= -1 && window_right >= -1,
                      "window_size bounds must be >= -1 (-1: unbounded), got ({}, {})", window_left,
                      window_right);
  // Not a JSON key here, but settable in C++: backward_dw is a no-op, so Linears that
  // delayed their weight gradients would never compute them.
  TPCHECK_CHECK_INPUT(!wgrad.delay_wgrad_compute,
                      "MultiheadAttention: delay_wgrad_compute is not supported (its backward "
                      "computes every weight gradient); expected false");
  TPCHECK_CHECK_INPUT(norm.eps > 0, "layernorm_epsilon must be positive, got {}", norm.eps);
  TPCHECK_CHECK_INPUT(num_attention_heads % tp_size == 0,
                      "num_attention_heads {} is not divisible by the tensor-parallel size {}; "
                      "expected a multiple of {}",
                      num_attention_heads, tp_size, tp_size);
  TPCHECK_CHECK_INPUT(groups() % tp_size == 0,
                      "num_gqa_groups {} is not divisible by the tensor-parallel size {}; "
                      "expected a multiple of {}",
                      groups(), tp_size, tp_size);
}

namespace {

// Mutation::kGqaWrongGroup: query head i must use local group i / hg (the reference's
// repeat_interleave order); the bug uses group i mod gl (torch's `repeat` order). The
// backend maps position p to group p / hg, so the bug runs as a head permutation around
// the core: position p = grp·hg + m holds head m·gl + grp, whose group is then grp =
// head mod gl. Empty (no permutation) when the bug cannot show: one local group or one
// head per group, where both orders agree — as in every `te` case.
std::vector<std::int64_t> wrong_group_order(std::int64_t hl, std::int64_t gl) {
  const std::int64_t hg = hl / gl;
  if (gl < 2 || hg < 2) return {};
  std::vector<std::int64_t> order(hl);
  for (std::int64_t grp = 0; grp < gl; ++grp) {
    for (std::int64_t m = 0; m < hg; ++m) order[grp * hg + m] = m * gl + grp;
  }
  return order;
}

// out[:, :, p] = t[:, :, order[p]] for t [s, b, heads, d].
Tensor gather_heads(const Tensor& t, const std::vector<std::int64_t>& order) {
  std::vector<Tensor> parts;
  for (std::int64_t h : order) parts.push_back(t.slice(2, h, 1));
  return Tensor::cat(parts, 2);
}

// The inverse of gather_heads: out[:, :, order[p]] = t[:, :, p].
Tensor scatter_heads(const Tensor& t, const std::vector<std::int64_t>& order) {
  std::vector<std::int64_t> inverse(order.size());
  for (std::size_t p = 0; p < order.size(); ++p) inverse[order[p]] = static_cast<std::int64_t>(p);
  return gather_heads(t, inverse);
}

}  // namespace

MultiheadAttention::MultiheadAttention(std::string prefix, Options options,
                                       const ModuleContext& ctx)
    : options_(std::move(options)), ctx_(ctx), prefix_(std::move(prefix)) {
  normalize_window_size(options_.attn_mask_type, options_.window_left, options_.window_right);
  const Options& o = options_;
  o.validate(ctx_.tp_size());
  const std::int64_t d = o.head_dim(), heads = o.num_attention_heads, g = o.groups();
  local_heads_ = heads / ctx_.tp_size();
  local_groups_ = g / ctx_.tp_size();
  const std::string qkv_prefix = prefix_ + (o.input_layernorm ? "layernorm_qkv." : "qkv.");

  // One projection either way, as the reference: fused, one parameter; separate, the
  // three parameters of parameters_split, still one GEMM per pass (site attn.qkv).
  Linear::Options l = block_linear_options(o, o.hidden_size, (heads + 2 * g) * d,
                                           ParallelMode::kColumn, "attn.qkv");
  if (!o.fuse_qkv_params) {
    l.parameters_split = {{"query", heads * d}, {"key", g * d}, {"value", g * d}};
  } else if (!o.qkv_weight_interleaved) {
    // Interleaved: whole groups are contiguous, so one block; otherwise Q, K, V are
    // sharded separately.
    l.weight_blocks = {heads * d, g * d, g * d};
    l.one_block_mutation = Mutation::kQkvOneBlock;
  }
  if (o.input_layernorm) {
    LayerNormLinear::Options n;
    copy_linear_fields(l, n);
    n.norm = o.norm;
    n.return_layernorm_output = o.return_layernorm_output;
    qkv_ln_ = std::make_unique<LayerNormLinear>(qkv_prefix, n, ctx_);
  } else {
    qkv_ = std::make_unique<Linear>(qkv_prefix, l, ctx_);
  }

  proj_ = std::make_unique<Linear>(
      prefix_ + "proj.", output_linear_options(o, heads * d, o.hidden_size, "attn.proj"), ctx_);
}

MultiheadAttention::~MultiheadAttention() = default;
MultiheadAttention::MultiheadAttention(MultiheadAttention&&) noexcept = default;

double MultiheadAttention::softmax_scale() const {
  if (ctx_.mutated(Mutation::kAttentionScaleLocal)) {
    // The bug: the head dimension computed as hidden / (local heads).
    return 1.0 /
           std::sqrt(static_cast<double>(options_.hidden_size) / static_cast<double>(local_heads_));
  }
  return 1.0 / std::sqrt(static_cast<double>(options_.head_dim()));
}

AttentionMask MultiheadAttention::mask() const {
  AttentionMask m;
  if (options_.attn_mask_type == AttnMaskType::kCausal) {
    // TransformerEngine's rule: with a causal mask the right bound is 0.
    m.type = AttentionMask::Type::kCausal;
    m.window_left = options_.window_left;
    m.window_right = 0;
  } else if (options_.window_left >= 0 || options_.window_right >= 0) {
    m.type = AttentionMask::Type::kSlidingWindow;
    m.window_left = options_.window_left;
    m.window_right = options_.window_right;
    if (ctx_.mutated(Mutation::kWindowOffset) && ctx_.rank() > 0 && m.window_right > 0) {
      // The bug: the window's diagonal one token off on ranks other than 0 (keys
      // [i - l - 1, i + r - 1] instead of [i - l, i + r]).
      m.window_left += 1;
      m.window_right -= 1;
    }
  } else {
    m.type = AttentionMask::Type::kNoMask;
  }
  return m;
}

ShardSpec MultiheadAttention::input_layout() const {
  return options_.sequence_parallel && ctx_.tp_size() > 1 ? ShardSpec::along(0)
                                                          : ShardSpec::replicated();
}

OutputLayout MultiheadAttention::output_layout() const {
  return OutputLayout{input_layout(), ShardSpec::replicated(), input_layout()};
}

std::vector<Parameter*> MultiheadAttention::parameters() {
  std::vector<Parameter*> out = qkv_ln_ ? qkv_ln_->parameters() : qkv_->parameters();
  for (Parameter* p : proj_->parameters()) out.push_back(p);
  return out;
}

LayerOutputs MultiheadAttention::forward(const Tensor& x, Saved& saved) {
  const Options& o = options_;
  TPCHECK_CHECK_INPUT(x.rank() == 3 && x.dim(2) == o.hidden_size,
                      "MultiheadAttention: input must be [s, b, {}], got {}", o.hidden_size,
                      x.describe());
  const std::int64_t sp = input_layout().is_replicated() ? 1 : ctx_.tp_size();
  const std::int64_t s = x.dim(0) * sp, b = x.dim(1), d = o.head_dim();
  const std::int64_t hl = local_heads_, gl = local_groups_, hg = hl / gl;
  saved.seq = s;

  LayerOutputs out;
  LayerOutputs qkv;
  if (qkv_ln_) {
    qkv = qkv_ln_->forward(x, saved.qkv_ln);
    out.layernorm_output = qkv.layernorm_output;
  } else {
    qkv = qkv_->forward(x, saved.qkv);
  }
  TPCHECK_CHECK(qkv.output.numel() == s * b * (hl + 2 * gl) * d,
                "QKV output {} has an unexpected size", qkv.output.describe());
  if (o.fuse_qkv_params && o.qkv_weight_interleaved) {
    const Tensor t = qkv.output.reshape({s * b, gl, hg + 2, d});
    saved.q = t.slice(2, 0, hg).reshape({s, b, hl, d});
    saved.k = t.slice(2, hg, 1).reshape({s, b, gl, d});
    saved.v = t.slice(2, hg + 1, 1).reshape({s, b, gl, d});
  } else {
    // [q | k | v]: fused not interleaved, and the separate parameters' concatenation.
    const Tensor t = qkv.output.reshape({s * b, (hl + 2 * gl) * d});
    saved.q = t.slice(1, 0, hl * d).reshape({s, b, hl, d});
    saved.k = t.slice(1, hl * d, gl * d).reshape({s, b, gl, d});
    saved.v = t.slice(1, (hl + gl) * d, gl * d).reshape({s, b, gl, d});
  }

  const std::vector<std::int64_t> wrong_order =
      ctx_.mutated(Mutation::kGqaWrongGroup) ? wrong_group_order(hl, gl)
                                             : std::vector<std::int64_t>();
  if (!wrong_order.empty()) saved.q = gather_heads(saved.q, wrong_order);
  saved.attention =
      ctx_.backend->attention_forward(saved.q, saved.k, saved.v, mask(), softmax_scale());
  const Tensor o_heads = wrong_order.empty() ? saved.attention.out
                                             : scatter_heads(saved.attention.out, wrong_order);
  LayerOutputs proj = proj_->forward(o_heads.reshape({s, b, hl * d}), saved.proj);
  out.output = proj.output;
  out.bias = proj.bias;
  return out;
}

Tensor MultiheadAttention::backward(const OutputGrads& grads, Saved& saved) {
  const Options& o = options_;
  const std::int64_t s = saved.seq, d = o.head_dim();
  const std::int64_t hl = local_heads_, gl = local_groups_, hg = hl / gl;
  const std::int64_t b = saved.q.dim(1);

  OutputGrads proj_grads;
  proj_grads.output = grads.output;
  proj_grads.bias = grads.bias;
  const std::vector<std::int64_t> wrong_order =
      ctx_.mutated(Mutation::kGqaWrongGroup) ? wrong_group_order(hl, gl)
                                             : std::vector<std::int64_t>();
  Tensor d_o = proj_->backward(proj_grads, saved.proj).reshape({s, b, hl, d});
  if (!wrong_order.empty()) d_o = gather_heads(d_o, wrong_order);
  AttentionGrads g = ctx_.backend->attention_backward(d_o, saved.q, saved.k, saved.v,
                                                      saved.attention, mask(), softmax_scale());
  if (!wrong_order.empty()) g.dq = scatter_heads(g.dq, wrong_order);

  Tensor dqkv;
  if (o.fuse_qkv_params && o.qkv_weight_interleaved) {
    // The three slices below cover it (hg + 1 + 1 along dim 2).
    dqkv = Tensor::empty({s * b, gl, hg + 2, d}, g.dq.dtype(), g.dq.device());
    dqkv.write_slice(2, 0, g.dq.reshape({s * b, gl, hg, d}));
    dqkv.write_slice(2, hg, g.dk.reshape({s * b, gl, 1, d}));
    dqkv.write_slice(2, hg + 1, g.dv.reshape({s * b, gl, 1, d}));
  } else {
    dqkv = Tensor::cat({g.dq.reshape({s * b, hl * d}), g.dk.reshape({s * b, gl * d}),
                        g.dv.reshape({s * b, gl * d})},
                       1);
  }
  OutputGrads qkv_grads;
  qkv_grads.output = dqkv.reshape({s, b, (hl + 2 * gl) * d});
  if (qkv_ln_) {
    qkv_grads.layernorm_output = grads.layernorm_output;
    return qkv_ln_->backward(qkv_grads, saved.qkv_ln);
  }
  return qkv_->backward(qkv_grads, saved.qkv);
}

}  // namespace tpcheck

// any_layer.cpp — make_layer: the kind → typed layer dispatch, and the adapter.
//
// Adding a kind: one `if` line in make_layer and its name in layer_kinds().
#include "tpcheck/layers/any_layer.h"

#include <fmt/ranges.h>

#include <array>

#include "layers/tp_ops.h"
#include "tpcheck/error.h"
#include "tpcheck/layers/multihead_attention.h"
#include "tpcheck/layers/layernorm.h"
#include "tpcheck/layers/layernorm_linear.h"
#include "tpcheck/layers/layernorm_mlp.h"
#include "tpcheck/layers/linear.h"
#include "tpcheck/layers/transformer_layer.h"

namespace tpcheck {
namespace {

// The layer's context, with `scaling` as the delayed-scaling state its Linears keep.
ModuleContext with_scaling(ModuleContext ctx, DelayedScalingSet* scaling) {
  ctx.delayed_scaling = scaling;
  return ctx;
}

// Holds a typed layer, its Saved state between forward and backward, and the delayed-
// scaling state its Linears keep across steps.
template <typename Layer>
class LayerAdapter final : public AnyLayer {
 public:
  LayerAdapter(typename Layer::Options options, const ModuleContext& ctx)
      : ctx_(with_scaling(ctx, &scaling_)), layer_("", std::move(options), ctx_) {}

  std::vector<Parameter*> parameters() override { return layer_.parameters(); }
  LayerOutputs forward(const Tensor& x) override {
    saved_ = typename Layer::Saved();
    return layer_.forward(x, saved_);
  }
  Tensor backward(const OutputGrads& grads) override { return layer_.backward(grads, saved_); }
  void backward_dw() override { layer_.backward_dw(saved_); }
  void update_scaling() override { update_delayed_scaling(ctx_, scaling_); }
  const DelayedScalingSet& scaling_state() const override { return scaling_; }
  OutputLayout output_layout() const override { return layer_.output_layout(); }
  ShardSpec input_layout() const override { return layer_.input_layout(); }
  bool delays_wgrad() const override { return layer_.delays_wgrad(); }

 private:
  DelayedScalingSet scaling_;  // before ctx_ and layer_: the Linears keep pointers into it
  ModuleContext ctx_;
  Layer layer_;
  typename Layer::Saved saved_;
};

template <typename Layer>
std::unique_ptr<AnyLayer> adapt(typename Layer::Options options, const ModuleContext& ctx) {
  return std::make_unique<LayerAdapter<Layer>>(std::move(options), ctx);
}

// The kind fixes the normalization; an explicit, different "normalization" is an error.
LayerNorm::Options norm_options(const LayerSpec& spec, NormKind kind) {
  nlohmann::json j = spec.options.is_null() ? nlohmann::json::object() : spec.options;
  if (j.is_object() && j.contains("normalization")) {
    TPCHECK_CHECK_INPUT(j["normalization"] == norm_kind_name(kind),
                        "{}: option normalization {} contradicts the layer kind", spec.kind,
                        j["normalization"].dump());
  }
  LayerNorm::Options o = LayerNorm::Options::from_json(j);
  o.norm.normalization = kind;
  return o;
}

}  // namespace

std::span<const std::string_view> layer_kinds() {
  static constexpr std::array<std::string_view, 7> kKinds = {
      "Linear",       "LayerNorm",          "RMSNorm",         "LayerNormLinear",
      "LayerNormMLP", "MultiheadAttention", "TransformerLayer"};
  return kKinds;
}

std::unique_ptr<AnyLayer> make_layer(const LayerSpec& spec, const ModuleContext& ctx) {
  const std::string& k = spec.kind;
  if (k == "Linear") return adapt<Linear>(Linear::Options::from_json(spec.options), ctx);
  if (k == "LayerNorm") return adapt<LayerNorm>(norm_options(spec, NormKind::kLayerNorm), ctx);
  if (k == "RMSNorm") return adapt<LayerNorm>(norm_options(spec, NormKind::kRMSNorm), ctx);
  if (k == "LayerNormLinear")
    return adapt<LayerNormLinear>(LayerNormLinear::Options::from_json(spec.options), ctx);
  if (k == "LayerNormMLP")
    return adapt<LayerNormMLP>(LayerNormMLP::Options::from_json(spec.options), ctx);
  if (k == "MultiheadAttention")
    return adapt<MultiheadAttention>(MultiheadAttention::Options::from_json(spec.options), ctx);
  if (k == "TransformerLayer")
    return adapt<TransformerLayer>(TransformerLayer::Options::from_json(spec.options), ctx);
  TPCHECK_CHECK_INPUT(false, "unknown layer kind '{}'; expected one of: {}", k,
                      fmt::join(layer_kinds(), ", "));
  return nullptr;  // unreachable
}

}  // namespace tpcheck

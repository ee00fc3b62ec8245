// tpcheck/layers/any_layer.h — one interface over every layer, chosen by name.
//
// The suite and the test tools run layers without knowing their types: a LayerSpec
// (kind + JSON options, the keys documented on each layer's Options::from_json) makes
// an AnyLayer that owns the typed layer, the Saved state between forward and backward,
// and the quantization state kept across training steps (FP8 delayed scaling's amax
// histories). Parameter names carry no prefix ("weight", "fc1_weight", ...).
// Thread safety: a layer object belongs to one rank.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/layers/module.h"

namespace tpcheck {

struct LayerSpec {
  std::string kind;  // "Linear", "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP"
  nlohmann::json options = nlohmann::json::object();
};

class AnyLayer {
 public:
  virtual ~AnyLayer() = default;
  // Documented stable order.
  virtual std::vector<Parameter*> parameters() = 0;
  // x in input_layout() (this rank's piece). Keeps what backward needs.
  virtual LayerOutputs forward(const Tensor& x) = 0;
  // REQUIRES: forward ran. Returns dx (input_layout()); accumulates parameter gradients.
  virtual Tensor backward(const OutputGrads& grads) = 0;
  // Weight gradients when delays_wgrad(); otherwise a no-op.
  virtual void backward_dw() = 0;
  // After a training step (forward, backward, the optimizer's update): the quantization
  // state of the next step. Under FP8 delayed scaling every amax recorded this step is
  // max-reduced across the group (one all-reduce) and each amax history updated, so the
  // next step's scales come from it; for other recipes, nothing (no collective).
  virtual void update_scaling() = 0;
  // The quantization state the layer keeps across steps (FP8 delayed scaling's scales and
  // amax histories; empty for other recipes). After update_scaling every rank of a group
  // must hold the same bits: the suite compares it across ranks (ReplicatedState).
  virtual const DelayedScalingSet& scaling_state() const = 0;
  // Layouts for the tensors as the layer sees them (rank-2 [T, features] for Linear,
  // norms, LayerNormLinear, LayerNormMLP).
  virtual OutputLayout output_layout() const = 0;
  virtual ShardSpec input_layout() const = 0;
  virtual bool delays_wgrad() const = 0;
};

// The kinds make_layer knows, in a stable order.
std::span<const std::string_view> layer_kinds();

// Throws Error(kInput) for an unknown kind (listing the kinds) or bad options.
std::unique_ptr<AnyLayer> make_layer(const LayerSpec& spec, const ModuleContext& ctx);

}  // namespace tpcheck

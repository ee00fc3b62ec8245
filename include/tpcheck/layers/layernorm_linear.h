// tpcheck/layers/layernorm_linear.h — LayerNormLinear: a norm followed by a Linear.
//
// docs/LAYERS.md ("LayerNormLinear"). Parameters, in order: `<prefix>layer_norm_weight`,
// `<prefix>layer_norm_bias` (LayerNorm only), `<prefix>weight`, `<prefix>bias`.
// `ln = norm(x)`, `y = Linear(ln)`, column-parallel or unsharded (row is rejected).
// Under SP the norm runs on the local token slice and the Linear gathers `ln`;
// return_layernorm_output returns the local slice. Backward: d ln = dgrad of the
// Linear + the layernorm_output gradient, then the norm's backward.
// Composition: a LayerNorm (prefix `<prefix>layer_norm_`) and a Linear (prefix `<prefix>`).
// Thread safety: a layer object belongs to one rank.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tpcheck/layers/layernorm.h"
#include "tpcheck/layers/linear.h"
#include "tpcheck/layers/module.h"

namespace tpcheck {

class LayerNormLinear {
 public:
  struct Options {
    std::int64_t in_features = 0;   // required (> 0)
    std::int64_t out_features = 0;  // required (> 0)
    NormOptions norm;               // normalization, zero_centered_gamma, eps
    bool return_layernorm_output = false;
    ParamOptions params;  // bias, init_method, params_dtype
    bool return_bias = false;
    ParallelMode parallel_mode = ParallelMode::kNone;  // kNone or kColumn
    bool sequence_parallel = false;
    WgradOptions wgrad;                       // fuse_wgrad_accumulation, delay_wgrad_compute
    std::string site = "linear";              // not a JSON key: parents set it
    std::vector<std::int64_t> weight_blocks;  // not a JSON key; see Linear::Options
    Mutation one_block_mutation = Mutation::kNone;  // not a JSON key; see Linear::Options
    std::vector<Linear::Options::Split> parameters_split;  // not a JSON key; see Linear::Options

    // Keys: in_features, out_features, normalization, zero_centered_gamma, eps,
    // return_layernorm_output, bias, return_bias, parallel_mode ("none"|"column"),
    // sequence_parallel, init_method, fuse_wgrad_accumulation, delay_wgrad_compute,
    // params_dtype. Throws Error(kInput) on an unknown key or bad value (row mode too).
    static Options from_json(const nlohmann::json& j);
  };

  struct Saved {
    LayerNorm::Saved norm;
    Linear::Saved linear;
  };

  LayerNormLinear(std::string prefix, Options options, const ModuleContext& ctx);

  // x: [..., in] (SP: the local token slice along dim 0).
  LayerOutputs forward(const Tensor& x, Saved& saved);
  Tensor backward(const OutputGrads& grads, Saved& saved);
  void backward_dw(Saved& saved);

  std::vector<Parameter*> parameters();
  const Options& options() const { return options_; }
  LayerNorm& norm() { return norm_; }
  Linear& linear() { return linear_; }
  ShardSpec input_layout(int rank = 2) const;
  OutputLayout output_layout(int rank = 2) const;
  bool delays_wgrad() const { return options_.wgrad.delay_wgrad_compute; }

 private:
  static LayerNorm::Options norm_options(const Options& o);
  static Linear::Options linear_options(const Options& o);

  Options options_;
  ModuleContext ctx_;
  LayerNorm norm_;
  Linear linear_;
};

}  // namespace tpcheck

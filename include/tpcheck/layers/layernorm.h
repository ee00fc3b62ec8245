// tpcheck/layers/layernorm.h — LayerNorm and RMSNorm over the last dimension.
//
// docs/LAYERS.md ("LayerNorm, RMSNorm"). Parameters, in order: `<prefix>weight`
// [hidden]; `<prefix>bias` [hidden] (LayerNorm only). Both are replicated. Under
// sequence parallel the input is a token slice and the parameter gradients, partial
// sums over that slice, are all-reduced across the group in backward.
// One class serves both kinds (Options::norm.normalization); make_layer maps the kinds
// "LayerNorm" and "RMSNorm" onto it.
// Thread safety: a layer object belongs to one rank.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tpcheck/layers/module.h"
#include "tpcheck/layers/option_groups.h"

namespace tpcheck {

class LayerNorm {
 public:
  struct Options {
    std::int64_t hidden_size = 0;  // required (> 0)
    NormOptions norm;              // normalization, zero_centered_gamma, eps
    bool sequence_parallel = false;
    DType params_dtype = DType::kF32;

    // Keys: normalized_shape (the reference's name; hidden_size is an alias), normalization ("LayerNorm"|"RMSNorm"), eps, zero_centered_gamma,
    // sequence_parallel, params_dtype. Throws Error(kInput) on an unknown key or bad value.
    static Options from_json(const nlohmann::json& j);
  };

  struct Saved {
    Tensor input;      // x as given
    NormForward norm;  // y, mean, rstd
  };

  // Parameters `<prefix>weight`, `<prefix>bias` (LayerNorm only).
  LayerNorm(std::string prefix, Options options, const ModuleContext& ctx);

  // x: [..., hidden] (SP: the local token slice). output: same shape.
  LayerOutputs forward(const Tensor& x, Saved& saved);
  // Returns dx; accumulates weight/bias gradients (all-reduced under SP).
  Tensor backward(const OutputGrads& grads, Saved& saved);
  void backward_dw(Saved& saved) {}  // norms have no delayed weight gradient

  std::vector<Parameter*> parameters();
  const Options& options() const { return options_; }
  ShardSpec input_layout(int rank = 2) const;
  OutputLayout output_layout(int rank = 2) const;
  bool delays_wgrad() const { return false; }

 private:
  Options options_;
  ModuleContext ctx_;
  Parameter weight_;
  Parameter bias_;  // undefined value for RMSNorm
};

}  // namespace tpcheck

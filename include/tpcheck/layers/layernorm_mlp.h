// tpcheck/layers/layernorm_mlp.h — LayerNormMLP: norm, fc1, activation, fc2.
//
// docs/LAYERS.md ("LayerNormMLP"). Parameters, in order: `<prefix>layer_norm_weight`,
// `<prefix>layer_norm_bias` (LayerNorm only), `<prefix>fc1_weight` [ffn (2·ffn gated),
// hidden], `<prefix>fc1_bias`, `<prefix>fc2_weight` [hidden, ffn], `<prefix>fc2_bias`
// [hidden]. GEMM sites `<site>.fc1`, `<site>.fc2` (site defaults to "mlp").
// With a TP group of N > 1, fc1 is column-parallel (gated: the a and b halves sharded
// separately, blocks {ffn, ffn}) and fc2 row-parallel; fc2_bias is replicated and
// added after the reduction (or returned with return_bias).
// Rounding points (the reference's full-precision defaults): gelu — fc1 GEMM without
// bias, rounded; then bias + gelu in f32, rounded once (backward: gelu'(h + b)·da in f32,
// rounded once; fc1_bias gradient summed from the unrounded values). Other activations —
// fc1 bias in the GEMM epilogue (one rounding), then the activation (another).
// checkpoint: forward keeps only its input; backward first recomputes norm, fc1 and the
// activation (fc2's forward output is not needed by backward, so it is not recomputed).
// Composition: LayerNorm (`<prefix>layer_norm_`), Linear fc1 (`<prefix>fc1_`), Linear
// fc2 (`<prefix>fc2_`).
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

class LayerNormMLP {
 public:
  struct Options {
    std::int64_t hidden_size = 0;      // required (> 0)
    std::int64_t ffn_hidden_size = 0;  // required (> 0), divisible by the TP size
    Activation activation = Activation::kGelu;
    NormOptions norm;     // normalization, zero_centered_gamma, eps
    ParamOptions params;  // bias, init_method (fc1_weight), params_dtype
    bool return_bias = false;
    bool return_layernorm_output = false;
    bool checkpoint = false;
    InitMethod output_layer_init_method = InitMethod::kNormal;  // fc2_weight
    WgradOptions wgrad;  // fuse_wgrad_accumulation, delay_wgrad_compute
    bool sequence_parallel = false;
    std::string site = "mlp";  // not a JSON key: GEMM sites "<site>.fc1", "<site>.fc2"

    // Keys: hidden_size, ffn_hidden_size, activation (gelu|relu|srelu|qgelu|geglu|swiglu),
    // normalization, zero_centered_gamma, eps, bias, return_bias, return_layernorm_output,
    // checkpoint, init_method, output_layer_init_method, fuse_wgrad_accumulation,
    // delay_wgrad_compute, sequence_parallel, params_dtype.
    // Throws Error(kInput) on an unknown key or bad value.
    static Options from_json(const nlohmann::json& j);
  };

  struct Saved {
    Tensor input;  // x as given (all that checkpoint keeps)
    LayerNorm::Saved norm;
    Linear::Saved fc1;
    Tensor fc1_output;  // h = ln fc1ᵀ + fc1_b, local [T, ffn/N] (gated: 2·ffn/N);
                        // gelu: ln fc1ᵀ only (the bias is added with the activation)
    Tensor fc1_bias;    // gelu with bias: fc1's local bias, added in the fused bias + gelu
    Linear::Saved fc2;  // input = act(h)
  };

  LayerNormMLP(std::string prefix, Options options, const ModuleContext& ctx);

  // x: [..., hidden] (SP: the local token slice along dim 0). Output [..., hidden]
  // (SP: the local token slice).
  LayerOutputs forward(const Tensor& x, Saved& saved);
  Tensor backward(const OutputGrads& grads, Saved& saved);
  void backward_dw(Saved& saved);

  std::vector<Parameter*> parameters();
  const Options& options() const { return options_; }
  LayerNorm& norm() { return norm_; }
  Linear& fc1() { return fc1_; }
  Linear& fc2() { return fc2_; }
  ShardSpec input_layout(int rank = 2) const;
  OutputLayout output_layout(int rank = 2) const;
  bool delays_wgrad() const { return options_.wgrad.delay_wgrad_compute; }

 private:
  // norm → fc1 → activation, filling saved.norm, saved.fc1, saved.fc1_output, saved.fc2
  // (its input). Returns ln.
  Tensor forward_to_activation(const Tensor& x, Saved& saved);

  Options options_;
  ModuleContext ctx_;
  LayerNorm norm_;
  Linear fc1_;
  Linear fc2_;
};

}  // namespace tpcheck

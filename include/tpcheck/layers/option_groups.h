// tpcheck/layers/option_groups.h — the option groups several layers share.
//
// An option that more than one layer takes lives in one group here, and each layer's
// Options composes the groups it has (`opts.norm.eps`, `opts.params.bias`,
// `opts.wgrad.fuse_wgrad_accumulation`). So that an option is added in one place:
//   - each group is read from JSON by one OptionReader function (src/layers/json_options.h),
//     under the same flat keys as ever (the reference's constructor keywords);
//   - a parent layer hands a group to a child with one assignment (`fc1.params =
//     o.params`), then sets a field where that child differs (fc2's init_method is the
//     parent's output_layer_init_method).
// sequence_parallel stays a plain field of every layer: one flag, and LayerNormLinear
// hands its norm a different value than its Linear.
// Plain data; thread safety is that of the value.
#pragma once

#include <string_view>

#include "tpcheck/backend.h"
#include "tpcheck/dtype.h"

namespace tpcheck {

inline constexpr double kNormEps = 1e-5;

// How a weight is initialised: N(0, 0.023) or the constant 0.05 (docs/LAYERS.md).
enum class InitMethod { kNormal, kConstant };
std::string_view init_method_name(InitMethod m);  // "normal", "constant"

// The norm's math: LayerNorm and RMSNorm, and the norms inside LayerNormLinear,
// LayerNormMLP, MultiheadAttention and TransformerLayer (which hand it on unchanged).
// Keys: normalization ("LayerNorm"|"RMSNorm"), zero_centered_gamma, and eps — `eps` in
// LayerNorm, LayerNormLinear and LayerNormMLP, `layernorm_epsilon` in MultiheadAttention
// and TransformerLayer (the reference's names).
struct NormOptions {
  NormKind normalization = NormKind::kLayerNorm;
  bool zero_centered_gamma = false;
  double eps = kNormEps;
};

// How the parameters of a Linear are created: Linear, and the Linears inside
// LayerNormLinear, LayerNormMLP, MultiheadAttention and TransformerLayer. init_method is
// that of the input-side weights (QKV, fc1); those layers keep output_layer_init_method
// (proj, fc2) beside the group. A norm has no bias option and fixed gamma / beta fills,
// so LayerNorm takes only params_dtype, as a field of its own.
// Keys: bias, init_method ("normal"|"constant"), params_dtype ("f32"|"f16"|"bf16"|"f64").
struct ParamOptions {
  bool bias = true;
  InitMethod init_method = InitMethod::kNormal;
  DType params_dtype = DType::kF32;
};

// How weight gradients are computed: accumulated into an f32 main_grad
// (fuse_wgrad_accumulation), and in backward_dw instead of backward (delay_wgrad_compute).
// Linear, LayerNormLinear and LayerNormMLP take both keys. MultiheadAttention and
// TransformerLayer take fuse_wgrad_accumulation only, and their validate() rejects
// delay_wgrad_compute set in C++: their backward_dw does nothing, so delayed weight
// gradients would never be computed.
struct WgradOptions {
  bool fuse_wgrad_accumulation = false;
  bool delay_wgrad_compute = false;
};

}  // namespace tpcheck

// tpcheck/layers/option_groups.h — the option groups several layers share.
//
// An option that more than one layer takes lives in one group here, and each layer's
// Options composes the groups it has (`opts.norm.eps`). So that an option is added in one
// place:
//   - each group is read from JSON by one OptionReader function (src/layers/json_options.h),
//     under the same flat keys as ever (the reference's constructor keywords);
//   - a parent layer hands a group to a child with one assignment (`n.norm = o.norm`).
// Plain data; thread safety is that of the value.
#pragma once

#include "tpcheck/backend.h"

namespace tpcheck {

inline constexpr double kNormEps = 1e-5;

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

}  // namespace tpcheck

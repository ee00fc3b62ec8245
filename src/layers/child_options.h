// child_options.h — the options a composite layer hands its child layers, each kind built
// in one place: the Linear part that Linear::Options and LayerNormLinear::Options share,
// the Linears of a block (attention's QKV and proj, the MLP's fc1 and fc2), and
// the norm over a block's hidden size (the MLP's, the TransformerLayer's output norm).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "tpcheck/layers/layernorm.h"
#include "tpcheck/layers/linear.h"

namespace tpcheck {

// Copies the fields Linear::Options and LayerNormLinear::Options share: sizes, parameter
// and weight-gradient groups, return_bias, sharding, site, weight blocks and splits.
template <typename To, typename From>
void copy_linear_fields(const From& from, To& to) {
  to.in_features = from.in_features;
  to.out_features = from.out_features;
  to.params = from.params;
  to.return_bias = from.return_bias;
  to.parallel_mode = from.parallel_mode;
  to.sequence_parallel = from.sequence_parallel;
  to.wgrad = from.wgrad;
  to.site = from.site;
  to.weight_blocks = from.weight_blocks;
  to.one_block_mutation = from.one_block_mutation;
  to.parameters_split = from.parameters_split;
}

// A Linear inside a block (attention's QKV and proj, the MLP's fc1 and fc2): the parent's
// parameter options, sequence parallelism and wgrad, sharded as `mode`.
template <typename Parent>
Linear::Options block_linear_options(const Parent& o, std::int64_t in_features,
                                     std::int64_t out_features, ParallelMode mode,
                                     std::string site) {
  Linear::Options l;
  l.in_features = in_features;
  l.out_features = out_features;
  l.params = o.params;
  l.parallel_mode = mode;
  l.sequence_parallel = o.sequence_parallel;
  l.wgrad = o.wgrad;
  l.site = std::move(site);
  return l;
}

// The row-parallel output-side Linear of a block, with the parent's
// output_layer_init_method and return_bias.
template <typename Parent>
Linear::Options output_linear_options(const Parent& o, std::int64_t in_features,
                                      std::int64_t out_features, std::string site) {
  Linear::Options l =
      block_linear_options(o, in_features, out_features, ParallelMode::kRow, std::move(site));
  l.params.init_method = o.output_layer_init_method;  // the output-side weight
  l.return_bias = o.return_bias;
  return l;
}

// The norm over the parent's hidden_size, with its norm math, sequence parallelism and
// parameter dtype.
template <typename Parent>
LayerNorm::Options hidden_norm_options(const Parent& o) {
  LayerNorm::Options n;
  n.hidden_size = o.hidden_size;
  n.norm = o.norm;
  n.sequence_parallel = o.sequence_parallel;
  n.params_dtype = o.params.params_dtype;
  return n;
}

}  // namespace tpcheck

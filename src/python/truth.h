// truth.h — tpcheck as an fp64 oracle for someone else's layer run (tpcheck.truth):
// builds tpcheck's implementation of a reference-library (TransformerEngine) layer from
// its constructor keywords, loads the caller's parameters (keyed by the reference's
// state_dict names), and runs forward — and backward when output gradients are given — in
// f64 on one device. No Python here; src/python/bindings.cpp binds it.
// Thread safety: each call builds its own layer and backend.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tpcheck/tensor.h"

namespace tpcheck {

struct TruthRequest {
  std::string kind;                    // make_layer kind: "LayerNormMLP", "TransformerLayer", ...
  nlohmann::json options;              // TransformerEngine constructor keywords (json_options.cpp)
  std::map<std::string, Tensor> params;  // state_dict name → value (any dtype, CPU or CUDA)
  Tensor input;
  // Gradient of the loss with respect to each returned tensor ("output", "bias",
  // "layernorm_output"); empty: forward only. A returned tensor without one gets zeros.
  std::map<std::string, Tensor> grad_outputs;
  std::string device = "cpu";  // "cpu" or "cuda" (GPU 0)
  // The rounding probe (make_rounding_probe_backend): 0 runs the plain f64 truth; u > 0
  // perturbs every value the layer's ops store by (1 + u·r), r from `probe_seed`'s stream.
  double probe_u = 0;
  std::uint64_t probe_seed = 0;
};

struct TruthResult {
  std::map<std::string, Tensor> outputs;  // f64 on the CPU: "output", "bias"?, "layernorm_output"?
  std::map<std::string, Tensor> grads;    // parameter name → f64 gradient (when backward ran)
  Tensor grad_input;                      // undefined when backward did not run
};

// The layer's parameters as (name, shape), in its documented order.
// Throws Error(kInput) for an unknown kind or bad options.
std::vector<std::pair<std::string, Shape>> layer_parameter_shapes(const std::string& kind,
                                                                   const nlohmann::json& options);

// REQUIRES (Error(kInput), naming expected against given): the parameter names are exactly
// the layer's (keys ending in "_extra_state", the reference's FP8 metadata, are ignored),
// every shape matches; grad_outputs only for tensors the layer returns, shaped like them.
TruthResult compute_truth(const TruthRequest& request);

}  // namespace tpcheck

// truth.h — tpcheck's layers run on someone else's parameters (tpcheck.layer_truth,
// tpcheck.layer_run): builds tpcheck's implementation of a reference-library
// (TransformerEngine) layer from its constructor keywords, loads the caller's parameters
// (keyed by the reference's state_dict names), and runs forward — and backward when output
// gradients are given — on one device. In f64 it is the fp64 oracle of someone else's layer
// run; in the caller's precision it is the layer the suite runs, for measuring it against
// the real library (docs/LAYERS.md, "Fidelity"). No Python here; src/python/bindings.cpp
// binds it.
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

struct LayerRunRequest {
  std::string kind;                    // make_layer kind: "LayerNormMLP", "TransformerLayer", ...
  nlohmann::json options;              // TransformerEngine constructor keywords (json_options.cpp)
  std::map<std::string, Tensor> params;  // state_dict name → value (any dtype, CPU or CUDA)
  Tensor input;
  // Gradient of the loss with respect to each returned tensor ("output", "bias",
  // "layernorm_output"); empty: forward only. A returned tensor without one gets zeros.
  std::map<std::string, Tensor> grad_outputs;
  std::string device = "cpu";  // "cpu" or "cuda" (GPU 0)
  // The precision the layer computes in ("f64": the truth; "f32", "bf16", "f16": the
  // suite's run of the layer), and for f32 on CUDA whether its GEMMs may use TF32.
  std::string dtype = "f64";
  bool allow_tf32 = false;
  // Ranks of the tensor-parallel group (1: the unsharded layer). Above 1 the layer runs
  // sharded as the suite runs it (`tpcheck run --backend <device> --tp N --comm emulated`'s
  // group, every rank a thread of this process), each rank on its shards of the caller's full
  // parameters, input and output gradients; the results are reassembled to full tensors.
  int tp_size = 1;
  // The quantized recipe of every Linear GEMM (quant.h's names: "none", "fp8", "fp8_cs",
  // "fp8_block_scaling", "mxfp8", "nvfp4"), as one step of `tpcheck run --recipe` runs it
  // (delayed scaling: the initial scales, 1). Not with f64: the truth never quantizes.
  std::string recipe = "none";
  // The rounding probe (make_rounding_probe_backend): 0 runs the plain f64 truth; u > 0
  // perturbs every value the layer's ops store by (1 + u·r), r from `probe_seed`'s stream.
  double probe_u = 0;
  std::uint64_t probe_seed = 0;
};

struct LayerRunResult {
  // On the CPU in the run's dtype: "output", "bias"?, "layernorm_output"?
  std::map<std::string, Tensor> outputs;
  std::map<std::string, Tensor> grads;    // parameter name → gradient (when backward ran)
  Tensor grad_input;                      // undefined when backward did not run
};

// The layer's parameters as (name, shape), in its documented order.
// Throws Error(kInput) for an unknown kind or bad options.
std::vector<std::pair<std::string, Shape>> layer_parameter_shapes(const std::string& kind,
                                                                   const nlohmann::json& options);

// REQUIRES (Error(kInput), naming expected against given): the parameter names are exactly
// the layer's (keys ending in "_extra_state", the reference's FP8 metadata, are ignored),
// every shape matches; grad_outputs only for tensors the layer returns, shaped like them;
// the probe only with dtype f64. The caller's arrays are rounded to `dtype` first (exact
// when they already are in it).
LayerRunResult run_layer(const LayerRunRequest& request);

}  // namespace tpcheck

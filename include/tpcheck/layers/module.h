// tpcheck/layers/module.h — what every layer shares: context, parameters, outputs.
//
// Layers are written once against Backend (compute) and Communicator (peers), and know
// nothing else about where they run. A layer built with a communicator of size 1 is the
// unsharded twin; the same class with a group of N ranks is the sharded run.
//
// Each layer class has:
//   struct Options;                      // its documented options (docs/LAYERS.md)
//   struct Saved;                        // what forward keeps for backward
//   Layer(std::string prefix, Options, const ModuleContext&);   // creates parameters
//   LayerOutputs forward(const Tensor& x, Saved& saved);
//   Tensor backward(const OutputGrads& grads, Saved& saved);    // returns dx
//   void backward_dw(Saved& saved);                             // delay_wgrad_compute only
//   std::vector<Parameter*> parameters();                       // documented stable order
// Parameter gradients accumulate (+=) into Parameter::grad (or main_grad); activation
// gradients are returned.
// Thread safety: a layer object belongs to one rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/mutation.h"
#include "tpcheck/quant.h"
#include "tpcheck/rng.h"
#include "tpcheck/shard.h"
#include "tpcheck/tensor.h"

namespace tpcheck {

enum class ParallelMode { kNone, kColumn, kRow };

struct ModuleContext {
  Backend* backend = nullptr;
  Communicator* comm = nullptr;  // the TP group; size 1 for single and truth runs
  std::uint64_t seed = 0;        // parameters are generated from (seed, full name, global index)
  Mutation mutation = Mutation::kNone;
  // Build the layer's structure only (option checks, parameter names, shapes and shards)
  // without generating or allocating parameter values: how the suite validates every
  // case before running any, which must stay cheap at production sizes. A layer built so
  // must not run.
  bool shapes_only = false;
  // The quantized recipe of every Linear GEMM (quant.h; kNone: high precision). Linear
  // quantizes its input, weight and output gradient as the reference does; attention's
  // batched products and the norms stay in high precision (docs/QUANTIZATION.md).
  Recipe recipe = Recipe::kNone;
  // FP8 delayed scaling (recipe kFp8Delayed): where each Linear keeps the amax histories of
  // the tensors it quantizes (input, weight, output gradient), across the steps of a run.
  // AnyLayer owns one per layer and updates it after each step (update_scaling). Null: the
  // scales stay the initial 1 and nothing is recorded (a layer built on its own).
  DelayedScalingSet* delayed_scaling = nullptr;

  int tp_size() const { return comm->size(); }
  int rank() const { return comm->rank(); }
  bool mutated(Mutation m) const { return mutation == m && comm->size() > 1; }
};

struct Parameter {
  std::string name;    // full documented name, e.g. "layernorm_mlp.fc1_weight"
  Shape global_shape;  // shape of the unsharded parameter
  ShardSpec shard;     // how the global parameter is split across the TP group
  Tensor value;        // this rank's shard, in params dtype
  Tensor grad;         // same shape and dtype as value; zero until backward
  Tensor main_grad;    // f32 accumulation buffer when fuse_wgrad_accumulation, else undefined
  // Replicated parameters whose gradient is a partial sum under sequence parallel (norm
  // weights and biases, row-parallel biases): the layer all-reduces it in backward.
  bool sequence_parallel_grad = false;

  // The gradient the checker compares: main_grad when it is used, else grad.
  const Tensor& gradient() const { return main_grad.defined() ? main_grad : grad; }
};

// Creates a parameter: its shard generated from `fill`, grad zeroed, main_grad (f32)
// allocated when `fuse_wgrad_accumulation`. Checks the global shape is shardable.
Parameter make_parameter(const ModuleContext& ctx, std::string name, Shape global_shape,
                         ShardSpec shard, const FillSpec& fill, DType dtype,
                         bool fuse_wgrad_accumulation = false);

// What a layer returns. `bias` is set when return_bias asks for it (the bias is then not
// added to `output`); `layernorm_output` when return_layernorm_output asks for it.
struct LayerOutputs {
  Tensor output;
  Tensor bias;
  Tensor layernorm_output;
};

// Gradients of the loss with respect to each returned tensor (undefined when not returned).
struct OutputGrads {
  Tensor output;
  Tensor bias;
  Tensor layernorm_output;
};

// How each returned tensor is laid out across the group (for gathering and comparing).
struct OutputLayout {
  ShardSpec output;
  ShardSpec bias;
  ShardSpec layernorm_output;
};

// One plain SGD step on a parameter, the same in every run (single, sharded, truth):
// value ← value + (−lr · gradient()), the product and the sum in f32 (f64 when the value
// is f64), the sum rounded once to the value's dtype; elementwise, so a shard is updated
// exactly as the same elements of the unsharded parameter. Runs on the backend's device.
void sgd_update(Backend& backend, Parameter& p, double lr);
// Zeroes grad (and main_grad) for the next step's accumulation. REQUIRES: p has values
// (not a shapes_only parameter).
void zero_gradients(Parameter& p);

// Default initializations (docs/LAYERS.md explains the choice):
//   weights N(0, 0.023) — TransformerEngine's init_method default;
//   biases N(0, 0.023) and norm gamma 1 + N(0, 0.1) (N(0, 0.1) when zero-centered),
//   beta N(0, 0.1) — non-trivial, unlike TE's zeros/ones, so every code path that
//   touches them changes the numbers and a TP bug there cannot hide.
inline constexpr double kWeightInitStd = 0.023;
inline constexpr double kConstantInitValue = 0.05;
FillSpec default_weight_fill();
FillSpec default_bias_fill();
FillSpec default_gamma_fill(bool zero_centered_gamma);
FillSpec default_beta_fill();

}  // namespace tpcheck

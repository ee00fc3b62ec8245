// tpcheck/layers/linear.h — Linear: y = x Wᵀ + b, unsharded, column- or row-parallel.
//
// The contract is docs/LAYERS.md ("Linear"). Parameters, in order: `<prefix>weight`
// [out, in], `<prefix>bias` [out] (when `bias`). GEMM sites `<site>/fwd`, `<site>/dgrad`,
// `<site>/wgrad`.
// With `parameters_split` (TransformerEngine's argument of that name) the weight and bias
// are held as several parameters — `<prefix><name>_weight` for each split, then
// `<prefix><name>_bias` for each — each sharded along dim 0 on its own, and every pass
// still runs one GEMM over their concatenated local shards (weight [Σ local rows, in]),
// as the reference does for attention's separate Q, K, V.
//
// Rounding points (as the reference): an unsharded or column-parallel bias that is added
// is applied in the forward GEMM's epilogue (one rounding of x·Wᵀ + b, cuBLASLt's BIAS);
// a row-parallel bias is added after the reduction (its own rounding).
//
//   mode    weight shard  bias shard        local input                 output layout
//   none    replicated    replicated        x                           replicated
//   column  dim 0         dim 0             x (SP: token slice, gathered) last dim (features)
//   row     dim 1         replicated        features slice of x          replicated (SP: dim 0)
//
// Row-parallel output is all-reduced (SP: reduce-scattered along dim 0); the bias is
// added after the reduction. Column-parallel input gradient is all-reduced (SP:
// reduce-scattered). Under SP, the row-parallel bias gradient is all-reduced.
// Linear is also the building block of LayerNormLinear, LayerNormMLP and attention.
// Thread safety: a layer object belongs to one rank.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tpcheck/layers/module.h"
#include "tpcheck/layers/option_groups.h"

namespace tpcheck {

std::string_view parallel_mode_name(ParallelMode m);  // "none", "column", "row"

class Linear {
 public:
  struct Options {
    std::int64_t in_features = 0;   // required (> 0)
    std::int64_t out_features = 0;  // required (> 0)
    ParamOptions params;            // bias, init_method, params_dtype
    bool return_bias = false;
    ParallelMode parallel_mode = ParallelMode::kNone;
    bool sequence_parallel = false;
    WgradOptions wgrad;  // fuse_wgrad_accumulation, delay_wgrad_compute
    bool save_original_input = false;
    // GEMM site name (records "<site>/fwd" ...). Not a JSON key: parents set it.
    std::string site = "linear";
    // Column mode only, not a JSON key: shard blocks of the weight's dim 0 (and of the
    // bias), for fused weights whose parts are sharded separately (gated fc1 {ffn, ffn},
    // non-interleaved QKV {heads·d, g·d, g·d}). Empty: one block.
    std::vector<std::int64_t> weight_blocks;
    // Not a JSON key: the Mutation under which this rank takes its weight and bias rows as
    // if the weight were one block (ignoring weight_blocks); kNone: never. Parents set it
    // for the fused weights whose per-block sharding is the point (gated fc1, QKV).
    Mutation one_block_mutation = Mutation::kNone;
    // Not a JSON key: the weight (and bias) held as one parameter per entry {name, rows},
    // rows summing to out_features, each sharded along dim 0 (column mode) or replicated
    // (none). Empty: one `weight` and one `bias`. Excludes weight_blocks.
    struct Split {
      std::string name;
      std::int64_t rows = 0;
    };
    std::vector<Split> parameters_split;

    // Keys: in_features, out_features, bias, return_bias, parallel_mode
    // ("none"|"column"|"row"), sequence_parallel, init_method ("normal"|"constant"),
    // fuse_wgrad_accumulation, delay_wgrad_compute, save_original_input, params_dtype
    // ("f32"|"f16"|"bf16"|"f64"). Throws Error(kInput) on an unknown key or a bad value.
    static Options from_json(const nlohmann::json& j);
  };

  struct Saved {
    Shape input_shape;         // shape of x as given to forward (dx gets it)
    Tensor input;              // [T, in_local] GEMM input: gathered under SP column, or
                               // the local slice with save_original_input (re-gathered)
    Tensor grad_output;        // delay_wgrad_compute: [T, out_local] dy as the wgrad GEMM uses it
    Tensor grad_output_local;  // delay_wgrad_compute, row SP: the local dy slice (bias grad)
    Tensor grad_bias_output;   // delay_wgrad_compute with return_bias: the `bias` output grad
    Tensor weight;             // under a recipe: the weight as forward quantized it (both
                               // copies), for dgrad; undefined otherwise (dgrad quantizes)
  };

  // Creates the parameters `<prefix>weight`, `<prefix>bias`. Throws Error(kInput) when
  // a size is not positive or not divisible by the TP size where the mode shards it.
  Linear(std::string prefix, Options options, const ModuleContext& ctx);

  // x: [..., in] (column/none; SP column: the local token slice along dim 0) or
  // [..., in/N] (row). Output [..., out_local] (row SP: the local token slice).
  // (TransformerLayer adds its residuals itself, in combine(), where the
  // residual-before-reduce mutation lives.)
  LayerOutputs forward(const Tensor& x, Saved& saved);
  // Returns dx (shape of forward's x). Accumulates weight/bias gradients unless
  // delay_wgrad_compute, in which case it keeps what backward_dw needs in `saved`.
  Tensor backward(const OutputGrads& grads, Saved& saved);
  // delay_wgrad_compute only: weight and bias gradients. No-op otherwise.
  void backward_dw(Saved& saved);

  // Records in `saved` the input forward would keep for `x` (gathers under SP column
  // unless save_original_input). Used by forward and by checkpoint recomputation.
  void save_input(const Tensor& x, Saved& saved);

  std::vector<Parameter*> parameters();
  // The (first) weight parameter; the only one without parameters_split.
  Parameter& weight() { return weights_.front(); }
  const Options& options() const { return options_; }
  // Layouts for an input / output of rank `rank` (2 for [T, features]).
  ShardSpec input_layout(int rank = 2) const;
  OutputLayout output_layout(int rank = 2) const;
  bool delays_wgrad() const { return options_.wgrad.delay_wgrad_compute; }

 private:
  // dy: [T, out_local] as the wgrad GEMM uses it; dy_local: row SP's local slice (bias).
  void weight_and_bias_grads(const Tensor& dy, const Tensor& dy_local, const Tensor& dbias_out,
                             const Saved& saved);

  // Last-dimension sizes of this rank's input and output.
  std::int64_t local_in() const;
  std::int64_t local_out() const;
  bool column_sp() const;
  // This rank's weight [out_local, in_local] (bias [out_local]) as the GEMMs use it: the
  // one parameter, or the concatenation of the split parameters' local shards.
  Tensor local_weight() const;
  Tensor local_bias() const;
  // Under a recipe (ctx_.recipe): `t` with the quantized copy the next GEMM reads (the
  // rowwise one, or the columnwise one for dgrad's weight and wgrad's operands), quantized
  // from t's own values — or `t` itself when it already carries its copies (a tensor the
  // FP8 all-gather made); without a recipe, `t` unchanged. `what` names t in errors.
  Tensor quantized_for_gemm(const Tensor& t, QuantRole role, bool columnwise,
                            std::string_view what) const;
  // Under a recipe: `t` carrying both copies (rowwise and columnwise), quantized once for
  // the two products that read it in a step (x: fwd and wgrad; W: fwd and dgrad; dy: dgrad
  // and wgrad), as the reference's quantizers make both when both are needed. Without a
  // recipe, `t` unchanged.
  Tensor quantized_for_both(const Tensor& t, QuantRole role, std::string_view what) const;
  // `t` carrying the copies `usage` asks for, quantized under ctx_.recipe with the scaling
  // state of `role` (delayed scaling records the amax).
  Tensor quantized_copies(const Tensor& t, QuantRole role, QuantUsage usage,
                          std::string_view what) const;
  // SP: the token slice `local` gathered along dim 0 — in high precision, or under FP8
  // delayed scaling with a context that keeps its state, as the reference's FP8 all-gather
  // (tp_ops gather_tokens_fp8) of a tensor of role `role`.
  Tensor gather_for_gemm(const Tensor& local, QuantRole role) const;
  // The delayed-scaling state of the tensor of `role`, or null (no state kept: scale 1).
  DelayedScaling* scaling_of(QuantRole role) const;
  // The GEMM front end the three products go through: gemm, or gemm_quantized under a
  // recipe (its operands made by quantized_for_gemm).
  void linear_gemm(std::string_view pass, const Tensor& a, bool trans_a, QuantRole a_role,
                   const Tensor& b, bool trans_b, QuantRole b_role, Tensor& c, bool accumulate,
                   const GemmEpilogue& epilogue = {}) const;
  // Adds `sum` ([out_local, ...], concatenated like local_weight()) into the parameters'
  // gradient buffers: main_grad (fuse_wgrad_accumulation, weights only) or grad.
  enum class GradTarget { kWeight, kBias };
  Tensor gradient_buffer(GradTarget which);
  void store_gradient_buffer(GradTarget which, const Tensor& buffer);

  Options options_;
  ModuleContext ctx_;
  std::vector<Parameter> weights_;  // one, or one per split
  std::vector<Parameter> biases_;   // empty without bias
  // FP8 delayed scaling with ctx_.delayed_scaling: the amax histories of the input, the
  // weight and the output gradient (indexed by QuantRole), entries of that set; else null.
  DelayedScaling* scaling_[3] = {nullptr, nullptr, nullptr};
};

}  // namespace tpcheck

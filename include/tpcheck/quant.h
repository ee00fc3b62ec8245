// tpcheck/quant.h — the quantized recipes: FP8 delayed scaling, FP8 current scaling, FP8
// block scaling, MXFP8 and NVFP4, bit-exact with TransformerEngine's formulas.
//
// A recipe turns a high-precision tensor (f32, f16 or bf16, viewed as a matrix [rows,
// cols] with cols its last dimension) into a `QuantizedData` (tensor.h): data in a narrow
// format, scale_inv per tensor or per block, the amax, and up to two copies — rowwise
// (blocks along cols: what a GEMM reducing over cols reads) and columnwise (stored as the
// transpose [cols, rows], blocks along the original rows: what wgrad / dgrad read).
// Every formula, with its source, is in docs/QUANTIZATION.md; in short:
//
//   recipe             data            scale (per)                     q
//   fp8 (delayed)      E4M3 fwd,       given: DelayedScaling::scale()  sat(x · scale)
//                      E5M2 grads      (per tensor)
//   fp8_cs (current)   E4M3 / E5M2     fmax / amax (per tensor)        sat(x · scale)
//   fp8_block_scaling  E4M3            pow2floor(448 / amax) per 1x128 sat(x · scale)
//                                      (weights: 128x128)
//   mxfp8              E4M3            E8M0 2^e, e = ceil-exponent of  sat(x · 2^(127−e))
//                                      amax · (1/448), per 1x32
//   nvfp4              E2M1            E4M3 sb per 1x16 and f32 S_enc  sat(x · 1/(sb · 1/S_enc))
//
// sat() rounds to nearest even and saturates to the finite range, as the GPU's
// `cvt.rn.satfinite` does: ±inf → ±max, NaN → NaN (f4e2m1 has no NaN: see dtype.h).
// All arithmetic is in f32 with one rounding per operation, in TE's order.
//
// Not modelled: Hadamard transforms and stochastic rounding (the reference suite turns
// them off), NVFP4 16x16 weight blocks, scale swizzling and FP4 packing (layouts only).
// Thread safety: functions are pure; a DelayedScaling object belongs to one rank.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>

#include "tpcheck/gemm_record.h"
#include "tpcheck/tensor.h"

namespace tpcheck {

enum class Recipe { kNone, kFp8Delayed, kFp8Current, kFp8Block, kMxfp8, kNvfp4 };
// "none", "fp8", "fp8_cs", "fp8_block_scaling", "mxfp8", "nvfp4" (the `--recipe` names).
std::string_view recipe_name(Recipe recipe);
// Inverse of recipe_name; Error(kInput) naming the text and the accepted names.
Recipe parse_recipe(std::string_view name);

// What a tensor is to a Linear: it picks the format (HYBRID FP8: gradients E5M2) and the
// block shape (block scaling: weights 128x128).
enum class QuantRole { kInput, kWeight, kGradOutput };
std::string_view quant_role_name(QuantRole role);  // "input", "weight", "grad_output"

// Which copies to make.
struct QuantUsage {
  bool rowwise = true;
  bool columnwise = true;
};

// The element format of the data: E4M3, except E5M2 for gradients under the FP8 per-tensor
// recipes (HYBRID) and E2M1 under NVFP4. REQUIRES: recipe != kNone.
DType quant_data_dtype(Recipe recipe, QuantRole role);
// The rowwise block shape ({} per tensor, {1, 128}, {128, 128}, {1, 32}, {1, 16}).
Shape quant_block(Recipe recipe, QuantRole role);
// The GEMM math class of a recipe (kFp8, kFp8Block, kMxfp8, kNvfp4).
MathClass quant_math_class(Recipe recipe);
// The tolerances the reference suite (run_numerics.py) checks a recipe's runs with:
// 0.125 / 0.0625 (fp8, fp8_block_scaling, mxfp8), 0.125 / 0.12 (nvfp4), 0.4 / 0.25
// (fp8_cs). REQUIRES: recipe != kNone.
struct RecipeTolerance {
  double rtol = 0, atol = 0;
};
RecipeTolerance reference_recipe_tolerance(Recipe recipe);

// Error(kInput) unless a [.., cols] tensor of `shape` can be quantized: the recipe's block
// divides cols (and rows, for a columnwise copy or 2-D blocks); FP8 per-tensor data needs
// cols (and rows, for the transposed copy) to be multiples of 16, as Hopper's FP8 GEMMs
// do. The message names `what`, the size and the multiple it needs.
void check_quantizable(std::string_view what, const Shape& shape, Recipe recipe, QuantRole role,
                       QuantUsage usage);

// ---- element operations (quant/element.cpp) -------------------------------------------
// max |x| over the values (f32 math); NaN if any value is NaN; 0 for an empty tensor.
float amax_of(const Tensor& x);
// sat(v): round to nearest even into `format` (f8e4m3, f8e5m2, f4e2m1), ±inf and finite
// overflow to ±max finite, NaN to NaN (f4e2m1: dtype.h's NaN rule). Returns the bits.
std::uint8_t cast_satfinite(DType format, float v);
// TE's float_to_e8m0: the biased exponent of v rounded *up* to a power of two (so 2^(e−127)
// >= v): NaN → 0xFF, inf → 0xFE, 0 → 0, never above 0xFE; an f32 subnormal at or below
// 2^-127 → 0. REQUIRES: v >= 0 or NaN.
std::uint8_t e8m0_round_up(float v);
// 2^(127 − e) as an f32, the factor MXFP8 data is multiplied by; TE's exp2f_rcp: 1 for
// e = 0 (not 2^127), NaN for e = 0xFF.
float e8m0_reciprocal(std::uint8_t e);

// ---- scales ----------------------------------------------------------------------------
// FP8 current scaling (TE compute_scale_from_amax, epsilon 0, no power-of-two rounding):
// fmax / amax in f32; amax 0, inf or NaN → 1; an infinite quotient → FLT_MAX.
float fp8_current_scale(float amax, DType format);
// 1 / scale, rounded to nearest (f32 division).
float scale_reciprocal(float scale);
// FP8 block scaling: the current scale for E4M3 with its exponent kept and mantissa
// dropped (a power of two at or below 448 / amax).
float fp8_block_scale(float block_amax);
// MXFP8: e8m0_round_up(amax · fl(1/448)).
std::uint8_t mxfp8_scale_exponent(float block_amax);
// NVFP4 (TE core_nvfp4.cuh): S_enc = min(448 · 6 / amax, FLT_MAX), 1 when amax is 0 or the
// quotient is 0 (amax inf); a NaN amax gives FLT_MAX (fminf drops the NaN).
float nvfp4_global_encode_scale(float tensor_amax);
// sb = sat_E4M3(min(block_amax · (S_enc · fl(1/6)), FLT_MAX)); returns E4M3 bits.
std::uint8_t nvfp4_block_decode_scale(float block_amax, float s_enc);
// min(1 / (sb · fl(1 / S_enc)), FLT_MAX): what each value of the block is multiplied by.
float nvfp4_encode_factor(std::uint8_t sb_bits, float s_enc);
// The GEMM's alpha: (amax_a · amax_b) · fl(1 / (6² · 448²)), each product rounded to f32.
float nvfp4_gemm_alpha(float amax_a, float amax_b);

// ---- FP8 delayed scaling --------------------------------------------------------------
// One tensor's amax history (length 32, "max" algorithm, margin 0, as the reference's
// DelayedScaling recipe defaults). The scale used at step t comes from the amaxes recorded
// up to step t−1: quantize with scale(), record() the tensor's amax (after any reduction
// across the group), and update() after the step. Starts with scale 1 and an empty history.
class DelayedScaling {
 public:
  explicit DelayedScaling(DType format, int history_length = 32, int margin = 0);
  DType format() const { return format_; }
  float scale() const { return scale_; }
  // The amax of this step (the newest history entry; recorded again the max is kept).
  void record(float amax);
  // What record() has collected this step; empty when nothing was recorded.
  std::optional<float> pending() const { return pending_; }
  // After the step: scale = fmax / max(history) · 2^-margin, kept unchanged when that max
  // is 0 or not finite, FLT_MAX when the quotient overflows; then the window moves on.
  void update();
  const std::deque<float>& history() const { return history_; }

 private:
  DType format_;
  int history_length_;
  int margin_;
  float scale_ = 1.0f;
  std::optional<float> pending_;
  std::deque<float> history_;  // newest first
};

// Every DelayedScaling of one run on one rank, in the order they were added: what the
// reference keeps as one buffer of amaxes, so that one collective reduces them all after
// the step. Every rank of a group adds the same entries in the same order (the layers
// construct them identically), so entry i is the same tensor on every rank. Entries never
// move: a reference from add() stays valid for the set's life.
class DelayedScalingSet {
 public:
  DelayedScaling& add(DType format) { return entries_.emplace_back(format); }
  std::size_t size() const { return entries_.size(); }
  DelayedScaling& operator[](std::size_t i) { return entries_[i]; }
  const DelayedScaling& operator[](std::size_t i) const { return entries_[i]; }

 private:
  std::deque<DelayedScaling> entries_;
};

// The receiving side of the reference's FP8 all-gather under delayed scaling: `rowwise`
// ([rows, cols], f8e4m3 or f8e5m2) holds every rank's quantized rows, concatenated; the
// gathered tensor is read with *this* rank's `scale` (its scale_inv for every row, as the
// reference's gathered Float8Tensor takes the local one) — right only when every rank
// quantized with the same scale. The columnwise copy is the transpose of the bytes.
// `amax` is this rank's own (the local rows'). Error(kInput) for another dtype or rank.
std::shared_ptr<QuantizedData> fp8_gathered(const Tensor& rowwise, float scale, float amax);

// ---- quantize / dequantize -------------------------------------------------------------
struct QuantizeOptions {
  Recipe recipe = Recipe::kNone;
  QuantRole role = QuantRole::kInput;
  QuantUsage usage;
  // Current scaling and NVFP4: the amax to derive the scale from (after a max-reduction
  // across the TP group); default: the tensor's own.
  std::optional<float> amax;
  // Delayed scaling: the scale of this step (DelayedScaling::scale()).
  float scale = 1.0f;
};

// Quantizes x (f32, f16 or bf16; CPU or GPU — a GPU tensor is copied to the host) and
// returns the quantized copies, on the CPU. Error(kInput) for a recipe of kNone, an f64
// or narrow input, or a shape check_quantizable rejects.
std::shared_ptr<QuantizedData> quantize(const Tensor& x, const QuantizeOptions& options,
                                        std::string_view what = "tensor");

// One copy's values as a GEMM reads them: `values` [rows, cols] of the copy's own layout
// (columnwise: [cols, rows] of the original), each the quantized value times its block
// scale_inv (exact in f32: the block factors are powers of two, or an E4M3 times an E2M1),
// and `tensor_factor`, the per-tensor factor a GEMM applies to its accumulator (FP8
// per-tensor: scale_inv; NVFP4: 1 — its alpha comes from nvfp4_gemm_alpha; others: 1).
struct QuantizedValues {
  Tensor values;  // f32
  float tensor_factor = 1.0f;
};
QuantizedValues quantized_values(const QuantizedData& q, bool columnwise);
// The dequantized tensor [rows, cols] (columnwise copies are transposed back) in f32:
// values · tensor_factor, and for NVFP4 values · fl(1 / S_enc), each rounded to f32.
Tensor dequantize(const QuantizedData& q, bool columnwise = false);

}  // namespace tpcheck

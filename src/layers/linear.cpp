// linear.cpp — Linear forward, backward and delayed weight gradient (linear.h).
//
//   fwd    y[T, out_l]  = x[T, in_l] · W[out_l, in_l]ᵀ      site <site>/fwd
//   dgrad  dx[T, in_l]  = dy[T, out_l] · W[out_l, in_l]      site <site>/dgrad
//   wgrad  dW[out_l, in_l] += dy[T, out_l]ᵀ · x[T, in_l]     site <site>/wgrad
// Column: out_l = out/N, x gathered over tokens under SP, dx reduced (tp_ops).
// Row: in_l = in/N, y reduced (tp_ops), dy gathered over tokens under SP.
//
// Under a quantized recipe (ModuleContext::recipe) the three products run on quantized
// operands (Backend::gemm_quantized), each read in the copy that product needs:
//   fwd    x rowwise (role input),        W rowwise (role weight)
//   dgrad  dy rowwise (role grad_output), W columnwise
//   wgrad  dy columnwise,                 x columnwise
// Each tensor is quantized once per step into both its copies, from its high-precision
// values (quantized_for_both): x and W in forward (kept for backward), dy before dgrad —
// as the reference's quantizers do. Both copies share the tensor's scale (per-tensor
// recipes) or are each quantized from high precision (block recipes), so this is the same
// arithmetic as quantizing each copy just before its product, done once. A weight forward
// did not keep (a checkpointed fc2, recomputed by save_input) is quantized by dgrad.
// The gathered tensors (x under column SP, dy under row SP) are quantized after the
// gather, so their per-tensor scale comes from the amax of the whole tensor — what the
// reference gets by reducing the amax (max) across the TP group before its quantized
// all-gather; a shard quantized on its own (a row-parallel input, a column-parallel dy, a
// weight shard) uses its own amax, as there. FP8 delayed scaling, whose scales come from
// the amax history (ModuleContext::delayed_scaling; the initial 1 without one), gathers
// them as the reference does: each rank quantizes its slice with its own scale and the
// FP8 bytes are all-gathered (tp_ops gather_tokens_fp8); every amax this Linear quantizes
// is recorded in its history (docs/QUANTIZATION.md, "In the layers").
#include "tpcheck/layers/linear.h"

#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "layers/json_options.h"
#include "layers/tp_ops.h"
#include "tpcheck/error.h"

namespace tpcheck {

std::string_view init_method_name(InitMethod m) {
  return m == InitMethod::kConstant ? "constant" : "normal";
}

std::string_view parallel_mode_name(ParallelMode m) {
  switch (m) {
    case ParallelMode::kColumn:
      return "column";
    case ParallelMode::kRow:
      return "row";
    case ParallelMode::kNone:
      break;
  }
  return "none";
}

Linear::Options Linear::Options::from_json(const nlohmann::json& j) {
  OptionReader r(j, "Linear");
  Options o;
  o.in_features = r.get_size("in_features", true);
  o.out_features = r.get_size("out_features", true);
  o.params = r.get_param_options();
  o.return_bias = r.get_bool("return_bias", o.return_bias);
  o.parallel_mode = r.get_parallel_mode(o.parallel_mode);
  o.sequence_parallel = r.get_bool("sequence_parallel", o.sequence_parallel);
  o.wgrad = r.get_wgrad_options(/*delay_is_a_key=*/true);
  o.save_original_input = r.get_bool("save_original_input", o.save_original_input);
  r.finish();
  return o;
}

namespace {

// The options' own consistency (sizes, weight blocks, parameter splits), as the
// constructor's first checks.
void check_linear_options(const Linear::Options& o) {
  TPCHECK_CHECK_INPUT(o.in_features > 0 && o.out_features > 0,
                      "{}: in_features {} and out_features {} must be positive", o.site,
                      o.in_features, o.out_features);
  TPCHECK_CHECK_INPUT(o.weight_blocks.empty() || o.parallel_mode == ParallelMode::kColumn,
                      "{}: weight_blocks apply to column-parallel weights only", o.site);
  if (!o.weight_blocks.empty()) {
    const std::int64_t sum =
        std::accumulate(o.weight_blocks.begin(), o.weight_blocks.end(), std::int64_t{0});
    TPCHECK_CHECK_INPUT(sum == o.out_features,
                        "{}: weight blocks sum to {}, expected out_features {}", o.site, sum,
                        o.out_features);
  }
  TPCHECK_CHECK_INPUT(o.parameters_split.empty() || o.weight_blocks.empty(),
                      "{}: parameters_split and weight_blocks exclude each other", o.site);
  TPCHECK_CHECK_INPUT(o.parameters_split.empty() || o.parallel_mode != ParallelMode::kRow,
                      "{}: parameters_split applies to column-parallel or unsharded weights, "
                      "got parallel_mode row",
                      o.site);
  if (!o.parameters_split.empty()) {
    std::int64_t sum = 0;
    for (const Linear::Options::Split& s : o.parameters_split) sum += s.rows;
    TPCHECK_CHECK_INPUT(sum == o.out_features,
                        "{}: parameters_split rows sum to {}, expected out_features {}", o.site,
                        sum, o.out_features);
  }
}

// How this rank's weight and bias are cut from the full ones, and which rank's shard they
// hold (another's under the shard mutations).
struct LinearSharding {
  ShardSpec weight, bias;
  std::optional<ShardSpec> values_from;  // the mutated layout the values come from
  int weight_rank = 0, bias_rank = 0;
};

LinearSharding linear_sharding(const Linear::Options& o, const ModuleContext& ctx) {
  const int n = ctx.tp_size();
  LinearSharding s;
  s.weight_rank = s.bias_rank = ctx.rank();
  if (o.parallel_mode == ParallelMode::kColumn) {
    std::vector<std::int64_t> blocks =
        o.weight_blocks.empty() ? std::vector{o.out_features} : o.weight_blocks;
    if (!o.parameters_split.empty()) {
      blocks.clear();
      for (const Linear::Options::Split& p : o.parameters_split) blocks.push_back(p.rows);
    }
    for (std::int64_t block : blocks) {
      TPCHECK_CHECK_INPUT(block % n == 0,
                          "{}: column-parallel out_features {} (block {}) is not divisible by the "
                          "tensor-parallel size {}",
                          o.site, o.out_features, block, n);
    }
    s.weight = ShardSpec::along(0, o.weight_blocks);
    s.bias = ShardSpec::along(0, o.weight_blocks);
    if (ctx.mutated(Mutation::kShardOffByOne)) s.weight_rank = (ctx.rank() + 1) % n;
    if (!o.weight_blocks.empty() && o.one_block_mutation != Mutation::kNone &&
        ctx.mutated(o.one_block_mutation)) {
      s.values_from = ShardSpec::along(0);  // the bug: the fused rows split as one block
    }
    if (ctx.mutated(Mutation::kColumnBiasNotSharded)) s.bias_rank = 0;
  } else if (o.parallel_mode == ParallelMode::kRow) {
    TPCHECK_CHECK_INPUT(o.in_features % n == 0,
                        "{}: row-parallel in_features {} is not divisible by the tensor-parallel "
                        "size {}",
                        o.site, o.in_features, n);
    s.weight = ShardSpec::along(1);
  }
  return s;
}

}  // namespace

Linear::Linear(std::string prefix, Options options, const ModuleContext& ctx)
    : options_(std::move(options)), ctx_(ctx) {
  const Options& o = options_;
  check_linear_options(o);
  if (ctx_.recipe != Recipe::kNone) {
    // The weight shard is quantized rowwise (fwd) and columnwise (dgrad): both dimensions
    // must fit the recipe's blocks. Checked at construction, so before any case runs.
    check_quantizable(o.site + " weight (this rank's shard)", {local_out(), local_in()},
                      ctx_.recipe, QuantRole::kWeight, QuantUsage{true, true});
  }
  if (ctx_.recipe == Recipe::kFp8Delayed && ctx_.delayed_scaling != nullptr && !ctx_.shapes_only) {
    // The reference's per-module scaling state: one history per tensor this Linear quantizes.
    for (QuantRole role : {QuantRole::kInput, QuantRole::kWeight, QuantRole::kGradOutput}) {
      scaling_[static_cast<int>(role)] =
          &ctx_.delayed_scaling->add(quant_data_dtype(ctx_.recipe, role));
    }
  }
  const LinearSharding shard = linear_sharding(o, ctx_);
  const FillSpec weight_fill = o.params.init_method == InitMethod::kConstant
                                   ? FillSpec::constant(kConstantInitValue)
                                   : default_weight_fill();
  // One parameter per split (each sharded on its own), or one `weight` / `bias`.
  std::vector<Options::Split> parts = o.parameters_split;
  if (parts.empty()) parts.push_back({"", o.out_features});
  for (const Options::Split& part : parts) {
    const std::string stem = part.name.empty() ? prefix : prefix + part.name + "_";
    weights_.push_back(make_parameter_from_rank(ctx_, stem + "weight", {part.rows, o.in_features},
                                                shard.weight, weight_fill, o.params.params_dtype,
                                                o.wgrad.fuse_wgrad_accumulation, shard.weight_rank,
                                                shard.values_from));
  }
  if (o.params.bias) {
    for (const Options::Split& part : parts) {
      const std::string stem = part.name.empty() ? prefix : prefix + part.name + "_";
      Parameter b = make_parameter_from_rank(ctx_, stem + "bias", {part.rows}, shard.bias,
                                             default_bias_fill(), o.params.params_dtype, false,
                                             shard.bias_rank, shard.values_from);
      b.sequence_parallel_grad = o.parallel_mode == ParallelMode::kRow && o.sequence_parallel;
      biases_.push_back(std::move(b));
    }
  }
}

Tensor Linear::local_weight() const {
  if (weights_.size() == 1) return weights_.front().value;
  std::vector<Tensor> parts;
  for (const Parameter& w : weights_) parts.push_back(w.value);
  return Tensor::cat(parts, 0);
}

Tensor Linear::local_bias() const {
  if (biases_.size() <= 1) return biases_.empty() ? Tensor() : biases_.front().value;
  std::vector<Tensor> parts;
  for (const Parameter& b : biases_) parts.push_back(b.value);
  return Tensor::cat(parts, 0);
}

Tensor Linear::gradient_buffer(GradTarget which) {
  std::vector<Parameter>& ps = which == GradTarget::kWeight ? weights_ : biases_;
  const bool to_main_grad = which == GradTarget::kWeight && options_.wgrad.fuse_wgrad_accumulation;
  auto target = [&](Parameter& p) -> Tensor& { return to_main_grad ? p.main_grad : p.grad; };
  // One parameter: its own buffer (a handle on the same storage), so GEMMs accumulate
  // into it in place.
  if (ps.size() == 1) return target(ps.front());
  std::vector<Tensor> parts;
  for (Parameter& p : ps) parts.push_back(target(p));
  return Tensor::cat(parts, 0);
}

void Linear::store_gradient_buffer(GradTarget which, const Tensor& buffer) {
  std::vector<Parameter>& ps = which == GradTarget::kWeight ? weights_ : biases_;
  if (ps.size() == 1) return;  // written in place
  const bool to_main_grad = which == GradTarget::kWeight && options_.wgrad.fuse_wgrad_accumulation;
  std::int64_t row = 0;
  for (Parameter& p : ps) {
    Tensor& t = to_main_grad ? p.main_grad : p.grad;
    t.copy_from(buffer.slice(0, row, t.dim(0)));
    row += t.dim(0);
  }
}

DelayedScaling* Linear::scaling_of(QuantRole role) const {
  return scaling_[static_cast<int>(role)];
}

Tensor Linear::quantized_copies(const Tensor& t, QuantRole role, QuantUsage usage,
                                std::string_view what) const {
  QuantizeOptions q;
  q.recipe = ctx_.recipe;
  q.role = role;
  q.usage = usage;
  DelayedScaling* scaling = scaling_of(role);
  if (scaling != nullptr) q.scale = scaling->scale();
  Tensor out = t;  // a handle on the same values, carrying the quantized copies
  out.set_quantized(ctx_.backend->quantize(t, q, what));
  // Delayed scaling: this step's amax of the tensor as this rank quantized it (a tensor
  // quantized twice in a step records the same value twice; the history keeps the larger).
  if (scaling != nullptr) scaling->record(static_cast<float>(out.quantized()->amax.at(0)));
  return out;
}

Tensor Linear::quantized_for_gemm(const Tensor& t, QuantRole role, bool columnwise,
                                  std::string_view what) const {
  // Called by linear_gemm under a recipe only.
  // Already carrying the copy (quantized_for_both, or gathered in FP8 by gather_for_gemm:
  // the bytes every rank sent, both copies): not a requantization.
  if (const QuantizedData* q = t.quantized().get();
      q != nullptr && (columnwise ? q->columnwise_data : q->rowwise_data).defined()) {
    return t;
  }
  return quantized_copies(t, role, QuantUsage{!columnwise, columnwise}, what);
}

Tensor Linear::quantized_for_both(const Tensor& t, QuantRole role, std::string_view what) const {
  if (ctx_.recipe == Recipe::kNone) return t;
  if (const QuantizedData* q = t.quantized().get();
      q != nullptr && q->rowwise_data.defined() && q->columnwise_data.defined()) {
    return t;
  }
  return quantized_copies(t, role, QuantUsage{true, true}, what);
}

Tensor Linear::gather_for_gemm(const Tensor& local, QuantRole role) const {
  DelayedScaling* scaling = scaling_of(role);
  if (scaling == nullptr) return gather_tokens(ctx_, local);
  const std::string what = options_.site + (role == QuantRole::kGradOutput
                                                ? " output gradient (FP8 all-gather)"
                                                : " input (FP8 all-gather)");
  return gather_tokens_fp8(ctx_, local, *scaling, role, what);
}

void Linear::linear_gemm(std::string_view pass, const Tensor& a, bool trans_a, QuantRole a_role,
                         const Tensor& b, bool trans_b, QuantRole b_role, Tensor& c,
                         bool accumulate, const GemmEpilogue& epilogue) const {
  const std::string site = options_.site + "/" + std::string(pass);
  if (ctx_.recipe == Recipe::kNone) {
    ctx_.backend->gemm(site, a, trans_a, b, trans_b, c, accumulate, epilogue);
    return;
  }
  // gemm_quantized reads A's rowwise copy unless trans_a, B's columnwise copy unless
  // trans_b (backend.h): make exactly that one.
  const Tensor qa = quantized_for_gemm(a, a_role, trans_a, site + " operand A");
  const Tensor qb = quantized_for_gemm(b, b_role, !trans_b, site + " operand B");
  // The reference's per-tensor FP8 recipes run the forward GEMM with Hopper's fast
  // accumulation and dgrad / wgrad with the split accumulator; block scaling uses the split
  // accumulator throughout (its MMParams), and MXFP8 / NVFP4 have no such switch.
  const bool per_tensor_fp8 =
      ctx_.recipe == Recipe::kFp8Delayed || ctx_.recipe == Recipe::kFp8Current;
  const bool fast_accumulation = per_tensor_fp8 && pass == "fwd";
  ctx_.backend->gemm_quantized(site, qa, trans_a, qb, trans_b, c, accumulate, epilogue,
                               fast_accumulation);
}

std::int64_t Linear::local_in() const {
  return options_.parallel_mode == ParallelMode::kRow ? options_.in_features / ctx_.tp_size()
                                                      : options_.in_features;
}

std::int64_t Linear::local_out() const {
  return options_.parallel_mode == ParallelMode::kColumn ? options_.out_features / ctx_.tp_size()
                                                         : options_.out_features;
}

bool Linear::column_sp() const {
  return options_.parallel_mode == ParallelMode::kColumn && options_.sequence_parallel;
}

void Linear::save_input(const Tensor& x, Saved& saved) {
  saved.input_shape = x.shape();
  const Tensor full =
      column_sp() && !options_.save_original_input ? gather_for_gemm(x, QuantRole::kInput) : x;
  saved.input = full.reshape({full.numel() / local_in(), local_in()});
}

LayerOutputs Linear::forward(const Tensor& x, Saved& saved) {
  const Options& o = options_;
  TPCHECK_CHECK_INPUT(x.defined() && x.rank() >= 2 && x.dim(-1) == local_in(),
                      "{}: input {} expected [..., {}] (in_features {}, {} mode, tensor-parallel "
                      "size {})",
                      o.site, x.defined() ? x.describe() : "undefined", local_in(), o.in_features,
                      parallel_mode_name(o.parallel_mode), ctx_.tp_size());
  TPCHECK_CHECK_INPUT(x.dtype() == o.params.params_dtype,
                      "{}: input dtype {}, expected params_dtype {}", o.site, dtype_name(x.dtype()),
                      dtype_name(o.params.params_dtype));
  const bool row = o.parallel_mode == ParallelMode::kRow;
  const Tensor full = column_sp() ? gather_for_gemm(x, QuantRole::kInput) : x;
  const Tensor x2 = quantized_for_both(full.reshape({full.numel() / local_in(), local_in()}),
                                       QuantRole::kInput, o.site + " input");
  const Tensor weight = quantized_for_both(local_weight(), QuantRole::kWeight, o.site + " weight");
  saved.weight = ctx_.recipe == Recipe::kNone ? Tensor() : weight;

  saved.input_shape = x.shape();
  saved.input =
      o.save_original_input && column_sp() ? x.reshape({x.numel() / local_in(), local_in()}) : x2;

  const bool add_bias = o.params.bias && !o.return_bias;
  const Tensor bias = local_bias();
  // Unsharded and column-parallel: the bias goes into the GEMM epilogue (one rounding of
  // x·Wᵀ + b), as the reference passes it to its GEMM. Row-parallel: after the reduction.
  GemmEpilogue epilogue;
  bool bias_added = false;
  if (add_bias && !row) {
    epilogue.bias = &bias;
    bias_added = true;
  }
  // Written in full by the GEMM (accumulate = false: C is not read).
  Tensor y2 = Tensor::empty({x2.dim(0), local_out()}, x.dtype(), x.device());
  linear_gemm("fwd", x2, false, QuantRole::kInput, weight, true, QuantRole::kWeight, y2, false,
              epilogue);
  Shape out_shape = full.shape();
  out_shape.back() = local_out();
  Tensor y = y2.reshape(out_shape);

  if (row) {
    if (add_bias && ctx_.mutated(Mutation::kRowBiasBeforeReduce)) {
      ctx_.backend->add_bias(y, bias);  // the bug: every rank adds it
      bias_added = true;
    }
    y = reduce_row_output(ctx_, y, o.sequence_parallel);
  }
  LayerOutputs out;
  if (add_bias && !bias_added) ctx_.backend->add_bias(y, bias);
  if (o.params.bias && o.return_bias) out.bias = bias.clone();
  out.output = y;
  return out;
}

Tensor Linear::backward(const OutputGrads& grads, Saved& saved) {
  const Options& o = options_;
  TPCHECK_CHECK(grads.output.defined(), "{}: backward needs the output gradient", o.site);
  TPCHECK_CHECK(saved.input.defined(), "{}: backward before forward", o.site);
  const bool row = o.parallel_mode == ParallelMode::kRow;
  const Tensor& dy = grads.output;
  TPCHECK_CHECK(dy.dim(-1) == local_out(), "{}: output gradient {}, expected [..., {}]", o.site,
                dy.describe(), local_out());
  const bool row_sp = row && o.sequence_parallel;
  const Tensor dy_full = row_sp ? gather_for_gemm(dy, QuantRole::kGradOutput) : dy;
  const Tensor dy2 =
      quantized_for_both(dy_full.reshape({dy_full.numel() / local_out(), local_out()}),
                         QuantRole::kGradOutput, o.site + " output gradient");
  const Tensor dy_local = dy.reshape({dy.numel() / local_out(), local_out()});

  Tensor dx2 = Tensor::empty({dy2.dim(0), local_in()}, dy.dtype(), dy.device());
  linear_gemm("dgrad", dy2, false, QuantRole::kGradOutput,
              saved.weight.defined() ? saved.weight : local_weight(), false, QuantRole::kWeight,
              dx2, false);
  saved.weight = Tensor();
  Tensor dx = dx2;
  if (o.parallel_mode == ParallelMode::kColumn) {
    Shape full_shape = saved.input_shape;
    full_shape[0] = dx2.numel() / (shape_numel(saved.input_shape) / saved.input_shape[0]);
    dx = reduce_column_dgrad(ctx_, dx2.reshape(full_shape), o.sequence_parallel);
  }

  if (o.wgrad.delay_wgrad_compute) {
    saved.grad_output = dy2;
    saved.grad_output_local = dy_local;
    saved.grad_bias_output = grads.bias;
  } else {
    weight_and_bias_grads(dy2, dy_local, grads.bias, saved);
  }
  return dx.reshape(saved.input_shape);
}

void Linear::backward_dw(Saved& saved) {
  if (!options_.wgrad.delay_wgrad_compute) return;
  TPCHECK_CHECK(saved.grad_output.defined(), "{}: backward_dw before backward", options_.site);
  weight_and_bias_grads(saved.grad_output, saved.grad_output_local, saved.grad_bias_output, saved);
  saved.grad_output = Tensor();
  saved.grad_output_local = Tensor();
  saved.grad_bias_output = Tensor();
}

void Linear::weight_and_bias_grads(const Tensor& dy, const Tensor& dy_local,
                                   const Tensor& dbias_out, const Saved& saved) {
  const Options& o = options_;
  // save_original_input kept the local token slice; gather it again, as TE does.
  const Tensor input = column_sp() && o.save_original_input
                           ? gather_for_gemm(saved.input, QuantRole::kInput)
                           : saved.input;
  Tensor dw = gradient_buffer(GradTarget::kWeight);
  linear_gemm("wgrad", dy, true, QuantRole::kGradOutput, input, false, QuantRole::kInput, dw,
              true);
  store_gradient_buffer(GradTarget::kWeight, dw);
  if (!o.params.bias) return;
  Tensor db = gradient_buffer(GradTarget::kBias);
  if (o.return_bias) {
    // The returned bias's gradient is given whole (a replicated output's gradient).
    TPCHECK_CHECK(dbias_out.defined(), "{}: return_bias needs the bias output gradient", o.site);
    ctx_.backend->accumulate(db, dbias_out);
  } else if (o.parallel_mode == ParallelMode::kRow && o.sequence_parallel) {
    // Each rank's output slice saw the bias: a partial sum, all-reduced.
    Tensor partial = Tensor::zeros_like(db);
    ctx_.backend->accumulate_bias_grad(dy_local, partial);
    reduce_replicated_grad(ctx_, partial, ReplicatedGrad::kRowBias);
    ctx_.backend->accumulate(db, partial);
  } else {
    ctx_.backend->accumulate_bias_grad(dy, db);
  }
  store_gradient_buffer(GradTarget::kBias, db);
}

std::vector<Parameter*> Linear::parameters() {
  std::vector<Parameter*> ps;
  for (Parameter& w : weights_) ps.push_back(&w);
  for (Parameter& b : biases_) ps.push_back(&b);
  return ps;
}

ShardSpec Linear::input_layout(int rank) const {
  if (options_.parallel_mode == ParallelMode::kRow) return ShardSpec::along(rank - 1);
  if (column_sp()) return ShardSpec::along(0);
  return ShardSpec::replicated();
}

OutputLayout Linear::output_layout(int rank) const {
  OutputLayout l;
  if (options_.parallel_mode == ParallelMode::kColumn) {
    l.output = ShardSpec::along(rank - 1, options_.weight_blocks);
    l.bias = ShardSpec::along(0, options_.weight_blocks);
  } else if (options_.parallel_mode == ParallelMode::kRow && options_.sequence_parallel) {
    l.output = ShardSpec::along(0);
  }
  return l;
}

}  // namespace tpcheck

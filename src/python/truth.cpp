// truth.cpp — see truth.h.
#include "python/truth.h"

#include <functional>
#include <set>
#include <tuple>

#include "run/execution.h"
#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"
#include "tpcheck/layers/any_layer.h"
#include "tpcheck/quant.h"
#include "tpcheck/run_options.h"
#include "tpcheck/shard.h"

namespace tpcheck {
namespace {

bool is_extra_state(const std::string& name) {
  const std::string suffix = "_extra_state";
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The caller's options with the run's precision: the truth computes in f64 whatever the
// caller's own run used.
nlohmann::json options_in(const nlohmann::json& options, DType dtype) {
  TPCHECK_CHECK_INPUT(options.is_object(),
                      "layer options must be a dict of constructor keywords, got {}",
                      options.dump());
  nlohmann::json o = options;
  o["params_dtype"] = dtype_name(dtype);
  return o;
}

// The GEMM class rule of a run: f32 GEMMs in the TF32 class when allowed, as the suite runs
// them (the CPU backend rounds their operands to TF32; cuBLASLt computes 32F_FAST_TF32).
GemmClassRule f32_gemm_rule(bool allow_tf32) {
  GemmClassRule rule;
  if (allow_tf32) rule.f32_class = MathClass::kTf32;
  return rule;
}

struct Built {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<AnyLayer> layer;
};

Built build(const std::string& kind, const nlohmann::json& options, const std::string& device,
            DType dtype = DType::kF64, bool allow_tf32 = false, Recipe recipe = Recipe::kNone,
            double probe_u = 0, std::uint64_t probe_seed = 0) {
  Built b;
  if (device == "cpu") {
    b.backend = make_cpu_backend();
  } else {
    TPCHECK_CHECK_INPUT(device == "cuda", "device '{}': expected 'cpu' or 'cuda'", device);
    CudaBackendOptions o;
    o.allow_tf32 = allow_tf32;  // what cuBLASLt may use; the gemm rule below says what it must
    b.backend = make_cuda_backend(o);
  }
  b.backend->set_gemm_rule(f32_gemm_rule(allow_tf32));
  if (probe_u > 0) {
    TPCHECK_CHECK_INPUT(probe_u < 1, "probe_u {}: expected 0 (no probe) or 0 < u < 1", probe_u);
    b.backend = make_rounding_probe_backend(std::move(b.backend), probe_u, probe_seed);
  }
  b.comm = make_single_communicator();
  ModuleContext ctx;
  ctx.backend = b.backend.get();
  ctx.comm = b.comm.get();
  ctx.seed = 0;  // every parameter is overwritten with the caller's
  ctx.recipe = recipe;
  b.layer = make_layer(LayerSpec{kind, options_in(options, dtype)}, ctx);
  return b;
}

std::string expected_list(const std::vector<Parameter*>& params) {
  std::string out;
  for (const Parameter* p : params) {
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", p->name, shape_str(p->global_shape));
  }
  return out;
}

// A copy of `src` in `dtype` on the host.
Tensor host_copy_in(const Tensor& src, DType dtype) {
  Tensor host = src.to_host();
  Tensor out(host.shape(), dtype);
  out.copy_from(host);
  return out;
}

// The caller's parameters against the layer's: names and global shapes, every mismatch in
// one message.
void check_parameter_names(const std::string& kind, const std::vector<Parameter*>& params,
                           const std::map<std::string, Tensor>& given_params) {
  std::set<std::string> given;
  for (const auto& [name, t] : given_params) given.insert(name);
  std::vector<std::string> missing, mismatched;
  for (const Parameter* p : params) {
    auto it = given_params.find(p->name);
    if (it == given_params.end()) {
      missing.push_back(p->name);
      continue;
    }
    given.erase(p->name);
    if (it->second.shape() != p->global_shape) {
      mismatched.push_back(fmt::format("{} expected {} given {}", p->name,
                                       shape_str(p->global_shape), shape_str(it->second.shape())));
    }
  }
  if (!missing.empty() || !given.empty() || !mismatched.empty()) {
    std::string problems;
    if (!missing.empty()) problems += fmt::format("missing: {}; ", fmt::join(missing, ", "));
    if (!given.empty()) problems += fmt::format("unexpected: {}; ", fmt::join(given, ", "));
    if (!mismatched.empty())
      problems += fmt::format("wrong shape: {}; ", fmt::join(mismatched, "; "));
    TPCHECK_CHECK_INPUT(false, "{} parameters do not match its state_dict names: {}expected: {}",
                        kind, problems, expected_list(params));
  }
}

}  // namespace

std::vector<std::pair<std::string, Shape>> layer_parameter_shapes(const std::string& kind,
                                                                  const nlohmann::json& options) {
  Built b = build(kind, options, "cpu");
  std::vector<std::pair<std::string, Shape>> out;
  for (const Parameter* p : b.layer->parameters()) out.emplace_back(p->name, p->global_shape);
  return out;
}

namespace {

// What the caller gave, in the run's dtype on the host.
struct Given {
  std::map<std::string, Tensor> params, grads;
  Tensor input;
};

// The global shape of a tensor whose rank-local piece has `local` shape under `spec` (one
// block per rank along spec.dim: the layers' input and output layouts).
Shape global_shape_of(Shape local, const ShardSpec& spec, int world) {
  if (!spec.is_replicated()) local[static_cast<std::size_t>(spec.dim)] *= world;
  return local;
}

// One rank's local results (rank r of `world`; world 1: the unsharded layer), on the host.
struct RankResults {
  std::map<std::string, Tensor> outputs;
  std::map<std::string, ShardSpec> output_layouts;
  Tensor grad_input;
  std::map<std::string, Tensor> grads;
};

// A rank's run: its shards of the caller's parameters, input and output gradients, then
// forward and (with output gradients) backward.
RankResults run_rank(const std::string& kind, AnyLayer& layer, Device device, DType dtype,
                     const Given& given, int rank, int world) {
  std::vector<Parameter*> params = layer.parameters();
  check_parameter_names(kind, params, given.params);
  for (Parameter* p : params) {
    p->value.copy_from(
        take_shard(given.params.at(p->name), p->shard, rank, world).to_device(device));
  }
  const LayerOutputs outs =
      layer.forward(take_shard(given.input, layer.input_layout(), rank, world).to_device(device));
  const OutputLayout layout = layer.output_layout();
  RankResults result;
  const std::tuple<const char*, const Tensor*, const ShardSpec*, Tensor OutputGrads::*> returned[] =
      {{"output", &outs.output, &layout.output, &OutputGrads::output},
       {"bias", &outs.bias, &layout.bias, &OutputGrads::bias},
       {"layernorm_output", &outs.layernorm_output, &layout.layernorm_output,
        &OutputGrads::layernorm_output}};
  std::vector<std::string> returned_names;
  for (const auto& [name, t, spec, slot] : returned) {
    if (!t->defined()) continue;
    result.outputs[name] = t->to_host();
    result.output_layouts[name] = *spec;
    returned_names.push_back(name);
  }
  if (given.grads.empty()) return result;

  for (const auto& [name, g] : given.grads) {
    TPCHECK_CHECK_INPUT(result.outputs.count(name) == 1,
                        "{}: grad_output '{}' given, but the layer returns only {} (with these "
                        "options)",
                        kind, name, fmt::join(returned_names, ", "));
  }
  OutputGrads grads;
  for (const auto& [name, t, spec, slot] : returned) {
    if (!t->defined()) continue;
    auto it = given.grads.find(name);
    if (it == given.grads.end()) {
      grads.*slot = Tensor::zeros(t->shape(), dtype, device);  // not in the loss
      continue;
    }
    const Shape global = global_shape_of(t->shape(), *spec, world);
    TPCHECK_CHECK_INPUT(it->second.shape() == global,
                        "{}: grad_output '{}' has shape {}, the {} has shape {}", kind, name,
                        shape_str(it->second.shape()), name, shape_str(global));
    grads.*slot = take_shard(it->second, *spec, rank, world).to_device(device);
  }
  result.grad_input = layer.backward(grads).to_host();
  if (layer.delays_wgrad()) layer.backward_dw();
  for (const Parameter* p : params) result.grads[p->name] = p->gradient().to_host();
  return result;
}

// The whole tensor from every rank's piece (rank 0's when it is replicated: the same on
// every rank, by a collective or the same computation).
Tensor assembled(const std::vector<RankResults>& ranks, const ShardSpec& spec,
                 const std::function<const Tensor&(const RankResults&)>& piece) {
  if (spec.is_replicated() || ranks.size() == 1) return piece(ranks[0]);
  std::vector<Tensor> pieces;
  for (const RankResults& r : ranks) pieces.push_back(piece(r));
  return assemble_shards(pieces, spec);
}

// The run at tp_size > 1: the suite's own group for the device (CPU threads, or every rank
// on GPU 0 over the device group in NCCL's ring order: `tpcheck run --backend D --tp N
// --comm emulated`), each rank a thread of this process even inside a torchrun or
// `tpcheck emulate` rank; the ranks' pieces assembled after.
LayerRunResult run_sharded(const LayerRunRequest& r, DType dtype, Recipe recipe,
                           const Given& given) {
  RunOptions o;
  set_run_option(o, "backend", r.device);
  set_run_option(o, "tp", std::to_string(r.tp_size));
  set_run_option(o, "tf32", r.allow_tf32 ? "on" : "off");
  RunSettings settings;
  const ResolvedExecution resolved = in_process_execution(o, f32_gemm_rule(r.allow_tf32), settings);
  const Execution& execution = resolved.execution;
  const Device device = r.device == "cpu" ? Device::kCpu : Device::kCuda;

  std::vector<RankResults> ranks(static_cast<std::size_t>(r.tp_size));
  std::vector<ShardSpec> input_layouts(ranks.size());
  std::vector<std::map<std::string, ShardSpec>> param_shards(ranks.size());
  execution.launch_group(r.tp_size, [&](Communicator& group) {
    std::unique_ptr<Backend> backend = execution.make_backend(group.rank());
    backend->set_gemm_rule(resolved.gemm_rule);
    backend->set_rank(group.rank());
    ModuleContext ctx;
    ctx.backend = backend.get();
    ctx.comm = &group;
    ctx.recipe = recipe;
    ctx.seed = 0;  // every parameter is overwritten with the caller's
    std::unique_ptr<AnyLayer> layer =
        make_layer(LayerSpec{r.kind, options_in(r.options, dtype)}, ctx);
    const auto me = static_cast<std::size_t>(group.rank());
    ranks[me] = run_rank(r.kind, *layer, device, dtype, given, group.rank(), r.tp_size);
    input_layouts[me] = layer->input_layout();
    for (const Parameter* p : layer->parameters()) param_shards[me][p->name] = p->shard;
  });

  LayerRunResult result;
  for (const auto& [name, spec] : ranks[0].output_layouts) {
    result.outputs[name] = assembled(
        ranks, spec, [&name](const RankResults& x) -> const Tensor& { return x.outputs.at(name); });
  }
  if (!ranks[0].grad_input.defined()) return result;
  result.grad_input = assembled(ranks, input_layouts[0],
                                [](const RankResults& x) -> const Tensor& { return x.grad_input; });
  for (const auto& [name, spec] : param_shards[0]) {
    result.grads[name] = assembled(
        ranks, spec, [&name](const RankResults& x) -> const Tensor& { return x.grads.at(name); });
  }
  return result;
}

}  // namespace

LayerRunResult run_layer(const LayerRunRequest& r) {
  TPCHECK_CHECK_INPUT(r.input.defined(), "{}: the input is missing", r.kind);
  const DType dtype = parse_dtype(r.dtype);
  TPCHECK_CHECK_INPUT(
      dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
      "dtype '{}': expected f64 (the truth), f32, bf16 or f16", r.dtype);
  TPCHECK_CHECK_INPUT(r.probe_u >= 0, "probe_u {}: expected 0 (no probe) or 0 < u < 1", r.probe_u);
  TPCHECK_CHECK_INPUT(r.probe_u == 0 || dtype == DType::kF64,
                      "probe_u {} with dtype {}: the rounding probe perturbs the f64 truth only",
                      r.probe_u, r.dtype);
  TPCHECK_CHECK_INPUT(r.tp_size >= 1 && r.tp_size <= 64, "tp_size {}: expected 1 to 64", r.tp_size);
  TPCHECK_CHECK_INPUT(r.tp_size == 1 || r.probe_u == 0,
                      "probe_u {} at tp_size {}: the rounding probe runs the unsharded truth only",
                      r.probe_u, r.tp_size);
  const Recipe recipe = parse_recipe(r.recipe);
  TPCHECK_CHECK_INPUT(recipe == Recipe::kNone || dtype != DType::kF64,
                      "recipe {} with dtype f64: the truth never quantizes", r.recipe);
  // Everything the caller gave, in the run's dtype on the host first: a caller's device
  // arrays are read on the stream they were handed over on, before the layer's backend
  // (its own stream) exists.
  Given given;
  for (const auto& [name, t] : r.params) {
    if (!is_extra_state(name)) given.params[name] = host_copy_in(t, dtype);
  }
  for (const auto& [name, t] : r.grad_outputs) given.grads[name] = host_copy_in(t, dtype);
  given.input = host_copy_in(r.input, dtype);
  // The token layers take [T, features] (T: every leading dimension, docs/LAYERS.md) and
  // state their layouts for that view; the attention layers take [s, b, hidden]. A caller's
  // [s, b, features] goes in flattened and its results come back in the caller's shape.
  const Shape input_shape = given.input.shape();
  const bool flatten =
      r.kind != "MultiheadAttention" && r.kind != "TransformerLayer" && input_shape.size() > 2;
  auto tokens_2d = [](const Tensor& t) {
    Shape s = t.shape();
    std::int64_t tokens = 1;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) tokens *= s[i];
    return t.reshape(Shape{tokens, s.back()});
  };
  if (recipe != Recipe::kNone) {
    // every quantized activation is a [tokens, features] matrix of the whole token count
    const std::int64_t features = input_shape.back();
    check_quantizable(fmt::format("{}: input", r.kind), {given.input.numel() / features, features},
                      recipe, QuantRole::kInput, QuantUsage{true, true});
  }
  if (flatten) {
    given.input = tokens_2d(given.input);
    for (auto& [name, g] : given.grads) {
      if (g.shape().size() > 1) g = tokens_2d(g);
    }
  }

  LayerRunResult result;
  if (r.tp_size > 1) {
    result = run_sharded(r, dtype, recipe, given);
  } else {
    Built b =
        build(r.kind, r.options, r.device, dtype, r.allow_tf32, recipe, r.probe_u, r.probe_seed);
    const Device device = r.device == "cpu" ? Device::kCpu : Device::kCuda;
    RankResults mine = run_rank(r.kind, *b.layer, device, dtype, given, 0, 1);
    result.outputs = std::move(mine.outputs);
    result.grad_input = std::move(mine.grad_input);
    result.grads = std::move(mine.grads);
  }
  if (flatten) {
    for (auto& [name, t] : result.outputs) {
      if (t.shape().size() != 2) continue;  // a returned bias: [features]
      Shape back(input_shape.begin(), input_shape.end() - 1);
      back.push_back(t.shape().back());
      t = t.reshape(back);
    }
    if (result.grad_input.defined()) result.grad_input = result.grad_input.reshape(input_shape);
  }
  return result;
}

}  // namespace tpcheck

// truth.cpp — see truth.h.
#include "python/truth.h"

#include <set>

#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"
#include "tpcheck/layers/any_layer.h"

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
  TPCHECK_CHECK_INPUT(options.is_object(), "layer options must be a dict of constructor keywords, got {}",
                      options.dump());
  nlohmann::json o = options;
  o["params_dtype"] = dtype_name(dtype);
  return o;
}

struct Built {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<AnyLayer> layer;
};

Built build(const std::string& kind, const nlohmann::json& options, const std::string& device,
            DType dtype = DType::kF64, bool allow_tf32 = false, double probe_u = 0,
            std::uint64_t probe_seed = 0) {
  Built b;
  if (device == "cpu") {
    b.backend = make_cpu_backend();
  } else {
    TPCHECK_CHECK_INPUT(device == "cuda", "device '{}': expected 'cpu' or 'cuda'", device);
    CudaBackendOptions o;
    o.allow_tf32 = allow_tf32;  // what cuBLASLt may use; the gemm rule below says what it must
    b.backend = make_cuda_backend(o);
  }
  if (allow_tf32) {
    // f32 GEMMs in the TF32 class, as the suite runs them with TF32 allowed (the CPU
    // backend rounds their operands to TF32; cuBLASLt computes 32F_FAST_TF32)
    GemmClassRule rule;
    rule.f32_class = MathClass::kTf32;
    b.backend->set_gemm_rule(rule);
  }
  if (probe_u > 0) {
    TPCHECK_CHECK_INPUT(probe_u < 1, "probe_u {}: expected 0 (no probe) or 0 < u < 1", probe_u);
    b.backend = make_rounding_probe_backend(std::move(b.backend), probe_u, probe_seed);
  }
  b.comm = make_single_communicator();
  ModuleContext ctx;
  ctx.backend = b.backend.get();
  ctx.comm = b.comm.get();
  ctx.seed = 0;  // every parameter is overwritten with the caller's
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

}  // namespace

std::vector<std::pair<std::string, Shape>> layer_parameter_shapes(const std::string& kind,
                                                                   const nlohmann::json& options) {
  Built b = build(kind, options, "cpu");
  std::vector<std::pair<std::string, Shape>> out;
  for (const Parameter* p : b.layer->parameters()) out.emplace_back(p->name, p->global_shape);
  return out;
}

LayerRunResult run_layer(const LayerRunRequest& r) {
  TPCHECK_CHECK_INPUT(r.input.defined(), "{}: the input is missing", r.kind);
  const DType dtype = parse_dtype(r.dtype);
  TPCHECK_CHECK_INPUT(dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kBF16 ||
                          dtype == DType::kF16,
                      "dtype '{}': expected f64 (the truth), f32, bf16 or f16", r.dtype);
  TPCHECK_CHECK_INPUT(r.probe_u >= 0, "probe_u {}: expected 0 (no probe) or 0 < u < 1", r.probe_u);
  TPCHECK_CHECK_INPUT(r.probe_u == 0 || dtype == DType::kF64,
                      "probe_u {} with dtype {}: the rounding probe perturbs the f64 truth only",
                      r.probe_u, r.dtype);
  // Everything the caller gave, in the run's dtype on the host first: a caller's device
  // arrays are read on the stream they were handed over on, before the layer's backend
  // (its own stream) exists.
  std::map<std::string, Tensor> given_params, given_grads;
  for (const auto& [name, t] : r.params) {
    if (!is_extra_state(name)) given_params[name] = host_copy_in(t, dtype);
  }
  for (const auto& [name, t] : r.grad_outputs) given_grads[name] = host_copy_in(t, dtype);
  const Tensor x_host = host_copy_in(r.input, dtype);

  Built b = build(r.kind, r.options, r.device, dtype, r.allow_tf32, r.probe_u, r.probe_seed);
  const Device device = r.device == "cpu" ? Device::kCpu : Device::kCuda;
  std::vector<Parameter*> params = b.layer->parameters();

  // Names and shapes, all mismatches in one message.
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
    if (!mismatched.empty()) problems += fmt::format("wrong shape: {}; ", fmt::join(mismatched, "; "));
    TPCHECK_CHECK_INPUT(false, "{} parameters do not match its state_dict names: {}expected: {}",
                        r.kind, problems, expected_list(params));
  }
  for (Parameter* p : params) p->value.copy_from(given_params.at(p->name).to_device(device));

  const Tensor x = x_host.to_device(device);
  const LayerOutputs outs = b.layer->forward(x);
  LayerRunResult result;
  const std::pair<const char*, const Tensor*> returned[] = {
      {"output", &outs.output}, {"bias", &outs.bias}, {"layernorm_output", &outs.layernorm_output}};
  for (const auto& [name, t] : returned) {
    if (t->defined()) result.outputs[name] = t->to_host();
  }
  if (given_grads.empty()) return result;

  OutputGrads grads;
  Tensor* slots[] = {&grads.output, &grads.bias, &grads.layernorm_output};
  std::vector<std::string> returned_names;
  for (const auto& [name, t] : result.outputs) returned_names.push_back(name);
  for (const auto& [name, g] : given_grads) {
    TPCHECK_CHECK_INPUT(result.outputs.count(name) == 1,
                        "{}: grad_output '{}' given, but the layer returns only {} (with these "
                        "options)",
                        r.kind, name, fmt::join(returned_names, ", "));
  }
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& [name, t] = returned[i];
    if (!t->defined()) continue;
    auto it = given_grads.find(name);
    if (it == given_grads.end()) {
      *slots[i] = Tensor::zeros(t->shape(), dtype, device);  // not in the loss
      continue;
    }
    TPCHECK_CHECK_INPUT(it->second.shape() == t->shape(),
                        "{}: grad_output '{}' has shape {}, the {} has shape {}", r.kind, name,
                        shape_str(it->second.shape()), name, shape_str(t->shape()));
    *slots[i] = it->second.to_device(device);
  }
  result.grad_input = b.layer->backward(grads).to_host();
  if (b.layer->delays_wgrad()) b.layer->backward_dw();
  for (const Parameter* p : params) result.grads[p->name] = p->gradient().to_host();
  return result;
}

}  // namespace tpcheck

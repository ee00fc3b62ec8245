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

nlohmann::json f64_options(const nlohmann::json& options) {
  TPCHECK_CHECK_INPUT(options.is_object(), "layer options must be a dict of constructor keywords, got {}",
                      options.dump());
  nlohmann::json o = options;
  o["params_dtype"] = "f64";  // the truth computes in f64 whatever the caller's run used
  return o;
}

struct Built {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<AnyLayer> layer;
};

Built build(const std::string& kind, const nlohmann::json& options, const std::string& device,
            double probe_u = 0, std::uint64_t probe_seed = 0) {
  Built b;
  if (device == "cpu") {
    b.backend = make_cpu_backend();
  } else {
    TPCHECK_CHECK_INPUT(device == "cuda", "device '{}': expected 'cpu' or 'cuda'", device);
    CudaBackendOptions o;
    o.allow_tf32 = false;
    b.backend = make_cuda_backend(o);
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
  b.layer = make_layer(LayerSpec{kind, f64_options(options)}, ctx);
  return b;
}

std::string expected_list(const std::vector<Parameter*>& params) {
  std::string out;
  for (const Parameter* p : params) {
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", p->name, shape_str(p->global_shape));
  }
  return out;
}

// A copy of `src` in f64 on `device`.
Tensor f64_on(const Tensor& src, Device device) {
  Tensor host = src.to_host();
  Tensor out(host.shape(), DType::kF64);
  out.copy_from(host);
  return out.to_device(device);
}

}  // namespace

std::vector<std::pair<std::string, Shape>> layer_parameter_shapes(const std::string& kind,
                                                                   const nlohmann::json& options) {
  Built b = build(kind, options, "cpu");
  std::vector<std::pair<std::string, Shape>> out;
  for (const Parameter* p : b.layer->parameters()) out.emplace_back(p->name, p->global_shape);
  return out;
}

TruthResult compute_truth(const TruthRequest& r) {
  TPCHECK_CHECK_INPUT(r.input.defined(), "{}: the input is missing", r.kind);
  // Everything the caller gave, in f64 on the host first: a caller's device arrays are read
  // on the stream they were handed over on, before the layer's backend (its own stream)
  // exists.
  std::map<std::string, Tensor> given_params, given_grads;
  for (const auto& [name, t] : r.params) {
    if (!is_extra_state(name)) given_params[name] = f64_on(t, Device::kCpu);
  }
  for (const auto& [name, t] : r.grad_outputs) given_grads[name] = f64_on(t, Device::kCpu);
  const Tensor x_host = f64_on(r.input, Device::kCpu);

  TPCHECK_CHECK_INPUT(r.probe_u >= 0, "probe_u {}: expected 0 (no probe) or 0 < u < 1", r.probe_u);
  Built b = build(r.kind, r.options, r.device, r.probe_u, r.probe_seed);
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
  TruthResult result;
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
      *slots[i] = Tensor::zeros(t->shape(), DType::kF64, device);  // not in the loss
      continue;
    }
    TPCHECK_CHECK_INPUT(it->second.shape() == t->shape(),
                        "{}: grad_output '{}' has shape {}, the {} has shape {}", r.kind, name,
                        shape_str(it->second.shape()), name, shape_str(t->shape()));
    *slots[i] = it->second.to_device(device);
  }
  result.grad_input = b.layer->backward(grads).to_host();
  if (b.layer->delays_wgrad()) b.layer->backward_dw();
  for (const Parameter* p : params) result.grads[p->name] = f64_on(p->gradient(), Device::kCpu);
  return result;
}

}  // namespace tpcheck

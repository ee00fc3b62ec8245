// layer_dump — runs one tpcheck layer forward and backward on one device and writes
// everything an independent reference needs to a safetensors file, for
// tests/python/test_layers_vs_jax.py.
//
// Usage: layer_dump --kind KIND --options JSON --input-shape D0,D1,.. --seed S --out PATH
//   KIND     a make_layer kind ("Linear", "TransformerLayer", ...)
//   JSON     the layer's options (docs/LAYERS.md); params_dtype defaults to f64 here
//
// The layer is built with make_layer on the CPU backend and a single communicator.
// Input and targets are N(0, 1) from the RNG under the names "input", "target",
// "target_ln". The loss is the suite's (docs/LAYERS.md, "Loss used by the suite"):
//   MSE(output (+ bias, broadcast over rows, when returned), target)
//   + MSE(layernorm_output, target_ln)   (when returned)
// so the output gradients are 2 (y − t) / numel, and the returned bias's gradient is the
// column sum of the output gradient. Backward, then backward_dw when the layer delays
// weight gradients.
//
// File contents: input, target, target_ln (when used), param/<name> (value),
// out/output, out/bias, out/layernorm_output (when returned), grad/input,
// grad/<name> (Parameter::gradient()); metadata {"kind", "options" (JSON, with
// params_dtype), "parameters" (JSON list of names in parameters() order)}.
// Exit status: 0 written, 2 bad arguments or options, 3 other errors.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/dtype.h"
#include "tpcheck/error.h"
#include "tpcheck/layers/any_layer.h"
#include "tpcheck/layers/module.h"
#include "tpcheck/rng.h"
#include "tpcheck/safetensors.h"
#include "tpcheck/tensor.h"

namespace {

using tpcheck::DType;
using tpcheck::Shape;
using tpcheck::Tensor;

struct Args {
  std::string kind;
  std::string options = "{}";
  Shape input_shape;
  std::uint64_t seed = 0;
  std::string out;
};

Shape parse_shape(const std::string& text) {
  Shape shape;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string part = text.substr(pos, comma - pos);
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TPCHECK_CHECK_INPUT(used == part.size() && !part.empty() && v > 0,
                        "--input-shape '{}': expected positive integers separated by commas", text);
    shape.push_back(v);
    pos = comma + 1;
  }
  return shape;
}

Args parse_args(int argc, char** argv) {
  Args args;
  bool have_seed = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    TPCHECK_CHECK_INPUT(i + 1 < argc, "{} needs a value", flag);
    const std::string value = argv[++i];
    if (flag == "--kind") {
      args.kind = value;
    } else if (flag == "--options") {
      args.options = value;
    } else if (flag == "--input-shape") {
      args.input_shape = parse_shape(value);
    } else if (flag == "--seed") {
      std::size_t used = 0;
      try {
        args.seed = std::stoull(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TPCHECK_CHECK_INPUT(used == value.size() && !value.empty(),
                          "--seed '{}': expected a non-negative integer", value);
      have_seed = true;
    } else if (flag == "--out") {
      args.out = value;
    } else {
      TPCHECK_CHECK_INPUT(false,
                          "unknown argument '{}'; expected --kind, --options, "
                          "--input-shape, --seed, --out",
                          flag);
    }
  }
  TPCHECK_CHECK_INPUT(
      !args.kind.empty() && !args.input_shape.empty() && have_seed && !args.out.empty(),
      "usage: layer_dump --kind KIND --options JSON --input-shape D0,D1,.. "
      "--seed S --out PATH");
  return args;
}

// 2 (y + bias − t) / numel(y), with bias [n] broadcast over the rows of y [.., n]
// (bias undefined: not added). f64 math, result in y's dtype.
Tensor mse_grad(const Tensor& y, const Tensor& bias, const Tensor& target) {
  TPCHECK_CHECK(y.shape() == target.shape(), "target {} vs output {}", target.describe(),
                y.describe());
  std::vector<double> yv = y.to_f64();
  const std::vector<double> tv = target.to_f64();
  const std::vector<double> bv = bias.defined() ? bias.to_f64() : std::vector<double>{};
  const std::size_t n = static_cast<std::size_t>(y.dim(-1));
  TPCHECK_CHECK(bv.empty() || bv.size() == n, "bias {} vs output {}", bias.describe(),
                y.describe());
  const double scale = 2.0 / static_cast<double>(yv.size());
  for (std::size_t i = 0; i < yv.size(); ++i) {
    const double b = bv.empty() ? 0.0 : bv[i % n];
    yv[i] = scale * (yv[i] + b - tv[i]);
  }
  return Tensor::from_f64(yv, y.shape(), y.dtype());
}

// Σ over rows of dy [.., n] → [n], in dy's dtype.
Tensor column_sums(const Tensor& dy) {
  const std::int64_t n = dy.dim(-1);
  std::vector<double> sums(static_cast<std::size_t>(n), 0.0);
  const std::vector<double> v = dy.to_f64();
  for (std::size_t i = 0; i < v.size(); ++i) sums[i % static_cast<std::size_t>(n)] += v[i];
  return Tensor::from_f64(sums, Shape{n}, dy.dtype());
}

int run(const Args& args) {
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(args.options);
  } catch (const nlohmann::json::exception& e) {
    TPCHECK_CHECK_INPUT(false, "--options '{}' is not valid JSON: {}", args.options, e.what());
  }
  TPCHECK_CHECK_INPUT(options.is_object(), "--options '{}': expected a JSON object", args.options);
  if (!options.contains("params_dtype")) options["params_dtype"] = "f64";
  const DType dtype = tpcheck::parse_dtype(options["params_dtype"].get<std::string>());

  std::unique_ptr<tpcheck::Backend> backend = tpcheck::make_cpu_backend();
  std::unique_ptr<tpcheck::Communicator> comm = tpcheck::make_single_communicator();
  tpcheck::ModuleContext ctx;
  ctx.backend = backend.get();
  ctx.comm = comm.get();
  ctx.seed = args.seed;
  std::unique_ptr<tpcheck::AnyLayer> layer =
      tpcheck::make_layer(tpcheck::LayerSpec{args.kind, options}, ctx);

  const auto normal = tpcheck::FillSpec::normal(0.0, 1.0);
  const Tensor x = tpcheck::generate(normal, args.seed, "input", args.input_shape, dtype);
  const tpcheck::LayerOutputs outs = layer->forward(x);

  tpcheck::SafetensorsFile file;
  file.metadata["kind"] = args.kind;
  file.metadata["options"] = options.dump();
  file.tensors["input"] = x;
  file.tensors["out/output"] = outs.output;

  const Tensor target = tpcheck::generate(normal, args.seed, "target", outs.output.shape(), dtype);
  file.tensors["target"] = target;
  tpcheck::OutputGrads grads;
  grads.output = mse_grad(outs.output, outs.bias, target);
  if (outs.bias.defined()) {
    file.tensors["out/bias"] = outs.bias;
    grads.bias = column_sums(grads.output);
  }
  if (outs.layernorm_output.defined()) {
    const Tensor target_ln =
        tpcheck::generate(normal, args.seed, "target_ln", outs.layernorm_output.shape(), dtype);
    file.tensors["target_ln"] = target_ln;
    file.tensors["out/layernorm_output"] = outs.layernorm_output;
    grads.layernorm_output = mse_grad(outs.layernorm_output, Tensor(), target_ln);
  }

  file.tensors["grad/input"] = layer->backward(grads);
  if (layer->delays_wgrad()) layer->backward_dw();
  nlohmann::json order = nlohmann::json::array();
  for (const tpcheck::Parameter* p : layer->parameters()) {
    order.push_back(p->name);
    file.tensors["param/" + p->name] = p->value;
    file.tensors["grad/" + p->name] = p->gradient();
  }
  file.metadata["parameters"] = order.dump();  // the file's tensors are sorted by name
  tpcheck::write_safetensors(args.out, file);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const tpcheck::Error& e) {
    std::fprintf(stderr, "layer_dump: %s\n", e.what());
    return e.kind() == tpcheck::ErrorKind::kInput ? 2 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "layer_dump: %s\n", e.what());
    return 3;
  }
}

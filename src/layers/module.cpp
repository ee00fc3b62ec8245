// module.cpp — parameter creation, the SGD step and the default initialisations (module.h).
#include "tpcheck/layers/module.h"

#include "layers/tp_ops.h"
#include "tpcheck/error.h"

namespace tpcheck {

Parameter make_parameter(const ModuleContext& ctx, std::string name, Shape global_shape,
                         ShardSpec shard, const FillSpec& fill, DType dtype,
                         bool fuse_wgrad_accumulation) {
  return make_parameter_from_rank(ctx, std::move(name), std::move(global_shape), std::move(shard),
                                  fill, dtype, fuse_wgrad_accumulation, ctx.rank());
}

Parameter make_parameter_from_rank(const ModuleContext& ctx, std::string name, Shape global_shape,
                                   ShardSpec shard, const FillSpec& fill, DType dtype,
                                   bool fuse_wgrad_accumulation, int source_rank,
                                   const std::optional<ShardSpec>& values_from) {
  const int world = ctx.tp_size();
  check_shardable(global_shape, shard, world, name);
  Parameter p;
  if (ctx.shapes_only) {  // check_case: no values (see ModuleContext)
    p.name = std::move(name);
    p.global_shape = std::move(global_shape);
    p.shard = std::move(shard);
    return p;
  }
  // Generated from global indices where the backend computes (rng.h).
  p.value = generate(fill, ctx.seed, name, global_shape, dtype, values_from.value_or(shard),
                     source_rank, world, ctx.backend->device());
  p.grad = Tensor::zeros_like(p.value);
  if (fuse_wgrad_accumulation) {
    // f32 as in TransformerEngine; f64 in the truth run, whose point is to lose nothing.
    const DType main_dtype = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
    p.main_grad = Tensor::zeros(p.value.shape(), main_dtype, p.value.device());
  }
  p.name = std::move(name);
  p.global_shape = std::move(global_shape);
  p.shard = std::move(shard);
  return p;
}

void sgd_update(Backend& backend, Parameter& p, double lr) {
  const Tensor& g = p.gradient();
  TPCHECK_CHECK(p.value.defined() && g.defined() && g.shape() == p.value.shape(),
                "sgd_update: parameter {} has value {} and gradient {}", p.name,
                p.value.defined() ? p.value.describe() : "undefined",
                g.defined() ? g.describe() : "undefined");
  // f64 for an f64 value (the truth run, whose gradients are f64 too), else f32: −lr · g
  // in it (widening a gradient is exact; the product rounds once), then value + that,
  // computed wide and rounded once to the value's dtype (Backend::accumulate).
  const DType wide = p.value.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor step = backend.scale(g.dtype() == wide ? g : g.to(wide), -lr);
  backend.accumulate(p.value, step);
}

void zero_gradients(Parameter& p) {
  p.grad.fill_zero();
  if (p.main_grad.defined()) p.main_grad.fill_zero();
}

FillSpec default_weight_fill() { return FillSpec::normal(0.0, kWeightInitStd); }
FillSpec default_bias_fill() { return FillSpec::normal(0.0, kWeightInitStd); }
FillSpec default_gamma_fill(bool zero_centered_gamma) {
  return FillSpec::normal(zero_centered_gamma ? 0.0 : 1.0, 0.1);
}
FillSpec default_beta_fill() { return FillSpec::normal(0.0, 0.1); }

}  // namespace tpcheck

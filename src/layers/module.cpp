// module.cpp — parameter creation and the default initialisations (module.h).
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
                                   bool fuse_wgrad_accumulation, int source_rank) {
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
  p.value = generate(fill, ctx.seed, name, global_shape, dtype, shard, source_rank, world,
                     ctx.backend->device());
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

FillSpec default_weight_fill() { return FillSpec::normal(0.0, kWeightInitStd); }
FillSpec default_bias_fill() { return FillSpec::normal(0.0, kWeightInitStd); }
FillSpec default_gamma_fill(bool zero_centered_gamma) {
  return FillSpec::normal(zero_centered_gamma ? 0.0 : 1.0, 0.1);
}
FillSpec default_beta_fill() { return FillSpec::normal(0.0, 0.1); }

}  // namespace tpcheck

// run_case: one suite case, three runs (single, sharded, truth), every compared tensor
// reassembled to its global shape.
//
// Data flow, identical in the three runs, once per training step (RunConfig::steps):
//   global input ──(input layout)──▶ local input ─▶ layer.forward ─▶ local outputs
//   local outputs ──all_gather──▶ global outputs ─▶ MSE loss gradients (global, f64)
//   global gradients ──(output layout)──▶ local output gradients ─▶ layer.backward
//   (+ backward_dw) ─▶ parameter gradients (local shards) ─▶ kept for this step
//   then, before the next step: SGD on every parameter (sgd_update, kSgdLearningRate),
//   gradients zeroed, the quantization state updated (AnyLayer::update_scaling).
// The same input and targets every step. The loss gradient is computed on the gathered
// global output, as the reference suite does with its differentiable gather; the
// runner's own gathers are never mutated.
#include <chrono>
#include <future>
#include <string_view>
#include <vector>

#include "tpcheck/error.h"
#include "tpcheck/layers/any_layer.h"
#include "tpcheck/suite.h"

namespace tpcheck {
namespace {

// What one rank (or the single / truth run) produced in one step, still sharded.
struct StepOutputs {
  LayerOutputs outputs;
  std::vector<Tensor> gradients;  // Parameter::gradient(), in parameters() order
  Tensor input_gradient;          // what backward returns: dL/dinput, input_layout()
};

// Everything one rank (or the single / truth run) produced.
struct RankResult {
  std::vector<StepOutputs> steps;  // one per training step
  std::vector<GemmRecord> gemms;   // every step's
  std::vector<CommRecord> comms;
};

struct Layouts {
  OutputLayout outputs;
  ShardSpec input;
  std::vector<std::string> param_names;
  std::vector<ShardSpec> param_shards;
};

Tensor gather_global(Communicator& comm, const Tensor& local, const ShardSpec& spec) {
  if (spec.is_replicated() || comm.size() == 1) return local;
  TPCHECK_CHECK(spec.blocks.size() <= 1, "outputs are sharded as one block");
  return comm.all_gather(local, spec.dim);
}

// Gradients of the suite loss with respect to output, bias and layernorm output (global).
//   kExtended:  L = MSE(output + bias, target) [+ MSE(layernorm_output, target_ln)]
//   kReference: L = MSE(output, target); the returned bias and layernorm output get zero
//               gradients (they are outside the loss, as in the reference suite).
// computed in f64 and rounded once to each tensor's dtype.
// The targets are generated on `device` (the run's: on a GPU much quicker than on the host
// at production sizes) and read back. Every run of a case is on one kind of device, so
// single, sharded and truth see the same targets (f64 values may differ in the last bit
// between host and GPU generation: ARCHITECTURE.md, random values).
std::vector<double> loss_target(std::uint64_t seed, std::string_view name, const Shape& shape,
                                Device device) {
  return generate(FillSpec::normal(0, 1), seed, name, shape, DType::kF64, {}, 0, 1, device).to_f64();
}

// Host copies of a run's outputs (the loss, and Execution::results_on_host).
LayerOutputs to_host(const LayerOutputs& o) {
  auto host = [](const Tensor& t) { return t.defined() ? t.to_host() : t; };
  return {host(o.output), host(o.bias), host(o.layernorm_output)};
}

// The loss gradients of the global outputs, in each output's dtype: computed in f64 and
// rounded once. The reference loss (MSE on the output) is 2/n · (y − target) — the
// Backend's mse_loss_backward contract, so on a GPU it is computed there, where y is, by
// the undecorated backend (the rounding probe perturbs the layer's stores, not the
// harness's), bit for bit the host loop. tpcheck's own loss (the `full` suite's) is
// computed on the host.
OutputGrads loss_gradients(const LayerOutputs& global, std::uint64_t seed, SuiteLoss loss,
                           Backend& backend) {
  OutputGrads g;
  const Device device = backend.device();
  if (loss == SuiteLoss::kReference) {
    const Tensor& y = global.output;
    if (device != Device::kCpu) {
      const Tensor target = generate(FillSpec::normal(0, 1), seed, "target", y.shape(),
                                     DType::kF64, {}, 0, 1, device);
      g.output = backend.undecorated().mse_loss_backward(y.to(DType::kF64), target).to(y.dtype());
    } else {
      std::vector<double> yv = y.to_f64();
      const std::vector<double> t = loss_target(seed, "target", y.shape(), device);
      const double factor = 2.0 / static_cast<double>(yv.size());
      for (std::size_t i = 0; i < yv.size(); ++i) yv[i] = factor * (yv[i] - t[i]);
      g.output = Tensor::from_f64(yv, y.shape(), y.dtype());
    }
    if (global.bias.defined()) g.bias = Tensor::zeros_like(global.bias);
    if (global.layernorm_output.defined())
      g.layernorm_output = Tensor::zeros_like(global.layernorm_output);
    return g;
  }
  const LayerOutputs host = to_host(global);
  const Tensor& y = host.output;
  const std::int64_t cols = y.dim(-1), rows = y.numel() / cols;
  std::vector<double> yv = y.to_f64();
  if (host.bias.defined()) {
    std::vector<double> b = host.bias.to_f64();
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) yv[i * cols + j] += b[j];
  }
  const std::vector<double> t = loss_target(seed, "target", y.shape(), device);
  std::vector<double> dy(yv.size());
  for (std::size_t i = 0; i < yv.size(); ++i) dy[i] = 2.0 * (yv[i] - t[i]) / yv.size();
  g.output = Tensor::from_f64(dy, y.shape(), y.dtype());
  if (host.bias.defined()) {
    std::vector<double> db(cols, 0.0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) db[j] += dy[i * cols + j];
    g.bias = Tensor::from_f64(db, host.bias.shape(), host.bias.dtype());
  }
  if (host.layernorm_output.defined()) {
    const Tensor& ln = host.layernorm_output;
    const std::vector<double> tln = loss_target(seed, "target_ln", ln.shape(), device);
    std::vector<double> lv = ln.to_f64(), d(lv.size());
    for (std::size_t i = 0; i < lv.size(); ++i) d[i] = 2.0 * (lv[i] - tln[i]) / lv.size();
    g.layernorm_output = Tensor::from_f64(d, ln.shape(), ln.dtype());
  }
  return g;
}

Tensor shard_of(const Tensor& global, const ShardSpec& spec, const Communicator& comm) {
  if (!global.defined()) return global;
  return take_shard(global, spec, comm.rank(), comm.size());
}

// One run of the case on one rank of `comm` (size 1 for single and truth): `steps`
// training steps.
RankResult run_rank(const SuiteCase& c, const nlohmann::json& options, DType dtype,
                    const GemmClassRule& rule, Mutation mutation, Recipe recipe, int steps,
                    std::uint64_t seed, const Execution& execution, Communicator& group,
                    Layouts* layouts) {
  std::unique_ptr<Communicator> wrapped;
  if (execution.wrap_communicator) wrapped = execution.wrap_communicator(group);
  Communicator& comm = wrapped ? *wrapped : group;
  std::unique_ptr<Backend> backend = execution.make_backend(comm.rank());
  comm.clear_comm_ledger();  // a process group's communicator lives across cases
  backend->set_gemm_rule(rule);
  backend->set_rank(comm.rank());
  const Device device = backend->device();
  ModuleContext ctx{backend.get(), &comm, seed, mutation};
  ctx.recipe = recipe;
  std::unique_ptr<AnyLayer> layer = make_layer(LayerSpec{c.module, options}, ctx);

  // Inputs are generated on the backend's device from global indices; outputs come back
  // to the host for the loss and the comparison.
  Tensor input = generate(FillSpec::normal(0, 1), seed, "input", c.input_shape, dtype,
                          layer->input_layout(), comm.rank(), comm.size(), device);
  const OutputLayout layout = layer->output_layout();
  // The results stay where they were computed (the comparison reads them there), unless
  // the execution asks for host copies. A device tensor outlives its backend: the
  // backend's destructor waits for its stream, so every result is complete by then.
  const bool host = execution.results_on_host;
  auto keep = [host](const Tensor& t) { return host && t.defined() ? t.to_host() : t; };
  auto local_grad = [&](const Tensor& g, const ShardSpec& spec) {
    const Tensor shard = shard_of(g, spec, comm);
    return shard.defined() ? shard.to_device(device) : shard;
  };
  RankResult result;
  for (int step = 1; step <= steps; ++step) {
    if (step > 1) {
      // Between steps, identically in every run: the optimizer, then the next step's
      // quantization state (delayed scaling's amax reduction and history update).
      for (Parameter* p : layer->parameters()) {
        sgd_update(*backend, *p, kSgdLearningRate);
        zero_gradients(*p);
      }
      layer->update_scaling();
    }
    LayerOutputs local = layer->forward(input);
    LayerOutputs global;
    global.output = gather_global(comm, local.output, layout.output);
    if (local.bias.defined()) global.bias = gather_global(comm, local.bias, layout.bias);
    if (local.layernorm_output.defined())
      global.layernorm_output =
          gather_global(comm, local.layernorm_output, layout.layernorm_output);

    OutputGrads global_grads = loss_gradients(global, seed, c.loss, *backend);
    OutputGrads grads{local_grad(global_grads.output, layout.output),
                      local_grad(global_grads.bias, layout.bias),
                      local_grad(global_grads.layernorm_output, layout.layernorm_output)};
    StepOutputs out;
    out.input_gradient = keep(layer->backward(grads));
    if (layer->delays_wgrad()) layer->backward_dw();
    out.outputs = host ? to_host(local) : local;
    // The gradient buffers are zeroed and refilled by the next step: keep a copy then.
    for (Parameter* p : layer->parameters()) {
      out.gradients.push_back(keep(step < steps ? p->gradient().clone() : p->gradient()));
    }
    result.steps.push_back(std::move(out));
  }
  result.gemms = backend->ledger().records();
  result.comms = comm.comm_ledger();
  if (layouts != nullptr) {
    layouts->outputs = layout;
    layouts->input = layer->input_layout();
    for (Parameter* p : layer->parameters()) {
      layouts->param_names.push_back(p->name);
      layouts->param_shards.push_back(p->shard);
    }
  }
  return result;
}

RankResult run_unsharded(const SuiteCase& c, const nlohmann::json& options, DType dtype,
                         const GemmClassRule& rule, Recipe recipe, int steps,
                         std::uint64_t seed, const Execution& execution, Layouts* layouts) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  return run_rank(c, options, dtype, rule, Mutation::kNone, recipe, steps, seed, execution,
                  *comm, layouts);
}

// Stands in for rank 0 of a group of `size` when layers are only constructed (which needs
// the size and rank, never a collective).
class ConstructionOnlyCommunicator : public Communicator {
 public:
  explicit ConstructionOnlyCommunicator(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  Tensor all_gather(const Tensor&, int) override { return unused(); }
  Tensor reduce_scatter(const Tensor&, int) override { return unused(); }
  void all_reduce(Tensor&, ReduceOp) override { unused(); }
  void broadcast(Tensor&, int) override { unused(); }
  void barrier() override { unused(); }
  void abort(const std::string&) override {}

 private:
  static Tensor unused() {
    TPCHECK_CHECK(false, "check_case constructs layers only; no collective may run");
    return Tensor();
  }
  int size_;
};

}  // namespace

// One process per rank: every process gets every rank's results. Each compared tensor is
// flattened to [1, n] on the rank's device and all-gathered to [world, n]; shapes are
// the same on every rank (equal shards), so row r is rank r's tensor.
void share_results(Communicator& comm, Device device, std::vector<RankResult>& ranks) {
  const int me = comm.rank();
  const std::size_t steps = ranks[me].steps.size();
  for (int r = 0; r < comm.size(); ++r) ranks[r].steps.resize(steps);
  for (std::size_t s = 0; s < steps; ++s) {
    auto share = [&](auto member) {
      const Tensor mine = member(ranks[me].steps[s]);
      if (!mine.defined()) return;
      const Tensor rows = comm.all_gather(mine.to_device(device).reshape({1, mine.numel()}), 0);
      for (int r = 0; r < comm.size(); ++r) {
        member(ranks[r].steps[s]) = rows.slice(0, r, 1).reshape(mine.shape());
      }
    };
    share([](StepOutputs& o) -> Tensor& { return o.outputs.output; });
    share([](StepOutputs& o) -> Tensor& { return o.outputs.bias; });
    share([](StepOutputs& o) -> Tensor& { return o.outputs.layernorm_output; });
    share([](StepOutputs& o) -> Tensor& { return o.input_gradient; });
    const std::size_t n = ranks[me].steps[s].gradients.size();
    for (int r = 0; r < comm.size(); ++r) ranks[r].steps[s].gradients.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      share([i](StepOutputs& o) -> Tensor& { return o.gradients[i]; });
    }
  }
}

Execution cpu_execution() {
  Execution e;
  e.backend = "cpu";
  e.communicator = "threads (rank-order sums in f32, rounded once)";
  e.make_backend = [](int) { return make_cpu_backend(); };
  e.launch_group = [](int world, const std::function<void(Communicator&)>& body) {
    run_thread_group(world, body);
  };
  return e;
}

void check_run_config(const RunConfig& config) {
  TPCHECK_CHECK_INPUT(config.steps >= 1, "--steps {}: expected a number of training steps >= 1",
                      config.steps);
  if (config.mutation != Mutation::kNone) {
    const MutationInfo& m = mutation_info(config.mutation);
    TPCHECK_CHECK_INPUT(m.recipe == Recipe::kNone || m.recipe == config.recipe,
                        "--mutate {}: the bug is in recipe {}'s code, which this run (recipe {}) "
                        "never executes; give --recipe {} (and --steps {} or more: it changes "
                        "nothing before step {})",
                        m.name, recipe_name(m.recipe), recipe_name(config.recipe),
                        recipe_name(m.recipe), m.first_step, m.first_step);
  }
}

void check_case(const SuiteCase& c, const RunConfig& config) {
  check_run_config(config);
  // Construction only, shapes only: the CPU backend is enough to build every layer (no
  // GPU work) and no parameter is generated (production sizes would take seconds each).
  std::unique_ptr<Backend> backend = make_cpu_backend();
  if (config.recipe != Recipe::kNone) {
    // Every quantized activation and gradient is a [tokens, features] matrix of the whole
    // token count (gathered tensors are quantized after the gather, or under delayed
    // scaling transposed after their FP8 gather); the weights' shards are checked by
    // Linear's constructor below.
    const std::int64_t features = c.input_shape.back();
    check_quantizable(fmt::format("case {}: input", c.id),
                      {shape_numel(c.input_shape) / features, features}, config.recipe,
                      QuantRole::kInput, QuantUsage{true, true});
  }
  nlohmann::json unsharded = c.options;
  unsharded["sequence_parallel"] = false;
  std::unique_ptr<Communicator> single = make_single_communicator();
  ModuleContext single_ctx{backend.get(), single.get(), config.seed, Mutation::kNone, true};
  single_ctx.recipe = config.recipe;
  make_layer(LayerSpec{c.module, unsharded}, single_ctx);
  ConstructionOnlyCommunicator group(config.tp);
  ModuleContext sharded_ctx{backend.get(), &group, config.seed, config.mutation, true};
  sharded_ctx.recipe = config.recipe;
  make_layer(LayerSpec{c.module, c.options}, sharded_ctx);
}

// The rounding probe's relative perturbation: small enough for first order, far above
// f64 rounding (2⁻⁵²).
constexpr double kProbeU = 0x1.0p-30;

CaseRun run_case(const SuiteCase& c, const RunConfig& config) {
  const auto start = std::chrono::steady_clock::now();

  // The unsharded twins: same options without tensor parallelism.
  nlohmann::json unsharded = c.options;
  unsharded["sequence_parallel"] = false;
  Layouts layouts;
  const Execution& ex = config.execution;
  const int steps = config.steps;
  TPCHECK_CHECK_INPUT(steps >= 1, "case {}: {} training steps; expected at least 1", c.id, steps);
  nlohmann::json truth_options = unsharded;
  truth_options["params_dtype"] = "f64";
  RankResult truth, probed;
  // The rounding probe: the truth run once more with every stored intermediate perturbed
  // by a relative kProbeU (make_rounding_probe_backend); (probed − truth) / kProbeU is each
  // tensor's sensitivity to one rounding of everything it was computed from — the truth
  // policy's cancellation floor (kProbeU: see its definition above).
  // Truth never quantizes: it is the exact computation the recipes approximate. It
  // trains the same steps (in f64).
  const auto run_truth = [&] {
    return run_unsharded(c, truth_options, DType::kF64, GemmClassRule{}, Recipe::kNone, steps,
                         config.seed, ex, nullptr);
  };
  // The probe decorates the run's backend, so the probed run stays on the case's device.
  const auto run_probed = [&] {
    Execution probe_ex = ex;
    probe_ex.make_backend = [&ex, seed = config.seed](int rank) {
      return make_rounding_probe_backend(ex.make_backend(rank), kProbeU, seed);
    };
    return run_unsharded(c, truth_options, DType::kF64, GemmClassRule{}, Recipe::kNone, steps,
                         config.seed, probe_ex, nullptr);
  };
  const auto run_single = [&] {
    return run_unsharded(c, unsharded, c.dtype, config.gemm_rule, config.recipe, steps,
                         config.seed, ex, &layouts);
  };
  // The three unsharded runs one after the other here, or (Execution::
  // concurrent_unsharded_runs, small cases) each on a thread of its own from here on while
  // this thread runs the sharded group, collected after it. A future of std::async waits
  // for its task when destroyed, so an exception leaves no thread running on this
  // frame's variables.
  const bool concurrent = ex.concurrent_unsharded_runs && !config.skip_truth &&
                          shape_numel(c.input_shape) <= kConcurrentRunsMaxElements;
  RankResult single;
  std::future<RankResult> single_future, truth_future, probed_future;
  if (concurrent) {
    single_future = std::async(std::launch::async, run_single);
    truth_future = std::async(std::launch::async, run_truth);
    probed_future = std::async(std::launch::async, run_probed);
  } else {
    single = run_single();
    if (config.skip_truth) {
      for (RankResult* r : {&truth, &probed}) {
        r->steps.resize(steps);
        for (StepOutputs& o : r->steps) o.gradients.resize(layouts.param_names.size());
      }
    } else {
      truth = run_truth();
      probed = run_probed();
    }
  }
  // n = (probed − truth) / kProbeU, on the device the runs' results are on: the
  // subtraction rounds once in f64 and the division by a power of two is exact, so the
  // bits are the host loop's (−truth and the scaling are exact).
  std::unique_ptr<Backend> arithmetic;
  if (!config.skip_truth) {
    const bool on_host = ex.backend == "cpu" || ex.results_on_host;
    arithmetic = on_host ? make_cpu_backend() : ex.make_backend(0);
  }
  auto noise_of = [&arithmetic](const Tensor& p, const Tensor& t) {
    if (!t.defined()) return Tensor();
    return arithmetic->scale(arithmetic->add(p, arithmetic->scale(t, -1.0)), 1.0 / kProbeU);
  };

  std::vector<RankResult> ranks(config.tp);
  Layouts sharded_layouts;
  ex.launch_group(config.tp, [&](Communicator& comm) {
    Layouts* mine = comm.rank() == 0 || ex.one_process_per_rank ? &sharded_layouts : nullptr;
    ranks[comm.rank()] = run_rank(c, c.options, c.dtype, config.gemm_rule, config.mutation,
                                  config.recipe, steps, config.seed, ex, comm, mine);
    if (ex.one_process_per_rank && comm.size() > 1) {
      share_results(comm, ex.backend == "cuda" ? Device::kCuda : Device::kCpu, ranks);
    }
  });

  if (concurrent) {
    single = single_future.get();
    truth = truth_future.get();
    probed = probed_future.get();
  }

  TPCHECK_CHECK(sharded_layouts.param_names == layouts.param_names,
                "case {}: sharded and single layers have different parameters ({} vs {})", c.id,
                fmt::join(sharded_layouts.param_names, ", "), fmt::join(layouts.param_names, ", "));

  CaseRun run;
  const OutputLayout& out = sharded_layouts.outputs;
  for (int step = 0; step < steps; ++step) {
    std::vector<ComparedTensor>& tensors = run.steps.emplace_back();
    const StepOutputs& sg = single.steps[step];
    const StepOutputs& tr = truth.steps[step];
    const StepOutputs& pr = probed.steps[step];
    auto gather = [&](auto member, const ShardSpec& spec) {
      std::vector<Tensor> shards;
      for (const RankResult& r : ranks) shards.push_back(member(r.steps[step]));
      return assemble_shards(shards, spec);
    };
    auto add = [&](std::string name, std::string kind, int index, Tensor s, Tensor sh, Tensor t,
                   const Tensor& p) {
      Tensor noise = noise_of(p, t);
      tensors.push_back(ComparedTensor{std::move(name), std::move(kind), index, std::move(s),
                                       std::move(sh), std::move(t), std::move(noise)});
    };
    add("output", "output", -1, sg.outputs.output,
        gather([](const StepOutputs& o) { return o.outputs.output; }, out.output),
        tr.outputs.output, pr.outputs.output);
    if (sg.outputs.bias.defined()) {
      add("bias", "output", -1, sg.outputs.bias,
          gather([](const StepOutputs& o) { return o.outputs.bias; }, out.bias), tr.outputs.bias,
          pr.outputs.bias);
    }
    if (sg.outputs.layernorm_output.defined()) {
      add("layernorm_output", "output", -1, sg.outputs.layernorm_output,
          gather([](const StepOutputs& o) { return o.outputs.layernorm_output; },
                 out.layernorm_output),
          tr.outputs.layernorm_output, pr.outputs.layernorm_output);
    }
    // The gradient that flows to the previous layer: reassembled like the input
    // (token-sharded under sequence parallel, replicated otherwise).
    add("input", "input_gradient", -1, sg.input_gradient,
        gather([](const StepOutputs& o) { return o.input_gradient; }, sharded_layouts.input),
        tr.input_gradient, pr.input_gradient);
    for (std::size_t i = 0; i < layouts.param_names.size(); ++i) {
      add(layouts.param_names[i], "gradient", static_cast<int>(i), sg.gradients[i],
          gather([i](const StepOutputs& o) { return o.gradients[i]; },
                 sharded_layouts.param_shards[i]),
          tr.gradients[i], pr.gradients[i]);
    }
  }
  run.single_gemms = std::move(single.gemms);
  run.sharded_gemms = ranks[0].gemms;
  for (RankResult& r : ranks) {
    run.sharded_gemms_by_rank.push_back(std::move(r.gemms));
    run.sharded_comms_by_rank.push_back(std::move(r.comms));
  }
  run.truth_gemms = std::move(truth.gemms);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace tpcheck

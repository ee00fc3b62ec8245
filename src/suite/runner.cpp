// run_case: one suite case, three runs (single, sharded, truth; the truth once more under
// the rounding probe), every compared tensor reassembled to its global shape. Its parts:
// UnshardedRuns (single, truth, probed), run_sharded (the group), RoundingNoise and
// compared_tensors (per step); each run is run_rank (set_up_rank, then run_step per step).
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
#include <bit>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tpcheck/error.h"
#include "tpcheck/layers/any_layer.h"
#include "tpcheck/names.h"
#include "tpcheck/suite.h"

namespace tpcheck {
namespace {

// What one rank (or the single / truth run) produced in one step, still sharded.
struct StepOutputs {
  LayerOutputs outputs;
  std::vector<Tensor> gradients;  // Parameter::gradient(), in parameters() order
  Tensor input_gradient;          // what backward returns: dL/dinput, input_layout()
  DelayedScalingSet scaling;      // the quantizer state this step quantized with (a copy)
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

// One run of a case: what run_rank needs besides the communicator.
struct RunSpec {
  const SuiteCase* c = nullptr;
  nlohmann::json options;  // the layer's: the case's, or its unsharded / f64 twin
  DType dtype = DType::kF32;
  GemmClassRule rule;
  Mutation mutation = Mutation::kNone;
  Recipe recipe = Recipe::kNone;
  int steps = 1;
  std::uint64_t seed = 0;
  const Execution* execution = nullptr;
};

// A rank's layer, built on the rank's backend, with its input and output layout.
struct RankSetup {
  std::unique_ptr<Communicator> wrapped;  // Execution::wrap_communicator's, if any
  Communicator* comm = nullptr;           // wrapped, or the group's
  std::unique_ptr<Backend> backend;
  std::unique_ptr<AnyLayer> layer;
  Tensor input;
  OutputLayout layout;
};

RankSetup set_up_rank(const RunSpec& run, Communicator& group) {
  RankSetup s;
  const Execution& execution = *run.execution;
  if (execution.wrap_communicator) s.wrapped = execution.wrap_communicator(group);
  s.comm = s.wrapped ? s.wrapped.get() : &group;
  Communicator& comm = *s.comm;
  s.backend = execution.make_backend(comm.rank());
  comm.clear_comm_ledger();  // a process group's communicator lives across cases
  s.backend->set_gemm_rule(run.rule);
  s.backend->set_rank(comm.rank());
  ModuleContext ctx{s.backend.get(), &comm, run.seed, run.mutation};
  ctx.recipe = run.recipe;
  s.layer = make_layer(LayerSpec{run.c->module, run.options}, ctx);
  // Inputs are generated on the backend's device from global indices; outputs come back
  // to the host for the loss and the comparison.
  s.input = generate(FillSpec::normal(0, 1), run.seed, "input", run.c->input_shape, run.dtype,
                     s.layer->input_layout(), comm.rank(), comm.size(), s.backend->device());
  s.layout = s.layer->output_layout();
  return s;
}

// Training step `step` (1-based) of a rank: forward, the loss gradients of the gathered
// outputs, backward.
StepOutputs run_step(const RunSpec& run, RankSetup& s, int step) {
  Communicator& comm = *s.comm;
  AnyLayer& layer = *s.layer;
  const OutputLayout& layout = s.layout;
  const Device device = s.backend->device();
  if (step > 1) {
    // Between steps, identically in every run: the optimizer, then the next step's
    // quantization state (delayed scaling's amax reduction and history update).
    for (Parameter* p : layer.parameters()) {
      sgd_update(*s.backend, *p, kSgdLearningRate);
      zero_gradients(*p);
    }
    layer.update_scaling();
  }
  // The results stay where they were computed (the comparison reads them there), unless
  // the execution asks for host copies. A device tensor outlives its backend: the
  // backend's destructor waits for its stream, so every result is complete by then.
  const bool host = run.execution->results_on_host;
  auto keep = [host](const Tensor& t) { return host && t.defined() ? t.to_host() : t; };
  auto local_grad = [&](const Tensor& g, const ShardSpec& spec) {
    const Tensor shard = shard_of(g, spec, comm);
    return shard.defined() ? shard.to_device(device) : shard;
  };
  LayerOutputs local = layer.forward(s.input);
  LayerOutputs global;
  global.output = gather_global(comm, local.output, layout.output);
  if (local.bias.defined()) global.bias = gather_global(comm, local.bias, layout.bias);
  if (local.layernorm_output.defined())
    global.layernorm_output = gather_global(comm, local.layernorm_output, layout.layernorm_output);

  OutputGrads global_grads = loss_gradients(global, run.seed, run.c->loss, *s.backend);
  OutputGrads grads{local_grad(global_grads.output, layout.output),
                    local_grad(global_grads.bias, layout.bias),
                    local_grad(global_grads.layernorm_output, layout.layernorm_output)};
  StepOutputs out;
  // Scales and histories change only in update_scaling (above): this is the step's state.
  out.scaling = layer.scaling_state();
  out.input_gradient = keep(layer.backward(grads));
  if (layer.delays_wgrad()) layer.backward_dw();
  out.outputs = host ? to_host(local) : local;
  // The gradient buffers are zeroed and refilled by the next step: keep a copy then.
  for (Parameter* p : layer.parameters()) {
    out.gradients.push_back(keep(step < run.steps ? p->gradient().clone() : p->gradient()));
  }
  return out;
}

// One run of the case on one rank of `group` (size 1 for single and truth): `run.steps`
// training steps. `layouts`, when given, receives the layer's layouts and parameters.
RankResult run_rank(const RunSpec& run, Communicator& group, Layouts* layouts) {
  RankSetup s = set_up_rank(run, group);
  RankResult result;
  for (int step = 1; step <= run.steps; ++step) result.steps.push_back(run_step(run, s, step));
  result.gemms = s.backend->ledger().records();
  result.comms = s.comm->comm_ledger();
  if (layouts != nullptr) {
    layouts->outputs = s.layout;
    layouts->input = s.layer->input_layout();
    for (Parameter* p : s.layer->parameters()) {
      layouts->param_names.push_back(p->name);
      layouts->param_shards.push_back(p->shard);
    }
  }
  return result;
}

RankResult run_unsharded(const RunSpec& run, Layouts* layouts) {
  std::unique_ptr<Communicator> comm = make_single_communicator();
  return run_rank(run, *comm, layouts);
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
  e.backend = BackendKind::kCpu;
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

// The rounding probe's relative perturbation (include/tpcheck/names.h).
using names::kProbeU;

namespace {

// The unsharded runs of a case: single (the case's dtype, GEMM rule and recipe, without
// tensor parallelism), truth and the probed truth.
// Truth never quantizes: it is the exact computation the recipes approximate. It trains
// the same steps, in f64 with fp64 GEMMs.
// The rounding probe: the truth run once more with every stored intermediate perturbed by
// a relative kProbeU (make_rounding_probe_backend decorates the run's backend, so the
// probed run stays on the case's device); (probed − truth) / kProbeU is each tensor's
// sensitivity to one rounding of everything it was computed from — the truth policy's
// cancellation floor (kProbeU: see its definition above).
// Started before the sharded group and collected after it: one after the other when
// started, or (Execution::concurrent_unsharded_runs, small cases) each on a thread of its
// own while the caller runs the sharded group. A future of std::async waits for its task
// when destroyed (the futures are the last members, destroyed first), so an exception
// leaves no thread running on this object's members.
class UnshardedRuns {
 public:
  UnshardedRuns(const SuiteCase& c, const RunConfig& config) : config_(config) {
    single_ = RunSpec{.c = &c,
                      .options = c.options,
                      .dtype = c.dtype,
                      .rule = config.gemm_rule,
                      .mutation = Mutation::kNone,
                      .recipe = config.recipe,
                      .steps = config.steps,
                      .seed = config.seed,
                      .execution = &config.execution};
    single_.options["sequence_parallel"] = false;
    truth_ = single_;
    truth_.options["params_dtype"] = "f64";
    truth_.dtype = DType::kF64;
    truth_.rule = GemmClassRule{};
    truth_.recipe = Recipe::kNone;
    probe_execution_ = config.execution;
    probe_execution_.make_backend = [&ex = config.execution, seed = config.seed](int rank) {
      return make_rounding_probe_backend(ex.make_backend(rank), kProbeU, seed);
    };
    probed_ = truth_;
    probed_.execution = &probe_execution_;
    start(c);
  }
  UnshardedRuns(const UnshardedRuns&) = delete;
  UnshardedRuns& operator=(const UnshardedRuns&) = delete;

  // The results, waiting for the runs on threads. `layouts` (single's) stays with this
  // object. REQUIRES: called once.
  void collect(RankResult& single, RankResult& truth, RankResult& probed) {
    if (concurrent_) {
      single_result_ = single_future_.get();
      truth_result_ = truth_future_.get();
      probed_result_ = probed_future_.get();
    }
    single = std::move(single_result_);
    truth = std::move(truth_result_);
    probed = std::move(probed_result_);
  }
  const Layouts& layouts() const { return layouts_; }

 private:
  void start(const SuiteCase& c) {
    concurrent_ = config_.execution.concurrent_unsharded_runs && !config_.skip_truth &&
                  shape_numel(c.input_shape) <= kConcurrentRunsMaxElements;
    if (concurrent_) {
      single_future_ =
          std::async(std::launch::async, [this] { return run_unsharded(single_, &layouts_); });
      truth_future_ =
          std::async(std::launch::async, [this] { return run_unsharded(truth_, nullptr); });
      probed_future_ =
          std::async(std::launch::async, [this] { return run_unsharded(probed_, nullptr); });
      return;
    }
    single_result_ = run_unsharded(single_, &layouts_);
    if (!config_.skip_truth) {
      truth_result_ = run_unsharded(truth_, nullptr);
      probed_result_ = run_unsharded(probed_, nullptr);
      return;
    }
    for (RankResult* r : {&truth_result_, &probed_result_}) {
      r->steps.resize(config_.steps);
      for (StepOutputs& o : r->steps) o.gradients.resize(layouts_.param_names.size());
    }
  }

  const RunConfig& config_;
  RunSpec single_, truth_, probed_;
  Execution probe_execution_;
  Layouts layouts_;
  bool concurrent_ = false;
  RankResult single_result_, truth_result_, probed_result_;
  std::future<RankResult> single_future_, truth_future_, probed_future_;
};

// The sharded group: config.tp ranks of the case as given. `layouts` receives rank 0's
// (every rank's when each is a process of its own).
std::vector<RankResult> run_sharded(const SuiteCase& c, const RunConfig& config, Layouts& layouts) {
  const Execution& ex = config.execution;
  const RunSpec run{.c = &c,
                    .options = c.options,
                    .dtype = c.dtype,
                    .rule = config.gemm_rule,
                    .mutation = config.mutation,
                    .recipe = config.recipe,
                    .steps = config.steps,
                    .seed = config.seed,
                    .execution = &ex};
  std::vector<RankResult> ranks(config.tp);
  ex.launch_group(config.tp, [&](Communicator& comm) {
    Layouts* mine = comm.rank() == 0 || ex.one_process_per_rank ? &layouts : nullptr;
    ranks[comm.rank()] = run_rank(run, comm, mine);
    if (ex.one_process_per_rank && comm.size() > 1) {
      share_results(comm, ex.backend == BackendKind::kCuda ? Device::kCuda : Device::kCpu, ranks);
    }
  });
  return ranks;
}

// n = (probed − truth) / kProbeU, on the device the runs' results are on: the subtraction
// rounds once in f64 and the division by a power of two is exact, so the bits are the
// host loop's (−truth and the scaling are exact). Undefined without truth.
class RoundingNoise {
 public:
  explicit RoundingNoise(const RunConfig& config) {
    if (config.skip_truth) return;
    const Execution& ex = config.execution;
    const bool on_host = ex.backend == BackendKind::kCpu || ex.results_on_host;
    arithmetic_ = on_host ? make_cpu_backend() : ex.make_backend(0);
  }
  Tensor operator()(const Tensor& probed, const Tensor& truth) const {
    if (!truth.defined()) return Tensor();
    return arithmetic_->scale(arithmetic_->add(probed, arithmetic_->scale(truth, -1.0)),
                              1.0 / kProbeU);
  }

 private:
  std::unique_ptr<Backend> arithmetic_;
};

// Every run's results of one case, as run_case collected them.
struct CaseResults {
  RankResult single, truth, probed;
  std::vector<RankResult> ranks;             // the sharded group's, by rank
  const Layouts* layouts = nullptr;          // single's (parameter names)
  const Layouts* sharded_layouts = nullptr;  // the sharded group's (output and shard layouts)
};

// The compared tensors of step `step` (0-based): outputs, the input gradient and every
// parameter gradient, the sharded ones reassembled to their global shape.
std::vector<ComparedTensor> compared_tensors(const CaseResults& r, int step,
                                             const RoundingNoise& noise_of) {
  std::vector<ComparedTensor> tensors;
  const OutputLayout& out = r.sharded_layouts->outputs;
  const StepOutputs& sg = r.single.steps[step];
  const StepOutputs& tr = r.truth.steps[step];
  const StepOutputs& pr = r.probed.steps[step];
  auto gather = [&](auto member, const ShardSpec& spec) {
    std::vector<Tensor> shards;
    for (const RankResult& rank : r.ranks) shards.push_back(member(rank.steps[step]));
    return assemble_shards(shards, spec);
  };
  // `member` picks the tensor out of a run's StepOutputs; `spec` reassembles the ranks'.
  auto add = [&](std::string name, std::string_view kind, int index, const ShardSpec& spec,
                 auto member) {
    const Tensor t = member(tr);
    tensors.push_back(ComparedTensor{std::move(name), std::string(kind), index, member(sg),
                                     gather(member, spec), t, noise_of(member(pr), t)});
  };
  add("output", names::kOutput, -1, out.output, [](const StepOutputs& o) { return o.outputs.output; });
  if (sg.outputs.bias.defined()) {
    add("bias", names::kOutput, -1, out.bias, [](const StepOutputs& o) { return o.outputs.bias; });
  }
  if (sg.outputs.layernorm_output.defined()) {
    add("layernorm_output", names::kOutput, -1, out.layernorm_output,
        [](const StepOutputs& o) { return o.outputs.layernorm_output; });
  }
  // The gradient that flows to the previous layer: reassembled like the input
  // (token-sharded under sequence parallel, replicated otherwise).
  add("input", names::kInputGradient, -1, r.sharded_layouts->input,
      [](const StepOutputs& o) { return o.input_gradient; });
  const std::vector<std::string>& param_names = r.layouts->param_names;
  for (std::size_t i = 0; i < param_names.size(); ++i) {
    add(param_names[i], names::kParameterGradient, static_cast<int>(i), r.sharded_layouts->param_shards[i],
        [i](const StepOutputs& o) { return o.gradients[i]; });
  }
  return tensors;
}

// "entry 3 (f8e5m2) scale: rank 1 holds 0.5 (0x3f000000), rank 0 2 (0x40000000)".
std::string float_difference(std::size_t entry, const DelayedScaling& e, const std::string& what,
                             int rank, float here, float first) {
  return fmt::format("entry {} ({}) {}: rank {} holds {} ({:#010x}), rank 0 {} ({:#010x})", entry,
                     dtype_name(e.format()), what, rank, here, std::bit_cast<std::uint32_t>(here),
                     first, std::bit_cast<std::uint32_t>(first));
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// The first difference of `state` (rank `rank`) from rank 0's `first`; empty when none.
std::string scaling_difference(const DelayedScalingSet& first, const DelayedScalingSet& state,
                               int rank) {
  if (state.size() != first.size()) {
    return fmt::format("rank {} keeps {} scaling entries, rank 0 {}", rank, state.size(),
                       first.size());
  }
  for (std::size_t i = 0; i < first.size(); ++i) {
    const DelayedScaling &a = first[i], &b = state[i];
    if (!same_bits(b.scale(), a.scale())) return float_difference(i, a, "scale", rank, b.scale(), a.scale());
    if (b.history().size() != a.history().size()) {
      return fmt::format("entry {} ({}) amax history: rank {} holds {} amaxes, rank 0 {}", i,
                         dtype_name(a.format()), rank, b.history().size(), a.history().size());
    }
    for (std::size_t h = 0; h < a.history().size(); ++h) {
      if (!same_bits(b.history()[h], a.history()[h])) {
        return float_difference(i, a, fmt::format("amax history[{}]", h), rank, b.history()[h],
                                a.history()[h]);
      }
    }
  }
  return {};
}

// Every rank's quantizer state at step `step` (0-based) against rank 0's, bit for bit.
ReplicatedState replicated_state(const std::vector<RankResult>& ranks, int step) {
  const DelayedScalingSet& first = ranks.front().steps[step].scaling;
  ReplicatedState state{static_cast<int>(first.size()), {}};
  for (std::size_t r = 1; r < ranks.size() && state.consistent(); ++r) {
    state.difference = scaling_difference(first, ranks[r].steps[step].scaling, static_cast<int>(r));
  }
  return state;
}

}  // namespace

CaseRun run_case(const SuiteCase& c, const RunConfig& config) {
  const auto start = std::chrono::steady_clock::now();
  TPCHECK_CHECK_INPUT(config.steps >= 1, "case {}: {} training steps; expected at least 1", c.id,
                      config.steps);
  CaseResults r;
  UnshardedRuns unsharded(c, config);
  const RoundingNoise noise_of(config);
  Layouts sharded_layouts;
  r.ranks = run_sharded(c, config, sharded_layouts);
  unsharded.collect(r.single, r.truth, r.probed);
  r.layouts = &unsharded.layouts();
  r.sharded_layouts = &sharded_layouts;
  TPCHECK_CHECK(sharded_layouts.param_names == r.layouts->param_names,
                "case {}: sharded and single layers have different parameters ({} vs {})", c.id,
                fmt::join(sharded_layouts.param_names, ", "),
                fmt::join(r.layouts->param_names, ", "));

  CaseRun run;
  for (int step = 0; step < config.steps; ++step) {
    run.steps.push_back(compared_tensors(r, step, noise_of));
    run.replicated_state.push_back(replicated_state(r.ranks, step));
  }
  run.single_gemms = std::move(r.single.gemms);
  run.sharded_gemms = r.ranks[0].gemms;
  for (RankResult& rank : r.ranks) {
    run.sharded_gemms_by_rank.push_back(std::move(rank.gemms));
    run.sharded_comms_by_rank.push_back(std::move(rank.comms));
  }
  run.truth_gemms = std::move(r.truth.gemms);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace tpcheck

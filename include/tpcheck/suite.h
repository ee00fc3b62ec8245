// tpcheck/suite.h — suites of cases and the runner that executes one case three ways.
//
// A case is one layer configuration (module kind + options + dtype + sequence parallel)
// and the global input shape. `run_case` runs it three times with the same global
// parameters and inputs — single (unsharded, case dtype), sharded (TP = N, thread ranks
// on the CPU), truth (unsharded, f64 everywhere) — through MSE loss, forward then
// backward (then backward_dw where delayed), and returns every compared tensor
// reassembled to its global shape, plus each run's GEMM ledger. With RunConfig::steps
// N > 1 each run trains N steps on the same input and targets — after each step's
// backward a plain SGD update (kSgdLearningRate) of every parameter and the quantization
// state's update (AnyLayer::update_scaling) — and the tensors are compared after every
// step.
// Thread safety: run_case starts its own rank threads; call it from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/forensics.h"
#include "tpcheck/gemm_record.h"
#include "tpcheck/numerics.h"
#include "tpcheck/quant.h"
#include "tpcheck/mutation.h"
#include "tpcheck/tensor.h"

namespace tpcheck {

// Sizes of a suite. te's defaults are the reference suite's (made for TP ≤ 4); full's are
// chosen per TP (full_suite.cpp). An explicitly given size is never changed; defaults
// may be raised to fit the TP size.
struct SuiteSizes {
  std::optional<std::int64_t> hidden, ffn, heads, seq, batch;
};

// The loss a case's runs differentiate (docs/LAYERS.md, "Loss used by the suite").
//   kReference: MSE(output, target) only, as the reference suite: a returned bias and a
//               returned layernorm output get zero gradient.
//   kExtended:  MSE(output + returned bias, target) + MSE(layernorm_output, target_ln):
//               more tensors flow into the backward.
enum class SuiteLoss { kReference, kExtended };

struct SuiteCase {
  std::string id;                // stable, regex-friendly: "Linear.column.sp1.bias=false"
  std::string module;            // layer kind for make_layer: "Linear", "TransformerLayer", ...
  nlohmann::json options;        // layer options (parallel_mode, sequence_parallel, ... included)
  std::string variant;           // the option that distinguishes the case: "bias=false", "default"
  bool sequence_parallel = false;
  DType dtype = DType::kF32;     // storage dtype of the single and sharded runs
  Shape input_shape;             // global input shape (the single run's input)
  SuiteLoss loss = SuiteLoss::kReference;  // chosen by the suite (te: the reference's)
};

struct Suite {
  std::string name;
  std::vector<SuiteCase> cases;
  std::vector<std::string> notes;  // adjustments the suite made, printed to the user
  std::string description;         // one line: what the suite is ("te: TransformerEngine's ...")
};

// Names of the suites `make_suite` knows:
//   "full" (the CLI's default): every option value that changes what the sharded code
//          does, in pairwise combinations, every layer, f32/f16/bf16, SP off and on
//          (docs/ARCHITECTURE.md, "Suites"); ids stable across TP 2, 4 and 8;
//   "te":  TransformerEngine's distributed numerics matrix, exactly (118 cases).
std::vector<std::string> suite_names();
// Builds a suite for `tp` ranks. Throws Error(kInput) for an unknown suite name, or when
// `tp` does not divide an explicitly given size (naming it).
// `recipe` (default none): the reference's per-recipe sizes fill the sizes not given
// (raised to fit the recipe's blocks at this TP, noted), and te makes the reference's
// case changes for it (te_suite.cpp).
Suite make_suite(const std::string& name, int tp, const SuiteSizes& sizes,
                 Recipe recipe = Recipe::kNone);

// Where a case's runs compute. `make_backend(rank)` makes the backend of one rank, on the
// calling thread (a CUDA backend makes its stream current there); the single and truth
// runs use make_backend(0). `launch_group(world, body)` runs body(comm) once per sharded
// rank and waits for all of them (threads on the CPU; threads on one GPU with the ring
// communicator; one thread per GPU over NCCL), rethrowing the first failure.
using BackendFactory = std::function<std::unique_ptr<Backend>(int rank)>;
using GroupLauncher =
    std::function<void(int world, const std::function<void(Communicator&)>& body)>;

// The backend an Execution's ranks run on; backend_kind_name is the reports' name for it.
enum class BackendKind { kCpu, kCuda };
inline std::string_view backend_kind_name(BackendKind kind) {
  return kind == BackendKind::kCuda ? "cuda" : "cpu";
}

struct Execution {
  BackendKind backend = BackendKind::kCpu;
  std::string communicator = "threads (rank-order f32 sums)";  // for reports
  BackendFactory make_backend;      // default: the CPU backend
  GroupLauncher launch_group;       // default: run_thread_group
  // One process per rank (mpirun / torchrun): launch_group runs only this process's rank,
  // and run_case shares every rank's compared tensors through the communicator (an
  // all_gather each), so every process holds them all. The other ranks' GEMM and
  // communication ledgers stay in their processes.
  bool one_process_per_rank = false;
  // Where each run's outputs and gradients are kept for the comparison: on the device
  // they were computed on (false: the comparison runs there, on the GPU for CUDA ranks),
  // or copied to the host (true: one process with a GPU per rank, whose tensors a kernel
  // on another GPU cannot read).
  bool results_on_host = false;
  // Optional: wraps each run's communicator (the sharded ranks' and the unsharded runs'
  // group of one) before the rank makes its backend, on the rank's thread — a decorator
  // that records collectives (tpcheck explain). Unset: the communicator as it is.
  std::function<std::unique_ptr<Communicator>(Communicator&)> wrap_communicator;
  // The unsharded runs (single, truth and its rounding probe) may each run on a thread of
  // its own while the sharded group runs (each run makes its backend on its thread): set
  // for GPU executions, where a small case's runs are bound by kernel launches on the
  // host, not by the device. run_case uses it only for cases of at most
  // kConcurrentRunsMaxElements input elements (a production-size case keeps the device's
  // memory to one run at a time). Results do not depend on it: every run has its own
  // backend and stream.
  bool concurrent_unsharded_runs = false;
  // Several small cases (at most kConcurrentRunsMaxElements input elements each) may run
  // at once, each on a thread of its own (`tpcheck run` keeps up to kCasesInFlight in
  // flight and reports them in case order): set for GPU ranks emulated in this process,
  // whose group launcher makes a fresh group per run. A larger case runs alone.
  bool concurrent_cases = false;
};
inline constexpr int kCasesInFlight = 4;
inline constexpr std::int64_t kConcurrentRunsMaxElements = std::int64_t{1} << 22;
// The CPU backend with thread ranks (what CI runs).
Execution cpu_execution();

// The learning rate of the SGD update between steps (module.h sgd_update): a power of two,
// so −lr · g is exact in every dtype; large enough that one step visibly moves the te
// suite's parameters (‖lr·g‖ / ‖w‖ measured at seed 1234: 0.35 for Linear's weight, 0.03
// for LayerNormMLP's, 0.007–0.02 for TransformerLayer's projections; README, --steps).
inline constexpr double kSgdLearningRate = 1.0;

struct RunConfig {
  int tp = 4;
  std::uint64_t seed = 1234;
  Mutation mutation = Mutation::kNone;
  GemmClassRule gemm_rule;  // single and sharded runs; truth always computes in fp64
  Execution execution = cpu_execution();
  // Only the single and sharded runs (no truth run, no rounding probe: ComparedTensor's
  // truth and rounding_noise stay undefined). For re-runs that compare sharded with
  // single only (explain's counterfactuals); judge_case needs the truth run.
  bool skip_truth = false;
  // The quantized recipe of the single and sharded runs' Linear GEMMs (quant.h); truth
  // never quantizes. Runs on the CPU and the CUDA backend.
  Recipe recipe = Recipe::kNone;
  // Training steps per run (>= 1): forward, backward, then (before the next step) the SGD
  // update and the quantization state's update; compared after every step.
  int steps = 1;
};

// One compared tensor, global shape, in each run.
struct ComparedTensor {
  std::string name;  // "output", "bias", "layernorm_output", "input", or a parameter name
  std::string kind;  // "output", "gradient" (a parameter's) or "input_gradient"
  int index = 0;     // the reference suite's index: position among the parameters (-1: none)
  Tensor single, sharded, truth;
  // (truth run under the rounding probe − truth) / probe u, f64: what one rounding of
  // every stored intermediate moves this tensor by, per unit roundoff.
  Tensor rounding_noise;
};

// The quantizer state every rank of the sharded group must hold bit for bit, compared
// across ranks at one step: under FP8 delayed scaling, each quantized tensor's scale and
// amax history as the step used them (after the previous step's amax max-reduction across
// the group). Ranks that scale one replicated tensor differently read each other's FP8
// bytes with the wrong factor, by an amount the tensors' statistics can hide.
struct ReplicatedState {
  int entries = 0;         // state entries per rank (0: the recipe keeps no such state)
  std::string difference;  // the first difference from rank 0; empty when every rank agrees
  bool consistent() const { return difference.empty(); }
};

struct CaseRun {
  // The compared tensors after each training step: steps[s] after step s + 1
  // (RunConfig::steps entries, in the same order each step).
  std::vector<std::vector<ComparedTensor>> steps;
  // Every step's GEMMs and collectives, in order.
  std::vector<GemmRecord> single_gemms, truth_gemms;
  std::vector<GemmRecord> sharded_gemms;  // rank 0's ledger (the one diffs are shown for)
  std::vector<std::vector<GemmRecord>> sharded_gemms_by_rank;  // every rank's ledger
  std::vector<std::vector<CommRecord>> sharded_comms_by_rank;  // every rank's collectives
  // The sharded ranks' replicated quantizer state at each step (steps[s]'s), compared.
  std::vector<ReplicatedState> replicated_state;
  double seconds = 0;
};

CaseRun run_case(const SuiteCase& c, const RunConfig& config);

// Error(kInput) for a configuration no case can run: steps < 1, or a mutation of one
// recipe's code (MutationInfo::recipe) under another recipe.
void check_run_config(const RunConfig& config);
// check_run_config, then builds the case's layers — unsharded, and rank 0 of the sharded
// group — without running them, so bad options or sizes fail (Error(kInput)) before any
// case runs.
void check_case(const SuiteCase& c, const RunConfig& config);

// ---- judging ----------------------------------------------------------------------

struct JudgeConfig {
  std::vector<Policy> policies;   // every policy reported (te, allclose, truth, bitwise)
  CompareOptions compare;         // --rtol / --atol overrides for te and allclose
};

struct TensorResult {
  std::string name, kind;
  int index = 0;
  TensorComparison comparison;
  std::vector<Verdict> verdicts;  // one per JudgeConfig::policies entry
};

// One training step of a case, judged.
struct StepResult {
  int step = 1;  // 1-based
  std::vector<TensorResult> tensors;
  // Across the sharded ranks. A difference fails the step under tpcheck's own policies,
  // truth and bitwise; te and allclose stay the reference's rules on the tensors alone.
  ReplicatedState replicated_state;
  std::vector<Verdict> verdicts;  // per policy: fails if any tensor fails
};

struct CaseResult {
  SuiteCase spec;
  int tp = 1;
  std::vector<StepResult> steps;  // one per training step, in order
  // Per policy, the case's verdict: its worst step's (the first of them), reason prefixed
  // "step k: " when there are several steps.
  std::vector<Verdict> verdicts;
  std::vector<Policy> policies;   // as applied (truth: with this case's u and K)
  std::vector<GemmClassDiff> gemm_class_diffs;
  std::size_t gemm_count_single = 0, gemm_count_sharded = 0;
  std::vector<CommRecord> collectives;  // rank 0's communication ledger of the sharded run
  double seconds = 0;
};

CaseResult judge_case(const SuiteCase& c, int tp, const CaseRun& run, const JudgeConfig& config);

// The u a GEMM math class contributes to the truth policy's error model (quantized
// classes: their f32 accumulation; judge.cpp says why).
double math_class_unit_roundoff(MathClass c);

// The step that decides the case under policy `p`: the first whose verdict is the case's
// (so the first failing step of a failing case; the last step of a passing one).
// REQUIRES: result.steps not empty.
const StepResult& deciding_step(const CaseResult& result, std::size_t p);
// Index, in deciding_step(result, p).tensors, of the tensor that decides the case under
// policy `p` (the first failing one, else the one with the largest sharded-vs-single
// norm-wise difference); -1 if none.
int worst_tensor(const CaseResult& result, std::size_t p);

}  // namespace tpcheck

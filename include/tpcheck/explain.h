// tpcheck/explain.h — why does the sharded run differ? One case, investigated.
//
// explain_case runs a suite case as `tpcheck run` does (single, sharded, truth), but with
// every backend op and collective recorded, and answers in three steps:
//   1. first divergence: every intermediate tensor (GEMM outputs, norm outputs,
//      activations, attention probabilities, collective results, gradients) in execution
//      order, single against sharded (the sharded ranks' tensors assembled to the global
//      one) and each against the fp64 truth run's, with the first op whose sharded error
//      exceeds what rounding explains (the truth policy's bound applied to that tensor);
//   2. GEMM attribution: the GEMM sites upstream of each failing (or the worst) tensor
//      whose numerical class or algorithm differs between single and sharded, both
//      records side by side;
//   3. counterfactual proof: the case re-run with each such site forced to the other
//      run's class — sharded to single's and single to sharded's — and the difference
//      that remains; the site whose forcing removes the most is named.
// A closing sentence says in plain words whether the difference is rounding (a class
// change accounts for it) or a TP bug (the sharded run is far from truth from some op on).
// Design notes and the layout rules for sharded intermediates: docs/FORENSICS.md.
// Thread safety: explain_case starts the case's rank threads; call it from one thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tpcheck/forensics.h"
#include "tpcheck/suite.h"

namespace tpcheck {

struct ExplainOptions {
  std::size_t chosen_policy = 0;  // index into JudgeConfig::policies: what "failing" means
  bool counterfactual = true;     // re-run with forced classes (step 3)
  int max_forced_sites = 12;      // at most this many sites are forced one by one
  int max_tensors = 6;            // failing tensors explained (the worst first)
};

// One intermediate tensor of the layer, single against sharded.
struct TrailEntry {
  int order = 0;            // position in the sharded run's execution order
  std::string name;         // "mlp.fc1/fwd" (a GEMM), "mlp.fc1/fwd → activation_forward"
  std::string op;           // "gemm", "norm_forward", "all_reduce", ...
  int occurrence = 0;       // n-th op of this name in the run
  bool comparable = false;  // a layout relating the ranks' tensors to single's was found
  std::string layout;  // "replicated", "sum over ranks", "split dim 1", "split dim 0 (4 blocks)"
  std::string note;    // why not comparable / present in one run only
  Shape single_shape, sharded_shape;  // sharded: rank 0's local shape
  double max_abs_diff = 0;            // max |sharded − single|
  double norm_rel_diff = 0;           // ‖sharded − single‖ / ‖single‖
  // rms error against the truth run's tensor, and the truth's rms.
  double single_err = 0, sharded_err = 0, truth_rms = 0;
  bool has_truth = false;
  // sharded_err beyond m·sqrt(N)·single_err + f·u·sqrt(K)·truth_rms (the truth policy's
  // rms bound for this case): worse than rounding explains.
  bool diverges = false;
};

// Forcing one GEMM site (all its occurrences) in one run to the other run's class.
struct Counterfactual {
  std::string site;        // GEMM site; "all" = every differing site at once
  std::string forced_run;  // "sharded" (forced to single's class) or "single"
  std::string forced_to;   // the class (and, on CUDA, what was pinned) it was forced to
  // Per explained tensor (same order as CaseExplanation::tensors): ‖sharded − single‖ /
  // ‖single‖ after forcing, and the fraction of the original difference it removed.
  std::vector<double> remaining;
  std::vector<double> removed;
};

struct TensorExplanation {
  std::string name, kind;    // as in the case's tensors ("fc1_weight", "gradient")
  bool failing = false;      // fails the chosen policy (else: the case's worst tensor)
  double norm_rel_diff = 0;  // ‖sharded − single‖ / ‖single‖
  double max_abs_diff = 0;
  double single_err = 0, sharded_err = 0;     // rms against truth
  int first_divergence = -1;                  // index into CaseExplanation::trail; -1 none
  std::vector<GemmClassDiff> upstream_diffs;  // GEMM sites upstream whose class/algorithm differ
  std::string best_site;                      // the forcing that removes the most ("" none)
  std::string best_direction;                 // "sharded" or "single"
  double best_removed = 0;                    // fraction of the difference it removed
  std::string cause;                          // "rounding", "bug", "identical"
  std::string sentence;                       // the closing sentence
};

struct CaseExplanation {
  CaseResult result;  // the judged case (as `tpcheck run` reports it)
  CaseRun run;        // its tensors and ledgers
  std::vector<TrailEntry> trail;
  std::vector<TensorExplanation> tensors;
  std::vector<Counterfactual> counterfactuals;
  int reruns = 0;  // case re-runs spent on counterfactuals
  double seconds = 0;
};

// REQUIRES: judge.policies includes the truth policy (its bound flags divergence);
// options.chosen_policy < judge.policies.size().
CaseExplanation explain_case(const SuiteCase& c, const RunConfig& config, const JudgeConfig& judge,
                             const ExplainOptions& options = {});

nlohmann::json explanation_to_json(const CaseExplanation& e);
void print_explanation(std::ostream& out, const CaseExplanation& e);

}  // namespace tpcheck

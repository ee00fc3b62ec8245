// explain/recorder.h — decorators that record every intermediate tensor of a run, and
// force chosen GEMM sites to a numerical class (tpcheck explain).
//
// RecordingBackend wraps a rank's backend (a BackendWrapper: it shares the target's rule,
// ledger and rank, and GEMMs still pass the one front end). Its after_op hook copies the
// op's results to the host and appends them to the run's Recording, in the order the
// backend stored them: GEMM outputs (C after the call, named by site), norm outputs and
// gradients, activations and their gradients, attention probabilities and their gradient
// (the softmax primitives) and the heads' sum, bias and elementwise results, accumulated
// gradients. RecordingCommunicator wraps the rank's communicator and appends each
// collective's result.
//
// Forcing: a RecordingBackend given a GemmForcing runs the named sites with the forced
// class (the problem's math_class, which the CPU engine emulates and the CUDA engine maps
// to its compute type) and, on CUDA, the other run's cuBLASLt algorithm (GemmProblem::pin,
// src/backend/cuda/gemm.cu). The front end has already chosen the class; the decorator
// changes it before the engine runs, so layer and backend code are untouched.
//
// ExplainRecorders ties both to a run: Execution::wrap_communicator makes a new Recording
// on the rank's thread (run_rank calls it before it makes the backend), and the backend
// factory made by wrap() picks that Recording up on the same thread.
// Thread safety: one Recording per rank thread; ExplainRecorders' list is locked.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/comm.h"
#include "tpcheck/suite.h"

namespace tpcheck::explain {

struct RecordedOp {
  std::string op;    // "gemm", "norm_forward", "all_reduce", ...
  std::string site;  // GEMM site; "" for other ops
  Tensor value;      // host copy of the result
};

// Every op of one rank of one run, in execution order.
struct Recording {
  int rank = 0;
  int world = 1;
  std::vector<RecordedOp> ops;
  bool is_f64() const;  // the truth run records f64 tensors
};

// Forced GEMM sites for one run: site → class (and the other run's record on CUDA).
struct GemmForcing {
  struct Target {
    MathClass math_class = MathClass::kFp32;
    std::optional<CublasLtAlgoRecord> algorithm;  // CUDA: pin this algorithm if it fits
  };
  std::map<std::string, Target> sites;
};

class ExplainRecorders {
 public:
  // `single` / `sharded`: forcing applied in the single (group of one, not f64) and the
  // sharded runs (group of more than one).
  ExplainRecorders(bool record, GemmForcing single, GemmForcing sharded);

  // `base` with the backend factory and communicator wrapped.
  Execution wrap(const Execution& base);

  // After run_case: the recordings by run.
  std::shared_ptr<Recording> single() const;
  std::shared_ptr<Recording> truth() const;
  std::vector<std::shared_ptr<Recording>> sharded() const;  // by rank

 private:
  bool record_;
  GemmForcing single_forcing_, sharded_forcing_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Recording>> all_;
};

}  // namespace tpcheck::explain

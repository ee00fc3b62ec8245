// execution.h — from the command line's backend options to an Execution (which backend
// each rank gets, how the sharded ranks are launched) and the environment it reports.
// Thread safety: call from the main thread before any case runs.
#pragma once

#include <string>

#include "tpcheck/report.h"
#include "tpcheck/suite.h"

namespace tpcheck {

struct ExecutionArgs {
  std::string backend = "auto";     // auto | cpu | cuda
  std::string tf32 = "on";          // cuda, f32 GEMMs: on | off
  std::string gemm_impl = "any";    // cuda: any | tensor-core | fma
  std::string comm = "auto";        // cuda: auto | emulated | nccl
  std::string comm_order = "nccl-ring";  // cuda emulated: nccl-ring | rank
  std::string attention = "unfused";  // cuda: unfused | fused (cuDNN, where it applies)
  std::string inject_failure;       // testing: "RANK@RUN" (inject_failure below), "" = none
};

// Validates the options (Error(kInput) naming the bad value), resolves `auto`, and fills
// the run's Execution, GEMM class rule, and settings (backend name, notes, environment).
// `cpu_gemm_given`: --cpu-gemm was on the command line (an input error with cuda).
struct ResolvedExecution {
  Execution execution;
  GemmClassRule gemm_rule;
  // False in the processes of ranks 1..N-1 of an mpirun / torchrun launch: rank 0 reports.
  bool reports = true;
};
ResolvedExecution resolve_execution(const ExecutionArgs& args, int tp, const GemmClassRule& cpu_rule,
                                    bool cpu_gemm_given, RunSettings& settings);

// Testing hook behind --inject-failure RANK@RUN (hidden from --help): wraps the launcher
// so that rank RANK throws at the start of the RUN-th sharded run (counted from 1), after
// printing "tpcheck: --inject-failure: rank R throws now ..." to stderr, flushed, so a
// script can time how long the other ranks take to end. Used by the fault tests (CPU
// threads here; NCCL threads and mpirun processes in tests/gpu/run_x2.sh). A spec that is
// not RANK@RUN with 0 <= RANK < tp and RUN >= 1 is Error(kInput) naming it.
void inject_failure(Execution& execution, const std::string& spec, int tp);

}  // namespace tpcheck

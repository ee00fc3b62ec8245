// execution.h — from the run options' backend choices to an Execution (which backend each
// rank gets, how the sharded ranks are launched) and the environment the report shows.
// Four kinds of execution, one function each (execution.cpp): the CPU's thread ranks; one
// process per rank started by mpirun / torchrun; one thread per GPU over NCCL; every rank
// emulated on one GPU.
// Thread safety: call from the main thread before any case runs.
#pragma once

#include <string>

#include "tpcheck/report.h"
#include "tpcheck/run_options.h"
#include "tpcheck/suite.h"

namespace tpcheck {

// Validates the backend options (Error(kInput) naming the bad value), resolves `auto`, and
// fills the run's Execution, GEMM class rule, and settings (backend name, notes,
// environment). A given --cpu-gemm is an input error with cuda.
struct ResolvedExecution {
  Execution execution;
  GemmClassRule gemm_rule;
  // False in the processes of ranks 1..N-1 of an mpirun / torchrun launch: rank 0 reports.
  bool reports = true;
};
ResolvedExecution resolve_execution(const RunOptions& options, const GemmClassRule& cpu_rule,
                                    RunSettings& settings);

// Every rank a thread of this process, whatever launched it (tpcheck.layer_run inside a
// torchrun or `tpcheck emulate` rank): the CPU's thread group, or with backend cuda every
// rank on GPU 0 with the collectives emulated in the options' comm order (the execution
// `tpcheck run --backend cuda --comm emulated` gets). Options checked as above.
ResolvedExecution in_process_execution(const RunOptions& options, const GemmClassRule& cpu_rule,
                                       RunSettings& settings);

// Testing hook behind --inject-failure RANK@RUN (hidden from --help): wraps the launcher
// so that rank RANK throws at the start of the RUN-th sharded run (counted from 1), after
// printing "tpcheck: --inject-failure: rank R throws now ..." to stderr, flushed, so a
// script can time how long the other ranks take to end. Used by the fault tests (CPU
// threads here; NCCL threads and mpirun processes in tests/gpu/run_multi.sh). A spec that
// is not RANK@RUN with 0 <= RANK < tp and RUN >= 1 is Error(kInput) naming it.
void inject_failure(Execution& execution, const std::string& spec, int tp);

}  // namespace tpcheck

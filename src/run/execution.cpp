// execution.cpp — see execution.h.
#include "run/execution.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <regex>

#include "tpcheck/cuda_backend.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// The CUDA backend's options from the run options (each checked: a bad name is an input
// error naming it).
CudaBackendOptions cuda_backend_options(const RunOptions& o) {
  CudaBackendOptions options;
  options.allow_tf32 = o.tf32 == Tf32Choice::kOn;
  options.impl_mask = parse_gemm_impl_mask(o.gemm_impl);
  options.fused_attention = o.attention == AttentionChoice::kFused;
  return options;
}

// The class a GPU run asks of its f32 GEMMs (what ran is in each GEMM record).
MathClass f32_gemm_class(const CudaBackendOptions& options) {
  return options.allow_tf32 ? MathClass::kTf32 : MathClass::kFp32;
}

// The CPU's thread ranks: the GEMM class rule is --cpu-gemm's.
ResolvedExecution cpu_execution_for(const RunOptions& o, const GemmClassRule& cpu_rule) {
  TPCHECK_CHECK_INPUT(o.attention != AttentionChoice::kFused,
                      "--attention fused runs cuDNN's fused attention on the GPU; the CPU "
                      "backend has the unfused path only (use --backend cuda)");
  ResolvedExecution out;
  out.execution = cpu_execution();
  out.gemm_rule = cpu_rule;
  return out;
}

// (b) One process per rank, started by mpirun or torchrun: this process is one rank.
ResolvedExecution process_per_rank_execution(const NcclProcessLaunch& l,
                                             const CudaBackendOptions& options, int tp,
                                             const DeviceInfo& devices) {
  TPCHECK_CHECK_INPUT(l.world == tp,
                      "{} started {} processes but --tp is {}: one process per rank, so --tp "
                      "must equal the process count",
                      l.launcher, l.world, tp);
  TPCHECK_CHECK_INPUT(l.local_rank < devices.cuda_devices,
                      "{} rank {}: local rank {} has no GPU of its own ({} visible)", l.launcher,
                      l.rank, l.local_rank, devices.cuda_devices);
  ResolvedExecution out;
  Execution& e = out.execution;
  e.backend = BackendKind::kCuda;
  e.communicator = TPCHECK_FORMAT("nccl (one process per GPU, {})", l.launcher);
  e.one_process_per_rank = true;
  e.make_backend = [options, l](int) {
    CudaBackendOptions o = options;
    o.device = l.local_rank;
    return make_cuda_backend(o);
  };
  // The process group is joined once and kept for every case of the run.
  auto group = std::make_shared<std::unique_ptr<Communicator>>();
  e.launch_group = [l, group](int, const std::function<void(Communicator&)>& body) {
    if (!*group) *group = connect_nccl_process_group(l);
    try {
      body(**group);
    } catch (const std::exception& ex) {
      (*group)->abort(ex.what());  // the other processes stop and name this rank
      throw;
    }
  };
  out.reports = l.rank == 0;
  return out;
}

// One thread per GPU, NCCL between them.
ResolvedExecution nccl_thread_execution(const CudaBackendOptions& options, int tp) {
  ResolvedExecution out;
  Execution& e = out.execution;
  e.backend = BackendKind::kCuda;
  e.concurrent_unsharded_runs = true;
  e.communicator = "nccl (one thread per GPU)";
  e.results_on_host = true;  // rank r's tensors are on GPU r
  e.make_backend = [options](int rank) {
    CudaBackendOptions o = options;
    o.device = rank;
    return make_cuda_backend(o);
  };
  // One group for the whole run: NCCL's initialization once, not once per case.
  auto group = std::make_shared<NcclThreadGroup>(tp);
  e.launch_group = [group](int world, const std::function<void(Communicator&)>& body) {
    TPCHECK_CHECK(world == group->size(), "the NCCL group has {} ranks, a run asked for {}",
                  group->size(), world);
    group->run(body);
  };
  return out;
}

// Every rank on GPU 0, the collectives emulated in `order`.
ResolvedExecution emulated_execution(const CudaBackendOptions& options, CommOrder order, int tp,
                                     RunSettings& settings) {
  ResolvedExecution out;
  Execution& e = out.execution;
  e.backend = BackendKind::kCuda;
  e.concurrent_unsharded_runs = true;
  e.communicator = TPCHECK_FORMAT("emulated on GPU 0 ({})", comm_order_name(order));
  e.concurrent_cases = true;  // a fresh device group per run: groups do not share state
  e.make_backend = [options](int) { return make_cuda_backend(options); };
  e.launch_group = [order](int world, const std::function<void(Communicator&)>& body) {
    DeviceGroupOptions group;
    group.order = order;
    run_device_group(world, body, group);
  };
  if (tp > 1) {
    settings.notes.push_back(TPCHECK_FORMAT(
        "{} ranks emulated on one GPU: sharded shapes as on {} GPUs, collectives in {} order", tp,
        tp, comm_order_name(order)));
  }
  return out;
}

// The GPU executions: which kind the options, the devices and the launch ask for.
ResolvedExecution cuda_execution_for(const RunOptions& o, const CudaBackendOptions& options,
                                     CommOrder order, const DeviceInfo& devices,
                                     RunSettings& settings) {
  TPCHECK_CHECK_INPUT(!o.cpu_gemm,
                      "--cpu-gemm applies to --backend cpu; on the GPU cuBLASLt chooses (use "
                      "--tf32 on|off and --gemm-impl any|tensor-core|fma)");
  TPCHECK_CHECK_INPUT(devices.cuda_devices > 0,
                      "--backend cuda: no usable GPU ({}); run on a machine with an NVIDIA GPU, "
                      "or use --backend cpu",
                      devices.description);
  if (const std::optional<NcclProcessLaunch> launch = nccl_process_launch_from_env()) {
    return process_per_rank_execution(*launch, options, o.tp, devices);
  }
  const bool nccl = o.comm == CommChoice::kNccl ||
                    (o.comm == CommChoice::kAuto && o.tp > 1 && devices.cuda_devices >= o.tp);
  TPCHECK_CHECK_INPUT(!(o.comm == CommChoice::kNccl && devices.cuda_devices < o.tp),
                      "--comm nccl at --tp {} needs {} GPUs, this machine has {} (NCCL refuses two "
                      "ranks on one GPU); use --comm emulated",
                      o.tp, o.tp, devices.cuda_devices);
  return nccl ? nccl_thread_execution(options, o.tp)
              : emulated_execution(options, order, o.tp, settings);
}

// The one environment report. Every execution names its communicator; a GPU one adds the
// device, the versions and TF32, and one whose ranks are all in this process (threads or
// emulated) also the GPU count, the allowed implementations, the workspace and the
// collectives' order. A one-process-per-rank launch has always reported only the first
// set, and the JSON of a launch stays what it was.
void report_environment(const ResolvedExecution& r, const CudaBackendOptions& options,
                        CommOrder order, const DeviceInfo& devices, RunSettings& settings) {
  const Execution& e = r.execution;
  settings.backend = std::string(backend_kind_name(e.backend));
  nlohmann::json& env = settings.environment;
  env["communicator"] = e.communicator;
  if (e.backend == BackendKind::kCpu) return;
  // The class asked of f32 GEMMs; what ran is in each GEMM record.
  settings.cpu_gemm = options.allow_tf32 ? "tf32 on" : "tf32 off";
  env["attention"] = std::string(options.fused_attention ? "fused" : "unfused");
  env["gpu"] = devices.description;
  env["cuda_versions"] = cuda_versions();
  env["tf32"] = options.allow_tf32;
  if (e.one_process_per_rank) return;
  const bool nccl = e.results_on_host;
  env["gpu_count"] = devices.cuda_devices;
  env["gemm_impl"] = std::string(gemm_impl_mask_name(options.impl_mask));
  env["workspace_bytes"] = options.workspace_bytes;
  env["comm_order"] = nccl ? "nccl" : std::string(comm_order_name(order));
}

}  // namespace

ResolvedExecution resolve_execution(const RunOptions& o, const GemmClassRule& cpu_rule,
                                    RunSettings& settings) {
  // Every option is checked before the devices are asked, whichever backend runs.
  const CudaBackendOptions options = cuda_backend_options(o);
  const CommOrder order = parse_comm_order(o.comm_order);

  const DeviceInfo devices = query_devices();
  bool cuda = o.backend == BackendChoice::kCuda;
  if (o.backend == BackendChoice::kAuto) {
    cuda = devices.cuda_devices > 0;
    if (!cuda) {
      settings.notes.push_back(
          TPCHECK_FORMAT("no GPU ({}): running on the CPU backend", devices.description));
    }
  }
  ResolvedExecution out = cuda ? cuda_execution_for(o, options, order, devices, settings)
                               : cpu_execution_for(o, cpu_rule);
  if (cuda) out.gemm_rule.f32_class = f32_gemm_class(options);
  report_environment(out, options, order, devices, settings);
  return out;
}

ResolvedExecution in_process_execution(const RunOptions& o, const GemmClassRule& cpu_rule,
                                       RunSettings& settings) {
  const CudaBackendOptions options = cuda_backend_options(o);
  const CommOrder order = parse_comm_order(o.comm_order);
  if (o.backend != BackendChoice::kCuda) return cpu_execution_for(o, cpu_rule);
  const DeviceInfo devices = query_devices();
  TPCHECK_CHECK_INPUT(devices.cuda_devices > 0, "device 'cuda': no usable GPU ({})",
                      devices.description);
  ResolvedExecution out = emulated_execution(options, order, o.tp, settings);
  out.gemm_rule.f32_class = f32_gemm_class(options);
  return out;
}

void inject_failure(Execution& execution, const std::string& spec, int tp) {
  std::smatch m;
  const std::regex form(R"(^(\d{1,4})@(\d{1,9})$)");
  TPCHECK_CHECK_INPUT(std::regex_match(spec, m, form),
                      "--inject-failure '{}': expected RANK@RUN (e.g. 1@20: rank 1 throws at the "
                      "start of the 20th sharded run)",
                      spec);
  const int rank = std::stoi(m[1].str());
  const long run = std::stol(m[2].str());
  TPCHECK_CHECK_INPUT(rank < tp, "--inject-failure '{}': rank {} does not exist at --tp {} (0..{})",
                      spec, rank, tp, tp - 1);
  TPCHECK_CHECK_INPUT(run >= 1, "--inject-failure '{}': runs are counted from 1", spec);
  auto launches = std::make_shared<std::atomic<long>>(0);
  // "The RUN-th sharded run" is counted in the order runs start: one case at a time.
  execution.concurrent_cases = false;
  execution.launch_group = [inner = execution.launch_group, rank, run, launches](
                               int world, const std::function<void(Communicator&)>& body) {
    const long this_run = ++*launches;
    inner(world, [&](Communicator& comm) {
      if (this_run == run && comm.rank() == rank) {
        std::fprintf(stderr, "tpcheck: --inject-failure: rank %d throws now (sharded run %ld)\n",
                     rank, run);
        std::fflush(stderr);
        throw Error(
            ErrorKind::kRuntime,
            TPCHECK_FORMAT("rank {}: injected failure (--inject-failure {}@{})", rank, rank, run),
            {}, rank);
      }
      body(comm);
    });
  };
}

}  // namespace tpcheck

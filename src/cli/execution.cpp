// execution.cpp — see execution.h.
#include "cli/execution.h"

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

bool parse_on_off(const std::string& flag, const std::string& value) {
  if (value == "on") return true;
  if (value == "off") return false;
  TPCHECK_CHECK_INPUT(false, "{} '{}': expected on or off", flag, value);
  return false;
}

}  // namespace

ResolvedExecution resolve_execution(const ExecutionArgs& args, int tp, const GemmClassRule& cpu_rule,
                                    bool cpu_gemm_given, RunSettings& settings) {
  TPCHECK_CHECK_INPUT(args.backend == "auto" || args.backend == "cpu" || args.backend == "cuda",
                      "unknown --backend '{}'; expected auto, cpu or cuda", args.backend);
  const bool tf32 = parse_on_off("--tf32", args.tf32);
  const GemmImplMask impl = parse_gemm_impl_mask(args.gemm_impl);
  TPCHECK_CHECK_INPUT(args.comm == "auto" || args.comm == "emulated" || args.comm == "nccl",
                      "unknown --comm '{}'; expected auto, emulated or nccl", args.comm);
  const CommOrder order = parse_comm_order(args.comm_order);
  TPCHECK_CHECK_INPUT(args.attention == "unfused" || args.attention == "fused",
                      "unknown --attention '{}'; expected unfused or fused", args.attention);
  const bool fused_attention = args.attention == "fused";

  const DeviceInfo devices = query_devices();
  std::string backend = args.backend;
  if (backend == "auto") {
    backend = devices.cuda_devices > 0 ? "cuda" : "cpu";
    if (backend == "cpu") {
      settings.notes.push_back(TPCHECK_FORMAT("no GPU ({}): running on the CPU backend",
                                              devices.description));
    }
  }
  settings.backend = backend;
  ResolvedExecution out;
  if (backend == "cpu") {
    TPCHECK_CHECK_INPUT(!fused_attention,
                        "--attention fused runs cuDNN's fused attention on the GPU; the CPU "
                        "backend has the unfused path only (use --backend cuda)");
    out.execution = cpu_execution();
    out.gemm_rule = cpu_rule;
    settings.environment["communicator"] = out.execution.communicator;
    return out;
  }

  TPCHECK_CHECK_INPUT(!cpu_gemm_given,
                      "--cpu-gemm applies to --backend cpu; on the GPU cuBLASLt chooses (use "
                      "--tf32 on|off and --gemm-impl any|tensor-core|fma)");
  TPCHECK_CHECK_INPUT(devices.cuda_devices > 0,
                      "--backend cuda: no usable GPU ({}); run on a machine with an NVIDIA GPU, "
                      "or use --backend cpu",
                      devices.description);
  CudaBackendOptions options;
  options.allow_tf32 = tf32;
  options.impl_mask = impl;
  options.fused_attention = fused_attention;
  settings.environment["attention"] = args.attention;
  // (b) One process per rank, started by mpirun or torchrun: this process is one rank.
  if (const std::optional<NcclProcessLaunch> launch = nccl_process_launch_from_env()) {
    TPCHECK_CHECK_INPUT(launch->world == tp,
                        "{} started {} processes but --tp is {}: one process per rank, so --tp "
                        "must equal the process count",
                        launch->launcher, launch->world, tp);
    TPCHECK_CHECK_INPUT(launch->local_rank < devices.cuda_devices,
                        "{} rank {}: local rank {} has no GPU of its own ({} visible)",
                        launch->launcher, launch->rank, launch->local_rank, devices.cuda_devices);
    Execution& e = out.execution;
    e.backend = "cuda";
    e.communicator = TPCHECK_FORMAT("nccl (one process per GPU, {})", launch->launcher);
    e.one_process_per_rank = true;
    const NcclProcessLaunch l = *launch;
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
    out.gemm_rule.f32_class = tf32 ? MathClass::kTf32 : MathClass::kFp32;
    settings.cpu_gemm = tf32 ? "tf32 on" : "tf32 off";
    settings.environment["gpu"] = devices.description;
    settings.environment["cuda_versions"] = cuda_versions();
    settings.environment["tf32"] = tf32;
    settings.environment["communicator"] = e.communicator;
    return out;
  }
  const bool nccl = args.comm == "nccl" || (args.comm == "auto" && tp > 1 && devices.cuda_devices >= tp);
  TPCHECK_CHECK_INPUT(!(args.comm == "nccl" && devices.cuda_devices < tp),
                      "--comm nccl at --tp {} needs {} GPUs, this machine has {} (NCCL refuses two "
                      "ranks on one GPU); use --comm emulated",
                      tp, tp, devices.cuda_devices);
  Execution& e = out.execution;
  e.backend = "cuda";
  e.concurrent_unsharded_runs = true;
  if (nccl) {
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
  } else {
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
          "{} ranks emulated on one GPU: sharded shapes as on {} GPUs, collectives in {} order",
          tp, tp, comm_order_name(order)));
    }
  }
  // The class asked of f32 GEMMs; what ran is in each GEMM record.
  out.gemm_rule.f32_class = tf32 ? MathClass::kTf32 : MathClass::kFp32;
  settings.cpu_gemm = tf32 ? "tf32 on" : "tf32 off";
  settings.environment["gpu"] = devices.description;
  settings.environment["gpu_count"] = devices.cuda_devices;
  settings.environment["cuda_versions"] = cuda_versions();
  settings.environment["tf32"] = tf32;
  settings.environment["gemm_impl"] = std::string(gemm_impl_mask_name(impl));
  settings.environment["workspace_bytes"] = options.workspace_bytes;
  settings.environment["communicator"] = e.communicator;
  settings.environment["comm_order"] = nccl ? "nccl" : std::string(comm_order_name(order));
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
        throw Error(ErrorKind::kRuntime,
                    TPCHECK_FORMAT("rank {}: injected failure (--inject-failure {}@{})", rank, rank, run), {},
                    rank);
      }
      body(comm);
    });
  };
}

}  // namespace tpcheck

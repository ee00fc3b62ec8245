// nccl_process_check — one rank of an mpirun / torchrun launch (tests/gpu/launch_mpirun.sh):
// joins the NCCL process group, all-reduces (rank + 1) over 1000 f32 and checks the sum
// N(N+1)/2. Options to test the failure paths (two or more ranks, one GPU each):
//   --fail-rank R   rank R exits with status 1 before the all-reduce (a crashed process);
//   --throw-rank R  rank R throws (reports through the failure channel) before it;
//   --hang-rank R   rank R sleeps 60 s before it (a process that stops answering).
// The other ranks must exit non-zero within ~10 s naming R (or timing out). Exit status: 0
// pass, 1 wrong sum / injected crash, 2 usage, 3 error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tpcheck/cuda_backend.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

int main(int argc, char** argv) {
  using namespace tpcheck;
  int fail_rank = -1, throw_rank = -1, hang_rank = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--fail-rank") == 0) fail_rank = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--throw-rank") == 0) throw_rank = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--hang-rank") == 0) hang_rank = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  int rank = -1;
  try {
    std::optional<NcclProcessLaunch> launch = nccl_process_launch_from_env();
    if (!launch) {
      std::fprintf(stderr, "not started by mpirun or torchrun (no OMPI_COMM_WORLD_* or RANK/WORLD_SIZE)\n");
      return 2;
    }
    rank = launch->rank;
    CudaBackendOptions bo;
    bo.device = launch->local_rank;
    std::unique_ptr<Backend> backend = make_cuda_backend(bo);
    std::unique_ptr<Communicator> comm = connect_nccl_process_group(*launch);
    try {
      if (rank == fail_rank) std::_Exit(1);
      if (rank == throw_rank) throw Error(ErrorKind::kRuntime, "injected failure", {}, rank);
      if (rank == hang_rank) std::this_thread::sleep_for(std::chrono::seconds(60));
      std::vector<double> v(1000, rank + 1.0);
      Tensor t = Tensor::from_f64(v, {1000}, DType::kF32).to_device(Device::kCuda);
      comm->all_reduce(t);
      const double want = launch->world * (launch->world + 1) / 2.0;
      const double got = t.to_host().at(999);
      std::printf("rank %d of %d (%s, GPU %d): all_reduce %s (%g, expected %g)\n", rank,
                  launch->world, launch->launcher.c_str(), launch->local_rank,
                  got == want ? "ok" : "WRONG", got, want);
      return got == want ? 0 : 1;
    } catch (const std::exception& e) {
      comm->abort(e.what());  // tell the others before this process goes
      throw;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return e.kind() == ErrorKind::kInput ? 2 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 3;
  }
}

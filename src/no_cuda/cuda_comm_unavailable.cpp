// The CUDA communicators' entry points in a build without CUDA: a clear error, not a link
// failure (nccl_process_launch_from_env needs no CUDA and lives in process_launch.cpp).
#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {
[[noreturn]] void unavailable(const char* what) {
  TPCHECK_CHECK_INPUT(false,
                      "{}: this tpcheck was built without CUDA (TPCHECK_CUDA=OFF); rebuild on a "
                      "machine with nvcc and NCCL, or use the CPU backend's thread group",
                      what);
  throw 0;  // unreachable
}
}  // namespace

void run_device_group(int, const std::function<void(Communicator&)>&, CudaGroupOptions) {
  unavailable("device group (N ranks on one GPU)");
}
NcclId make_nccl_id() { unavailable("NCCL"); }
std::unique_ptr<Communicator> make_nccl_communicator(int, int, int, const NcclId&, NcclOptions) {
  unavailable("NCCL communicator");
}
void run_nccl_group(int, const std::function<void(Communicator&)>&, NcclOptions) {
  unavailable("NCCL group");
}
struct NcclThreadGroup::State {};
NcclThreadGroup::NcclThreadGroup(int world, NcclOptions) : world_(world) { unavailable("NCCL group"); }
NcclThreadGroup::~NcclThreadGroup() = default;
void NcclThreadGroup::run(const std::function<void(Communicator&)>&) { unavailable("NCCL group"); }
std::unique_ptr<Communicator> connect_nccl_process_group(const NcclProcessLaunch&, NcclOptions) {
  unavailable("NCCL process group (mpirun / torchrun)");
}

}  // namespace tpcheck

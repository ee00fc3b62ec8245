// Placeholder definitions of tpcheck/cuda_comm.h until the GPU communicators land.
#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

namespace tpcheck {

std::string_view comm_order_name(CommOrder order) {
  return order == CommOrder::kNcclRing ? "nccl-ring" : "rank";
}
CommOrder parse_comm_order(std::string_view name) {
  if (name == "nccl-ring") return CommOrder::kNcclRing;
  if (name == "rank") return CommOrder::kRank;
  TPCHECK_CHECK_INPUT(false, "unknown --comm-order '{}'; expected nccl-ring or rank", name);
  return CommOrder::kNcclRing;
}

void run_device_group(int world, const std::function<void(Communicator&)>& body,
                      DeviceGroupOptions) {
  TPCHECK_CHECK_INPUT(world == 1, "GPU ranks emulated on one GPU: not built yet (--tp 1 only)");
  std::unique_ptr<Communicator> comm = make_single_communicator();
  body(*comm);
}
void run_nccl_group(int world, const std::function<void(Communicator&)>& body) {
  TPCHECK_CHECK_INPUT(false, "the NCCL communicator is not built yet");
}

}  // namespace tpcheck

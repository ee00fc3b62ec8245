// tpcheck/cuda_comm.h — communicators for ranks on GPUs (no CUDA headers here).
// (Interface placeholder: the device-group and NCCL implementations land next.)
#pragma once

#include <functional>
#include <string_view>

#include "tpcheck/comm.h"

namespace tpcheck {

// How emulated collectives add: NCCL's ring order with the input type's rounding after
// every addition (the default: what NCCL computes), or rank order in f32 rounded once.
enum class CommOrder { kNcclRing, kRank };
std::string_view comm_order_name(CommOrder order);   // "nccl-ring", "rank"
CommOrder parse_comm_order(std::string_view name);   // throws Error(kInput)

struct DeviceGroupOptions {
  CommOrder order = CommOrder::kNcclRing;
};

// N ranks as threads on one GPU (each body makes its own CUDA backend and stream).
void run_device_group(int world, const std::function<void(Communicator&)>& body,
                      DeviceGroupOptions options = {});
// N ranks, one thread per GPU, over NCCL.
void run_nccl_group(int world, const std::function<void(Communicator&)>& body);

}  // namespace tpcheck

// tpcheck/device.h — what accelerators this process can see.
// Thread safety: safe to call from any thread.
#pragma once

#include <string>

namespace tpcheck {

struct DeviceInfo {
  int cuda_devices = 0;     // 0 when built without CUDA, without a driver, or with no GPU
  std::string description;  // "2 × NVIDIA H200 (sm_90)", or why there is none
};

// Built with CUDA: asks the runtime. Otherwise reports that CUDA support is not built.
DeviceInfo query_devices();

}  // namespace tpcheck

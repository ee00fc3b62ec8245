// query_devices() for builds with CUDA: asks the CUDA runtime, never fails (a machine
// without a driver or GPU reports 0 devices and the runtime's reason).
#include <cuda_runtime.h>

#include <string>

#include "tpcheck/device.h"

namespace tpcheck {

DeviceInfo query_devices() {
  DeviceInfo info;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    info.description = status != cudaSuccess
                           ? std::string("no CUDA device: ") + cudaGetErrorString(status)
                           : "no CUDA device";
    return info;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  info.cuda_devices = count;
  info.description = std::to_string(count) + " x " + prop.name + " (sm_" +
                     std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  return info;
}

}  // namespace tpcheck

// query_devices() for builds without CUDA (the CUDA build provides its own).
#include "tpcheck/device.h"

namespace tpcheck {

DeviceInfo query_devices() { return {0, "built without CUDA (TPCHECK_CUDA=OFF)"}; }

}  // namespace tpcheck

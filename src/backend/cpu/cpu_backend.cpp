// cpu_backend.cpp — the factory for the reference CPU backend. The ops themselves live
// in one file per op (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <memory>

namespace tpcheck {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace tpcheck

// cpu_backend.cpp — the factory for the reference CPU backend. The ops themselves live
// in one file per op (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <memory>

#include "backend/cpu/cpu_math.h"
#include "tpcheck/error.h"

namespace tpcheck {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

void set_cpu_gemm_threads(int threads) { openblas_set_num_threads(threads); }
int cpu_gemm_threads() { return openblas_get_num_threads(); }
std::string cpu_gemm_library() { return openblas_get_config(); }

namespace cpu {

RoundingProbeState*& rounding_probe() {
  thread_local RoundingProbeState* active = nullptr;
  return active;
}

void apply_rounding_probe(double* values, std::size_t n) {
  RoundingProbeState* probe = rounding_probe();
  if (probe == nullptr) return;
  for (std::size_t i = 0; i < n; ++i) {
    // splitmix64 of (seed, position): a fixed stream, so a probed run is reproducible.
    std::uint64_t z = probe->seed + 0x9E3779B97F4A7C15ull * (++probe->counter);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double r = static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;  // uniform in [-1, 1)
    values[i] *= 1.0 + probe->u * r;
  }
}

}  // namespace cpu

ScopedRoundingProbe::ScopedRoundingProbe(double u, std::uint64_t seed)
    : state_(std::make_unique<cpu::RoundingProbeState>()) {
  TPCHECK_CHECK_INPUT(u > 0 && u < 1, "rounding probe: u = {} must be in (0, 1)", u);
  TPCHECK_CHECK(cpu::rounding_probe() == nullptr, "rounding probes do not nest");
  state_->u = u;
  state_->seed = seed;
  cpu::rounding_probe() = state_.get();
}

ScopedRoundingProbe::~ScopedRoundingProbe() { cpu::rounding_probe() = nullptr; }

}  // namespace tpcheck

// rounding_probe.cpp — the rounding probe (tpcheck/backend.h, make_rounding_probe_backend):
// a BackendWrapper whose after_op multiplies every f64 tensor an op wrote by (1 + u·r) on
// the device that holds it, r from one fixed stream (random_math::probe_factor).
//
// The stream position of each value is its place in the sequence of everything the run's
// ops stored: the wrapper hands an op's outputs over in the order the backend stores them
// (Backend::store_order), so the positions, and the probed bits, are those of the CPU
// backend's former in-store probe on the CPU and those of this decorator's earlier
// per-op overrides on the GPU. Layout copies (attention's heads-in) store nothing new
// and are not perturbed.
// Thread safety: one instance per rank thread, like the backend it wraps.
#include <cstdint>
#include <memory>

#include "core/device_runtime.h"
#include "core/random_math.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// Owns the wrapped backend; a base class so it is built before BackendWrapper takes the
// reference (bases are constructed in declaration order).
struct OwnedTarget {
  explicit OwnedTarget(std::unique_ptr<Backend> t) : owned(std::move(t)) {
    TPCHECK_CHECK(owned != nullptr, "rounding probe: no backend to wrap");
  }
  std::unique_ptr<Backend> owned;
};

class RoundingProbeBackend final : private OwnedTarget, public BackendWrapper {
 public:
  RoundingProbeBackend(std::unique_ptr<Backend> target, double u, std::uint64_t seed)
      : OwnedTarget(std::move(target)), BackendWrapper(*owned), u_(u), seed_(seed) {
    TPCHECK_CHECK_INPUT(u > 0 && u < 1, "rounding probe: u = {} must be in (0, 1)", u);
  }

 protected:
  void after_op(const OpCall& call) override {
    for (const OpOutput& out : call.outputs) {
      if (out.computed) perturb(*out.tensor);
    }
  }

 private:
  // Only f64 stores are perturbed (the probe runs the f64 truth computation).
  void perturb(Tensor& t) {
    if (t.dtype() != DType::kF64 || t.numel() == 0) return;
    const std::uint64_t first = counter_ + 1;
    counter_ += static_cast<std::uint64_t>(t.numel());
    auto* values = static_cast<double*>(t.raw());
    if (t.device() == Device::kCpu) {
      for (std::int64_t i = 0; i < t.numel(); ++i)
        values[i] *= random_math::probe_factor(u_, seed_, first + static_cast<std::uint64_t>(i));
      return;
    }
    device_runtime(t.device()).perturb_f64(values, t.numel(), u_, seed_, first);
  }

  double u_;
  std::uint64_t seed_;
  std::uint64_t counter_ = 0;  // values perturbed so far: the stream position
};

}  // namespace

std::unique_ptr<Backend> make_rounding_probe_backend(std::unique_ptr<Backend> target, double u,
                                                     std::uint64_t seed) {
  return std::make_unique<RoundingProbeBackend>(std::move(target), u, seed);
}

}  // namespace tpcheck

// cuda_random_test.cpp — tensors generated on the GPU against the host's generator, and
// the rounding probe decorator on the CUDA backend against the same decorator on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gpu_test_support.h"
#include "tpcheck/backend.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/rng.h"
#include "tpcheck/shard.h"

namespace tpcheck {
namespace {

// Last-bit distance of two doubles of one sign (0 when equal).
std::int64_t ulps(double a, double b) {
  std::int64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return x > y ? x - y : y - x;
}

TEST(CudaGenerate, MatchesTheHostShardForShard) {
  TPCHECK_REQUIRE_GPU();
  std::unique_ptr<Backend> be = make_cuda_backend();  // installs the device runtime
  const Shape global{48, 40};
  const struct {
    ShardSpec spec;
    int world;
  } layouts[] = {{ShardSpec::replicated(), 1},
                 {ShardSpec::along(0), 4},
                 {ShardSpec::along(1), 4},
                 {ShardSpec::along(0, {16, 16, 16}), 4}};  // fused QKV-like blocks
  const FillSpec fills[] = {FillSpec::normal(0.5, 2.0), FillSpec::uniform(-3, 1),
                            FillSpec::constant(0.25)};
  std::int64_t worst_f64_ulps = 0;
  for (const auto& l : layouts) {
    for (const FillSpec& fill : fills) {
      for (int rank = 0; rank < l.world; ++rank) {
        for (DType dt : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
          const Tensor host = generate(fill, 7, "w", global, dt, l.spec, rank, l.world);
          const Tensor dev =
              generate(fill, 7, "w", global, dt, l.spec, rank, l.world, Device::kCuda);
          ASSERT_EQ(dev.device(), Device::kCuda);
          ASSERT_EQ(dev.shape(), host.shape());
          const std::vector<double> h = host.to_f64(), d = dev.to_f64();
          for (std::size_t i = 0; i < h.size(); ++i) {
            if (dt == DType::kF64) {
              // The device's log/cos are not glibc's (CUDA documents log ≤ 1 ulp, cos ≤ 2
              // ulp): near a zero of cos or at u1 ≈ 1 a few ulps of the factor are many
              // ulps of a tiny value (measured: 64 ulps at one element of this test), so
              // the bound is absolute, on the scale of the distribution: 1e-14 · (|a| +
              // 8·|b|), about 50 ulps of a value at 8 standard deviations.
              worst_f64_ulps = std::max(worst_f64_ulps, ulps(h[i], d[i]));
              ASSERT_LE(std::abs(h[i] - d[i]), 1e-14 * (std::abs(fill.a) + 8 * std::abs(fill.b)))
                  << "element " << i << " rank " << rank;
            } else {
              // Rounded to a narrower format, a last-bit difference in f64 almost never
              // shows; allow it only within one unit of the narrow format.
              ASSERT_NEAR(h[i], d[i], std::abs(h[i]) * 1e-2 + 1e-30)
                  << dtype_name(dt) << " element " << i;
            }
          }
        }
      }
    }
  }
  RecordProperty("worst_f64_ulps", static_cast<int>(worst_f64_ulps));
}

TEST(CudaRoundingProbe, PerturbsOnlyF64OutputsLikeTheCpuDecorator) {
  TPCHECK_REQUIRE_GPU();
  auto gpu = make_rounding_probe_backend(make_cuda_backend(), 0x1p-30, 99);
  auto cpu = make_rounding_probe_backend(make_cpu_backend(), 0x1p-30, 99);
  const Tensor a = generate(FillSpec::normal(0, 1), 1, "a", {64, 32}, DType::kF64);
  const Tensor b = generate(FillSpec::normal(0, 1), 1, "b", {64, 32}, DType::kF64);
  // An elementwise add is exact-rounded on both devices: the probed results must agree
  // bit for bit (same factor stream, same multiplication).
  const Tensor on_cpu = cpu->add(a, b);
  const Tensor on_gpu = gpu->add(a.to_device(Device::kCuda), b.to_device(Device::kCuda));
  const std::vector<double> x = on_cpu.to_f64(), y = on_gpu.to_f64();
  const std::vector<double> av = a.to_f64(), bv = b.to_f64();
  int moved = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i], y[i]) << "element " << i;
    moved += x[i] != av[i] + bv[i];
  }
  EXPECT_GT(moved, static_cast<int>(x.size()) * 9 / 10);  // the probe did perturb
  // f32 outputs are left alone.
  const Tensor f = gpu->add(a.to(DType::kF32).to_device(Device::kCuda),
                            b.to(DType::kF32).to_device(Device::kCuda));
  const Tensor plain = make_cpu_backend()->add(a.to(DType::kF32), b.to(DType::kF32));
  EXPECT_EQ(f.to_f64(), plain.to_f64());
}

}  // namespace
}  // namespace tpcheck

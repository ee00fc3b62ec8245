// rounding_probe_test.cpp — the rounding probe as a backend decorator
// (make_rounding_probe_backend): every f64 tensor an op writes moves by a relative
// amount below u, differently per element, reproducibly; other dtypes are untouched.
#include <gtest/gtest.h>

#include <cmath>

#include "tpcheck/backend.h"
#include "tpcheck/error.h"
#include "tpcheck/rng.h"

namespace tpcheck {
namespace {

constexpr double kU = 0x1p-30;

// Checks that `probed` is `plain` times (1 + δ), |δ| ≤ u, with δ ≠ 0 for most elements.
void expect_perturbed(const Tensor& probed, const Tensor& plain, const char* what) {
  const std::vector<double> p = probed.to_f64(), q = plain.to_f64();
  ASSERT_EQ(p.size(), q.size()) << what;
  int moved = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (q[i] == 0) continue;
    const double rel = std::abs(p[i] / q[i] - 1);
    EXPECT_LE(rel, kU * (1 + 1e-6)) << what << " element " << i;
    moved += rel > 0;
  }
  EXPECT_GT(moved, static_cast<int>(p.size()) / 2) << what << ": the probe moved too few";
}

TEST(RoundingProbeBackend, PerturbsEveryF64OutputByLessThanU) {
  auto probed = make_rounding_probe_backend(make_cpu_backend(), kU, 5);
  auto plain = make_cpu_backend();
  const Tensor a = generate(FillSpec::normal(0, 1), 1, "a", {16, 24}, DType::kF64);
  const Tensor b = generate(FillSpec::normal(0, 1), 1, "b", {24, 8}, DType::kF64);
  Tensor c1({16, 8}, DType::kF64), c2({16, 8}, DType::kF64);
  probed->gemm("t", a, false, b, false, c1, false);
  plain->gemm("t", a, false, b, false, c2, false);
  expect_perturbed(c1, c2, "gemm");
  EXPECT_EQ(probed->ledger().records().size(), 1u);  // still one ledger record

  const Tensor gamma = generate(FillSpec::normal(1, 0.1), 1, "g", {24}, DType::kF64);
  const Tensor beta = generate(FillSpec::normal(0, 0.1), 1, "be", {24}, DType::kF64);
  const NormForward n1 = probed->norm_forward(NormKind::kLayerNorm, a, gamma, beta, 1e-5, false);
  const NormForward n2 = plain->norm_forward(NormKind::kLayerNorm, a, gamma, beta, 1e-5, false);
  expect_perturbed(n1.y, n2.y, "norm y");
  expect_perturbed(n1.rstd, n2.rstd, "norm rstd");
  expect_perturbed(probed->activation_forward(Activation::kGelu, a),
                   plain->activation_forward(Activation::kGelu, a), "gelu");
  expect_perturbed(probed->add(a, a), plain->add(a, a), "add");
}

TEST(RoundingProbeBackend, ReproducibleAndSeeded) {
  const Tensor a = generate(FillSpec::normal(0, 1), 1, "a", {32, 32}, DType::kF64);
  auto run = [&](std::uint64_t seed) {
    auto be = make_rounding_probe_backend(make_cpu_backend(), kU, seed);
    return be->scale(a, 3.0).to_f64();
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST(RoundingProbeBackend, LeavesOtherDtypesAlone) {
  auto probed = make_rounding_probe_backend(make_cpu_backend(), kU, 5);
  auto plain = make_cpu_backend();
  const Tensor a = generate(FillSpec::normal(0, 1), 1, "a", {32, 32}, DType::kF32);
  EXPECT_EQ(probed->scale(a, 3.0).to_f64(), plain->scale(a, 3.0).to_f64());
}

TEST(RoundingProbeBackend, RejectsUOutsideZeroOne) {
  EXPECT_THROW(make_rounding_probe_backend(make_cpu_backend(), 0.0, 1), Error);
  EXPECT_THROW(make_rounding_probe_backend(make_cpu_backend(), 1.5, 1), Error);
}

}  // namespace
}  // namespace tpcheck

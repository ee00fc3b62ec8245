// norm_test.cpp — LayerNorm and RMSNorm on the CPU backend: backward against central
// finite differences in f64, forward against the defining statistics, accumulation of
// parameter gradients, the f32/f16 storage paths, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/finite_diff.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using testing::numeric_gradient;
using testing::random_f64;
using testing::checked_gradient_error;
using testing::relative_error;
using testing::weighted_sum;

constexpr double kEps = 1e-5;

struct Case {
  NormKind kind;
  Shape shape;
  bool zero_centered;
};

std::string describe(const Case& c) {
  return std::string(norm_kind_name(c.kind)) + shape_str(c.shape) +
         (c.zero_centered ? " zero_centered" : "");
}

TEST(Norm, BackwardMatchesFiniteDifferences) {
  auto backend = make_cpu_backend();
  std::vector<Case> cases;
  for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRMSNorm}) {
    for (bool zc : {false, true}) {
      for (const Shape& s : {Shape{4, 7}, Shape{2, 3, 16}, Shape{1, 64}}) {
        cases.push_back({kind, s, zc});
      }
    }
  }
  for (const Case& c : cases) {
    const std::int64_t n = c.shape.back();
    Tensor x = random_f64(c.shape, "x");
    // gamma around 1 (or around 0 when zero-centered), both with non-zero random parts.
    Tensor gamma = random_f64({n}, "gamma", 0.3);
    if (!c.zero_centered) {
      for (std::int64_t i = 0; i < n; ++i) gamma.set(i, 1.0 + gamma.at(i));
    }
    Tensor beta = c.kind == NormKind::kLayerNorm ? random_f64({n}, "beta", 0.5) : Tensor();
    const Tensor w = random_f64(c.shape, "w");
    auto loss = [&] {
      return weighted_sum(backend->norm_forward(c.kind, x, gamma, beta, kEps, c.zero_centered).y,
                          w);
    };
    const NormForward saved = backend->norm_forward(c.kind, x, gamma, beta, kEps, c.zero_centered);
    Tensor dgamma = Tensor::zeros({n}, DType::kF64);
    Tensor dbeta = c.kind == NormKind::kLayerNorm ? Tensor::zeros({n}, DType::kF64) : Tensor();
    const Tensor dx =
        backend->norm_backward(c.kind, w, x, gamma, saved, c.zero_centered, dgamma, dbeta);
    // Central differences with h = 1e-6: truncation ~h² and cancellation ~1e-16/h give
    // ~1e-10; measured ≤ 9e-10 on these cases.
    EXPECT_LT(checked_gradient_error(dx.to_f64(), numeric_gradient(loss, x)), 1e-7) << describe(c);
    EXPECT_LT(checked_gradient_error(dgamma.to_f64(), numeric_gradient(loss, gamma)), 1e-7) << describe(c);
    if (c.kind == NormKind::kLayerNorm) {
      EXPECT_LT(checked_gradient_error(dbeta.to_f64(), numeric_gradient(loss, beta)), 1e-7) << describe(c);
    }
  }
}

TEST(Norm, ForwardHasTheDefiningStatistics) {
  // With unit scale and no shift, each output row has mean 0 and mean square
  // var/(var+eps) (LayerNorm), or mean square ms/(ms+eps) (RMSNorm), ms = mean(x²).
  auto backend = make_cpu_backend();
  const std::int64_t rows = 3, n = 32;
  Tensor x = random_f64({rows, n}, "x", 2.0);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, x.at(i) + 0.7);  // non-zero mean
  const Tensor ones = Tensor::full({n}, DType::kF64, 1.0);
  const Tensor zeros = Tensor::zeros({n}, DType::kF64);
  for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRMSNorm}) {
    const NormForward f = backend->norm_forward(kind, x, ones, zeros, kEps, false);
    // zero_centered with gamma = 0 is the same unit scale.
    const NormForward fz = backend->norm_forward(kind, x, zeros, zeros, kEps, true);
    EXPECT_TRUE(bitwise_equal(f.y, fz.y));
    EXPECT_EQ(f.rstd.shape(), Shape{rows});
    EXPECT_EQ(f.mean.defined(), kind == NormKind::kLayerNorm);
    for (std::int64_t r = 0; r < rows; ++r) {
      double mean = 0, ms = 0, y_mean = 0, y_ms = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        mean += x.at(r * n + j) / n;
        ms += x.at(r * n + j) * x.at(r * n + j) / n;
        y_mean += f.y.at(r * n + j) / n;
        y_ms += f.y.at(r * n + j) * f.y.at(r * n + j) / n;
      }
      const double var = ms - mean * mean;
      if (kind == NormKind::kLayerNorm) {
        EXPECT_NEAR(y_mean, 0.0, 1e-14);
        EXPECT_NEAR(y_ms, var / (var + kEps), 1e-13);
        EXPECT_NEAR(f.mean.at(r), mean, 1e-14);
        EXPECT_NEAR(f.rstd.at(r), 1 / std::sqrt(var + kEps), 1e-12);
      } else {
        EXPECT_NEAR(y_ms, ms / (ms + kEps), 1e-13);
        EXPECT_NEAR(f.rstd.at(r), 1 / std::sqrt(ms + kEps), 1e-12);
      }
    }
  }
}

TEST(Norm, ParameterGradientsAccumulate) {
  auto backend = make_cpu_backend();
  const Tensor x = random_f64({5, 8}, "x"), gamma = random_f64({8}, "g"),
               beta = random_f64({8}, "b"), dy = random_f64({5, 8}, "dy");
  const NormForward f = backend->norm_forward(NormKind::kLayerNorm, x, gamma, beta, kEps, false);
  Tensor dgamma = Tensor::zeros({8}, DType::kF64), dbeta = Tensor::zeros({8}, DType::kF64);
  backend->norm_backward(NormKind::kLayerNorm, dy, x, gamma, f, false, dgamma, dbeta);
  const std::vector<double> once_g = dgamma.to_f64(), once_b = dbeta.to_f64();
  backend->norm_backward(NormKind::kLayerNorm, dy, x, gamma, f, false, dgamma, dbeta);
  for (std::int64_t j = 0; j < 8; ++j) {
    EXPECT_DOUBLE_EQ(dgamma.at(j), 2 * once_g[j]);
    EXPECT_DOUBLE_EQ(dbeta.at(j), 2 * once_b[j]);
  }
}

TEST(Norm, NarrowStorageComputesInF32AndRoundsOnce) {
  auto backend = make_cpu_backend();
  const std::int64_t n = 48;
  const Tensor x64 = random_f64({6, n}, "x"), g64 = random_f64({n}, "g"),
               b64 = random_f64({n}, "b"), dy64 = random_f64({6, n}, "dy");
  for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRMSNorm}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      const Tensor x = x64.to(dt), g = g64.to(dt), b = b64.to(dt), dy = dy64.to(dt);
      const NormForward f = backend->norm_forward(kind, x, g, b, kEps, true);
      EXPECT_EQ(f.y.dtype(), dt);
      EXPECT_EQ(f.rstd.dtype(), DType::kF32);
      Tensor dg = Tensor::zeros({n}, DType::kF32), db = Tensor::zeros({n}, DType::kF32);
      const Tensor dx = backend->norm_backward(kind, dy, x, g, f, true, dg, db);
      EXPECT_EQ(dx.dtype(), dt);
      // Against the f64 op on the same stored inputs: the error is the storage rounding
      // of y and dx (u = 2^-24, 2^-11, 2^-8) plus f32 math (~1e-6); bound 2u + 1e-5.
      const NormForward f64 = backend->norm_forward(kind, x.to(DType::kF64), g.to(DType::kF64),
                                                    b.to(DType::kF64), kEps, true);
      Tensor dg64 = Tensor::zeros({n}, DType::kF64), db64 = Tensor::zeros({n}, DType::kF64);
      const Tensor dx64 = backend->norm_backward(kind, dy.to(DType::kF64), x.to(DType::kF64),
                                                 g.to(DType::kF64), f64, true, dg64, db64);
      const double bound = 2 * dtype_unit_roundoff(dt) + 1e-5;
      EXPECT_LT(relative_error(f.y.to_f64(), f64.y.to_f64()), bound) << dtype_name(dt);
      EXPECT_LT(relative_error(dx.to_f64(), dx64.to_f64()), bound) << dtype_name(dt);
      EXPECT_LT(relative_error(dg.to_f64(), dg64.to_f64()), 1e-5) << dtype_name(dt);
      // Stored values are representable in the storage dtype.
      for (std::int64_t i = 0; i < f.y.numel(); ++i) {
        EXPECT_EQ(f.y.at(i), round_to(dt, f.y.at(i)));
      }
    }
  }
}

template <typename F>
void expect_input_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << p << " not in " << e.what();
    }
  }
}

TEST(Norm, BadInputGivesClearErrors) {
  auto backend = make_cpu_backend();
  const Tensor x = Tensor::zeros({4, 8}, DType::kF32), g = Tensor::zeros({6}, DType::kF32),
               b = Tensor::zeros({8}, DType::kF32), g8 = Tensor::zeros({8}, DType::kF32);
  expect_input_error([&] { backend->norm_forward(NormKind::kLayerNorm, x, g, b, kEps, false); },
                     {"LayerNorm", "gamma", "f32[6]", "[8]"});
  expect_input_error(
      [&] { backend->norm_forward(NormKind::kLayerNorm, x, g8, Tensor(), kEps, false); },
      {"LayerNorm", "beta", "undefined"});
  expect_input_error([&] { backend->norm_forward(NormKind::kRMSNorm, x, g8, {}, -1.0, false); },
                     {"RMSNorm", "eps"});
  const NormForward f = backend->norm_forward(NormKind::kRMSNorm, x, g8, {}, kEps, false);
  Tensor dg = Tensor::zeros({8}, DType::kF32), db;
  expect_input_error(
      [&] {
        backend->norm_backward(NormKind::kRMSNorm, Tensor::zeros({4, 7}, DType::kF32), x, g8, f,
                               false, dg, db);
      },
      {"RMSNorm", "dy", "f32[4, 7]"});
}

TEST(NormKindNames, RoundTripAndUnknownNameIsRejected) {
  EXPECT_EQ(parse_norm_kind("LayerNorm"), NormKind::kLayerNorm);
  EXPECT_EQ(parse_norm_kind(norm_kind_name(NormKind::kRMSNorm)), NormKind::kRMSNorm);
  expect_input_error([] { parse_norm_kind("BatchNorm"); }, {"'BatchNorm'", "LayerNorm, RMSNorm"});
}

}  // namespace
}  // namespace tpcheck

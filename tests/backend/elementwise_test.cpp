// elementwise_test.cpp — residual add, accumulate, scale and the MSE loss on the CPU
// backend: the loss gradient against central finite differences in f64, the other ops
// against their definitions with one rounding to storage, and bad shapes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/finite_diff.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using testing::random_f64;

TEST(MseLoss, ValueIsTheMeanSquareAndGradientMatchesFiniteDifferences) {
  auto backend = make_cpu_backend();
  for (const Shape& shape : {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}}) {
    Tensor y = random_f64(shape, "y");
    const Tensor t = random_f64(shape, "t");
    double want = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      want += (y.at(i) - t.at(i)) * (y.at(i) - t.at(i)) / static_cast<double>(y.numel());
    }
    EXPECT_NEAR(backend->mse_loss(y, t), want, 1e-14 * want);
    const Tensor dy = backend->mse_loss_backward(y, t);
    auto loss = [&] { return backend->mse_loss(y, t); };
    // Quadratic loss: central differences are exact up to cancellation (measured ≤ 1e-9).
    EXPECT_LT(testing::checked_gradient_error(dy.to_f64(), testing::numeric_gradient(loss, y)), 1e-7)
        << shape_str(shape);
  }
}

TEST(MseLoss, LossIsF64EvenForNarrowStorageAndGradientIsStored) {
  auto backend = make_cpu_backend();
  const Tensor y = random_f64({4, 6}, "y").to(DType::kF16),
               t = random_f64({4, 6}, "t").to(DType::kF16);
  double want = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) want += (y.at(i) - t.at(i)) * (y.at(i) - t.at(i));
  EXPECT_NEAR(backend->mse_loss(y, t), want / 24, 1e-15);
  const Tensor dy = backend->mse_loss_backward(y, t);
  EXPECT_EQ(dy.dtype(), DType::kF16);
  for (std::int64_t i = 0; i < dy.numel(); ++i) {
    const float g = (2.0f / 24.0f) * (static_cast<float>(y.at(i)) - static_cast<float>(t.at(i)));
    EXPECT_EQ(dy.at(i), round_to(DType::kF16, g)) << i;
  }
}

TEST(Elementwise, AddAccumulateScaleRoundOnceToStorage) {
  auto backend = make_cpu_backend();
  for (DType dt : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16}) {
    const Tensor a = random_f64({3, 4}, "a").to(dt), b = random_f64({3, 4}, "b").to(dt);
    const Tensor sum = backend->add(a, b);
    Tensor acc = a.clone();
    backend->accumulate(acc, b);
    const Tensor scaled = backend->scale(a, 0.3);
    EXPECT_EQ(sum.dtype(), dt);
    EXPECT_EQ(scaled.dtype(), dt);
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      if (dt == DType::kF64) {
        EXPECT_EQ(sum.at(i), a.at(i) + b.at(i));
        EXPECT_EQ(scaled.at(i), a.at(i) * 0.3);
      } else {
        const float fa = static_cast<float>(a.at(i)), fb = static_cast<float>(b.at(i));
        EXPECT_EQ(sum.at(i), round_to(dt, fa + fb)) << dtype_name(dt) << " " << i;
        EXPECT_EQ(scaled.at(i), round_to(dt, fa * 0.3f)) << dtype_name(dt) << " " << i;
      }
      EXPECT_EQ(acc.at(i), sum.at(i));
    }
  }
}

TEST(Elementwise, AccumulateIntoF32FromF16) {
  // A main_grad-style accumulation: the narrow value widens exactly, the sum is f32.
  auto backend = make_cpu_backend();
  Tensor into = random_f64({5}, "into").to(DType::kF32);
  const Tensor x = random_f64({5}, "x").to(DType::kF16);
  const Tensor before = into.clone();
  backend->accumulate(into, x);
  for (std::int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(into.at(i), static_cast<float>(before.at(i)) + static_cast<float>(x.at(i)));
  }
}

TEST(Elementwise, ShapeMismatchGivesClearErrors) {
  auto backend = make_cpu_backend();
  Tensor a = Tensor::zeros({2, 3}, DType::kF32);
  const Tensor b = Tensor::zeros({3, 2}, DType::kF32);
  auto check = [](auto f, std::string_view op) {
    try {
      f();
      ADD_FAILURE() << op << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      const std::string what = e.what();
      EXPECT_NE(what.find(op), std::string::npos) << what;
      EXPECT_NE(what.find("f32[2, 3]"), std::string::npos) << what;
      EXPECT_NE(what.find("f32[3, 2]"), std::string::npos) << what;
    }
  };
  check([&] { backend->add(a, b); }, "add");
  check([&] { backend->accumulate(a, b); }, "accumulate");
  check([&] { backend->mse_loss(a, b); }, "mse_loss");
  check([&] { backend->mse_loss_backward(a, b); }, "mse_loss_backward");
}

}  // namespace
}  // namespace tpcheck

// bias_test.cpp — bias add and bias gradient on the CPU backend: the gradient against
// central finite differences in f64, accumulation, storage rounding, and bad shapes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/finite_diff.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using testing::random_f64;

TEST(Bias, GradientMatchesFiniteDifferencesAndAccumulates) {
  auto backend = make_cpu_backend();
  for (const Shape& shape : {Shape{5, 3}, Shape{2, 4, 6}, Shape{1, 9}}) {
    const std::int64_t n = shape.back();
    const Tensor x = random_f64(shape, "x"), w = random_f64(shape, "w");
    Tensor bias = random_f64({n}, "bias");
    auto loss = [&] {
      Tensor y = x.clone();
      backend->add_bias(y, bias);
      return testing::weighted_sum(y, w);
    };
    Tensor dbias = random_f64({n}, "dbias0");  // accumulates onto what is there
    const std::vector<double> before = dbias.to_f64();
    backend->accumulate_bias_grad(w, dbias);
    std::vector<double> grad = dbias.to_f64();
    for (std::int64_t j = 0; j < n; ++j) grad[j] -= before[j];
    // loss is linear in bias: central differences are exact up to cancellation (measured ≤ 6e-10).
    EXPECT_LT(testing::checked_gradient_error(grad, testing::numeric_gradient(loss, bias)), 1e-7)
        << shape_str(shape);
  }
}

TEST(Bias, AddBiasRoundsOnceToStorage) {
  auto backend = make_cpu_backend();
  const Tensor x = random_f64({4, 5}, "x").to(DType::kF16);
  const Tensor bias = random_f64({5}, "b").to(DType::kF16);
  Tensor y = x.clone();
  backend->add_bias(y, bias);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const float sum = static_cast<float>(x.at(i)) + static_cast<float>(bias.at(i % 5));
    EXPECT_EQ(y.at(i), round_to(DType::kF16, sum)) << i;
  }
}

TEST(Bias, GradientIntoNarrowDtypeIsRoundedOnce) {
  auto backend = make_cpu_backend();
  const Tensor dy = random_f64({7, 3}, "dy").to(DType::kF32);
  Tensor dbias = random_f64({3}, "db").to(DType::kBF16);
  const Tensor before = dbias.clone();
  backend->accumulate_bias_grad(dy, dbias);
  for (std::int64_t j = 0; j < 3; ++j) {
    float sum = 0;  // the f32 column sum, in row order
    for (std::int64_t r = 0; r < 7; ++r) sum += static_cast<float>(dy.at(r * 3 + j));
    EXPECT_EQ(dbias.at(j), round_to(DType::kBF16, static_cast<float>(before.at(j)) + sum)) << j;
  }
}

TEST(Bias, BadShapesGiveClearErrors) {
  auto backend = make_cpu_backend();
  Tensor y = Tensor::zeros({4, 5}, DType::kF32);
  Tensor bias = Tensor::zeros({6}, DType::kF32);
  for (int op = 0; op < 2; ++op) {
    try {
      if (op == 0)
        backend->add_bias(y, bias);
      else
        backend->accumulate_bias_grad(y, bias);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      const std::string what = e.what();
      EXPECT_NE(what.find("f32[6]"), std::string::npos) << what;
      EXPECT_NE(what.find("[5]"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace tpcheck

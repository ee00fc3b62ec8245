// activation_test.cpp — CpuBackend activations (gelu, relu, srelu, qgelu, geglu, swiglu):
// forward against independently written f64 formulas, backward against central finite
// differences in f64, storage-dtype rounding for f32/f16/bf16, and bad gated shapes.
#include <gtest/gtest.h>

#include <algorithm>
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

const std::vector<Activation> kAll = {Activation::kGelu,  Activation::kRelu,  Activation::kSrelu,
                                      Activation::kQgelu, Activation::kGeglu, Activation::kSwiglu};

// The textbook definitions, written without sharing code with the backend.
double ref_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * std::pow(x, 3))));
}
double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

// Reference output of `act` for x of shape [rows, cols] (cols = 2n for gated).
std::vector<double> reference(Activation act, const std::vector<double>& x, std::int64_t cols) {
  std::vector<double> y;
  if (is_gated(act)) {
    const std::int64_t n = cols / 2;
    for (std::size_t r = 0; r < x.size() / cols; ++r) {
      for (std::int64_t j = 0; j < n; ++j) {
        const double a = x[r * cols + j], b = x[r * cols + n + j];
        y.push_back((act == Activation::kGeglu ? ref_gelu(a) : ref_silu(a)) * b);
      }
    }
    return y;
  }
  for (double v : x) {
    switch (act) {
      case Activation::kGelu:
        y.push_back(ref_gelu(v));
        break;
      case Activation::kRelu:
        y.push_back(std::max(v, 0.0));
        break;
      case Activation::kSrelu:
        y.push_back(std::pow(std::max(v, 0.0), 2));
        break;
      case Activation::kQgelu:
        y.push_back(v / (1.0 + std::exp(-1.702 * v)));
        break;
      default:
        ADD_FAILURE();
    }
  }
  return y;
}

// Inputs [rows, cols] with std 2 so the saturating tails of gelu/sigmoid are exercised.
constexpr std::int64_t kRows = 6;
std::int64_t cols_for(Activation act) { return is_gated(act) ? 16 : 8; }

Shape out_shape(Activation act) {
  return {kRows, is_gated(act) ? cols_for(act) / 2 : cols_for(act)};
}

TEST(Activation, ForwardF64MatchesReference) {
  auto be = make_cpu_backend();
  for (Activation act : kAll) {
    SCOPED_TRACE(std::string(activation_name(act)));
    const Tensor x = random_f64({kRows, cols_for(act)}, "x", 2.0);
    const Tensor y = be->activation_forward(act, x);
    ASSERT_EQ(y.dtype(), DType::kF64);
    ASSERT_EQ(y.shape(), out_shape(act));
    // Same formulas up to algebraically equal rewrites (a stable sigmoid vs 1/(1+e^-x)):
    // measured ≤ 1.3e-16 norm-wise; 1e-14 leaves room and still catches any wrong term
    // (gelu's erf form instead of tanh differs by ~1e-4).
    EXPECT_LE(relative_error(y.to_f64(), reference(act, x.to_f64(), cols_for(act))), 1e-14);
  }
}

TEST(Activation, ForwardF32IsF32Math) {
  auto be = make_cpu_backend();
  for (Activation act : kAll) {
    SCOPED_TRACE(std::string(activation_name(act)));
    const Tensor x = random_f64({kRows, cols_for(act)}, "x", 2.0).to(DType::kF32);
    const Tensor y = be->activation_forward(act, x);
    ASSERT_EQ(y.dtype(), DType::kF32);
    const std::vector<double> ref = reference(act, x.to_f64(), cols_for(act));
    // f32 math, one f32 rounding: measured ≤ 4.2e-8 norm-wise (u = 6e-8); 1e-6 allows for
    // other inputs while a wrong formula (gelu erf vs tanh: ~1e-4) still fails.
    EXPECT_LE(relative_error(y.to_f64(), ref), 1e-6);
    // And it really is rounded to f32: the error is not zero (except relu, which is exact).
    if (act != Activation::kRelu) {
      EXPECT_GT(relative_error(y.to_f64(), ref), 0.0);
    }
  }
}

// f16/bf16 in, same dtype out; each value is the f32 result rounded once, so it is within
// the dtype's unit roundoff of the f64 reference plus the f32 math error.
TEST(Activation, LowPrecisionOutputIsRoundedToStorageDtype) {
  auto be = make_cpu_backend();
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (Activation act : kAll) {
      SCOPED_TRACE(std::string(activation_name(act)) + " " + std::string(dtype_name(dtype)));
      const Tensor x = random_f64({kRows, cols_for(act)}, "x", 2.0).to(dtype);
      const Tensor y = be->activation_forward(act, x);
      ASSERT_EQ(y.dtype(), dtype);
      ASSERT_EQ(y.shape(), out_shape(act));
      const std::vector<double> ref = reference(act, x.to_f64(), cols_for(act));
      const double u = dtype_unit_roundoff(dtype);
      for (std::int64_t i = 0; i < y.numel(); ++i) {
        const double yi = y.at(i);
        ASSERT_EQ(round_to(dtype, yi), yi) << "not representable at " << i;
        // u·|ref| for the final rounding; 1e-6 absolute covers the f32 math error (values
        // are O(10) at most; f32 relative error ≤ 4.2e-8 measured above) and f16 subnormal
        // spacing (6e-8).
        EXPECT_LE(std::abs(yi - ref[i]), u * std::abs(ref[i]) + 1e-6) << "at " << i;
      }
      const Tensor dx = be->activation_backward(act, y, x);
      EXPECT_EQ(dx.dtype(), dtype);
      EXPECT_EQ(dx.shape(), x.shape());
    }
  }
}

TEST(Activation, BackwardMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  for (Activation act : kAll) {
    SCOPED_TRACE(std::string(activation_name(act)));
    Tensor x = random_f64({kRows, cols_for(act)}, "x", 2.0);
    const Tensor w = random_f64(out_shape(act), "w", 1.0, 99);
    auto loss = [&] { return weighted_sum(be->activation_forward(act, x), w); };
    const Tensor dx = be->activation_backward(act, w, x);
    ASSERT_EQ(dx.dtype(), DType::kF64);
    ASSERT_EQ(dx.shape(), x.shape());
    const std::vector<double> numeric = numeric_gradient(loss, x);
    // Central differences with h = 1e-6: truncation O(h²) and roundoff O(1e-16/h); measured
    // ≤ 3.7e-10, the bound is 1e-7.
    EXPECT_LE(checked_gradient_error(dx.to_f64(), numeric), 1e-7);
  }
}

// A gated activation's gradient must land in the right half: zero dy on the output
// except one element leaves every other a, b gradient exactly zero.
TEST(Activation, GatedBackwardTouchesOnlyItsPair) {
  auto be = make_cpu_backend();
  for (Activation act : {Activation::kGeglu, Activation::kSwiglu}) {
    const Tensor x = random_f64({2, 6}, "x");
    Tensor dy = Tensor::zeros({2, 3}, DType::kF64);
    dy.set(1 * 3 + 2, 1.0);  // row 1, output 2 → a at column 2, b at column 5 of row 1
    const Tensor dx = be->activation_backward(act, dy, x);
    for (std::int64_t i = 0; i < dx.numel(); ++i) {
      const bool pair = i == 6 + 2 || i == 6 + 5;
      EXPECT_EQ(dx.at(i) != 0.0, pair) << activation_name(act) << " at " << i;
    }
  }
}

TEST(Activation, OddGatedDimensionIsAnInputError) {
  auto be = make_cpu_backend();
  const Tensor x = random_f64({3, 5}, "x");
  for (Activation act : {Activation::kGeglu, Activation::kSwiglu}) {
    try {
      be->activation_forward(act, x);
      ADD_FAILURE() << "no error for odd gated dim";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find("[3, 5]"), std::string::npos) << e.what();
    }
    EXPECT_THROW(be->activation_backward(act, random_f64({3, 2}, "dy"), x), Error);
  }
  // Non-gated activations accept any last dim.
  EXPECT_NO_THROW(be->activation_forward(Activation::kGelu, x));
}

TEST(Activation, BackwardRejectsWrongDyShape) {
  auto be = make_cpu_backend();
  const Tensor x = random_f64({3, 4}, "x");
  try {
    be->activation_backward(Activation::kSwiglu, random_f64({3, 4}, "dy"), x);
    ADD_FAILURE() << "no error for dy of the input's shape on a gated activation";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(be->activation_backward(Activation::kRelu, random_f64({4, 3}, "dy"), x), Error);
}

}  // namespace
}  // namespace tpcheck

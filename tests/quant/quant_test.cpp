// quant_test — the recipes' API contracts: names, formats and blocks per role, shape
// rejections, the delayed-scaling window, and dequantization error within the format's
// bound. Bit-exactness against an independent implementation is in
// tests/python/test_quant_conformance.py.
#include "tpcheck/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tpcheck/error.h"
#include "tpcheck/rng.h"

namespace tpcheck {
namespace {

template <typename F>
void expect_input_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
  }
}

constexpr Recipe kRecipes[] = {Recipe::kFp8Delayed, Recipe::kFp8Current, Recipe::kFp8Block,
                               Recipe::kMxfp8, Recipe::kNvfp4};

TEST(Recipe, NamesRoundTripAndUnknownIsRejected) {
  for (Recipe r : kRecipes) EXPECT_EQ(parse_recipe(recipe_name(r)), r);
  EXPECT_EQ(parse_recipe("none"), Recipe::kNone);
  expect_input_error([] { parse_recipe("fp4"); }, {"'fp4'", "fp8_block_scaling"});
}

TEST(Recipe, FormatsAndBlocksFollowTheRole) {
  EXPECT_EQ(quant_data_dtype(Recipe::kFp8Current, QuantRole::kInput), DType::kF8E4M3);
  EXPECT_EQ(quant_data_dtype(Recipe::kFp8Delayed, QuantRole::kGradOutput), DType::kF8E5M2);
  EXPECT_EQ(quant_data_dtype(Recipe::kFp8Block, QuantRole::kGradOutput), DType::kF8E4M3);
  EXPECT_EQ(quant_data_dtype(Recipe::kNvfp4, QuantRole::kWeight), DType::kF4E2M1);
  EXPECT_EQ(quant_block(Recipe::kFp8Block, QuantRole::kWeight), (Shape{128, 128}));
  EXPECT_EQ(quant_block(Recipe::kFp8Block, QuantRole::kInput), (Shape{1, 128}));
  EXPECT_EQ(quant_math_class(Recipe::kMxfp8), MathClass::kMxfp8);
}

Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(std::ldexp(rng_normal(seed, "x", i), static_cast<int>(i % 7) - 3));
  }
  return Tensor::from_f32(v, {rows, cols}, DType::kF32);
}

// Every recipe's dequantized values lie within half a quantum of the format (relative u
// of the format times the block's scale) of the input, for both copies.
TEST(Quantize, DequantizedValuesAreWithinTheFormatsRounding) {
  const Tensor x = random_matrix(128, 256, 7);
  const std::vector<float> xv = x.to_f32();
  for (Recipe r : kRecipes) {
    QuantizeOptions o;
    o.recipe = r;
    o.scale = 0.5f;  // delayed scaling: a scale that does not saturate
    const auto q = quantize(x, o);
    for (bool columnwise : {false, true}) {
      const std::vector<float> d = dequantize(*q, columnwise).to_f32();
      const float amax = amax_of(x);
      // Half a quantum: E4M3 relative 2^-4 of the value plus its subnormal quantum (tiny
      // next to the amax); E2M1 at most half its largest step (1 of 4 → 6, so 1/4 of the
      // value) and, near zero, 0.25 of the block's decode scale amax/6 (with the E4M3
      // rounding of that scale, below 0.05 · amax).
      const bool fp4 = r == Recipe::kNvfp4;
      const double rel = fp4 ? 0.25 * (1 + 1.0 / 16) : 0.0625;
      const double abs = fp4 ? 0.05 * amax : 1e-3 * amax;
      for (std::size_t i = 0; i < d.size(); ++i) {
        ASSERT_LE(std::fabs(d[i] - xv[i]), rel * std::fabs(xv[i]) + abs)
            << recipe_name(r) << (columnwise ? " columnwise" : " rowwise") << " at " << i;
      }
    }
  }
}

TEST(Quantize, RejectsShapesNamingTheSizeAndTheMultiple) {
  QuantizeOptions o;
  o.recipe = Recipe::kMxfp8;
  expect_input_error(
      [&] {
        quantize(Tensor::zeros({64, 40}, DType::kF32), o, "fc1 input");
      },
      {"fc1 input", "[64, 40]", "40", "multiple of 32", "mxfp8"});
  o.recipe = Recipe::kFp8Current;
  expect_input_error(
      [&] {
        quantize(Tensor::zeros({8, 32}, DType::kF32), o);
      },
      {"8 rows", "multiple of 16"});
  o.usage.columnwise = false;  // rowwise only: rows are free for per-tensor FP8
  EXPECT_NO_THROW(quantize(Tensor::zeros({8, 32}, DType::kF32), o));
  expect_input_error([&] { quantize(Tensor::zeros({16, 32}, DType::kF64), o); }, {"f64"});
  o.recipe = Recipe::kNone;
  expect_input_error([&] { quantize(Tensor::zeros({16, 32}, DType::kF32), o); }, {"none"});
}

TEST(Quantize, ColumnwiseCopyIsStoredTransposed) {
  QuantizeOptions o;
  o.recipe = Recipe::kNvfp4;
  const auto q = quantize(random_matrix(32, 64, 3), o);
  EXPECT_EQ(q->rowwise_data.shape(), (Shape{32, 64}));
  EXPECT_EQ(q->columnwise_data.shape(), (Shape{64, 32}));
  EXPECT_EQ(q->rowwise_scale_inv.shape(), (Shape{32, 4}));
  EXPECT_EQ(q->columnwise_scale_inv.shape(), (Shape{64, 2}));
  EXPECT_EQ(q->rowwise_scale_inv.dtype(), DType::kF8E4M3);
}

TEST(DelayedScaling, ScaleComesFromThePreviousStepsWindow) {
  DelayedScaling ds(DType::kF8E4M3, /*history_length=*/3);
  EXPECT_EQ(ds.scale(), 1.0f);
  ds.record(4.0f);
  EXPECT_EQ(ds.scale(), 1.0f);  // not before update()
  ds.update();
  EXPECT_EQ(ds.scale(), 112.0f);  // 448 / 4
  for (float a : {1.0f, 1.0f}) {
    ds.record(a);
    ds.update();
    EXPECT_EQ(ds.scale(), 112.0f);  // 4 still in the window
  }
  ds.record(2.0f);
  ds.update();
  EXPECT_EQ(ds.scale(), 224.0f);  // 4 left the window of 3
  ds.record(0.0f);
  ds.update();
  EXPECT_EQ(ds.scale(), 224.0f);  // the window's max is still 2
  expect_input_error([] { DelayedScaling(DType::kBF16); }, {"bf16"});
}

}  // namespace
}  // namespace tpcheck

// gemm_quantized_test — Backend::gemm_quantized's contract: the copy each operand reads,
// the ledger record (class, formats, alpha), and clear errors. The numbers themselves are
// checked against numpy in tests/python/test_quant_conformance.py.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

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

Tensor quantized(Shape shape, Recipe recipe, QuantRole role, double fill, QuantUsage usage = {}) {
  Tensor t = Tensor::full(std::move(shape), DType::kF32, fill);
  QuantizeOptions o;
  o.recipe = recipe;
  o.role = role;
  o.usage = usage;
  t.set_quantized(quantize(t, o));
  return t;
}

TEST(GemmQuantized, FpropDgradWgradAreRecordedWithTheRecipesClass) {
  auto backend = make_cpu_backend();
  const Tensor x = quantized({32, 64}, Recipe::kFp8Current, QuantRole::kInput, 3.5);
  const Tensor w = quantized({48, 64}, Recipe::kFp8Current, QuantRole::kWeight, 0.875);
  const Tensor dy = quantized({32, 48}, Recipe::kFp8Current, QuantRole::kGradOutput, 7.0);
  Tensor y({32, 48}, DType::kF32), dx({32, 64}, DType::kF32), dw({48, 64}, DType::kF32);
  backend->gemm_quantized("fc/fwd", x, false, w, true, y, false);
  backend->gemm_quantized("fc/dgrad", dy, false, w, false, dx, false);
  backend->gemm_quantized("fc/wgrad", dy, true, x, false, dw, false);
  // Constant tensors whose scales fmax / amax are powers of two (448 / 3.5 = 128,
  // 448 / 0.875 = 512, 57344 / 7 = 8192): every step is exact.
  EXPECT_EQ(y.at(0), 64 * 3.5 * 0.875);
  EXPECT_EQ(dx.at(0), 48 * 7.0 * 0.875);
  EXPECT_EQ(dw.at(0), 32 * 7.0 * 3.5);
  const auto& r = backend->ledger().records();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].math_class, MathClass::kFp8);
  EXPECT_EQ(r[0].a_dtype, DType::kF8E4M3);
  EXPECT_EQ(r[1].a_dtype, DType::kF8E5M2);  // HYBRID: the gradient in E5M2
  EXPECT_EQ(r[2].k, 32);
  EXPECT_EQ(math_class_name(r[0].math_class), "fp8");
  EXPECT_NE(r[0].implementation.find("f32 accumulation"), std::string::npos);
}

TEST(GemmQuantized, MissingCopiesMixedRecipesAndPlainOperandsAreInputErrors) {
  auto backend = make_cpu_backend();
  const Tensor x_row = quantized({32, 64}, Recipe::kMxfp8, QuantRole::kInput, 1.0, {true, false});
  const Tensor w = quantized({32, 64}, Recipe::kMxfp8, QuantRole::kWeight, 1.0);
  const Tensor w_nv = quantized({32, 64}, Recipe::kNvfp4, QuantRole::kWeight, 1.0);
  Tensor c({64, 64}, DType::kF32), y({32, 32}, DType::kF32);
  // wgrad-like use of x needs its columnwise copy, which was not made.
  expect_input_error([&] { backend->gemm_quantized("t/wgrad", x_row, true, w, false, c, false); },
                     {"t/wgrad", "operand A", "columnwise"});
  expect_input_error([&] { backend->gemm_quantized("t/fwd", x_row, false, w_nv, true, y, false); },
                     {"different recipes", "mxfp8", "nvfp4"});
  const Tensor plain = Tensor::zeros({32, 64}, DType::kF32);
  expect_input_error([&] { backend->gemm_quantized("t/fwd", plain, false, w, true, y, false); },
                     {"carries no quantized data"});
  // Quantized data in the plain GEMM: pointed to gemm_quantized.
  expect_input_error(
      [&] { backend->gemm("t/fwd", x_row.quantized()->rowwise_data, false, w, true, y, false); },
      {"gemm_quantized"});
  EXPECT_TRUE(backend->ledger().records().empty());
}

}  // namespace
}  // namespace tpcheck

// quantize.cpp — the recipes' common front: names, formats and block shapes per recipe and
// role, the shape checks, the dispatch to one file per recipe, and reading quantized
// copies back (the values a GEMM multiplies, and the dequantized tensor).
// Thread safety: pure functions.
#include <array>
#include <cmath>
#include <string>

#include "quant/recipes.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

constexpr std::array<std::string_view, 6> kRecipeNames = {
    "none", "fp8", "fp8_cs", "fp8_block_scaling", "mxfp8", "nvfp4"};
constexpr std::array<std::string_view, 3> kRoleNames = {"input", "weight", "grad_output"};

using quant_detail::Matrix;

}  // namespace

std::string_view recipe_name(Recipe recipe) { return kRecipeNames[static_cast<int>(recipe)]; }

Recipe parse_recipe(std::string_view name) {
  for (std::size_t i = 0; i < kRecipeNames.size(); ++i) {
    if (kRecipeNames[i] == name) return static_cast<Recipe>(i);
  }
  TPCHECK_CHECK_INPUT(false,
                      "unknown recipe '{}'; expected one of none, fp8, fp8_cs, fp8_block_scaling, "
                      "mxfp8, nvfp4",
                      name);
  return Recipe::kNone;
}

std::string_view quant_role_name(QuantRole role) { return kRoleNames[static_cast<int>(role)]; }

DType quant_data_dtype(Recipe recipe, QuantRole role) {
  switch (recipe) {
    case Recipe::kFp8Delayed:
    case Recipe::kFp8Current:
      // HYBRID: forward tensors E4M3, gradients E5M2.
      return role == QuantRole::kGradOutput ? DType::kF8E5M2 : DType::kF8E4M3;
    case Recipe::kFp8Block:
    case Recipe::kMxfp8:
      return DType::kF8E4M3;
    case Recipe::kNvfp4:
      return DType::kF4E2M1;
    case Recipe::kNone:
      break;
  }
  TPCHECK_CHECK_INPUT(false, "recipe 'none' quantizes nothing");
  return DType::kF32;
}

Shape quant_block(Recipe recipe, QuantRole role) {
  switch (recipe) {
    case Recipe::kFp8Delayed:
    case Recipe::kFp8Current:
      return {};
    case Recipe::kFp8Block:
      return role == QuantRole::kWeight ? Shape{128, 128} : Shape{1, 128};
    case Recipe::kMxfp8:
      return {1, 32};
    case Recipe::kNvfp4:
      return {1, 16};
    case Recipe::kNone:
      break;
  }
  TPCHECK_CHECK_INPUT(false, "recipe 'none' quantizes nothing");
  return {};
}

MathClass quant_math_class(Recipe recipe) {
  switch (recipe) {
    case Recipe::kFp8Delayed:
    case Recipe::kFp8Current:
      return MathClass::kFp8;
    case Recipe::kFp8Block:
      return MathClass::kFp8Block;
    case Recipe::kMxfp8:
      return MathClass::kMxfp8;
    case Recipe::kNvfp4:
      return MathClass::kNvfp4;
    case Recipe::kNone:
      break;
  }
  TPCHECK_CHECK_INPUT(false, "recipe 'none' has no quantized GEMM class");
  return MathClass::kFp32;
}

RecipeTolerance reference_recipe_tolerance(Recipe recipe) {
  switch (recipe) {
    case Recipe::kFp8Delayed:
    case Recipe::kFp8Block:
    case Recipe::kMxfp8:
      return {0.125, 0.0625};
    case Recipe::kNvfp4:
      return {0.125, 0.12};
    case Recipe::kFp8Current:
      return {0.4, 0.25};
    case Recipe::kNone:
      break;
  }
  TPCHECK_CHECK_INPUT(false, "recipe 'none' has no reference tolerance of its own");
  return {};
}

void check_quantizable(std::string_view what, const Shape& shape, Recipe recipe, QuantRole role,
                       QuantUsage usage) {
  TPCHECK_CHECK_INPUT(recipe != Recipe::kNone, "{}: recipe 'none' quantizes nothing", what);
  TPCHECK_CHECK_INPUT(!shape.empty(),
                      "{}: a scalar cannot be quantized by recipe {}; expected a "
                      "tensor of rank >= 1",
                      what, recipe_name(recipe));
  const std::int64_t cols = shape.back();
  const std::int64_t rows = cols == 0 ? 0 : shape_numel(shape) / cols;
  const Shape block = quant_block(recipe, role);
  // The per-tensor FP8 GEMMs on Hopper need leading dimensions that are multiples of 16.
  const std::int64_t col_multiple = block.empty() ? 16 : block[1];
  const std::int64_t row_multiple = block.empty() ? 16 : (usage.columnwise ? block[1] : block[0]);
  const std::string_view why = block.empty() ? " (FP8 GEMMs need leading dimensions that are "
                                               "multiples of 16)"
                                             : " (the recipe's block)";
  TPCHECK_CHECK_INPUT(cols % col_multiple == 0,
                      "{} {}: recipe {} quantizes the last dimension {}, which is not a multiple "
                      "of {}{}",
                      what, shape_str(shape), recipe_name(recipe), cols, col_multiple, why);
  // Rows matter for the transposed copy (its leading dimension) and for 2-D blocks.
  if (usage.columnwise || (!block.empty() && block[0] > 1)) {
    TPCHECK_CHECK_INPUT(rows % row_multiple == 0,
                        "{} {}: recipe {} quantizes the {} rows (the product of the leading "
                        "dimensions){}, which is not a multiple of {}{}",
                        what, shape_str(shape), recipe_name(recipe), rows,
                        usage.columnwise ? " for the columnwise copy" : "", row_multiple, why);
  }
}

std::shared_ptr<QuantizedData> quantize(const Tensor& x, const QuantizeOptions& options,
                                        std::string_view what) {
  TPCHECK_CHECK_INPUT(x.defined(), "{}: cannot quantize an undefined tensor", what);
  const DType dt = x.dtype();
  TPCHECK_CHECK_INPUT(dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16,
                      "{} {}: recipes quantize f32, f16 or bf16 tensors, got {}", what,
                      x.describe(), dtype_name(dt));
  TPCHECK_CHECK_INPUT(options.usage.rowwise || options.usage.columnwise,
                      "{}: quantization asked for neither a rowwise nor a columnwise copy", what);
  check_quantizable(what, x.shape(), options.recipe, options.role, options.usage);

  Matrix m;
  m.v = x.to_f32();  // exact for f16 / bf16
  m.cols = x.rank() == 0 ? 1 : x.dim(-1);
  m.rows = m.cols == 0 ? 0 : x.numel() / m.cols;

  auto q = std::make_shared<QuantizedData>();
  q->recipe = std::string(recipe_name(options.recipe));
  q->format = quant_data_dtype(options.recipe, options.role);
  q->rows = m.rows;
  q->cols = m.cols;
  const float own_amax = amax_of(x);
  const float amax = options.amax.value_or(own_amax);
  q->amax = quant_detail::scalar_tensor(own_amax);
  q->global_amax = quant_detail::scalar_tensor(amax);
  switch (options.recipe) {
    case Recipe::kFp8Delayed:
      quant_detail::quantize_fp8_per_tensor(m, q->format, options.scale, options.usage, *q);
      break;
    case Recipe::kFp8Current:
      quant_detail::quantize_fp8_per_tensor(m, q->format, fp8_current_scale(amax, q->format),
                                            options.usage, *q);
      break;
    case Recipe::kFp8Block:
      quant_detail::quantize_fp8_block(m, options.role, options.usage, *q);
      break;
    case Recipe::kMxfp8:
      quant_detail::quantize_mxfp8(m, options.usage, *q);
      break;
    case Recipe::kNvfp4:
      quant_detail::quantize_nvfp4(m, nvfp4_global_encode_scale(amax), options.usage, *q);
      break;
    case Recipe::kNone:
      break;
  }
  return q;
}

QuantizedValues quantized_values(const QuantizedData& q, bool columnwise) {
  const Tensor& copy = columnwise ? q.columnwise_data : q.rowwise_data;
  TPCHECK_CHECK_INPUT(copy.defined(), "quantized {} tensor [{}, {}] has no {} copy", q.recipe,
                      q.rows, q.cols, columnwise ? "columnwise" : "rowwise");
  // A GPU-quantized copy is read on the host (an explicit copy; the CUDA backend's GEMMs
  // decode on the device instead).
  const Tensor data = copy.to_host();
  const Tensor scale_inv = (columnwise ? q.columnwise_scale_inv : q.rowwise_scale_inv).to_host();
  const std::int64_t rows = data.dim(0), cols = data.dim(1);
  QuantizedValues out;
  out.values = Tensor({rows, cols}, DType::kF32);
  float* v = out.values.data<float>();
  const std::uint8_t* d = data.data<std::uint8_t>();
  if (q.block.empty()) {  // per tensor: the scale_inv is the GEMM's factor
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      v[i] = q.format == DType::kF8E4M3 ? f8e4m3_bits_to_f32(d[i]) : f8e5m2_bits_to_f32(d[i]);
    }
    out.tensor_factor = scale_inv.at(0);
    return out;
  }
  const std::int64_t br = q.block[0], bc = q.block[1];
  const std::int64_t scale_cols = cols / bc;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const float s = static_cast<float>(scale_inv.at((r / br) * scale_cols + c / bc));
      const std::uint8_t bits = d[r * cols + c];
      const float x =
          q.format == DType::kF4E2M1 ? f4e2m1_bits_to_f32(bits) : f8e4m3_bits_to_f32(bits);
      // Exact: a power-of-two scale, or (NVFP4) a 2-bit by 4-bit significand product.
      v[r * cols + c] = x * s;
    }
  }
  return out;
}

Tensor dequantize(const QuantizedData& q, bool columnwise) {
  QuantizedValues qv = quantized_values(q, columnwise);
  float factor = qv.tensor_factor;
  if (q.format == DType::kF4E2M1) factor = 1.0f / static_cast<float>(q.scale.at(0));
  float* v = qv.values.data<float>();
  for (std::int64_t i = 0; i < qv.values.numel(); ++i) v[i] = v[i] * factor;
  if (!columnwise) return qv.values;
  Matrix t;
  t.v = qv.values.to_f32();
  t.rows = q.cols;
  t.cols = q.rows;
  Matrix back = t.transposed();
  return Tensor::from_f32(back.v, {q.rows, q.cols}, DType::kF32);
}

namespace quant_detail {

Matrix Matrix::transposed() const {
  Matrix t;
  t.rows = cols;
  t.cols = rows;
  t.v.resize(v.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) t.v[c * rows + r] = v[r * cols + c];
  }
  return t;
}

float block_amax(const Matrix& m, std::int64_t r0, std::int64_t c0, std::int64_t br,
                 std::int64_t bc) {
  float a = 0.0f;
  for (std::int64_t r = r0; r < r0 + br; ++r) {
    for (std::int64_t c = c0; c < c0 + bc; ++c) {
      const float x = m.at(r, c);
      if (std::isnan(x)) return x;
      a = std::max(a, std::fabs(x));
    }
  }
  return a;
}

Tensor scalar_tensor(float v) {
  return Tensor::from_f32(std::span<const float>(&v, 1), {1}, DType::kF32);
}

}  // namespace quant_detail
}  // namespace tpcheck

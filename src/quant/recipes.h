// recipes.h — what quantize.cpp (dispatch, checks) and the per-recipe files share: a
// high-precision matrix in f32 and the block loop every block-scaled recipe runs.
// Private to src/quant. Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tpcheck/quant.h"

namespace tpcheck::quant_detail {

// A row-major [rows, cols] matrix of f32 values.
struct Matrix {
  std::vector<float> v;
  std::int64_t rows = 0, cols = 0;
  float at(std::int64_t r, std::int64_t c) const {
    return v[static_cast<std::size_t>(r * cols + c)];
  }
  Matrix transposed() const;
};

// max |x| over [r0, r0 + br) x [c0, c0 + bc); NaN when one of them is NaN.
float block_amax(const Matrix& m, std::int64_t r0, std::int64_t c0, std::int64_t br,
                 std::int64_t bc);

// Quantizes m in blocks of br x bc into `data` ([rows, cols], `format` bits): for block
// (i, j) — index i · (cols / bc) + j — `factor_of(amax, index)` returns the factor the
// block's values are multiplied by (and stores the block's scale_inv itself); each value
// becomes cast_satfinite(format, x · factor), the product rounded to f32 first.
// REQUIRES: br divides rows, bc divides cols.
template <typename FactorOf>
Tensor quantize_blocks(const Matrix& m, std::int64_t br, std::int64_t bc, DType format,
                       FactorOf factor_of) {
  Tensor data({m.rows, m.cols}, format);
  std::uint8_t* q = data.data<std::uint8_t>();
  const std::int64_t blocks_per_row = m.cols / bc;
  for (std::int64_t i = 0; i < m.rows / br; ++i) {
    for (std::int64_t j = 0; j < blocks_per_row; ++j) {
      const float factor = factor_of(block_amax(m, i * br, j * bc, br, bc), i * blocks_per_row + j);
      for (std::int64_t r = i * br; r < (i + 1) * br; ++r) {
        for (std::int64_t c = j * bc; c < (j + 1) * bc; ++c) {
          q[r * m.cols + c] = cast_satfinite(format, m.at(r, c) * factor);
        }
      }
    }
  }
  return data;
}

// The recipes. Each fills data and scale_inv of the copies `usage` asks for (the
// columnwise copy is the quantized transpose) and sets `block`.
void quantize_fp8_per_tensor(const Matrix& m, DType format, float scale, QuantUsage usage,
                             QuantizedData& out);
void quantize_fp8_block(const Matrix& m, QuantRole role, QuantUsage usage, QuantizedData& out);
void quantize_mxfp8(const Matrix& m, QuantUsage usage, QuantizedData& out);
void quantize_nvfp4(const Matrix& m, float s_enc, QuantUsage usage, QuantizedData& out);

// A [1] f32 tensor holding v.
Tensor scalar_tensor(float v);

}  // namespace tpcheck::quant_detail

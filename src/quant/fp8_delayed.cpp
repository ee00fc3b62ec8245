// fp8_delayed.cpp — FP8 delayed scaling: one tensor's amax history and the scale it gives
// the next step (TE's DelayedScaling recipe: history 32, "max", margin 0), and the
// receiving side of its FP8 all-gather. The cast itself is the per-tensor one
// (fp8_current.cpp) with this scale.
// Thread safety: a DelayedScaling object belongs to one rank.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "quant/recipes.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {

DelayedScaling::DelayedScaling(DType format, int history_length, int margin)
    : format_(format), history_length_(history_length), margin_(margin) {
  TPCHECK_CHECK_INPUT(is_fp8(format), "delayed scaling: format {}; expected f8e4m3 or f8e5m2",
                      dtype_name(format));
  TPCHECK_CHECK_INPUT(history_length >= 1, "delayed scaling: amax history length {}; expected >= 1",
                      history_length);
}

void DelayedScaling::record(float amax) {
  // A tensor quantized twice in one step (TE writes its amax into the same history slot):
  // keep the larger.
  pending_ = pending_ ? std::max(*pending_, amax) : amax;
}

void DelayedScaling::update() {
  if (pending_) {
    history_.push_front(*pending_);
    pending_.reset();
  }
  while (static_cast<int>(history_.size()) > history_length_) history_.pop_back();
  float amax = 0.0f;
  bool finite = true;
  for (float a : history_) {
    finite = finite && std::isfinite(a);
    amax = std::max(amax, a);
  }
  // TE (_default_sf_compute): a zero or non-finite amax keeps the previous scale.
  if (!finite || !(amax > 0.0f)) return;
  const float fmax = static_cast<float>(dtype_max_finite(format_));
  float scale = fmax / amax;
  scale = scale * std::ldexp(1.0f, -margin_);  // exact (a power of two) unless it underflows
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  scale_ = scale;
}

std::shared_ptr<QuantizedData> fp8_gathered(const Tensor& rowwise, float scale, float amax) {
  TPCHECK_CHECK_INPUT(rowwise.defined() && rowwise.rank() == 2 && is_fp8(rowwise.dtype()),
                      "FP8 all-gather: gathered data {}; expected a [rows, cols] f8e4m3 or f8e5m2 "
                      "matrix",
                      rowwise.defined() ? rowwise.describe() : "undefined");
  auto q = std::make_shared<QuantizedData>();
  q->recipe = std::string(recipe_name(Recipe::kFp8Delayed));
  q->format = rowwise.dtype();
  q->rows = rowwise.dim(0);
  q->cols = rowwise.dim(1);
  q->block = {};
  q->rowwise_data = rowwise.to_host();
  // The transposed copy wgrad and dgrad read: the same bytes, [cols, rows].
  q->columnwise_data = Tensor({q->cols, q->rows}, q->format);
  const std::uint8_t* in = q->rowwise_data.data<std::uint8_t>();
  std::uint8_t* out = q->columnwise_data.data<std::uint8_t>();
  for (std::int64_t r = 0; r < q->rows; ++r) {
    for (std::int64_t c = 0; c < q->cols; ++c) out[c * q->rows + r] = in[r * q->cols + c];
  }
  q->scale = quant_detail::scalar_tensor(scale);
  q->rowwise_scale_inv = quant_detail::scalar_tensor(scale_reciprocal(scale));
  q->columnwise_scale_inv = quant_detail::scalar_tensor(scale_reciprocal(scale));
  q->amax = quant_detail::scalar_tensor(amax);
  q->global_amax = quant_detail::scalar_tensor(amax);
  // Data and scale_inv where the gathered bytes are (quant.h's placement rule).
  const Device device = rowwise.device();
  q->rowwise_data = q->rowwise_data.to_device(device);
  q->columnwise_data = q->columnwise_data.to_device(device);
  q->rowwise_scale_inv = q->rowwise_scale_inv.to_device(device);
  q->columnwise_scale_inv = q->columnwise_scale_inv.to_device(device);
  return q;
}

}  // namespace tpcheck

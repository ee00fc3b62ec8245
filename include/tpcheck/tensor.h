// tpcheck/tensor.h — an owning, row-major tensor of up to 4 dimensions.
//
// A Tensor is a shape, a storage dtype, a device and a shared buffer. Copying a Tensor
// shares the buffer (like a handle); `clone()` copies the data. Values are stored in
// the dtype's own encoding: double for f64, float for f32, the 16-bit pattern for
// f16/bf16, the 8-bit pattern for fp8. Writes through `from_f64`, `set`, `to` round to
// nearest even.
//
// Device-agnostic: a kCuda tensor's buffer is device memory from the CUDA runtime's
// caching allocator (src/core/device_runtime.h; registered when a CUDA backend is made).
// Every structural method (`to`, `clone`, `slice`, `write_slice`, `cat`, `reshape`,
// `fill_zero`, `copy_from`) works on either device, on the device (copies and cast
// kernels on the calling thread's stream), so layer code is the same for both. Host
// access to a device tensor (`at`, `set`, `to_f64`, `to_f32`) copies explicitly and
// waits for the stream; `data<T>()` is for CPU tensors only (kernels take `raw()`).
// Thread safety: distinct Tensors may be used from distinct threads; sharing one buffer
// between threads that write is the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/dtype.h"

namespace tpcheck {

using Shape = std::vector<std::int64_t>;

inline constexpr int kMaxRank = 4;

std::int64_t shape_numel(const Shape& shape);
// "[16, 64]"
std::string shape_str(const Shape& shape);

enum class Device { kCpu, kCuda };
std::string_view device_name(Device device);  // "CPU", "GPU"

// Quantized copies of a tensor, as the FP8 / MXFP8 / NVFP4 recipes keep them next to the
// high-precision values (TransformerEngine keeps the same metadata with its tensors).
// Filled by the quantization code; a plain tensor has none.
struct QuantizedData;

class Tensor {
 public:
  // An undefined tensor (no shape, no buffer); `defined()` is false.
  Tensor() = default;
  // A zero-filled tensor. REQUIRES: rank <= 4, every dim >= 0.
  Tensor(Shape shape, DType dtype, Device device = Device::kCpu);

  // A tensor for an output that a kernel writes in full: on a GPU its memory is left as
  // the allocator hands it out (no zero fill, which would write the whole buffer once
  // more; bench/RESULTS.md has what that cost), on the CPU zero-filled like the
  // constructor. Reading an element before it is written is a bug.
  static Tensor empty(Shape shape, DType dtype, Device device = Device::kCpu);
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::kCpu) {
    return Tensor(std::move(shape), dtype, device);
  }
  // Zeros of `like`'s shape, dtype and device.
  static Tensor zeros_like(const Tensor& like) { return zeros(like.shape(), like.dtype(), like.device()); }
  static Tensor full(Shape shape, DType dtype, double value);
  // Values rounded (nearest even) to `dtype`. REQUIRES: values.size() == numel(shape).
  static Tensor from_f64(std::span<const double> values, Shape shape, DType dtype);
  static Tensor from_f32(std::span<const float> values, Shape shape, DType dtype);
  // A tensor over memory someone else owns (a DLPack array from Python, zero-copy):
  // `data` holds numel(shape) elements of `dtype`, row-major and contiguous, on `device`;
  // `owner` keeps that memory alive for as long as any handle to the tensor exists.
  // REQUIRES: rank <= 4, every dim >= 0, data not null (also for 0 elements).
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device,
                     std::shared_ptr<void> owner);
  // Concatenation along `dim`; all other dims must agree, dtypes must agree.
  static Tensor cat(const std::vector<Tensor>& parts, int dim);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Size of dimension `i`; negative i counts from the end.
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }

  // The buffer: host memory for kCpu, device memory for kCuda.
  void* raw() { return storage_.get(); }
  const void* raw() const { return storage_.get(); }
  // Typed access to the storage. REQUIRES: T matches the storage type of dtype()
  // (double, float, std::uint16_t for f16/bf16, std::uint8_t for fp8) and a CPU tensor.
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;

  // A copy on `device` (this tensor itself, shared, when it is there already).
  Tensor to_device(Device device) const;
  Tensor to_host() const { return to_device(Device::kCpu); }

  // Element `flat` (row-major) as a double, any dtype. Slow path: tests and reports.
  double at(std::int64_t flat) const;
  // Stores `value` rounded to dtype().
  void set(std::int64_t flat, double value);

  // All values widened (exactly) to double / rounded to float.
  std::vector<double> to_f64() const;
  std::vector<float> to_f32() const;

  // Cast (nearest even, plain cast). Same dtype returns a clone.
  Tensor to(DType dtype, CastMode mode = CastMode::kPlain) const;
  Tensor clone() const;
  // Same buffer, new shape. REQUIRES: same numel.
  Tensor reshape(Shape shape) const;
  // A copy of [start, start + length) along `dim`.
  Tensor slice(int dim, std::int64_t start, std::int64_t length) const;
  // Writes `length` rows of `src` along `dim` at [start, start + length) of this tensor.
  void write_slice(int dim, std::int64_t start, const Tensor& src);

  void fill_zero();
  // Copies `src` (same shape) into this tensor's buffer, casting to dtype().
  void copy_from(const Tensor& src);

  // "f32[16, 64]" ("f32[16, 64] on GPU" for device tensors)
  std::string describe() const;

  // Quantized copies (undefined until a recipe quantizes this tensor). Shared by copies
  // of the handle, like the buffer.
  const std::shared_ptr<QuantizedData>& quantized() const { return quantized_; }
  void set_quantized(std::shared_ptr<QuantizedData> q) { quantized_ = std::move(q); }

 private:
  Tensor(Shape shape, DType dtype, Device device, bool zero_fill);
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::shared_ptr<std::byte> storage_;
  std::shared_ptr<QuantizedData> quantized_;
};

struct QuantizedData {
  // The recipe's name (quant.h recipe_name: "fp8", "fp8_cs", "fp8_block_scaling", "mxfp8",
  // "nvfp4") and the element format of the data (f8e4m3, f8e5m2 or f4e2m1).
  std::string recipe;
  DType format = DType::kF8E4M3;
  // The tensor viewed as a matrix [rows, cols] (cols = its last dimension).
  std::int64_t rows = 0, cols = 0;
  // Scale granularity of the rowwise copy in the [rows, cols] layout: {} per tensor,
  // {1, 128}, {128, 128}, {1, 32}, {1, 16}. The columnwise copy is stored transposed
  // ([cols, rows]) and quantized with the same block shape in its own layout, so 1 x B
  // blocks there are B x 1 blocks of the original (2-D blocks are the same blocks).
  Shape block;
  Tensor rowwise_data;             // [rows, cols] in `format` (undefined if not made)
  Tensor rowwise_scale_inv;        // per block: f32 [1] or [rows/b0, cols/b1]; f8e8m0 (MXFP8),
                                   // f8e4m3 (NVFP4 block decode scales)
  Tensor columnwise_data;          // [cols, rows]: the transpose, for the GEMMs that reduce
  Tensor columnwise_scale_inv;     // over rows (wgrad, dgrad); undefined if not made
  Tensor amax;                     // [1] f32: this tensor's own amax, before any reduction
  Tensor global_amax;              // [1] f32: the amax the scales came from (after a
                                   // reduction across the group; NVFP4's GEMM alpha)
  Tensor scale;                    // [1] f32: the FP8 per-tensor scale; NVFP4's S_enc
  // Placement: the data and scale_inv tensors are on the device that quantized
  // (Backend::quantize), so a GEMM there reads them directly. amax, global_amax and scale
  // are on the host or on that device (the CUDA backend keeps a per-tensor FP8 scale on
  // the GPU, so quantizing needs no host round trip): read them with at() / to_host().
};

// True when a and b have the same shape, dtype and bit patterns.
bool bitwise_equal(const Tensor& a, const Tensor& b);

}  // namespace tpcheck

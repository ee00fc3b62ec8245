// tpcheck/tensor.h — an owning, row-major tensor of up to 4 dimensions.
//
// A Tensor is a shape, a storage dtype, a device and a shared buffer. Copying a Tensor
// shares the buffer (like a handle); `clone()` copies the data. Values are stored in
// the dtype's own encoding: double for f64, float for f32, the 16-bit pattern for
// f16/bf16, the 8-bit pattern for fp8. Writes through `from_f64`, `set`, `to` round to
// nearest even.
// CPU tensors only in this header's implementation; Device::kCuda buffers belong to the
// CUDA backend, which copies through `Backend::to_host`.
// Thread safety: distinct Tensors may be used from distinct threads; sharing one buffer
// between threads that write is the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tpcheck/dtype.h"

namespace tpcheck {

using Shape = std::vector<std::int64_t>;

inline constexpr int kMaxRank = 4;

std::int64_t shape_numel(const Shape& shape);
// "[16, 64]"
std::string shape_str(const Shape& shape);

enum class Device { kCpu, kCuda };

class Tensor {
 public:
  // An undefined tensor (no shape, no buffer); `defined()` is false.
  Tensor() = default;
  // A zero-filled tensor. REQUIRES: rank <= 4, every dim >= 0.
  Tensor(Shape shape, DType dtype, Device device = Device::kCpu);

  static Tensor zeros(Shape shape, DType dtype) { return Tensor(std::move(shape), dtype); }
  static Tensor full(Shape shape, DType dtype, double value);
  // Values rounded (nearest even) to `dtype`. REQUIRES: values.size() == numel(shape).
  static Tensor from_f64(std::span<const double> values, Shape shape, DType dtype);
  static Tensor from_f32(std::span<const float> values, Shape shape, DType dtype);
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

  void* raw() { return storage_.get(); }
  const void* raw() const { return storage_.get(); }
  // Typed access to the storage. REQUIRES: T matches the storage type of dtype()
  // (double, float, std::uint16_t for f16/bf16, std::uint8_t for fp8) and a CPU tensor.
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;

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

  // "f32[16, 64]"
  std::string describe() const;

 private:
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::shared_ptr<std::byte[]> storage_;
};

// True when a and b have the same shape, dtype and bit patterns.
bool bitwise_equal(const Tensor& a, const Tensor& b);

}  // namespace tpcheck

// Tensor: shape bookkeeping, element access in any dtype, casts, slicing.
#include "tpcheck/tensor.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#include "core/device_runtime.h"
#include "tpcheck/error.h"

namespace tpcheck {

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string_view device_name(Device device) { return device == Device::kCpu ? "CPU" : "GPU"; }

namespace {
std::array<std::atomic<DeviceRuntime*>, 2> g_runtimes{};
}  // namespace

void register_device_runtime(Device device, DeviceRuntime* runtime) {
  TPCHECK_CHECK(device != Device::kCpu, "the CPU needs no device runtime");
  g_runtimes[static_cast<int>(device)].store(runtime);
}

DeviceRuntime& device_runtime(Device device) {
  DeviceRuntime* r = g_runtimes[static_cast<int>(device)].load();
  TPCHECK_CHECK_INPUT(r != nullptr,
                      "no {} runtime: this tpcheck was built without CUDA, or no CUDA backend "
                      "was created yet (make_cuda_backend registers it)",
                      device_name(device));
  return *r;
}

namespace {

int normalize_dim(int dim, int rank) {
  int d = dim < 0 ? dim + rank : dim;
  TPCHECK_CHECK(d >= 0 && d < rank, "dimension {} out of range for a rank-{} tensor", dim, rank);
  return d;
}

// Element `i` of a buffer in `dtype` widened to double (exact for every dtype).
double load(DType dtype, const std::byte* base, std::int64_t i) {
  switch (dtype) {
    case DType::kF64: return reinterpret_cast<const double*>(base)[i];
    case DType::kF32: return reinterpret_cast<const float*>(base)[i];
    case DType::kF16: return f16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(base)[i]);
    case DType::kF8E4M3: return f8e4m3_bits_to_f32(reinterpret_cast<const std::uint8_t*>(base)[i]);
    case DType::kF8E5M2: return f8e5m2_bits_to_f32(reinterpret_cast<const std::uint8_t*>(base)[i]);
    case DType::kF4E2M1: return f4e2m1_bits_to_f32(reinterpret_cast<const std::uint8_t*>(base)[i]);
    case DType::kF8E8M0: return f8e8m0_bits_to_f32(reinterpret_cast<const std::uint8_t*>(base)[i]);
  }
  return 0;
}

// Stores `v` rounded to `dtype` (one rounding from double).
void store(DType dtype, std::byte* base, std::int64_t i, double v, CastMode mode) {
  switch (dtype) {
    case DType::kF64: reinterpret_cast<double*>(base)[i] = v; break;
    case DType::kF32: reinterpret_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kF16: reinterpret_cast<std::uint16_t*>(base)[i] = f64_to_f16_bits(v, mode); break;
    case DType::kBF16: reinterpret_cast<std::uint16_t*>(base)[i] = f64_to_bf16_bits(v, mode); break;
    case DType::kF8E4M3: reinterpret_cast<std::uint8_t*>(base)[i] = f64_to_f8e4m3_bits(v, mode); break;
    case DType::kF8E5M2: reinterpret_cast<std::uint8_t*>(base)[i] = f64_to_f8e5m2_bits(v, mode); break;
    case DType::kF4E2M1: reinterpret_cast<std::uint8_t*>(base)[i] = f64_to_f4e2m1_bits(v, mode); break;
    case DType::kF8E8M0: reinterpret_cast<std::uint8_t*>(base)[i] = f64_to_f8e8m0_bits(v, mode); break;
  }
}

// Stores a float with one rounding from float (the f32 → narrow path the GPU takes).
void store_f32(DType dtype, std::byte* base, std::int64_t i, float v) {
  switch (dtype) {
    case DType::kF64: reinterpret_cast<double*>(base)[i] = v; break;
    case DType::kF32: reinterpret_cast<float*>(base)[i] = v; break;
    case DType::kF16: reinterpret_cast<std::uint16_t*>(base)[i] = f32_to_f16_bits(v); break;
    case DType::kBF16: reinterpret_cast<std::uint16_t*>(base)[i] = f32_to_bf16_bits(v); break;
    case DType::kF8E4M3: reinterpret_cast<std::uint8_t*>(base)[i] = f32_to_f8e4m3_bits(v); break;
    case DType::kF8E5M2: reinterpret_cast<std::uint8_t*>(base)[i] = f32_to_f8e5m2_bits(v); break;
    case DType::kF4E2M1: reinterpret_cast<std::uint8_t*>(base)[i] = f32_to_f4e2m1_bits(v); break;
    case DType::kF8E8M0: reinterpret_cast<std::uint8_t*>(base)[i] = f32_to_f8e8m0_bits(v); break;
  }
}

template <typename T>
constexpr bool storage_matches(DType dtype) {
  switch (dtype) {
    case DType::kF64: return std::is_same_v<T, double>;
    case DType::kF32: return std::is_same_v<T, float>;
    case DType::kF16:
    case DType::kBF16: return std::is_same_v<T, std::uint16_t>;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF4E2M1:
    case DType::kF8E8M0: return std::is_same_v<T, std::uint8_t>;
  }
  return false;
}

}  // namespace

Tensor::Tensor(Shape shape, DType dtype, Device device) : Tensor(std::move(shape), dtype, device, true) {}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  return Tensor(std::move(shape), dtype, device, /*zero_fill=*/false);
}

Tensor::Tensor(Shape shape, DType dtype, Device device, bool zero_fill)
    : shape_(std::move(shape)), dtype_(dtype), device_(device) {
  TPCHECK_CHECK(rank() <= kMaxRank, "tensor rank {} exceeds the maximum {} (shape {})", rank(),
                kMaxRank, shape_str(shape_));
  for (std::int64_t d : shape_) {
    TPCHECK_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape_));
  }
  numel_ = shape_numel(shape_);
  // +1 byte keeps 0-element tensors defined (a non-null buffer).
  if (device == Device::kCpu) {
    // new byte[n]() value-initializes: zero fill.
    storage_ = std::shared_ptr<std::byte>(new std::byte[nbytes() + 1](),
                                          std::default_delete<std::byte[]>());
  } else {
    DeviceRuntime& rt = device_runtime(device);
    storage_ = rt.allocate(nbytes() + 1);
    if (zero_fill) rt.fill_zero(storage_.get(), nbytes());
  }
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device,
                    std::shared_ptr<void> owner) {
  TPCHECK_CHECK_INPUT(data != nullptr, "Tensor::wrap: null data pointer for {} {}",
                      dtype_name(dtype), shape_str(shape));
  TPCHECK_CHECK_INPUT(shape.size() <= static_cast<std::size_t>(kMaxRank),
                      "tensor rank {} exceeds the maximum {} (shape {})", shape.size(), kMaxRank,
                      shape_str(shape));
  for (std::int64_t d : shape) {
    TPCHECK_CHECK_INPUT(d >= 0, "negative dimension in shape {}", shape_str(shape));
  }
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.dtype_ = dtype;
  t.device_ = device;
  // The aliasing constructor: the handle points at `data` and shares `owner`'s lifetime.
  t.storage_ = std::shared_ptr<std::byte>(std::move(owner), static_cast<std::byte*>(data));
  return t;
}

Tensor Tensor::to_device(Device device) const {
  TPCHECK_CHECK(defined(), "to_device() on an undefined tensor");
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device);  // the copy writes every byte
  const Device gpu = device == Device::kCpu ? device_ : device;
  device_runtime(gpu).copy(out.raw(), device, raw(), device_, nbytes());
  return out;
}

namespace {
// Host-side read access to any tensor: the tensor itself on the CPU, else a host copy.
Tensor host_view(const Tensor& t) { return t.device() == Device::kCpu ? t : t.to_host(); }
}  // namespace

Tensor Tensor::full(Shape shape, DType dtype, double value) {
  Tensor t(std::move(shape), dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) store(dtype, t.storage_.get(), i, value, CastMode::kPlain);
  return t;
}

Tensor Tensor::from_f64(std::span<const double> values, Shape shape, DType dtype) {
  Tensor t(std::move(shape), dtype);
  TPCHECK_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(),
                "from_f64: {} values for shape {}", values.size(), shape_str(t.shape()));
  for (std::int64_t i = 0; i < t.numel(); ++i) store(dtype, t.storage_.get(), i, values[i], CastMode::kPlain);
  return t;
}

Tensor Tensor::from_f32(std::span<const float> values, Shape shape, DType dtype) {
  Tensor t(std::move(shape), dtype);
  TPCHECK_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(),
                "from_f32: {} values for shape {}", values.size(), shape_str(t.shape()));
  if (dtype == DType::kF32) {
    std::memcpy(t.raw(), values.data(), t.nbytes());
  } else {
    for (std::int64_t i = 0; i < t.numel(); ++i) store_f32(dtype, t.storage_.get(), i, values[i]);
  }
  return t;
}

std::int64_t Tensor::dim(int i) const { return shape_[normalize_dim(i, rank())]; }

template <typename T>
T* Tensor::data() {
  TPCHECK_CHECK(defined(), "data() on an undefined tensor");
  TPCHECK_CHECK(device_ == Device::kCpu,
                "data<T>() on {}: host pointers are for CPU tensors (use raw() in a kernel, or "
                "to_host())",
                describe());
  TPCHECK_CHECK(storage_matches<T>(dtype_), "data<T>() does not match the storage of {}", describe());
  return reinterpret_cast<T*>(storage_.get());
}
template <typename T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}
template double* Tensor::data<double>();
template float* Tensor::data<float>();
template std::uint16_t* Tensor::data<std::uint16_t>();
template std::uint8_t* Tensor::data<std::uint8_t>();
template const double* Tensor::data<double>() const;
template const float* Tensor::data<float>() const;
template const std::uint16_t* Tensor::data<std::uint16_t>() const;
template const std::uint8_t* Tensor::data<std::uint8_t>() const;

double Tensor::at(std::int64_t flat) const {
  TPCHECK_CHECK(flat >= 0 && flat < numel_, "index {} out of range for {}", flat, describe());
  if (device_ != Device::kCpu) {
    std::array<std::byte, sizeof(double)> one{};
    const std::size_t es = dtype_size(dtype_);
    device_runtime(device_).copy(one.data(), Device::kCpu,
                                 static_cast<const std::byte*>(raw()) + flat * es, device_, es);
    return load(dtype_, one.data(), 0);
  }
  return load(dtype_, storage_.get(), flat);
}

void Tensor::set(std::int64_t flat, double value) {
  TPCHECK_CHECK(flat >= 0 && flat < numel_, "index {} out of range for {}", flat, describe());
  if (device_ != Device::kCpu) {
    std::array<std::byte, sizeof(double)> one{};
    const std::size_t es = dtype_size(dtype_);
    store(dtype_, one.data(), 0, value, CastMode::kPlain);
    device_runtime(device_).copy(static_cast<std::byte*>(raw()) + flat * es, device_, one.data(),
                                 Device::kCpu, es);
    device_runtime(device_).synchronize();  // `one` dies here
    return;
  }
  store(dtype_, storage_.get(), flat, value, CastMode::kPlain);
}

std::vector<double> Tensor::to_f64() const {
  const Tensor host = host_view(*this);
  std::vector<double> out(numel_);
  for (std::int64_t i = 0; i < numel_; ++i) out[i] = load(dtype_, host.storage_.get(), i);
  return out;
}

std::vector<float> Tensor::to_f32() const {
  const Tensor host = host_view(*this);
  std::vector<float> out(numel_);
  if (dtype_ == DType::kF32) {
    std::memcpy(out.data(), host.raw(), nbytes());
  } else {
    for (std::int64_t i = 0; i < numel_; ++i) {
      out[i] = static_cast<float>(load(dtype_, host.storage_.get(), i));
    }
  }
  return out;
}

Tensor Tensor::to(DType dtype, CastMode mode) const {
  TPCHECK_CHECK(defined(), "to() on an undefined tensor");
  if (dtype == dtype_) return clone();
  Tensor out = empty(shape_, dtype, device_);  // the cast writes every element
  if (device_ != Device::kCpu) {
    device_runtime(device_).cast(out.raw(), dtype, raw(), dtype_, numel_, mode);
    return out;
  }
  for (std::int64_t i = 0; i < numel_; ++i) {
    store(dtype, out.storage_.get(), i, load(dtype_, storage_.get(), i), mode);
  }
  return out;
}

Tensor Tensor::clone() const {
  TPCHECK_CHECK(defined(), "clone() on an undefined tensor");
  Tensor out = empty(shape_, dtype_, device_);  // the copy writes every byte
  if (device_ != Device::kCpu) {
    device_runtime(device_).copy(out.raw(), device_, raw(), device_, nbytes());
  } else {
    std::memcpy(out.raw(), raw(), nbytes());
  }
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  TPCHECK_CHECK(shape_numel(shape) == numel_, "cannot reshape {} to {}", describe(), shape_str(shape));
  TPCHECK_CHECK(static_cast<int>(shape.size()) <= kMaxRank, "rank of {} exceeds {}", shape_str(shape), kMaxRank);
  Tensor out = *this;
  out.shape_ = std::move(shape);
  return out;
}

namespace {
// Views a tensor as [outer, dim, inner] around dimension `d`.
struct Split3 {
  std::int64_t outer = 1, mid = 1, inner = 1;
};
Split3 split_at(const Shape& shape, int d) {
  Split3 s;
  for (int i = 0; i < d; ++i) s.outer *= shape[i];
  s.mid = shape[d];
  for (std::size_t i = d + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}
}  // namespace

Tensor Tensor::slice(int dim, std::int64_t start, std::int64_t length) const {
  int d = normalize_dim(dim, rank());
  TPCHECK_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
                "slice [{}, {}) out of range for dim {} of {}", start, start + length, d, describe());
  Shape out_shape = shape_;
  out_shape[d] = length;
  Tensor out = empty(out_shape, dtype_, device_);  // the strided copy writes every row
  Split3 s = split_at(shape_, d);
  std::size_t es = dtype_size(dtype_);
  std::size_t row = static_cast<std::size_t>(length * s.inner) * es;
  if (device_ != Device::kCpu) {
    // One strided copy: `outer` rows of `row` bytes, source pitch a whole `mid` block.
    device_runtime(device_).copy_rows(out.raw(), row,
                                      storage_.get() + start * s.inner * es,
                                      static_cast<std::size_t>(s.mid * s.inner) * es, row, s.outer);
    return out;
  }
  for (std::int64_t o = 0; o < s.outer; ++o) {
    std::memcpy(out.storage_.get() + o * row,
                storage_.get() + (o * s.mid + start) * s.inner * es, row);
  }
  return out;
}

void Tensor::write_slice(int dim, std::int64_t start, const Tensor& src) {
  int d = normalize_dim(dim, rank());
  TPCHECK_CHECK(src.dtype() == dtype_, "write_slice: dtype {} into {}", dtype_name(src.dtype()), describe());
  TPCHECK_CHECK(src.device() == device_, "write_slice: {} into {}", src.describe(), describe());
  TPCHECK_CHECK(src.rank() == rank(), "write_slice: {} into {}", src.describe(), describe());
  for (int i = 0; i < rank(); ++i) {
    if (i != d) TPCHECK_CHECK(src.shape()[i] == shape_[i], "write_slice: {} into {}", src.describe(), describe());
  }
  std::int64_t length = src.shape()[d];
  TPCHECK_CHECK(start >= 0 && start + length <= shape_[d], "write_slice [{}, {}) out of range for {}",
                start, start + length, describe());
  Split3 s = split_at(shape_, d);
  std::size_t es = dtype_size(dtype_);
  std::size_t row = static_cast<std::size_t>(length * s.inner) * es;
  if (device_ != Device::kCpu) {
    device_runtime(device_).copy_rows(storage_.get() + start * s.inner * es,
                                      static_cast<std::size_t>(s.mid * s.inner) * es,
                                      src.raw(), row, row, s.outer);
    return;
  }
  for (std::int64_t o = 0; o < s.outer; ++o) {
    std::memcpy(storage_.get() + (o * s.mid + start) * s.inner * es,
                src.storage_.get() + o * row, row);
  }
}

Tensor Tensor::cat(const std::vector<Tensor>& parts, int dim) {
  TPCHECK_CHECK(!parts.empty(), "cat of no tensors");
  int d = normalize_dim(dim, parts[0].rank());
  Shape shape = parts[0].shape();
  shape[d] = 0;
  for (const Tensor& p : parts) shape[d] += p.shape()[d];
  Tensor out = empty(shape, parts[0].dtype(), parts[0].device());  // the parts cover it
  std::int64_t at = 0;
  for (const Tensor& p : parts) {
    out.write_slice(d, at, p);
    at += p.shape()[d];
  }
  return out;
}

void Tensor::fill_zero() {
  if (!defined()) return;
  if (device_ != Device::kCpu) {
    device_runtime(device_).fill_zero(raw(), nbytes());
  } else {
    std::memset(raw(), 0, nbytes());
  }
}

void Tensor::copy_from(const Tensor& src) {
  TPCHECK_CHECK(src.shape() == shape_, "copy_from: {} into {}", src.describe(), describe());
  if (src.device() != device_) {
    copy_from(src.to_device(device_));  // across devices: move first, then copy or cast here
    return;
  }
  if (device_ != Device::kCpu) {
    DeviceRuntime& rt = device_runtime(device_);
    if (src.dtype() == dtype_) {
      rt.copy(raw(), device_, src.raw(), device_, nbytes());
    } else {
      rt.cast(raw(), dtype_, src.raw(), src.dtype(), numel_, CastMode::kPlain);
    }
    return;
  }
  if (src.dtype() == dtype_) {
    std::memcpy(raw(), src.raw(), nbytes());
    return;
  }
  for (std::int64_t i = 0; i < numel_; ++i) {
    store(dtype_, storage_.get(), i, load(src.dtype(), src.storage_.get(), i), CastMode::kPlain);
  }
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  if (device_ != Device::kCpu) {
    return fmt::format("{}{} on {}", dtype_name(dtype_), shape_str(shape_), device_name(device_));
  }
  return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_));
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ha = host_view(a), hb = host_view(b);
  return std::memcmp(ha.raw(), hb.raw(), a.nbytes()) == 0;
}

}  // namespace tpcheck

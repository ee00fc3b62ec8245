// dlpack.cpp — see dlpack.h.
#include "python/dlpack.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <memory>
#include <vector>

namespace nb = nanobind;

namespace tpcheck::python {
namespace {

constexpr const char* kAcceptedDtypes =
    "float64, float32, float16, bfloat16, float8_e4m3fn or float8_e5m2";

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: base = "int"; break;
    case Code::UInt: base = "uint"; break;
    case Code::Float: base = "float"; break;
    case Code::Bfloat: base = "bfloat"; break;
    case Code::Complex: base = "complex"; break;
    case Code::Bool: return "bool";
    case Code::Float8_E4M3FNUZ: return "float8_e4m3fnuz";
    case Code::Float8_E5M2FNUZ: return "float8_e5m2fnuz";
    case Code::Float8_E8M0FNU: return "float8_e8m0fnu";
    case Code::Float4_E2M1FN: return "float4_e2m1fn";
    default: return fmt::format("DLPack type code {} ({} bits)", int(dt.code), int(dt.bits));
  }
  std::string name = base + std::to_string(dt.bits);
  if (dt.lanes != 1) name += fmt::format("x{}", int(dt.lanes));
  return name;
}

DType to_dtype(nb::dlpack::dtype dt, const std::string& what) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    switch (static_cast<Code>(dt.code)) {
      case Code::Float:
        if (dt.bits == 64) return DType::kF64;
        if (dt.bits == 32) return DType::kF32;
        if (dt.bits == 16) return DType::kF16;
        break;
      case Code::Bfloat:
        if (dt.bits == 16) return DType::kBF16;
        break;
      case Code::Float8_E4M3FN:
        if (dt.bits == 8) return DType::kF8E4M3;
        break;
      case Code::Float8_E5M2:
        if (dt.bits == 8) return DType::kF8E5M2;
        break;
      default:
        break;
    }
  }
  throw nb::type_error(fmt::format("{}: dtype {} is not supported; expected {}", what,
                                   dlpack_dtype_name(dt), kAcceptedDtypes)
                           .c_str());
}

std::string device_type_name(int type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host (pinned)";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 10: return "rocm";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
    default: return fmt::format("DLPack device type {}", type);
  }
}

}  // namespace

WrappedArray wrap_array(const nb::ndarray<>& array, const std::string& what) {
  const DType dtype = to_dtype(array.dtype(), what);
  const int device_type = array.device_type();
  if (device_type != nb::device::cpu::value && device_type != nb::device::cuda::value) {
    throw nb::value_error(fmt::format("{}: device {} is not supported; expected cpu or cuda",
                                      what, device_type_name(device_type))
                              .c_str());
  }
  WrappedArray out;
  out.device_id = array.device_id();
  std::vector<std::int64_t> strides;
  std::int64_t expected = 1;
  bool contiguous = true;
  for (std::size_t i = array.ndim(); i-- > 0;) {
    const auto n = static_cast<std::int64_t>(array.shape(i));
    if (n != 1 && array.stride(i) != expected) contiguous = false;
    expected *= n;
  }
  for (std::size_t i = 0; i < array.ndim(); ++i) {
    out.shape.push_back(static_cast<std::int64_t>(array.shape(i)));
    strides.push_back(array.stride(i));
  }
  if (!contiguous) {
    throw nb::value_error(
        fmt::format("{}: layout not supported: shape {} with strides {} (in elements) is not "
                    "C-contiguous; tpcheck reads arrays in place, so pass a contiguous one "
                    "(torch: .contiguous(), numpy: np.ascontiguousarray)",
                    what, shape_str(out.shape), fmt::join(strides, ", "))
            .c_str());
  }
  const Device device = device_type == nb::device::cpu::value ? Device::kCpu : Device::kCuda;
  // A 0-element array may have a null data pointer; Tensor::wrap wants one.
  static std::byte empty_byte{};
  void* data = array.size() == 0 ? &empty_byte : const_cast<void*>(array.data());
  auto owner = std::make_shared<nb::ndarray<>>(array);  // keeps the producer's buffer alive
  out.tensor = Tensor::wrap(data, Shape{static_cast<std::int64_t>(array.size())}, dtype, device,
                            std::move(owner));
  return out;
}

Tensor shaped(const WrappedArray& a, const std::string& what) {
  if (a.shape.size() > static_cast<std::size_t>(kMaxRank)) {
    throw nb::value_error(fmt::format("{}: shape {} has {} dimensions; layers take at most {}",
                                      what, shape_str(a.shape), a.shape.size(), kMaxRank)
                              .c_str());
  }
  return a.tensor.reshape(a.shape);
}

nb::object to_numpy(const Tensor& t) {
  Tensor host = t.to_host();
  const std::size_t n = static_cast<std::size_t>(host.numel());
  auto* values = new double[n == 0 ? 1 : n];
  if (host.dtype() == DType::kF64) {
    std::memcpy(values, host.raw(), n * sizeof(double));
  } else {
    const std::vector<double> wide = host.to_f64();
    std::copy(wide.begin(), wide.end(), values);
  }
  nb::capsule owner(values, [](void* p) noexcept { delete[] static_cast<double*>(p); });
  std::vector<std::size_t> shape(host.shape().begin(), host.shape().end());
  return nb::ndarray<nb::numpy, double>(values, shape.size(), shape.data(), owner).cast();
}

}  // namespace tpcheck::python

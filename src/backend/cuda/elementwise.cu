// elementwise.cu — CudaBackend::add / accumulate / scale / mse_loss / mse_loss_backward
// (twin of cpu/elementwise.cpp).
//
// Math in f32 (f64 when an input is f64: add and accumulate look at both operands, scale
// and mse_loss_backward at their first), one rounding to the output dtype; the second
// operand may be any kernel dtype (read as the math type, as the CPU's load does). Each
// of these is one f32 (f64) operation per element, so the results equal the CPU's bit
// for bit.
// mse_loss reduces in f64 with a fixed order: a grid of at most kMseBlocks blocks (a
// function of numel only) each sums a fixed grid-stride set of elements and reduces it
// with block_sum into partials[block]; one block then sums the partials the same way.
// The one host synchronization of these ops: the loss is copied back and waited for.
//
// Buffers: every tensor [numel] (any shape, same shape for both operands);
//   mse partials [blocks] f64, result [1] f64 (temporaries).
// Thread safety: see cuda_backend.h.
#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr long long kMseBlocks = 1024;

#define TPCHECK_GRID_STRIDE(i, count)                                                            \
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<long long>(gridDim.x) * blockDim.x)

// out[i] = a[i] + b[i] in Real, rounded once to T (out may be a: accumulate).
template <typename T, typename Real>
__global__ void add_kernel(T* out, const T* a, const void* __restrict__ b, DType b_dtype,
                           long long count) {
  TPCHECK_GRID_STRIDE(i, count) {
    out[i] = from_real<T>(static_cast<Real>(to_real(a[i])) + load_as<Real>(b, b_dtype, i));
  }
}

template <typename T>
__global__ void scale_kernel(T* __restrict__ out, const T* __restrict__ x, ComputeType<T> s,
                             long long count) {
  TPCHECK_GRID_STRIDE(i, count) { out[i] = from_real<T>(to_real(x[i]) * s); }
}

// dy[i] = factor · (y[i] − target[i]) in Real (y's math type), rounded once to T.
template <typename T>
__global__ void mse_backward_kernel(T* __restrict__ dy, const T* __restrict__ y,
                                    const void* __restrict__ target, DType target_dtype,
                                    ComputeType<T> factor, long long count) {
  using Real = ComputeType<T>;
  TPCHECK_GRID_STRIDE(i, count) {
    dy[i] = from_real<T>(factor * (to_real(y[i]) - load_as<Real>(target, target_dtype, i)));
  }
}

template <typename T>
__global__ void mse_partials_kernel(const T* __restrict__ y, const void* __restrict__ target,
                                    DType target_dtype, long long count,
                                    double* __restrict__ partials) {
  __shared__ double scratch[32];
  double acc = 0;
  TPCHECK_GRID_STRIDE(i, count) {
    const double d = static_cast<double>(to_real(y[i])) - load_as<double>(target, target_dtype, i);
    acc += d * d;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const double* __restrict__ partials, int count,
                                    double* __restrict__ out) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

#undef TPCHECK_GRID_STRIDE

// ---- launchers -------------------------------------------------------------------------

// out = a + b (out may alias a), math in f64 when a or b is f64.
template <typename T>
void launch_add(Tensor& out, const Tensor& a, const Tensor& b) {
  const long long count = a.numel();
  if (count == 0) return;
  const unsigned grid = grid_for(count, kThreads);
  if (std::is_same_v<T, double> || b.dtype() == DType::kF64) {
    add_kernel<T, double><<<grid, kThreads, 0, current_stream()>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(a.raw()), b.raw(), b.dtype(), count);
  } else {
    add_kernel<T, float><<<grid, kThreads, 0, current_stream()>>>(
        static_cast<T*>(out.raw()), static_cast<const T*>(a.raw()), b.raw(), b.dtype(), count);
  }
  TPCHECK_LAUNCH_CHECK();
}

template <typename T>
void launch_scale(Tensor& out, const Tensor& x, double s) {
  const long long count = x.numel();
  if (count == 0) return;
  scale_kernel<T><<<grid_for(count, kThreads), kThreads, 0, current_stream()>>>(
      static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), static_cast<ComputeType<T>>(s),
      count);
  TPCHECK_LAUNCH_CHECK();
}

template <typename T>
void launch_mse_backward(Tensor& dy, const Tensor& y, const Tensor& target) {
  using Real = ComputeType<T>;
  const long long count = y.numel();
  // The CPU's factor: 2 / numel in the math type (numel converted to it first).
  const Real factor = Real(2) / static_cast<Real>(count);
  mse_backward_kernel<T><<<grid_for(count, kThreads), kThreads, 0, current_stream()>>>(
      static_cast<T*>(dy.raw()), static_cast<const T*>(y.raw()), target.raw(), target.dtype(),
      factor, count);
  TPCHECK_LAUNCH_CHECK();
}

template <typename T>
void launch_mse_partials(const Tensor& y, const Tensor& target, Tensor& partials) {
  const long long count = y.numel();
  mse_partials_kernel<T>
      <<<static_cast<unsigned>(partials.numel()), kThreads, 0, current_stream()>>>(
          static_cast<const T*>(y.raw()), target.raw(), target.dtype(), count,
          static_cast<double*>(partials.raw()));
  TPCHECK_LAUNCH_CHECK();
}

void check_same_shape(std::string_view op, std::string_view a_name, const Tensor& a,
                      std::string_view b_name, const Tensor& b) {
  TPCHECK_CHECK_INPUT(a.defined() && b.defined(), "{}: undefined tensor", op);
  TPCHECK_CHECK_INPUT(a.shape() == b.shape(), "{}: shapes differ: {} and {}; expected equal shapes",
                      op, a.describe(), b.describe());
  check_cuda_operand(op, a_name, a);
  check_cuda_operand(op, b_name, b);
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::add(const Tensor& a, const Tensor& b) {
  cuda::check_same_shape("add", "a", a, "b", b);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), Device::kCuda);
  TPCHECK_DISPATCH_FLOAT(a.dtype(), "add", T, cuda::launch_add<T>(out, a, b));
  return out;
}

void CudaBackend::accumulate(Tensor& into, const Tensor& x) {
  cuda::check_same_shape("accumulate", "into", into, "x", x);
  TPCHECK_DISPATCH_FLOAT(into.dtype(), "accumulate", T, cuda::launch_add<T>(into, into, x));
}

Tensor CudaBackend::scale(const Tensor& x, double s) {
  TPCHECK_CHECK_INPUT(x.defined(), "scale: undefined tensor");
  cuda::check_cuda_operand("scale", "x", x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::kCuda);
  TPCHECK_DISPATCH_FLOAT(x.dtype(), "scale", T, cuda::launch_scale<T>(out, x, s));
  return out;
}

double CudaBackend::mse_loss(const Tensor& y, const Tensor& target) {
  cuda::check_same_shape("mse_loss", "y", y, "target", target);
  TPCHECK_CHECK_INPUT(y.numel() > 0, "mse_loss: empty tensor {}; expected at least one element",
                      y.describe());
  const long long count = y.numel();
  const long long blocks_needed = (count + cuda::kThreads - 1) / cuda::kThreads;
  const long long blocks = blocks_needed < cuda::kMseBlocks ? blocks_needed : cuda::kMseBlocks;
  Tensor partials({static_cast<std::int64_t>(blocks)}, DType::kF64, Device::kCuda);
  Tensor total({1}, DType::kF64, Device::kCuda);
  TPCHECK_DISPATCH_FLOAT(y.dtype(), "mse_loss", T,
                         cuda::launch_mse_partials<T>(y, target, partials));
  cudaStream_t stream = cuda::current_stream();
  cuda::sum_partials_kernel<<<1, cuda::kThreads, 0, stream>>>(
      static_cast<const double*>(partials.raw()), static_cast<int>(blocks),
      static_cast<double*>(total.raw()));
  TPCHECK_LAUNCH_CHECK();
  double sum = 0;
  TPCHECK_CUDA_CHECK(
      cudaMemcpyAsync(&sum, total.raw(), sizeof(double), cudaMemcpyDeviceToHost, stream));
  TPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return sum / static_cast<double>(count);
}

Tensor CudaBackend::mse_loss_backward(const Tensor& y, const Tensor& target) {
  cuda::check_same_shape("mse_loss_backward", "y", y, "target", target);
  TPCHECK_CHECK_INPUT(y.numel() > 0,
                      "mse_loss_backward: empty tensor {}; expected at least one element",
                      y.describe());
  Tensor dy(y.shape(), y.dtype(), Device::kCuda);
  TPCHECK_DISPATCH_FLOAT(y.dtype(), "mse_loss_backward", T,
                         cuda::launch_mse_backward<T>(dy, y, target));
  return dy;
}

}  // namespace tpcheck

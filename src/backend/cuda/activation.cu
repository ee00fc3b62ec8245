// activation.cu — CudaBackend::activation_forward / activation_backward: the MLP
// activations, elementwise (gelu, relu, srelu, qgelu) and gated (geglu, swiglu); twin
// of cpu/activation.cpp with the same scalar functions (cpu_math.h gelu_tanh, the
// numerically safe sigmoid).
//
// Math in Real = f32 (f64 for f64 x); each result rounded once to x's dtype. dy may be
// any kernel dtype (read as Real, as the CPU reads it).
// Gated activations read x [.., 2n] as [a | b] (a first) and produce y [.., n] = act(a)·b;
// backward writes dx [.., 2n] = [dy·act'(a)·b | dy·act(a)].
//
// Kernels: elementwise ones are grid-stride loops over the flat index; gated ones run
// one thread per column of a column tile (blockIdx.x) with rows strided over blockIdx.y,
// so a warp reads consecutive a's, b's and dy's (coalesced) with no index division.
//
// Buffers (rows = numel(y) / n):
//   x  [rows, m] T (m = n, or 2n gated)   y  [rows, n] T   dy [rows, n]   dx [rows, m] T
// Thread safety: see cuda_backend.h.
#include "backend/cuda/activation_math.cuh"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ---- kernels ---------------------------------------------------------------------------

template <typename T, Activation A>
__global__ void activation_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                          long long count) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    y[i] = from_real<T>(evaluate<A>(to_real(x[i])).value);
  }
}

template <typename T, Activation A>
__global__ void activation_backward_kernel(const void* __restrict__ dy, DType dy_dtype,
                                           const T* __restrict__ x, T* __restrict__ dx,
                                           long long count) {
  using Real = ComputeType<T>;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    dx[i] = from_real<T>(load_as<Real>(dy, dy_dtype, i) * evaluate<A>(to_real(x[i])).grad);
  }
}

// Row r of x is [a_r | b_r], n values each; y[r, j] = act(a[r, j]) · b[r, j].
template <typename T, Activation A>
__global__ void gated_forward_kernel(const T* __restrict__ x, T* __restrict__ y, long long rows,
                                     long long n) {
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* a = x + r * 2 * n;
    y[r * n + j] = from_real<T>(evaluate<A>(to_real(a[j])).value * to_real(a[n + j]));
  }
}

// y = act(a) · b:  da = dy · act'(a) · b,  db = dy · act(a).
template <typename T, Activation A>
__global__ void gated_backward_kernel(const void* __restrict__ dy, DType dy_dtype,
                                      const T* __restrict__ x, T* __restrict__ dx, long long rows,
                                      long long n) {
  using Real = ComputeType<T>;
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* a = x + r * 2 * n;
    T* da = dx + r * 2 * n;
    const Real g = load_as<Real>(dy, dy_dtype, r * n + j);
    const Real b = to_real(a[n + j]);
    const ValueAndGrad<Real> f = evaluate<A>(to_real(a[j]));
    da[j] = from_real<T>(g * f.grad * b);
    da[n + j] = from_real<T>(g * f.value);
  }
}

// ---- launchers -------------------------------------------------------------------------

dim3 gated_grid(long long rows, long long n) {
  return dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads),
              static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

template <typename T, Activation A>
void launch_forward(const Tensor& x, Tensor& y) {
  const T* xp = static_cast<const T*>(x.raw());
  T* yp = static_cast<T*>(y.raw());
  if constexpr (A == Activation::kGeglu || A == Activation::kSwiglu) {
    const long long n = y.dim(-1);
    const long long rows = y.numel() / n;
    gated_forward_kernel<T, A>
        <<<gated_grid(rows, n), kThreads, 0, current_stream()>>>(xp, yp, rows, n);
  } else {
    const long long count = x.numel();
    activation_forward_kernel<T, A>
        <<<grid_for(count, kThreads), kThreads, 0, current_stream()>>>(xp, yp, count);
  }
  TPCHECK_LAUNCH_CHECK();
}

template <typename T, Activation A>
void launch_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const T* xp = static_cast<const T*>(x.raw());
  T* dxp = static_cast<T*>(dx.raw());
  if constexpr (A == Activation::kGeglu || A == Activation::kSwiglu) {
    const long long n = dy.dim(-1);
    const long long rows = dy.numel() / n;
    gated_backward_kernel<T, A><<<gated_grid(rows, n), kThreads, 0, current_stream()>>>(
        dy.raw(), dy.dtype(), xp, dxp, rows, n);
  } else {
    const long long count = x.numel();
    activation_backward_kernel<T, A><<<grid_for(count, kThreads), kThreads, 0, current_stream()>>>(
        dy.raw(), dy.dtype(), xp, dxp, count);
  }
  TPCHECK_LAUNCH_CHECK();
}

// Runs F<T, A> for the run-time activation `act` (T already chosen).
#define TPCHECK_DISPATCH_ACTIVATION(act, A, ...)                            \
  switch (act) {                                                            \
    case Activation::kGelu: {                                               \
      constexpr Activation A = Activation::kGelu;                           \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case Activation::kRelu: {                                               \
      constexpr Activation A = Activation::kRelu;                           \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case Activation::kSrelu: {                                              \
      constexpr Activation A = Activation::kSrelu;                          \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case Activation::kQgelu: {                                              \
      constexpr Activation A = Activation::kQgelu;                          \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case Activation::kGeglu: {                                              \
      constexpr Activation A = Activation::kGeglu;                          \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    case Activation::kSwiglu: {                                             \
      constexpr Activation A = Activation::kSwiglu;                         \
      __VA_ARGS__;                                                          \
      break;                                                                \
    }                                                                       \
    default:                                                                \
      TPCHECK_CHECK(false, "unknown activation {}", static_cast<int>(act)); \
  }

// The output shape of `act` on x (the shared check, backend.cpp), after checking x is a
// GPU tensor.
Shape output_shape(Activation act, const Tensor& x) {
  Shape shape = activation_output_shape(act, x);
  check_cuda_operand(TPCHECK_FORMAT("activation {}", activation_name(act)), "x", x);
  return shape;
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::activation_forward(Activation act, const Tensor& x) {
  const Shape out_shape = cuda::output_shape(act, x);
  Tensor y(out_shape, x.dtype(), Device::kCuda);
  if (y.numel() == 0) return y;
  TPCHECK_DISPATCH_FLOAT(x.dtype(), "activation_forward", T,
                         TPCHECK_DISPATCH_ACTIVATION(act, A, cuda::launch_forward<T, A>(x, y)));
  return y;
}

Tensor CudaBackend::activation_backward(Activation act, const Tensor& dy, const Tensor& x) {
  const Shape out_shape = cuda::output_shape(act, x);
  TPCHECK_CHECK_INPUT(dy.defined() && dy.shape() == out_shape,
                      "activation {} backward: dy must have the output's shape {} (input {}), "
                      "got {}",
                      activation_name(act), shape_str(out_shape), x.describe(),
                      dy.defined() ? dy.describe() : "an undefined tensor");
  cuda::check_cuda_operand(TPCHECK_FORMAT("activation {} backward", activation_name(act)), "dy",
                           dy);
  Tensor dx(x.shape(), x.dtype(), Device::kCuda);
  if (dx.numel() == 0) return dx;
  TPCHECK_DISPATCH_FLOAT(
      x.dtype(), "activation_backward", T,
      TPCHECK_DISPATCH_ACTIVATION(act, A, cuda::launch_backward<T, A>(dy, x, dx)));
  return dx;
}

}  // namespace tpcheck

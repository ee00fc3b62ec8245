// bias.cu — CudaBackend::add_bias / accumulate_bias_grad (twin of cpu/bias.cpp).
//
// y[.., n] += bias[n]: math in f32 (f64 for f64 y), rounded once to y's dtype; bias may
// be any kernel dtype (read as the math type: an f64 bias next to f32 y rounds to f32
// first, as the CPU's load does).
// dbias[n] += Σ_rows dy[.., n]: a deterministic column reduction (column_reduce.cuh):
// fixed row chunks summed per block, then the chunk partials summed in chunk order and
// added to dbias's stored value (in f64 when dbias or dy is f64, else f32), rounded
// once to dbias's dtype. No atomics: the bits are the same on every run.
//
// Buffers (rows = numel / n):
//   y      [rows, n]  T (in place)      bias   [n]  any kernel dtype
//   dy     [rows, n]  any kernel dtype  dbias  [n]  any kernel dtype (accumulated)
// Thread safety: see cuda_backend.h (one rank at a time, on the rank's stream).
#include "backend/cuda/column_reduce.cuh"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/kernel_util.cuh"
#include "tpcheck/error.h"

namespace tpcheck {
namespace cuda {
namespace {

constexpr int kBiasThreads = 256;

// One thread per column j of a column tile (blockIdx.x), rows strided by gridDim.y:
// coalesced, and the bias value is read once per thread.
template <typename T>
__global__ void add_bias_kernel(T* __restrict__ y, const void* __restrict__ bias, DType bias_dtype,
                                long long rows, long long n) {
  using Real = ComputeType<T>;
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const Real b = load_as<Real>(bias, bias_dtype, j);
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    T* p = y + r * n + j;
    *p = from_real<T>(to_real(*p) + b);
  }
}

template <typename T>
void launch_add_bias(Tensor& y, const Tensor& bias) {
  const long long n = bias.numel();
  const long long rows = y.numel() / n;
  const dim3 grid(static_cast<unsigned>((n + kBiasThreads - 1) / kBiasThreads),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  add_bias_kernel<T><<<grid, kBiasThreads, 0, current_stream()>>>(
      static_cast<T*>(y.raw()), bias.raw(), bias.dtype(), rows, n);
  TPCHECK_LAUNCH_CHECK();
}

// Checks that `vec` is a [n] vector matching the last dimension of `mat` (the CPU's
// check, same message) and that both are GPU tensors of kernel dtypes.
void check_bias_shape(std::string_view op, std::string_view mat_name, const Tensor& mat,
                      std::string_view vec_name, const Tensor& vec) {
  TPCHECK_CHECK_INPUT(mat.defined() && vec.defined(), "{}: undefined tensor", op);
  TPCHECK_CHECK_INPUT(mat.rank() >= 1 && vec.rank() == 1 && vec.dim(0) == mat.dim(-1),
                      "{}: bias is {}, activations {}; expected a bias of shape [{}] (the last "
                      "dimension)",
                      op, vec.describe(), mat.describe(), mat.rank() >= 1 ? mat.dim(-1) : 0);
  check_cuda_operand(op, mat_name, mat);
  check_cuda_operand(op, vec_name, vec);
}

}  // namespace
}  // namespace cuda

void CudaBackend::add_bias(Tensor& y, const Tensor& bias) {
  cuda::check_bias_shape("add_bias", "y", y, "bias", bias);
  if (y.numel() == 0) return;
  TPCHECK_DISPATCH_FLOAT(y.dtype(), "add_bias", T, cuda::launch_add_bias<T>(y, bias));
}

void CudaBackend::accumulate_bias_grad(const Tensor& dy, Tensor& dbias) {
  cuda::check_bias_shape("accumulate_bias_grad", "dy", dy, "dbias", dbias);
  if (dy.numel() == 0) return;
  const long long n = dbias.numel();
  const long long rows = dy.numel() / n;
  cuda::ColumnReduce reduce(cuda::ColumnTerms::kSum, cuda::math_dtype_of(dy.dtype()), rows, n);
  reduce.partials(dy, Tensor(), Tensor(), Tensor());
  reduce.accumulate_into(0, dbias);
}

}  // namespace tpcheck

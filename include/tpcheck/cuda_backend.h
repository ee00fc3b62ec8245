// tpcheck/cuda_backend.h — the CUDA backend's options and factory (no CUDA headers here).
//
// A CudaBackend computes every Backend op on one GPU, on its own stream, with its own
// cuBLASLt handle and workspace: one per rank, so N emulated ranks on one GPU run
// concurrently and choose algorithms exactly as N separate GPUs would (cuBLASLt's
// heuristic depends on the shape, the types and the device, not on the process).
// Built without CUDA, make_cuda_backend throws Error(kInput) saying so.
// Thread safety: like every Backend, one rank (thread) at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "tpcheck/backend.h"
#include "tpcheck/quant.h"

namespace tpcheck {

// Which cuBLASLt implementations a GEMM may use (CUBLASLT_MATMUL_PREF_IMPL_MASK).
enum class GemmImplMask { kAny, kTensorCore, kFma };
std::string_view gemm_impl_mask_name(GemmImplMask m);  // "any", "tensor-core", "fma"
GemmImplMask parse_gemm_impl_mask(std::string_view name);  // throws Error(kInput)

struct CudaBackendOptions {
  int device = 0;               // CUDA device ordinal
  bool allow_tf32 = true;       // f32 GEMMs: CUBLAS_COMPUTE_32F_FAST_TF32, else 32F
  GemmImplMask impl_mask = GemmImplMask::kAny;
  std::size_t workspace_bytes = std::size_t{32} << 20;  // as the reference library uses
  // Attention through cuDNN's fused (flash) attention where it applies (f16 / bf16, no
  // mask or causal; src/backend/cuda/fused_attention.cpp), as TransformerEngine's
  // FusedAttention backend; off: the unfused composition with the reference's rounding
  // points (--attention fused|unfused).
  bool fused_attention = false;
};

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

// quantize() on the GPU (src/quant/cuda/quantize.cu), bit for bit the CPU's: x a GPU
// tensor (f32, f16, bf16); the quantized copies are GPU tensors, the amax / scale
// tensors host ones. Same checks and errors as quantize(). Built without CUDA: an error.
std::shared_ptr<QuantizedData> quantize_on_gpu(const Tensor& x, const QuantizeOptions& options,
                                               std::string_view what = "tensor");

// cast_satfinite (quant.h) on the GPU, element for element: x a GPU f32 tensor, format
// f8e4m3, f8e5m2 or f4e2m1 (a byte an element); the device casts the quantization kernels
// use (tests compare them with the CPU's on every f32 pattern). Built without CUDA: an error.
Tensor cast_satfinite_on_gpu(const Tensor& x, DType format);

// quantized_values() (quant.h) on the GPU: one copy of GPU-quantized data decoded, times
// its block scales, into a GPU f32 tensor (exact, as on the CPU); what the CUDA backend's
// emulated GEMMs multiply. Built without CUDA: an error.
QuantizedValues quantized_values_on_gpu(const QuantizedData& q, bool columnwise);

// Device memory tpcheck did not allocate (DLPack arrays from Python, zero-copy): makes the
// calling thread ready to wrap it as kCuda tensors (Tensor::wrap) on GPU `device` —
// registers the CUDA runtime with Tensor and the GPU statistics reduction with
// compare_tensors, and makes `device` and its legacy default stream current for this
// thread (the stream a DLPack producer makes its data ready for when no stream is given).
// Returns the device that was current before; give it to restore_cuda_device afterwards
// (frameworks such as PyTorch keep their own idea of the current device).
// Throws Error(kInput) when built without CUDA or `device` does not exist.
int use_external_cuda_device(int device);
void restore_cuda_device(int device);

// Device memory held by tpcheck's caching allocator, in use and cached, over all GPUs
// (0 when built without CUDA or before the first device tensor).
std::size_t cuda_memory_reserved();

// Versions for reports: "CUDA runtime 13.0, driver 13.0, cuBLASLt 13.1.0, NCCL 2.28.3", or
// why there is no CUDA.
std::string cuda_versions();

// Opens (true) or closes (false) the window a profiler started with capture off records
// (cudaProfilerStart / Stop: `ncu --profile-from-start off` times the kernels between).
// Without a profiler attached, or built without CUDA, it does nothing.
void cuda_profiler_capture(bool on);

}  // namespace tpcheck

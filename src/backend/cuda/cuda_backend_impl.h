// cuda_backend_impl.h — CudaBackend: every Backend op on one GPU.
//
// One object per rank: its own stream (every op and every Tensor operation of its thread
// runs there), its own cuBLASLt handle and 32 MiB workspace (256-byte aligned), so ranks
// emulated on one GPU run independently and cuBLASLt chooses for each exactly as it would
// on a GPU of its own.
//
// Ops live one file per op, forward and backward kernels with their host launchers, named
// like the CPU twins (src/backend/cpu): gemm.cu (cuBLASLt engine), bias.cu, norm.cu,
// activation.cu, bias_gelu.cu, bias_residual_add.cu, attention.cu, elementwise.cu;
// fused_attention.cpp runs cuDNN's fused attention. Math as the CPU backend: widen exactly, compute in f32 (f64
// for f64), round once to the storage dtype where a kernel stores.
// Thread safety: one rank (thread) at a time; the constructor makes the stream current
// for the constructing thread (the rank thread), so construct it there.
#pragma once

#include <cstddef>
#include <memory>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <tuple>

#include "tpcheck/backend.h"
#include "tpcheck/cuda_backend.h"

namespace tpcheck {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  void synchronize() override;

  const CudaBackendOptions& options() const { return options_; }
  cudaStream_t stream() const { return stream_; }

  // bias.cu
  void add_bias(Tensor& y, const Tensor& bias) override;
  void accumulate_bias_grad(const Tensor& dy, Tensor& dbias) override;

  // norm.cu
  NormForward norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           double eps, bool zero_centered_gamma) override;
  Tensor norm_backward(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                       const NormForward& saved, bool zero_centered_gamma, Tensor& dgamma,
                       Tensor& dbeta) override;

  // activation.cu
  Tensor activation_forward(Activation act, const Tensor& x) override;
  Tensor activation_backward(Activation act, const Tensor& dy, const Tensor& x) override;

  // bias_gelu.cu (one kernel per pass, the composition's bits)
  Tensor bias_gelu_forward(const Tensor& h, const Tensor& bias) override;
  Tensor bias_gelu_backward(const Tensor& da, const Tensor& h, const Tensor& bias,
                            Tensor& dbias) override;

  // bias_residual_add.cu (one kernel, the composition's bits)
  Tensor bias_residual_add(const Tensor& out, const Tensor& bias, const Tensor& residual) override;

  // quantize.cu (quantize_on_gpu)
  std::shared_ptr<QuantizedData> quantize(const Tensor& x, const QuantizeOptions& options,
                                          std::string_view what) override;

  // elementwise.cu
  Tensor add(const Tensor& a, const Tensor& b) override;
  void accumulate(Tensor& into, const Tensor& x) override;
  Tensor scale(const Tensor& x, double s) override;
  double mse_loss(const Tensor& y, const Tensor& target) override;
  Tensor mse_loss_backward(const Tensor& y, const Tensor& target) override;

 protected:
  // gemm.cu
  void run_gemm(const GemmProblem& p, GemmRecord& record) override;
  void run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord& record) override;

  // attention.cu (the primitives; Backend::attention_forward / attention_backward compose
  // them with the GEMM front end, whose engine is gemm.cu)
  Tensor attention_heads_in(const Tensor& x, std::int64_t heads) override;
  Tensor attention_heads_out(const Tensor& x, std::int64_t batch, std::int64_t groups) override;
  Tensor attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) override;
  Tensor attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) override;

  // fused_attention.cpp (cuDNN's flash attention, when options_.fused_attention is on)
  bool run_fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask, double scale, AttentionForward& out,
                                   std::string& implementation) override;
  AttentionGrads run_fused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                              const Tensor& v, const AttentionForward& saved,
                                              const AttentionMask& mask, double scale,
                                              std::string& implementation) override;

 private:
  CudaBackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  // From the caching allocator (not a cudaMalloc of its own): a backend is made per run,
  // and the allocator's out-of-memory path frees cached blocks before it gives up.
  std::shared_ptr<std::byte> workspace_block_;
  void* workspace_ = nullptr;
  // cuBLASLt heuristic results by problem (the heuristic is deterministic for a shape, so
  // asking once per shape is what a library with an algorithm cache does).
  struct CachedAlgo {
    cublasLtMatmulAlgo_t algo;
    std::size_t workspace = 0;
    float waves = 0;
  };
  std::map<std::string, CachedAlgo> algo_cache_;
  friend struct CudaGemmEngine;
  friend struct CudaQuantizedGemmEngine;
};

}  // namespace tpcheck

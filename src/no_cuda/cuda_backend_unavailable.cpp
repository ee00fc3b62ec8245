// The CUDA backend's entry points in a build without CUDA: a clear error, not a link
// failure, so the CLI and tests can say what is missing.
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  TPCHECK_CHECK_INPUT(false,
                      "--backend cuda: this tpcheck was built without CUDA (TPCHECK_CUDA=OFF); "
                      "rebuild on a machine with nvcc, or use --backend cpu");
  return nullptr;
}

std::size_t cuda_memory_reserved() { return 0; }
std::string cuda_versions() { return "built without CUDA"; }
void cuda_profiler_capture(bool) {}

std::shared_ptr<QuantizedData> quantize_on_gpu(const Tensor&, const QuantizeOptions&,
                                               std::string_view) {
  TPCHECK_CHECK_INPUT(false, "quantize_on_gpu: this tpcheck was built without CUDA "
                             "(TPCHECK_CUDA=OFF)");
  return nullptr;
}

Tensor cast_satfinite_on_gpu(const Tensor&, DType) {
  TPCHECK_CHECK_INPUT(false, "cast_satfinite_on_gpu: this tpcheck was built without CUDA "
                             "(TPCHECK_CUDA=OFF)");
  return {};
}

QuantizedValues quantized_values_on_gpu(const QuantizedData&, bool) {
  TPCHECK_CHECK_INPUT(false, "quantized_values_on_gpu: this tpcheck was built without CUDA "
                             "(TPCHECK_CUDA=OFF)");
  return {};
}

int use_external_cuda_device(int device) {
  TPCHECK_CHECK_INPUT(false,
                      "a CUDA tensor (device {}) was given, but this tpcheck was built without "
                      "CUDA (TPCHECK_CUDA=OFF); rebuild where nvcc is installed, or pass CPU "
                      "tensors",
                      device);
  return 0;
}
void restore_cuda_device(int) {}

}  // namespace tpcheck

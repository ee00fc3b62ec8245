// cuda_backend.cu — CudaBackend's lifetime (stream, cuBLASLt handle, workspace), the
// factory, versions for reports, and the error functions behind cuda_check.h.
#include "backend/cuda/cuda_backend_impl.h"

#include <cuda_profiler_api.h>
#include <nccl.h>

#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_libraries.h"
#include "backend/cuda/cuda_runtime.h"

namespace tpcheck {

namespace cuda {

void fail_cuda(cudaError_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a sticky-free error so the next call reports its own
  detail::fail(ErrorKind::kRuntime, file, line,
               TPCHECK_FORMAT("CUDA error {} ({}) in {}", cudaGetErrorName(status),
                           cudaGetErrorString(status), call));
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

void register_cuda_compare();  // compare_stats.cu

void fail_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  detail::fail(ErrorKind::kRuntime, file, line,
               TPCHECK_FORMAT("cuBLASLt error {} in {}", cublas_status_name(status), call));
}

}  // namespace cuda

namespace {

// The streams and cuBLASLt handles of finished backends, per device, kept for the next
// ones. A suite makes a backend per rank and run (eight per case at TP 4). Creating a
// stream takes the driver's context lock for writing: stack samples of the production
// shapes at TP 8 found half of the busy rank-thread stacks waiting for it in
// cuStreamCreate and 7 % in cublasLtCreate (tests/gpu/RESULTS.md). A pooled stream is
// synchronized and retired from the allocator exactly as a destroyed one was; only the
// two objects are kept.
struct StreamAndHandle {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
};

class StreamPool {
 public:
  std::optional<StreamAndHandle> take(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<StreamAndHandle>& idle = idle_[device];
    if (idle.empty()) return std::nullopt;
    StreamAndHandle s = idle.back();
    idle.pop_back();
    return s;
  }
  void give(int device, StreamAndHandle s) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_[device].push_back(s);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<StreamAndHandle>> idle_;
};

StreamPool& stream_pool() {
  // Never destroyed: at exit the driver may be shut down before static destructors run,
  // and the process's end frees streams and handles anyway.
  static StreamPool* pool = new StreamPool;
  return *pool;
}

}  // namespace

CudaBackend::CudaBackend(const CudaBackendOptions& options) : options_(options) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  TPCHECK_CHECK_INPUT(status == cudaSuccess && count > 0,
                      "--backend cuda: no usable GPU ({}); run on a machine with an NVIDIA GPU "
                      "and driver, or use --backend cpu",
                      status == cudaSuccess ? "no CUDA device" : cudaGetErrorString(status));
  TPCHECK_CHECK_INPUT(options.device >= 0 && options.device < count,
                      "CUDA device {} does not exist; this machine has {} (0..{})", options.device,
                      count, count - 1);
  cuda::require_cublaslt();  // a wheel without cuBLASLt on this machine says so here
  cuda::install_cuda_runtime();
  cuda::register_cuda_compare();  // the suite compares the results where they were computed
  TPCHECK_CUDA_CHECK(cudaSetDevice(options.device));
  if (std::optional<StreamAndHandle> idle = stream_pool().take(options.device)) {
    stream_ = idle->stream;
    lt_ = idle->lt;
  } else {
    TPCHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  cuda::allocator_adopt_stream(options.device, stream_);
  cuda::set_current_stream(options.device, stream_);
  if (lt_ == nullptr) TPCHECK_CUBLAS_CHECK(cublasLtCreate(&lt_));
  // Whole cudaMalloc blocks, 256-byte aligned: the alignment cuBLASLt asks of workspaces.
  workspace_block_ = cuda::install_cuda_runtime().allocate(options.workspace_bytes);
  workspace_ = workspace_block_.get();
}

CudaBackend::~CudaBackend() {
  // Never throw from here: a failed rank is already unwinding.
  bool idle = false;  // the stream finished its work without an error: it can be reused
  if (stream_ != nullptr) {
    idle = cudaStreamSynchronize(stream_) == cudaSuccess;
    // Its cached blocks (and those of its tensors that outlive it) serve later streams.
    cuda::allocator_retire_stream(options_.device, stream_);
  }
  workspace_block_.reset();  // to the idle pool: the stream is retired
  if (stream_ != nullptr && cuda::current_stream() == stream_) {
    try {
      cuda::set_current_stream(options_.device, nullptr);
    } catch (...) {  // a destructor must not throw; the stream is released either way
    }
  }
  if (idle && lt_ != nullptr) {
    try {
      stream_pool().give(options_.device, StreamAndHandle{stream_, lt_});
      return;
    } catch (...) {  // no memory to keep it: destroy it below
    }
  }
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaBackend::synchronize() { TPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

std::size_t cuda_memory_reserved() { return cuda::allocator_bytes_reserved(); }

void cuda_profiler_capture(bool on) {
  // The result is not checked: with no profiler attached these calls are no-ops.
  if (on) {
    cudaProfilerStart();
  } else {
    cudaProfilerStop();
  }
}

std::string cuda_versions() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  // A wheel loads cuBLASLt and NCCL at run time (cuda_libraries.h): one it cannot load is
  // named so, not asked.
  std::string lt_text = "cuBLASLt not loadable", nccl_text = "NCCL not loadable";
  if (cuda::cublaslt_unavailable().empty()) {
    const std::size_t lt = cublasLtGetVersion();
    lt_text = TPCHECK_FORMAT("cuBLASLt {}.{}.{}", lt / 10000, lt % 10000 / 100, lt % 100);
  }
  if (cuda::nccl_unavailable().empty()) {
    int nccl = 0;
    ncclGetVersion(&nccl);
    nccl_text = TPCHECK_FORMAT("NCCL {}.{}.{}", nccl / 10000, nccl % 10000 / 100, nccl % 100);
  }
  return TPCHECK_FORMAT("CUDA runtime {}.{}, driver {}.{}, {}, {}", runtime / 1000,
                        runtime % 1000 / 10, driver / 1000, driver % 1000 / 10, lt_text, nccl_text);
}

}  // namespace tpcheck

// cuda_runtime.cu — the CUDA DeviceRuntime: caching allocator, stream-ordered copies,
// cast kernels, per-thread current stream (see cuda_runtime.h).
#include "backend/cuda/cuda_runtime.h"

#include <cuda_fp8.h>
#include <execinfo.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_util.cuh"

namespace tpcheck::cuda {
namespace {

thread_local cudaStream_t t_stream = nullptr;
thread_local int t_device = 0;

// TPCHECK_TRACE_WAITS=1, a diagnostic for benchmarks: prints each point where the host
// waits for the GPU or the driver (a copy to or from host memory, a cudaMalloc) with its
// call stack to stderr, to find what leaves the GPU idle in a step. Frames without a
// symbol print as module(+offset): `addr2line -f -C -e <unstripped binary> offset`.
void trace_wait(const char* what, std::size_t bytes) {
  static const bool on = std::getenv("TPCHECK_TRACE_WAITS") != nullptr;
  if (!on) return;
  void* frames[32];
  const int n = backtrace(frames, 32);
  std::fprintf(stderr, "[wait] %s, %zu bytes\n", what, bytes);
  backtrace_symbols_fd(frames, n, 2);
}

std::size_t round_size(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20;
  if (bytes <= (std::size_t{1} << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

// Free blocks keyed by (device, stream, rounded size).
// A block freed by a thread whose current stream is not the block's own (a run's result
// read by the comparison after the run's stream retired; a tensor handed to another
// thread) may still be read by work that thread queued: it carries an event recorded on
// the freeing thread's stream, and the stream that takes the block next waits for it on
// the device (cudaStreamWaitEvent, no host wait). Without the event a block went to the
// idle pool at once and another thread's stream could overwrite it under a pending read:
// the intermittent garbage in the sharded gradients of the emulated recipes at TP 8
// (2026-12-02, tests/gpu/RESULTS.md).
class CachingAllocator {
 public:
  std::shared_ptr<std::byte> allocate(std::size_t bytes) {
    const std::size_t size = round_size(bytes);
    const int device = t_device;
    cudaStream_t stream = t_stream;
    void* p = take(device, stream, size);  // ordered after the block's last use
    if (p == nullptr) {
      trace_wait("cudaMalloc", size);
      TPCHECK_CUDA_CHECK(cudaSetDevice(device));
      cudaError_t status = cudaMalloc(&p, size);
      if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cached();
        status = cudaMalloc(&p, size);
      }
      if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        std::size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        TPCHECK_CHECK(false,
                      "out of device memory on GPU {}: asked for {:.1f} MiB with {:.1f} MiB free "
                      "of {:.1f} MiB; use smaller sizes (--hidden/--ffn/--seq/--batch) or fewer "
                      "emulated ranks",
                      device, size / 1048576.0, free_bytes / 1048576.0, total_bytes / 1048576.0);
      }
      TPCHECK_CUDA_CHECK(status);
      std::lock_guard<std::mutex> lock(mu_);
      reserved_ += size;
    }
    // TPCHECK_POISON_ALLOCATIONS=1: every block handed out is filled with 0xFF bytes (NaN
    // in f32 / f16 / bf16 / f64, 0xFF in the 8-bit formats) before its first use, so an
    // output a kernel writes only in part (Tensor::empty) shows up as non-finite values in
    // the comparison instead of as whatever the block held before. A debugging aid.
    static const bool poison = std::getenv("TPCHECK_POISON_ALLOCATIONS") != nullptr;
    if (poison) TPCHECK_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, size, stream));
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [this, device, stream, size](std::byte* q) {
      give_back(device, stream, size, q);
    });
  }

  std::size_t reserved() {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_;
  }

  // The stream is about to be destroyed and has no queued work (its owner synchronized
  // it): its cached blocks, and blocks of it freed from now on, go to the device's idle
  // pool, which any stream may take from. Without this every new rank stream (one per run
  // and rank) would cudaMalloc afresh while the dead streams' pools sat unreachable until
  // an out-of-memory flush.
  void retire_stream(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.lower_bound(Key{device, stream, 0});
         it != free_.end() && std::get<0>(it->first) == device && std::get<1>(it->first) == stream;
         it = free_.erase(it)) {
      auto& idle = idle_[Key{device, nullptr, std::get<2>(it->first)}];
      idle.insert(idle.end(), it->second.begin(), it->second.end());  // events kept
    }
    retired_.insert({device, stream});
  }
  // A new stream: CUDA may hand out a destroyed stream's handle again, and a live
  // stream's blocks must stay in its own pool.
  void adopt_stream(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    retired_.erase({device, stream});
  }

 private:
  using Key = std::tuple<int, cudaStream_t, std::size_t>;
  // A cached block, and the event its next user must wait for (null: none; the block's
  // last use was on its own stream, or that stream was synchronized).
  struct Cached {
    void* p;
    cudaEvent_t last_use;
  };

  static std::optional<Cached> pop(std::map<Key, std::vector<Cached>>& pool, const Key& key) {
    auto it = pool.find(key);
    if (it == pool.end() || it->second.empty()) return std::nullopt;
    const Cached c = it->second.back();
    it->second.pop_back();
    return c;
  }
  void* take(int device, cudaStream_t stream, std::size_t size) {
    std::optional<Cached> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c = pop(free_, Key{device, stream, size});
      if (!c) c = pop(idle_, Key{device, nullptr, size});
    }
    if (!c) return nullptr;
    if (c->last_use != nullptr) {
      TPCHECK_CUDA_CHECK(cudaStreamWaitEvent(stream, c->last_use, 0));
      cudaEventDestroy(c->last_use);  // released once the wait has run
    }
    return c->p;
  }
  // Called from a tensor's deleter: must not throw. (A thread working on another GPU —
  // NCCL's one thread per GPU — records nothing: its streams cannot read this block.)
  void give_back(int device, cudaStream_t stream, std::size_t size, void* p) {
    cudaEvent_t last_use = nullptr;
    if (t_stream != stream && t_device == device) {
      bool recorded = cudaEventCreateWithFlags(&last_use, cudaEventDisableTiming) == cudaSuccess;
      if (!recorded) {
        last_use = nullptr;
      } else if (cudaEventRecord(last_use, t_stream) != cudaSuccess) {
        cudaEventDestroy(last_use);
        last_use = nullptr;
        recorded = false;
      }
      if (!recorded) {  // no event: wait for the freeing thread's stream here instead
        (void)cudaGetLastError();
        cudaStreamSynchronize(t_stream);
        (void)cudaGetLastError();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (retired_.count({device, stream}) != 0) {
      idle_[Key{device, nullptr, size}].push_back({p, last_use});
    } else {
      free_[Key{device, stream, size}].push_back({p, last_use});
    }
  }
  // Frees every cached block (after synchronizing the device: a cached block may still be
  // read by queued work of its stream).
  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    cudaDeviceSynchronize();
    for (auto* pool : {&free_, &idle_}) {
      for (auto& [key, blocks] : *pool) {
        cudaSetDevice(std::get<0>(key));
        for (const Cached& c : blocks) {
          if (c.last_use != nullptr) cudaEventDestroy(c.last_use);
          cudaFree(c.p);
          reserved_ -= std::get<2>(key);
        }
        blocks.clear();
      }
    }
    cudaSetDevice(t_device);
  }

  std::mutex mu_;
  std::map<Key, std::vector<Cached>> free_;  // blocks of live streams
  std::map<Key, std::vector<Cached>> idle_;  // blocks of retired streams (stream = nullptr)
  std::set<std::pair<int, cudaStream_t>> retired_;
  std::size_t reserved_ = 0;
};

// ---- casts: widen exactly to double, round once to the destination ---------------------
__device__ double load_any(const void* p, DType t, long long i) {
  switch (t) {
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF8E4M3: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[i], __NV_E4M3);
      return __half2float(__half(h));
    }
    case DType::kF8E5M2: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[i], __NV_E5M2);
      return __half2float(__half(h));
    }
  }
  return 0;
}

__device__ void store_any(void* p, DType t, long long i, double v, bool saturate) {
  switch (t) {
    case DType::kF64: static_cast<double*>(p)[i] = v; return;
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::kF16: {
      __half h = __double2half(v);
      if (saturate && __hisinf(h)) h = __double2half(v > 0 ? 65504.0 : -65504.0);
      static_cast<__half*>(p)[i] = h;
      return;
    }
    case DType::kBF16: {
      __nv_bfloat16 h = __double2bfloat16(v);
      if (saturate && __hisinf(h)) h = __double2bfloat16(v > 0 ? 3.3895313892515355e38 : -3.3895313892515355e38);
      static_cast<__nv_bfloat16*>(p)[i] = h;
      return;
    }
    case DType::kF8E4M3:
      static_cast<__nv_fp8_storage_t*>(p)[i] =
          __nv_cvt_double_to_fp8(v, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3);
      return;
    case DType::kF8E5M2:
      static_cast<__nv_fp8_storage_t*>(p)[i] =
          __nv_cvt_double_to_fp8(v, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E5M2);
      return;
  }
}

__global__ void cast_kernel(void* dst, DType dst_t, const void* src, DType src_t, long long n,
                            bool saturate) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    store_any(dst, dst_t, i, load_any(src, src_t, i), saturate);
  }
}

class CudaRuntime final : public DeviceRuntime {
 public:
  std::shared_ptr<std::byte> allocate(std::size_t bytes) override {
    return allocator_.allocate(bytes);
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            std::size_t bytes) override {
    if (bytes == 0) return;
    const cudaMemcpyKind kind =
        dst_device == Device::kCpu
            ? (src_device == Device::kCpu ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
            : (src_device == Device::kCpu ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
    TPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, t_stream));
    // Host memory may be pageable and may die when the caller returns: wait for any copy
    // that touches it.
    if (kind != cudaMemcpyDeviceToDevice) {
      trace_wait(kind == cudaMemcpyDeviceToHost ? "copy to the host" : "copy from the host", bytes);
      TPCHECK_CUDA_CHECK(cudaStreamSynchronize(t_stream));
    }
  }
  void copy_rows(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                 std::size_t row_bytes, std::size_t rows) override {
    if (row_bytes == 0 || rows == 0) return;
    TPCHECK_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                         cudaMemcpyDeviceToDevice, t_stream));
  }
  void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n,
            CastMode mode) override {
    if (n == 0) return;
    // f4e2m1 / f8e8m0 are quantization storage: the quantization kernels write them
    // (src/quant), a plain cast does not.
    for (DType t : {dst_dtype, src_dtype}) {
      TPCHECK_CHECK_INPUT(t != DType::kF4E2M1 && t != DType::kF8E8M0,
                          "GPU cast {} -> {}: {} tensors are written by quantization only",
                          dtype_name(src_dtype), dtype_name(dst_dtype), dtype_name(t));
    }
    cast_kernel<<<grid_for(n), 256, 0, t_stream>>>(dst, dst_dtype, src, src_dtype, n,
                                                    mode == CastMode::kSaturate);
    TPCHECK_LAUNCH_CHECK();
  }
  void fill_zero(void* dst, std::size_t bytes) override {
    if (bytes == 0) return;
    TPCHECK_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, t_stream));
  }
  void generate(void* dst, DType dtype, std::int64_t n, int fill_kind, double a, double b,
                std::uint64_t seed, std::uint64_t name_hash, const GlobalIndexMap& map) override {
    launch_generate(dst, dtype, n, fill_kind, a, b, seed, name_hash, map);
  }
  void perturb_f64(double* values, std::int64_t n, double u, std::uint64_t seed,
                   std::uint64_t first_counter) override {
    launch_perturb_f64(values, n, u, seed, first_counter);
  }
  void synchronize() override { TPCHECK_CUDA_CHECK(cudaStreamSynchronize(t_stream)); }

  std::size_t reserved() { return allocator_.reserved(); }
  CachingAllocator& allocator() { return allocator_; }

 private:
  CachingAllocator allocator_;
};

CudaRuntime& runtime_instance() {
  static CudaRuntime* runtime = new CudaRuntime();  // never destroyed: outlives every tensor
  return *runtime;
}

}  // namespace

cudaStream_t current_stream() { return t_stream; }

void set_current_stream(int device, cudaStream_t stream) {
  t_device = device;
  t_stream = stream;
  TPCHECK_CUDA_CHECK(cudaSetDevice(device));
}

DeviceRuntime& install_cuda_runtime() {
  static std::once_flag once;
  std::call_once(once, [] { register_device_runtime(Device::kCuda, &runtime_instance()); });
  return runtime_instance();
}

std::size_t allocator_bytes_reserved() { return runtime_instance().reserved(); }

void allocator_adopt_stream(int device, cudaStream_t stream) {
  runtime_instance().allocator().adopt_stream(device, stream);
}

void allocator_retire_stream(int device, cudaStream_t stream) {
  runtime_instance().allocator().retire_stream(device, stream);
}

}  // namespace tpcheck::cuda

// cuda_runtime.h — the CUDA DeviceRuntime (caching allocator, copies, casts) and the
// per-thread current stream and device.
//
// Each rank thread owns one stream; `set_current_stream` (called by CudaBackend on its
// thread) makes every Tensor operation and kernel of that thread run on it. A thread
// that never set one uses the legacy default stream of device 0.
//
// Caching allocator: blocks are rounded up (512 B granularity; powers of two above 1 MiB
// are not used — sizes round to 2 MiB multiples there) and cached per (device, stream,
// size). A block freed by a tensor goes back to the pool of the stream it was allocated
// on, so it is only reused by work ordered after its last use on that stream; when that
// stream is retired (synchronized, then destroyed: a rank's backend at the end of a run)
// its blocks move to the device's idle pool, which any stream reuses. A block freed by a
// thread whose current stream is another one of the same device carries an event recorded
// on that stream, and its next user's stream waits for it (the thread's queued reads of
// it stay ahead of the next writes). A tensor read on another stream but freed by its own
// (an emulated collective reading a peer's buffer) must still be ordered by that reader
// before it is released (the collectives do: device_group.cpp). cudaMalloc runs
// only when a pool has no block; on cudaErrorMemoryAllocation the pools are emptied
// (cudaFree) once and the allocation retried, then Error(kRuntime) "out of device memory".
// Thread safety: everything here may be called from any thread.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/device_runtime.h"

namespace tpcheck::cuda {

// The calling thread's stream and device (set by the rank's CudaBackend).
cudaStream_t current_stream();
void set_current_stream(int device, cudaStream_t stream);

// Registers the CUDA runtime with Tensor (idempotent) and returns it.
DeviceRuntime& install_cuda_runtime();

// Bytes currently held by the caching allocator (in use + cached), for reports.
std::size_t allocator_bytes_reserved();

// Stream lifetime for the allocator (CudaBackend calls them): adopt after creating a
// stream; retire after synchronizing it, before destroying it — its blocks then move to
// the device's idle pool, which later streams reuse.
void allocator_adopt_stream(int device, cudaStream_t stream);
void allocator_retire_stream(int device, cudaStream_t stream);

// Kernels behind DeviceRuntime::generate and ::perturb_f64 (random.cu), on the calling
// thread's stream.
void launch_generate(void* dst, DType dtype, std::int64_t n, int fill_kind, double a, double b,
                     std::uint64_t seed, std::uint64_t name_hash, const GlobalIndexMap& map);
void launch_perturb_f64(double* values, std::int64_t n, double u, std::uint64_t seed,
                        std::uint64_t first_counter);

// Launch geometry for a 1-D grid-stride loop over n elements.
inline unsigned grid_for(long long n, unsigned block = 256) {
  long long g = (n + block - 1) / block;
  if (g < 1) g = 1;
  if (g > 65535LL * 16) g = 65535LL * 16;
  return static_cast<unsigned>(g);
}

}  // namespace tpcheck::cuda

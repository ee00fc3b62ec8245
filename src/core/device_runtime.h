// device_runtime.h — the memory services a device kind provides to Tensor.
//
// tpcheck_core knows no CUDA. A device Tensor's allocation, copies, casts and fills go
// through the DeviceRuntime registered for its Device; the CUDA library registers its
// runtime (caching allocator, stream-ordered copies and cast kernels) when a CUDA backend
// is made. A device tensor made before that, or in a build without CUDA, is an
// Error(kInput) that says so.
//
// Streams: every operation runs on the calling thread's current stream (each rank thread
// sets its own) and returns without waiting, except copies to the host, which wait.
// Thread safety: implementations are safe to call from any thread; registration happens
// before the first device tensor and never changes after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tpcheck/dtype.h"
#include "tpcheck/tensor.h"

namespace tpcheck {

// Where each element of a generated shard sits in the global tensor: local element
// (outer, row, col), with `row` along the sharded dimension and `inner` elements after
// it, is global element (outer · global_rows + row_map[row]) · inner + col. An empty
// row_map is the identity (a replicated or unsharded tensor).
struct GlobalIndexMap {
  std::int64_t inner = 1;
  std::int64_t global_rows = 1;
  std::vector<std::int64_t> row_map;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // `bytes` of device memory (uninitialized), released when the last owner lets go.
  virtual std::shared_ptr<std::byte> allocate(std::size_t bytes) = 0;
  // Copies between host and this device, or within this device.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device,
                    std::size_t bytes) = 0;
  // `rows` rows of `row_bytes` bytes, device to device, with row pitches in bytes.
  virtual void copy_rows(void* dst, std::size_t dst_pitch, const void* src,
                         std::size_t src_pitch, std::size_t row_bytes, std::size_t rows) = 0;
  // dst[i] = src[i] converted, one rounding (nearest even) from the exact source value.
  virtual void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n,
                    CastMode mode) = 0;
  virtual void fill_zero(void* dst, std::size_t bytes) = 0;
  // dst[i] = random_math::fill_value(fill_kind, a, b, seed, name_hash, global(i)) rounded
  // once to `dtype`, global(i) from `map` (rng.h's generate on the device).
  virtual void generate(void* dst, DType dtype, std::int64_t n, int fill_kind, double a, double b,
                        std::uint64_t seed, std::uint64_t name_hash, const GlobalIndexMap& map) = 0;
  // values[i] *= random_math::probe_factor(u, seed, first_counter + i): the rounding
  // probe (tpcheck/backend.h) applied to a stored f64 tensor.
  virtual void perturb_f64(double* values, std::int64_t n, double u, std::uint64_t seed,
                           std::uint64_t first_counter) = 0;
  // Waits for the calling thread's stream.
  virtual void synchronize() = 0;
};

// Registers the runtime for `device` (kCuda). REQUIRES: runtime outlives every tensor.
void register_device_runtime(Device device, DeviceRuntime* runtime);
// The runtime for `device`; throws Error(kInput) when none is registered.
DeviceRuntime& device_runtime(Device device);

}  // namespace tpcheck

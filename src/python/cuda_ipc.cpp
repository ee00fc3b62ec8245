// cuda_ipc.cpp — device memory shared between the rank processes of `tpcheck emulate`
// (python/tpcheck/emulate/cuda_ipc.py) through CUDA IPC, owned and released explicitly.
//
//   ipc_alloc(nbytes, device) -> (address, handle)
//       cudaMalloc of nbytes on GPU `device` and its IPC handle (64 bytes) for the peers.
//   ipc_open(handle, device) -> address
//       Maps a peer's allocation (its handle) into this process; `device` is the GPU the
//       allocation is on (cudaIpcMemLazyEnablePeerAccess: another current GPU may read it).
//   ipc_export(address, device) -> (handle, offset, size)
//       The IPC handle of the allocation that holds `address` — memory another allocator
//       made with cudaMalloc, e.g. a tensor of torch's caching allocator — the address's
//       offset in it and the allocation's size, so that peers read and write the tensor in
//       place (ipc_open maps the whole allocation; a peer views it once, whole). The
//       allocation's start comes from the driver's cuMemGetAddressRange, looked up in
//       libcuda at run time (the extension does not link the driver, so it imports on
//       machines without one). Memory from cuMemCreate (torch's expandable segments) has no
//       such handle: RuntimeError, and the caller stages.
//   ipc_close(address, device)   unmaps what ipc_open mapped.
//   ipc_free(address, device)    frees what ipc_alloc allocated.
//   cuda_bytes(address, nbytes, device) -> torch.Tensor
//       A torch uint8 CUDA tensor of nbytes viewing that memory; it does not own it (the
//       caller keeps the allocation or mapping alive while any view is in use).
//
// Why not torch's storage sharing (_share_cuda_ / _new_shared_cuda): it gives every shared
// storage a cross-process reference counter that consumers decrement when they release it,
// and torch warns at exit ("Producer process has been terminated before all shared CUDA
// tensors released") whenever one is still alive. The emulation's staging buffers live as
// long as the processes and are read by N - 1 peers, so that counter never settles; here
// the lifetime is the caller's: open/close and alloc/free at known points.
//
// Why the addresses work in torch kernels: this extension links cudart statically
// (CUDA::cudart_static) and torch has its own cudart, but both runtimes use the device's
// primary context, so memory allocated or mapped here is valid for torch's kernels of the
// same process on the same GPU (NCCL, also with its own runtime, relies on the same).
//
// Every function sets `device` current for its calls and restores the caller's device.
// Errors: a CUDA error → RuntimeError naming the call, the GPU and cudaGetErrorString; a
// bad argument → ValueError naming it. Built without CUDA: RuntimeError.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <utility>

#ifdef TPCHECK_HAVE_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace tpcheck::python {
namespace {

#ifdef TPCHECK_HAVE_CUDA
constexpr std::size_t kHandleBytes = sizeof(cudaIpcMemHandle_t);
static_assert(kHandleBytes == 64, "CUDA IPC memory handles are 64 bytes");

[[noreturn]] void fail(const char* fn, const char* call, int device, cudaError_t err) {
  // Clears this runtime's last error (a non-sticky one would otherwise be reported again
  // by the next unrelated call that checks cudaGetLastError).
  cudaGetLastError();
  throw std::runtime_error(fmt::format("{}: {} failed on GPU {}: {} ({})", fn, call, device,
                                       cudaGetErrorString(err), static_cast<int>(err)));
}

void check(cudaError_t err, const char* fn, const char* call, int device) {
  if (err != cudaSuccess) fail(fn, call, device, err);
}

void check_device(const char* fn, int device) {
  if (device < 0) {
    throw nb::value_error(
        fmt::format("{}: device {} is not a GPU index (0 or more)", fn, device).c_str());
  }
}

// Makes `device` current, and the caller's device current again on leaving (torch's current
// device is its own runtime's, but the primary contexts are shared; the calls here must not
// move this runtime's current device under ring_fold_cuda's feet either).
class DeviceScope {
 public:
  DeviceScope(const char* fn, int device) {
    check_device(fn, device);
    check(cudaGetDevice(&previous_), fn, "cudaGetDevice", device);
    if (previous_ != device) {
      check(cudaSetDevice(device), fn, "cudaSetDevice", device);
      restore_ = true;
    }
  }
  ~DeviceScope() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};
#endif

std::pair<std::uintptr_t, nb::bytes> ipc_alloc(std::int64_t nbytes, int device) {
  if (nbytes <= 0) {
    throw nb::value_error(
        fmt::format("ipc_alloc: nbytes {} on GPU {}; expected 1 or more", nbytes, device).c_str());
  }
#ifdef TPCHECK_HAVE_CUDA
  cudaIpcMemHandle_t handle;
  void* ptr = nullptr;
  {
    nb::gil_scoped_release unlocked;
    DeviceScope scope("ipc_alloc", device);
    check(cudaMalloc(&ptr, static_cast<std::size_t>(nbytes)), "ipc_alloc",
          fmt::format("cudaMalloc of {} bytes", nbytes).c_str(), device);
    const cudaError_t err = cudaIpcGetMemHandle(&handle, ptr);
    if (err != cudaSuccess) {
      cudaFree(ptr);  // not shareable: nothing keeps it
      fail("ipc_alloc", "cudaIpcGetMemHandle", device, err);
    }
  }
  return {reinterpret_cast<std::uintptr_t>(ptr),
          nb::bytes(reinterpret_cast<const char*>(&handle), kHandleBytes)};
#else
  throw std::runtime_error("ipc_alloc: this tpcheck was built without CUDA");
#endif
}

std::uintptr_t ipc_open(nb::bytes handle, int device) {
#ifdef TPCHECK_HAVE_CUDA
  if (handle.size() != kHandleBytes) {
    throw nb::value_error(fmt::format("ipc_open: a handle of {} bytes for GPU {}; CUDA IPC "
                                      "handles are {} bytes (from ipc_alloc)",
                                      handle.size(), device, kHandleBytes)
                              .c_str());
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.c_str(), kHandleBytes);
  void* ptr = nullptr;
  {
    nb::gil_scoped_release unlocked;
    DeviceScope scope("ipc_open", device);
    check(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess), "ipc_open",
          "cudaIpcOpenMemHandle", device);
  }
  return reinterpret_cast<std::uintptr_t>(ptr);
#else
  (void)handle, (void)device;
  throw std::runtime_error("ipc_open: this tpcheck was built without CUDA");
#endif
}

#ifdef TPCHECK_HAVE_CUDA
// cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr ptr), from libcuda
// (already loaded by the CUDA runtime when a GPU is in use).
using AddressRangeFn = int (*)(unsigned long long*, std::size_t*, unsigned long long);

AddressRangeFn address_range_fn() {
  static AddressRangeFn fn = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    return lib == nullptr ? nullptr
                          : reinterpret_cast<AddressRangeFn>(dlsym(lib, "cuMemGetAddressRange_v2"));
  }();
  return fn;
}
#endif

std::tuple<nb::bytes, std::int64_t, std::int64_t> ipc_export(std::uintptr_t address,
                                                               int device) {
#ifdef TPCHECK_HAVE_CUDA
  if (address == 0) throw nb::value_error("ipc_export: address 0");
  const AddressRangeFn range = address_range_fn();
  if (range == nullptr) {
    throw std::runtime_error("ipc_export: cuMemGetAddressRange_v2 not found in libcuda.so.1");
  }
  cudaIpcMemHandle_t handle;
  unsigned long long base = 0;
  std::size_t size = 0;
  {
    nb::gil_scoped_release unlocked;
    DeviceScope scope("ipc_export", device);
    const int rc = range(&base, &size, address);
    if (rc != 0) {
      throw std::runtime_error(fmt::format(
          "ipc_export: cuMemGetAddressRange failed on GPU {} for address {:#x} (CUresult {})",
          device, address, rc));
    }
    check(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)), "ipc_export",
          "cudaIpcGetMemHandle", device);
  }
  return {nb::bytes(reinterpret_cast<const char*>(&handle), kHandleBytes),
          static_cast<std::int64_t>(address - base), static_cast<std::int64_t>(size)};
#else
  (void)address, (void)device;
  throw std::runtime_error("ipc_export: this tpcheck was built without CUDA");
#endif
}

void ipc_close(std::uintptr_t address, int device) {
#ifdef TPCHECK_HAVE_CUDA
  if (address == 0) throw nb::value_error("ipc_close: address 0 was never opened");
  nb::gil_scoped_release unlocked;
  DeviceScope scope("ipc_close", device);
  check(cudaIpcCloseMemHandle(reinterpret_cast<void*>(address)), "ipc_close",
        "cudaIpcCloseMemHandle", device);
#else
  (void)address, (void)device;
  throw std::runtime_error("ipc_close: this tpcheck was built without CUDA");
#endif
}

void ipc_free(std::uintptr_t address, int device) {
#ifdef TPCHECK_HAVE_CUDA
  if (address == 0) throw nb::value_error("ipc_free: address 0 was never allocated");
  nb::gil_scoped_release unlocked;
  DeviceScope scope("ipc_free", device);
  check(cudaFree(reinterpret_cast<void*>(address)), "ipc_free", "cudaFree", device);
#else
  (void)address, (void)device;
  throw std::runtime_error("ipc_free: this tpcheck was built without CUDA");
#endif
}

using CudaBytes =
    nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cuda>;

CudaBytes cuda_bytes(std::uintptr_t address, std::int64_t nbytes, int device) {
#ifdef TPCHECK_HAVE_CUDA
  if (address == 0) throw nb::value_error("cuda_bytes: address 0");
  if (nbytes < 0) {
    throw nb::value_error(fmt::format("cuda_bytes: nbytes {}; expected 0 or more", nbytes).c_str());
  }
  check_device("cuda_bytes", device);
  // No owner: the memory is the caller's (ipc_alloc / ipc_open), freed explicitly.
  return CudaBytes(reinterpret_cast<void*>(address), {static_cast<std::size_t>(nbytes)},
                   nb::handle(), {1}, nb::dtype<std::uint8_t>(), nb::device::cuda::value, device);
#else
  (void)address, (void)nbytes, (void)device;
  throw std::runtime_error("cuda_bytes: this tpcheck was built without CUDA");
#endif
}

}  // namespace
}  // namespace tpcheck::python

// Registered from bindings.cpp's NB_MODULE with one line.
void tpcheck_register_cuda_ipc(nb::module_& m) {
  using namespace tpcheck::python;
  m.def("ipc_alloc", &ipc_alloc, "nbytes"_a, "device"_a,
        "cudaMalloc on a GPU and the allocation's CUDA IPC handle: (address, handle).");
  m.def("ipc_open", &ipc_open, "handle"_a, "device"_a,
        "Maps a peer process's allocation (its IPC handle) here; its address.");
  m.def("ipc_export", &ipc_export, "address"_a, "device"_a,
        "The IPC handle of the cudaMalloc allocation holding address, the offset in it and "
        "its size.");
  m.def("ipc_close", &ipc_close, "address"_a, "device"_a, "Unmaps what ipc_open mapped.");
  m.def("ipc_free", &ipc_free, "address"_a, "device"_a, "Frees what ipc_alloc allocated.");
  // rv_policy::reference: nanobind copies an ndarray without an owner under the default
  // policy (a clone in torch); the view must alias the shared memory.
  m.def("cuda_bytes", &cuda_bytes, "address"_a, "nbytes"_a, "device"_a, nb::rv_policy::reference,
        "A torch uint8 CUDA tensor viewing nbytes at address on a GPU, not owning them.");
}

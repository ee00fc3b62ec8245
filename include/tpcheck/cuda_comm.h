// tpcheck/cuda_comm.h — communicators for CUDA ranks (no CUDA or NCCL headers here).
//
// Two kinds:
//   * the device group: N ranks as threads on ONE GPU (NCCL refuses two ranks on one GPU,
//     "Duplicate GPU detected"); collectives are kernels reading the peers' device buffers,
//     summing in NCCL's ring order with NCCL's per-step rounding (CommOrder::kNcclRing,
//     default) or in rank order rounded once (CommOrder::kRank, the CPU semantics). See
//     comm.h for the exact promise and src/comm/ring_reference.h for the NCCL settings it
//     reproduces (NCCL_ALGO=Ring, NCCL_PROTO=Simple, one channel, 2 MiB chunks, ring
//     0 → 1 → ... → N-1).
//   * NCCL: one rank per GPU, in one process (one thread per GPU, run_nccl_group) or one
//     process per rank (mpirun / torchrun, connect_nccl_process_group).
// Streams: every collective runs on the calling thread's current stream (the rank's
// CudaBackend sets it: make the backend inside the body, on the rank's thread) and returns
// when its result is complete (a deadline-bounded poll, never a blocking CUDA call).
// Failure: as comm.h — a rank that throws aborts the group; the others get
// Error(kAborted) "rank R failed: ..." within the timeout. NCCL communicators are
// non-blocking (ncclConfig_t.blocking = 0); on a timeout or an error they are aborted
// (ncclCommAbort) and the rank throws. NCCL_NVLS_ENABLE is set to 0 before any NCCL call
// when it is unset (NVLink multicast is never turned on by tpcheck).
// Built without CUDA, every function here but nccl_process_launch_from_env throws
// Error(kInput) "built without CUDA".
// Thread safety: the launchers may be called from any thread; each Communicator is used by
// its own rank's thread (comm.h).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tpcheck/comm.h"

namespace tpcheck {

// ---- device group: N ranks on one GPU ------------------------------------------------
struct CudaGroupOptions {
  int device = 0;                         // the GPU every rank runs on
  CommOrder order = CommOrder::kNcclRing;  // --comm-order
  std::chrono::milliseconds timeout{10000};
  // kNcclRing: NCCL's all-reduce chunk (NCCL_BUFFSIZE / 2 with Simple; default 4 MiB / 2).
  std::size_t nccl_chunk_bytes = std::size_t{2} << 20;
};

// Runs body(comm) for ranks 0..world-1 on `world` threads, one device-local communicator
// each, and joins them. REQUIRES (checked, Error(kInput)): 1 <= world <= 64, a GPU.
// The body makes its CudaBackend (device options.device) first. Rethrows the failing
// rank's exception (an Error naming the rank), as run_thread_group does.
void run_device_group(int world, const std::function<void(Communicator&)>& body,
                      CudaGroupOptions options = {});
using DeviceGroupOptions = CudaGroupOptions;  // the name the runner uses

// ---- NCCL: one rank per GPU ------------------------------------------------------------
struct NcclOptions {
  // How long init or one collective may take before the communicator is aborted.
  std::chrono::milliseconds timeout{10000};
  // Processes (b): how long the TCP rendezvous waits for all ranks to connect (processes
  // start with seconds of skew under mpirun).
  std::chrono::milliseconds connect_timeout{60000};
};

// The 128-byte ncclUniqueId, as bytes.
struct NcclId {
  std::array<char, 128> bytes{};
};
// A fresh id (ncclGetUniqueId), made by one rank and shared with the others.
NcclId make_nccl_id();

// Rank `rank` of `world` on GPU `device` (cudaSetDevice on the calling thread), joined
// through `id`; every rank must call it concurrently (init completes when all have).
// Throws Error(kRuntime) naming the rank when init fails or times out.
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world, int device,
                                                     const NcclId& id, NcclOptions options = {});

// (a) One process: rank r on GPU r, one thread each, one shared id; runs body(comm) on each
// thread and joins them; a rank that throws aborts the others' NCCL communicators at once.
// REQUIRES (Error(kInput)): 1 <= world <= the number of GPUs.
void run_nccl_group(int world, const std::function<void(Communicator&)>& body,
                    NcclOptions options = {});

// (a), kept for many runs: the same group, but its communicators are made on the first
// run() and reused by every later one, so a suite of a hundred cases pays NCCL's
// initialization (about half a second for two GPUs) once instead of once per case. Each
// run() starts `world` fresh threads (rank r on GPU r) and joins them, with the failure
// contract of run_nccl_group. After a failed run every communicator is aborted and a later
// run() throws Error(kRuntime) saying so. The destructor finalizes the communicators, one
// thread per rank, and never throws.
// Thread safety: one run() at a time.
class NcclThreadGroup {
 public:
  explicit NcclThreadGroup(int world, NcclOptions options = {});
  ~NcclThreadGroup();
  NcclThreadGroup(const NcclThreadGroup&) = delete;
  NcclThreadGroup& operator=(const NcclThreadGroup&) = delete;

  void run(const std::function<void(Communicator&)>& body);
  int size() const { return world_; }

 private:
  struct State;  // the NCCL id and the communicators (nccl_communicator.cpp)
  int world_;
  std::unique_ptr<State> state_;
};

// (b) One process per rank, started by mpirun or torchrun.
struct NcclProcessLaunch {
  std::string launcher;  // "mpirun" (OMPI_COMM_WORLD_*) or "torchrun" (RANK, WORLD_SIZE, ...)
  int rank = 0;
  int world = 1;
  int local_rank = 0;  // the GPU this rank uses
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR, else this default
  int master_port = 29533;                // MASTER_PORT, else this default
  // The NCCL id when the launcher already shared it (set_process_nccl_id); then no TCP
  // rendezvous happens.
  std::optional<NcclId> id;
};

// (c) A launcher that shares bytes between its processes itself — torchrun's store,
// through the Python package (`python -m tpcheck run` under torchrun: rank 0 makes the
// id with make_nccl_id and puts it in the process group's store, every rank reads it and
// calls this). Call before the run: nccl_process_launch_from_env() then carries the id,
// and connect_nccl_process_group joins through it instead of listening on MASTER_PORT
// (where torchrun's own store already listens). Without the TCP connections there is no
// failure channel: a rank that dies is seen by the others when their NCCL operation
// times out (NcclOptions::timeout), still an error, never a hang.
void set_process_nccl_id(const NcclId& id);
// The launch this process belongs to, read from the environment: OMPI_COMM_WORLD_RANK /
// _SIZE / _LOCAL_RANK (OpenMPI's mpirun), else RANK / WORLD_SIZE / LOCAL_RANK (torchrun);
// MASTER_ADDR / MASTER_PORT in both cases (mpirun on one node needs neither). nullopt when
// neither set is present. Malformed values are Error(kInput) naming the variable.
// `id` is the one given to set_process_nccl_id, if any.
std::optional<NcclProcessLaunch> nccl_process_launch_from_env();

// Joins the process group: rank 0 listens on master_port (all interfaces) and sends the
// NCCL id to every rank that connects to master_addr:master_port (each retries until the
// timeout); the connections stay open as a failure channel (a rank that fails reports it,
// a process that exits is seen as a closed connection), so the others abort and name it.
// Then make_nccl_communicator(rank, world, local_rank, id). Errors name the rank, the
// address and what was expected.
std::unique_ptr<Communicator> connect_nccl_process_group(const NcclProcessLaunch& launch,
                                                         NcclOptions options = {});

}  // namespace tpcheck

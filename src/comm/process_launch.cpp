// process_launch.cpp — nccl_process_launch_from_env (tpcheck/cuda_comm.h): which rank of
// which launch this process is, from mpirun's or torchrun's environment. No CUDA.
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>

#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int fallback, int lo, int hi) {
  std::optional<std::string> v = env(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  TPCHECK_CHECK_INPUT(errno == 0 && end != v->c_str() && *end == '\0' && x >= lo && x <= hi,
                      "environment variable {}='{}' is not an integer in {}..{}", name, *v, lo, hi);
  return static_cast<int>(x);
}

std::mutex g_id_mutex;
std::optional<NcclId> g_process_id;  // set_process_nccl_id

}  // namespace

void set_process_nccl_id(const NcclId& id) {
  std::lock_guard<std::mutex> lock(g_id_mutex);
  g_process_id = id;
}

std::optional<NcclProcessLaunch> nccl_process_launch_from_env() {
  NcclProcessLaunch l;
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    l.launcher = "mpirun";
    l.world = env_int("OMPI_COMM_WORLD_SIZE", -1, 1, 1 << 20);
    TPCHECK_CHECK_INPUT(l.world >= 1, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    l.rank = env_int("OMPI_COMM_WORLD_RANK", -1, 0, l.world - 1);
    TPCHECK_CHECK_INPUT(l.rank >= 0, "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", l.rank, 0, 1 << 20);
  } else if (env("RANK") && env("WORLD_SIZE")) {
    l.launcher = "torchrun";
    l.world = env_int("WORLD_SIZE", 1, 1, 1 << 20);
    l.rank = env_int("RANK", 0, 0, l.world - 1);
    l.local_rank = env_int("LOCAL_RANK", l.rank, 0, 1 << 20);
  } else {
    return std::nullopt;
  }
  if (std::optional<std::string> addr = env("MASTER_ADDR")) l.master_addr = *addr;
  l.master_port = env_int("MASTER_PORT", l.master_port, 1, 65535);
  std::lock_guard<std::mutex> lock(g_id_mutex);
  l.id = g_process_id;
  return l;
}

}  // namespace tpcheck

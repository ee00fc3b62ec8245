// cuda_libraries.cpp — see cuda_libraries.h. With TPCHECK_CUDA_DLOPEN: the loader and one
// forwarder per cuBLASLt / NCCL function tpcheck calls (each defined with the header's own
// declaration, so a signature that drifts from the header does not compile). Without it
// (the development build links both libraries): the queries say they are there.
#include "backend/cuda/cuda_libraries.h"

#include <cublasLt.h>
#include <nccl.h>

#include <string>

#include "tpcheck/error.h"

#ifndef TPCHECK_CUDA_DLOPEN

namespace tpcheck::cuda {
std::string cublaslt_unavailable() { return {}; }
std::string nccl_unavailable() { return {}; }
void require_cublaslt() {}
void require_nccl() {}
std::string cublaslt_location() { return "linked"; }
std::string nccl_location() { return "linked"; }
}  // namespace tpcheck::cuda

#else  // TPCHECK_CUDA_DLOPEN

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#define TPCHECK_STRINGIZE_(x) #x
#define TPCHECK_STRINGIZE(x) TPCHECK_STRINGIZE_(x)

namespace tpcheck::cuda {
namespace {

struct Library {
  Library(const char* title_, const char* variable_, const char* soname_, const char* needed_,
          std::vector<const char*> pip_dirs_)
      : title(title_), variable(variable_), soname(soname_), needed(needed_),
        pip_dirs(std::move(pip_dirs_)) {}
  const char* title;     // "cuBLASLt"
  const char* variable;  // the environment variable that names the file
  const char* soname;    // "libcublasLt.so.13"
  const char* needed;    // what provides it, for the message
  std::vector<const char*> pip_dirs;  // below site-packages
  std::once_flag once;
  void* handle = nullptr;
  std::string path;     // where it was loaded from
  std::string failure;  // why it was not
};

Library& cublaslt_library() {
  static Library lib{
      "cuBLASLt", "TPCHECK_CUBLASLT_LIBRARY", "libcublasLt.so." TPCHECK_STRINGIZE(CUBLAS_VER_MAJOR),
      "CUDA " TPCHECK_STRINGIZE(CUBLAS_VER_MAJOR) "'s cuBLAS (pip: nvidia-cublas, which PyTorch's "
      "CUDA " TPCHECK_STRINGIZE(CUBLAS_VER_MAJOR) " wheels install; or the CUDA toolkit)",
      {"nvidia/cu" TPCHECK_STRINGIZE(CUBLAS_VER_MAJOR) "/lib", "nvidia/cublas/lib"}};
  return lib;
}

Library& nccl_library() {
  static Library lib{"NCCL", "TPCHECK_NCCL_LIBRARY", "libnccl.so." TPCHECK_STRINGIZE(NCCL_MAJOR),
                     "NCCL " TPCHECK_STRINGIZE(NCCL_MAJOR) " (pip: nvidia-nccl-cu" TPCHECK_STRINGIZE(
                         CUBLAS_VER_MAJOR) ", which PyTorch's CUDA wheels install)",
                     {"nvidia/nccl/lib"}};
  return lib;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string parent(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// The folders after the plain soname: pip's packages beside this file's shared object
// (site-packages/tpcheck/_tpcheck*.so → site-packages), then the CUDA toolkit.
std::vector<std::string> search_dirs(const Library& lib) {
  std::vector<std::string> dirs;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&search_dirs), &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] == '/') {
    const std::string site_packages = parent(parent(info.dli_fname));
    for (const char* d : lib.pip_dirs) dirs.push_back(site_packages + "/" + d);
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* home = std::getenv(var);
    if (home != nullptr && *home != '\0') {
      dirs.push_back(std::string(home) + "/lib64");
      dirs.push_back(std::string(home) + "/lib");
    }
  }
  dirs.push_back("/usr/local/cuda/lib64");
  dirs.push_back("/usr/local/cuda/lib");
  return dirs;
}

void load(Library& lib) {
  std::call_once(lib.once, [&lib] {
    std::string tried;
    auto attempt = [&](const std::string& file) {
      dlerror();
      void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) {
        lib.handle = handle;
        lib.path = file;
        link_map* map = nullptr;  // the file a soname resolved to
        if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
            map->l_name[0] != '\0') {
          lib.path = map->l_name;
        }
        return true;
      }
      const char* why = dlerror();  // names the file
      tried += "\n  " + (why != nullptr ? std::string(why) : file + ": not loadable");
      return false;
    };
    const char* named = std::getenv(lib.variable);
    if (named != nullptr && *named != '\0') {
      if (!attempt(named)) {
        lib.failure = std::string(lib.title) + " could not be loaded from " + lib.variable + "=" +
                      named + ":" + tried + "\nName the " + lib.soname + " of " + lib.needed +
                      " there, or unset " + lib.variable + " to search for it.";
      }
      return;
    }
    if (attempt(lib.soname)) return;
    std::string looked;
    for (const std::string& dir : search_dirs(lib)) {
      const std::string file = dir + "/" + lib.soname;
      if (is_file(file)) {
        if (attempt(file)) return;
      } else {
        looked += (looked.empty() ? "" : ", ") + dir;
      }
    }
    lib.failure = std::string("tpcheck's CUDA side needs ") + lib.title + " (" + lib.soname +
                  ", from " + lib.needed + "), which could not be loaded:" + tried +
                  "\n  not in: " + looked + "\nPut the folder that holds " + lib.soname +
                  " on LD_LIBRARY_PATH, or name the file in " + lib.variable +
                  " (`import torch` first also works when PyTorch has loaded its own copy); "
                  "or run on the CPU (--backend cpu).";
  });
}

void* resolve(Library& lib, const char* symbol) {
  load(lib);
  if (lib.handle == nullptr) throw Error(ErrorKind::kInput, lib.failure);
  void* address = dlsym(lib.handle, symbol);
  if (address == nullptr) {
    throw Error(ErrorKind::kInput,
                std::string(lib.title) + " loaded from " + lib.path + " has no function " + symbol +
                    ": it is older than the one tpcheck was built with (" + lib.soname +
                    "); name a newer one in " + lib.variable);
  }
  return address;
}

}  // namespace

std::string cublaslt_unavailable() {
  load(cublaslt_library());
  return cublaslt_library().failure;
}
std::string nccl_unavailable() {
  load(nccl_library());
  return nccl_library().failure;
}
void require_cublaslt() {
  if (std::string why = cublaslt_unavailable(); !why.empty()) throw Error(ErrorKind::kInput, why);
}
void require_nccl() {
  if (std::string why = nccl_unavailable(); !why.empty()) throw Error(ErrorKind::kInput, why);
}
std::string cublaslt_location() { return cublaslt_library().path; }
std::string nccl_location() { return nccl_library().path; }

}  // namespace tpcheck::cuda

// Each forwarder resolves its function on its first call (a throw leaves it unresolved, so a
// later call tries again after the message) and then calls it.
#define TPCHECK_FORWARD(library, ret, name, params, args)                                     \
  extern "C" ret name params {                                                              \
    static const auto real =                                                                \
        reinterpret_cast<decltype(&::name)>(::tpcheck::cuda::resolve(library(), #name));    \
    return real args;                                                                       \
  }
#define TPCHECK_LT(ret, name, params, args) \
  TPCHECK_FORWARD(::tpcheck::cuda::cublaslt_library, ret, name, params, args)
#define TPCHECK_NCCL(ret, name, params, args) \
  TPCHECK_FORWARD(::tpcheck::cuda::nccl_library, ret, name, params, args)

// The cuBLASLt functions tpcheck calls (src/backend/cuda, src/forensics/cuda).
TPCHECK_LT(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
TPCHECK_LT(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
TPCHECK_LT(size_t, cublasLtGetVersion, (void), ())
TPCHECK_LT(cublasStatus_t, cublasLtMatmul,
           (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
            cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
            const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
            cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
            size_t workspaceSizeInBytes, cudaStream_t stream),
           (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
            workspaceSizeInBytes, stream))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulAlgoCapGetAttribute,
           (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
            size_t sizeInBytes, size_t* sizeWritten),
           (algo, attr, buf, sizeInBytes, sizeWritten))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulAlgoCheck,
           (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
            cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
            cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
            cublasLtMatmulHeuristicResult_t* result),
           (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, algo, result))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulAlgoConfigGetAttribute,
           (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
            size_t sizeInBytes, size_t* sizeWritten),
           (algo, attr, buf, sizeInBytes, sizeWritten))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulAlgoConfigSetAttribute,
           (cublasLtMatmulAlgo_t * algo, cublasLtMatmulAlgoConfigAttributes_t attr, const void* buf,
            size_t sizeInBytes),
           (algo, attr, buf, sizeInBytes))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
           (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
            cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
            cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t preference,
            int requestedAlgoCount, cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
            int* returnAlgoCount),
           (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
            heuristicResultsArray, returnAlgoCount))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulAlgoInit,
           (cublasLtHandle_t handle, cublasComputeType_t computeType, cudaDataType_t scaleType,
            cudaDataType_t Atype, cudaDataType_t Btype, cudaDataType_t Ctype, cudaDataType_t Dtype,
            int algoId, cublasLtMatmulAlgo_t* algo),
           (handle, computeType, scaleType, Atype, Btype, Ctype, Dtype, algoId, algo))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulDescCreate,
           (cublasLtMatmulDesc_t * desc, cublasComputeType_t computeType, cudaDataType_t scaleType),
           (desc, computeType, scaleType))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulDescSetAttribute,
           (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
            size_t sizeInBytes),
           (desc, attr, buf, sizeInBytes))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref),
           (pref))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref),
           (pref))
TPCHECK_LT(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
           (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
            const void* buf, size_t sizeInBytes),
           (pref, attr, buf, sizeInBytes))
TPCHECK_LT(cublasStatus_t, cublasLtMatrixLayoutCreate,
           (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols,
            int64_t ld),
           (layout, type, rows, cols, ld))
TPCHECK_LT(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
TPCHECK_LT(cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
           (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
            size_t sizeInBytes),
           (layout, attr, buf, sizeInBytes))

// The NCCL functions tpcheck calls (src/comm/cuda, src/backend/cuda).
TPCHECK_NCCL(ncclResult_t, ncclGetVersion, (int* version), (version))
TPCHECK_NCCL(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId), (uniqueId))
TPCHECK_NCCL(ncclResult_t, ncclCommInitRankConfig,
             (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config),
             (comm, nranks, commId, rank, config))
TPCHECK_NCCL(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm))
TPCHECK_NCCL(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))
TPCHECK_NCCL(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm))
TPCHECK_NCCL(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError),
             (comm, asyncError))
TPCHECK_NCCL(const char*, ncclGetErrorString, (ncclResult_t result), (result))
TPCHECK_NCCL(const char*, ncclGetLastError, (ncclComm_t comm), (comm))
TPCHECK_NCCL(ncclResult_t, ncclAllReduce,
             (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, op, comm, stream))
TPCHECK_NCCL(ncclResult_t, ncclAllGather,
             (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
              ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, sendcount, datatype, comm, stream))
TPCHECK_NCCL(ncclResult_t, ncclReduceScatter,
             (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, recvcount, datatype, op, comm, stream))
TPCHECK_NCCL(ncclResult_t, ncclBroadcast,
             (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
              ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, root, comm, stream))

#endif  // TPCHECK_CUDA_DLOPEN

#pragma once
// NCCL and cuBLAS loaded with dlopen on first use, so that no ShardScope binary needs
// them (or libcuda, which they open themselves) to start. The function pointers have
// the exact types of the functions declared in nccl.h and cublas_v2.h.

#include <cublas_v2.h>
#include <nccl.h>

#include <string>

namespace shardscope::cuda {

struct NcclApi
{
    bool loaded = false;
    std::string error;   // why it did not load: the names tried and dlerror()
    std::string path;    // the library that was loaded
    std::string version; // "2.28.9"
    decltype(&::ncclGetVersion) getVersion = nullptr;
    decltype(&::ncclGetUniqueId) getUniqueId = nullptr;
    decltype(&::ncclCommInitRank) commInitRank = nullptr;
    decltype(&::ncclCommInitAll) commInitAll = nullptr;
    decltype(&::ncclCommDestroy) commDestroy = nullptr;
    decltype(&::ncclCommAbort) commAbort = nullptr;
    decltype(&::ncclCommGetAsyncError) commGetAsyncError = nullptr;
    decltype(&::ncclGetErrorString) getErrorString = nullptr;
    decltype(&::ncclGetLastError) getLastError = nullptr;
    decltype(&::ncclAllGather) allGather = nullptr;
    decltype(&::ncclBroadcast) broadcast = nullptr;
    decltype(&::ncclReduceScatter) reduceScatter = nullptr;
    decltype(&::ncclAllReduce) allReduce = nullptr;
    decltype(&::ncclGroupStart) groupStart = nullptr;
    decltype(&::ncclGroupEnd) groupEnd = nullptr;
};

struct CublasApi
{
    bool loaded = false;
    std::string error;
    std::string path;
    decltype(&::cublasCreate_v2) create = nullptr;
    decltype(&::cublasDestroy_v2) destroy = nullptr;
    decltype(&::cublasSetStream_v2) setStream = nullptr;
    decltype(&::cublasSetMathMode) setMathMode = nullptr;
    decltype(&::cublasSgemm_v2) sgemm = nullptr;
    decltype(&::cublasGetStatusString) getStatusString = nullptr;
};

// Loaded once, thread-safe; never throw (check loaded / error).
const NcclApi &ncclApi();
const CublasApi &cublasApi();
// The same, but throw CommError saying what is missing and what to do.
const NcclApi &requireNccl();
const CublasApi &requireCublas();

} // namespace shardscope::cuda

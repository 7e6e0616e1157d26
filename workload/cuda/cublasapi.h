#pragma once
// cuBLAS loaded with dlopen on first use (as NCCL is, comm/nccl/ncclapi.h), so that no
// ShardScope binary needs it to start. Only the workload's matrix products (blas.h) use
// it. The function pointers have the exact types of the functions in cublas_v2.h.

#include <cublas_v2.h>

#include <string>

namespace shardscope::cuda {

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

// Loaded once, thread-safe; never throws (check loaded / error).
const CublasApi &cublasApi();
// The same, but throws CommError saying what is missing and what to do.
const CublasApi &requireCublas();

} // namespace shardscope::cuda

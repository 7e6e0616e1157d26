#pragma once
// Turns a failing CUDA runtime call into a CommError that names the call, where it was
// made and CUDA's own message, so a user can tell an out-of-memory from a driver fault.

#include <cuda_runtime_api.h>

#include "comm/communicator.h"

namespace shardscope::comm {

[[noreturn]] void throwCudaError(cudaError_t err, const char *call, const char *file, int line);

inline void checkCuda(cudaError_t err, const char *call, const char *file, int line)
{
    if (err != cudaSuccess) throwCudaError(err, call, file, line);
}

} // namespace shardscope::comm

#define SHARDSCOPE_CUDA_CHECK(call) ::shardscope::comm::checkCuda((call), #call, __FILE__, __LINE__)

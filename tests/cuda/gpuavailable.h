#pragma once
// Why the GPU tests of this binary cannot run here (empty when they can): asked of the
// CUDA runtime directly, not of the code under test.

#include <string>

#if SHARDSCOPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace shardscope::test {

inline int gpuCount()
{
#if SHARDSCOPE_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

inline std::string gpuSkipReason()
{
#if SHARDSCOPE_HAVE_CUDA
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return std::string("no usable CUDA GPU on this machine (") + cudaGetErrorName(err) + ": " +
               cudaGetErrorString(err) + ")";
    }
    if (n == 0) return "no CUDA GPU on this machine";
    return {};
#else
    return "built without CUDA (SHARDSCOPE_CUDA=OFF or nvcc/NCCL not found)";
#endif
}

} // namespace shardscope::test

#define SHARDSCOPE_REQUIRE_GPU()                                                                   \
    do {                                                                                           \
        const std::string why = ::shardscope::test::gpuSkipReason();                               \
        if (!why.empty()) QSKIP(why.c_str());                                                      \
    } while (false)

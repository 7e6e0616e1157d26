// The element-wise add of comm/nccl/deviceadd.h: a grid-stride loop, 256 threads a block.

#include "comm/nccl/deviceadd.h"

#include <cuda_runtime.h>

#include "comm/nccl/cudacheck.h"

namespace shardscope::comm {

namespace {

constexpr int kThreads = 256;

__global__ void addKernel(float *y, const float *x, std::int64_t n)
{
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)
        y[i] += x[i];
}

} // namespace

void addInPlace(float *y, const float *x, std::int64_t n, cudaStream_t stream)
{
    if (n == 0) return;
    const std::int64_t b = (n + kThreads - 1) / kThreads;
    const int blocks = static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
    addKernel<<<blocks, kThreads, 0, stream>>>(y, x, n);
    checkCuda(cudaGetLastError(), "addKernel", __FILE__, __LINE__);
}

} // namespace shardscope::comm

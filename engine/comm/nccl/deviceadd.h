#pragma once
// y += x on the device, the one element-wise kernel the communicator's memory space needs
// (CudaMemory::addF32, the engine's gradient accumulation). The workload's CUDA layers
// use the same kernel (cuda/layers.h: cuda::addInPlace names this one).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace shardscope::comm {

// Enqueued on stream; y and x are device memory of n floats. Throws CommError when the
// launch fails.
void addInPlace(float *y, const float *x, std::int64_t n, cudaStream_t stream);

} // namespace shardscope::comm

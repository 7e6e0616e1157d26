// The CommError text for failing CUDA runtime calls.

#include "comm/nccl/cudacheck.h"

#include <string>

namespace shardscope::comm {

void throwCudaError(cudaError_t err, const char *call, const char *file, int line)
{
    cudaGetLastError(); // clear a sticky-free error so the next call is not blamed for it
    throw comm::CommError(std::string("CUDA call ") + call + " failed (" + file + ":" +
                          std::to_string(line) + "): " + cudaGetErrorName(err) + ": " +
                          cudaGetErrorString(err));
}

} // namespace shardscope::comm

#pragma once
// Chooses the compute/communication backend at run time. Built with or without CUDA:
// without a GPU, a driver or NCCL, `auto` falls back to the CPU and says why in one line,
// and `nccl` fails with a message that says what is missing.

#include <string>
#include <string_view>

#include "comm/communicator.h"

namespace shardscope::cuda {

struct BackendChoice
{
    comm::Backend backend = comm::Backend::Cpu;
    std::string reason; // one line: why this backend was chosen
    int deviceCount = 0;
};

// requested: "cpu", "nccl", "gloo" or "auto" ("gloo" is always available: it needs no GPU). Throws
// CommError when "nccl" cannot be used and std::invalid_argument for any other word.
BackendChoice chooseBackend(std::string_view requested);

} // namespace shardscope::cuda

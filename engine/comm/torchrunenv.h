#pragma once
// The torchrun environment of a process-per-rank run (NCCL or gloo): every process reads
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, as torchrun and
// scripts/launch set them. Qt-free and CUDA-free, so every backend shares one parser.

#include <chrono>
#include <string>

namespace shardscope::comm {

struct RendezvousConfig
{
    int rank = 0;
    int worldSize = 1;
    int localRank = 0;
    std::string masterAddr = "127.0.0.1";
    int masterPort = 29500;
    std::chrono::milliseconds timeout{60000};
};

// True when RANK and WORLD_SIZE are both set: the process is one rank of a launched world.
bool launchedPerRank();

// Reads the torchrun variables (and SHARDSCOPE_RENDEZVOUS_TIMEOUT_S, default 60).
// A missing or malformed variable is a CommError naming it and saying how to set it.
RendezvousConfig rendezvousFromEnv();

} // namespace shardscope::comm

#pragma once
// The torchrun-style rendezvous of one-process-per-GPU NCCL runs: every process reads
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; rank 0 serves a small blob
// (the ncclUniqueId) over TCP and the other ranks fetch it, retrying until a timeout.
// Plain POSIX sockets, no CUDA, so it is built and tested everywhere.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/torchrunenv.h" // RendezvousConfig, rendezvousFromEnv

namespace shardscope::comm {

// Rank 0's side: listens on masterPort as soon as it is constructed (a busy port is a
// CommError right away) and hands blob to each of the other worldSize-1 ranks from a
// background thread, so rank 0 can go on into ncclCommInitRank meanwhile.
class RendezvousServer
{
  public:
    RendezvousServer(const comm::RendezvousConfig &config, std::vector<std::byte> blob);
    ~RendezvousServer(); // stops serving
    RendezvousServer(const RendezvousServer &) = delete;
    RendezvousServer &operator=(const RendezvousServer &) = delete;

    int port() const; // the bound port (masterPort, or the kernel's choice when it was 0)
    // Blocks until every rank has fetched the blob; CommError on timeout or a peer that
    // is not part of this world (a different WORLD_SIZE, a repeated RANK).
    void wait();

    struct Impl;

  private:
    std::unique_ptr<Impl> d;
};

// A non-zero rank's side: connects to masterAddr:masterPort (retrying every 100 ms until
// the timeout) and returns rank 0's blob.
std::vector<std::byte> fetchRendezvousBlob(const comm::RendezvousConfig &config);

} // namespace shardscope::comm

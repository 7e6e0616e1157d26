#pragma once
// The gloo backend: one process per rank, collectives over TCP (gloo's tcp transport), so a
// world spans processes and machines. Ranks meet through rank 0's TcpStore at
// MASTER_ADDR:MASTER_PORT (torchrun's environment, comm/torchrunenv.h). Every collective
// is bounded by a timeout: a rank that dies or stops answering makes the others fail with a
// CommError that names it, never hang. Synchronous, like the threads backend; wrap it with
// makeAsyncCommunicator for overlap_comm. Buffers are host memory.

#include <chrono>
#include <memory>

#include "comm/communicator.h"
#include "comm/torchrunenv.h"

namespace shardscope::comm {

struct GlooOptions
{
    RendezvousConfig rendezvous;
    // Longest a collective may wait for its peers; a silent rank is judged stopped after
    // half of it. A failure is reported within about 1.5 times this.
    std::chrono::milliseconds timeout{60000};
};

// This process's rank of the world described by options.rendezvous: rank 0 serves the
// rendezvous, every rank connects to every other. Throws CommError when the world cannot
// be formed within options.rendezvous.timeout (naming what is missing).
std::unique_ptr<Communicator> makeGlooCommunicator(const GlooOptions &options);

} // namespace shardscope::comm

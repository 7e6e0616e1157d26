#pragma once
// Threads-as-ranks backend: every rank is a thread of this process, collectives work
// directly on the peers' buffers in shared memory and copy each byte once.

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shardscope::comm {

class CpuWorld; // shared rendezvous state of one world

// Creates worldSize communicators (index = rank) that share one world. Each must be
// used by exactly one thread at a time (its rank's thread).
std::vector<std::unique_ptr<Communicator>> makeCpuWorld(int worldSize);

} // namespace shardscope::comm

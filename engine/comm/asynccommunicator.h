#pragma once
// overlap_comm for the threads-as-ranks backend: wraps a synchronous communicator so
// that its collectives run on a progress thread of the rank, in issue order, while the
// rank's thread goes on computing. The engine then takes the same asynchronous path
// (issue, mark in flight, wait before use) on the CPU as with NCCL, and the overlap is real.
//
// Contract for callers:
// - Buffers passed to a collective stay valid and unchanged (send) or untouched (recv)
//   until its handle completes (ready() is true or wait() returned or threw).
// - A failed collective reports its error from wait() to every waiter; ready() is true
//   once it has finished, successfully or not.
// - barrier() returns after every collective issued before it has run.
// - abort() releases this rank: it forwards to the inner communicator (which releases
//   the collective running now, if the backend can) and fails every collective queued
//   but not started with a CommError; later calls throw the same.
// - The destructor runs the collectives still queued, then joins the progress thread:
//   it waits for them, so on a healthy world every peer must issue its matching
//   collectives, or the world must have been aborted.

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shardscope::comm {

// Wraps a synchronous communicator: a progress thread per rank runs its collectives in
// issue order.
std::unique_ptr<Communicator> makeAsyncCommunicator(std::unique_ptr<Communicator> inner);
// Every communicator of a world wrapped (same order).
std::vector<std::unique_ptr<Communicator>>
makeAsyncCommunicators(std::vector<std::unique_ptr<Communicator>> world);

} // namespace shardscope::comm

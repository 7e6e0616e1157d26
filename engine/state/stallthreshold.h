#pragma once
// The one threshold of a stalled collective (issue 51): how long a rank may wait in a
// collective that some rank has not reached before it is said stalled. Read here, once, by
// every part that decides a stall: the job's aligner (sessioncore), the engine's watchdog
// (core), the agents' watchdogs (through the native module) and shardscope-capture.

#include <cstdint>
#include <string>
#include <string_view>

namespace shardscope::state {

// SHARDSCOPE_STALL_SECONDS as nanoseconds: `fallbackNs` when unset; error set (naming the
// variable) and fallbackNs returned for a value that is not a positive number of seconds.
std::uint64_t stallNsFromEnvironment(std::uint64_t fallbackNs, std::string *error);
// The threshold where SHARDSCOPE_STALL_SECONDS is unset: 60 s for a job on NCCL (its
// collectives may legitimately wait for the GPUs), 5 s elsewhere (gloo, the CPU).
std::uint64_t defaultStallNs(std::string_view backend);

} // namespace shardscope::state

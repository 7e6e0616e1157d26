#pragma once
// Which job a process belongs to: every rank process of one training job carries the same
// job id in its discovery file and Welcome, with the global ranks it serves, so a client
// can find and group all ranks of a job (docs/protocol.md, "Jobs").

#include <string>
#include <string_view>
#include <vector>

#include "wire/jsonread.h"

namespace shardscope::wire {

struct JobIdentity
{
    std::string id;         // the job's name; the same in every rank process of the job
    std::vector<int> ranks; // the global ranks this process serves (several for CPU threads)
    int worldSize = 1;
    std::string host; // this process's host name
    // The rendezvous its processes met at ("MASTER_ADDR:MASTER_PORT"; empty when unknown):
    // two runs of one name (torchrun's static rendezvous names every job "none") running at
    // once cannot share it, so (id, rendezvous, world size) tells runs apart (sameRun).
    std::string rendezvous;
};

// True when a and b are processes of one run: the same id, rendezvous and world size.
bool sameRun(const JobIdentity &a, const JobIdentity &b);
// How a user names one run: "ID", or "ID@RENDEZVOUS" when the id alone names several.
std::string runName(const JobIdentity &job);

// The job id, first of: name (InspectorOptions::job, the agent's job=) when not empty;
// TORCHELASTIC_RUN_ID (torchrun, the `deepspeed` launcher); "MASTER_ADDR:MASTER_PORT" when both are
// set (any torchrun-style launcher: the rendezvous address is shared by the job's processes); else
// "<host>-<pid>", a job of this process alone.
JobIdentity jobFromEnvironment(std::string_view name, std::vector<int> ranks, int worldSize);
std::string hostName();

// The "job" member of a discovery file or Welcome.
detail::Json encodeJob(const JobIdentity &job);
// where: the path for messages ("discovery.job"); worldSize bounds the ranks.
JobIdentity decodeJob(const detail::Json &j, const std::string &where);

} // namespace shardscope::wire

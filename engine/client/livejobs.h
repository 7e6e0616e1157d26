#pragma once
// The live engines of a discovery directory grouped by job: every rank process of a
// torchrun/deepspeed job together, ordered by its first rank; an engine without a job id
// (a release before jobs) is a job of its own, "pid N". The one grouping rule the attach
// dialog (through session), JobSession's job:NAME and shardscope-capture --list/--attach use.

#include <set>
#include <string>
#include <vector>

#include "wire/discovery.h"

namespace shardscope::client {

struct LiveJob
{
    std::string id;       // the job's id; "pid N" for an engine without one
    bool named = false;   // the engines announced a job id
    int worldSize = 1;    // the largest of the job's and the engines' world sizes
    std::set<int> ranks;  // the global ranks live processes announce
    std::vector<wire::DiscoveryEntry> processes; // by first rank

    // Ranks of [0, worldSize) no live process announces.
    std::vector<int> missingRanks() const;
};

// Every live engine in dir, grouped; jobs in order of their ids.
std::vector<LiveJob> liveJobs(const std::string &dir);
// The live processes of the named job in dir, by first rank; empty if none.
LiveJob liveJob(const std::string &dir, const std::string &id);

} // namespace shardscope::client

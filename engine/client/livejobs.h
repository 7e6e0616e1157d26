#pragma once
// The live engines of a discovery directory grouped by run: the rank processes of one
// torchrun/deepspeed run together (wire::sameRun: job id, rendezvous, world size), each
// endpoint once, ordered by first rank; an engine without a job id (a release before jobs) is
// a job of its own, "pid N". The one grouping the attach dialog (through session),
// JobSession's job:NAME and shardscope-capture --list/--attach use; which run a name picks is
// wire::selectRun's rule.

#include <set>
#include <string>
#include <vector>

#include "wire/discovery.h"
#include "wire/result.h"

namespace shardscope::client {

struct LiveJob
{
    std::string id;      // what attaches it: the job id, or ID@RENDEZVOUS (wire::runName)
                         // when another live run shares the id; "pid N" for an engine without one
    bool named = false;  // the engines announced a job id
    int worldSize = 1;   // the largest of the job's and the engines' world sizes
    std::set<int> ranks; // the global ranks live processes announce, each once
    // The model the job runs: the first final name its processes announce (ranks still
    // building the model announce a provisional one: wire::provisionalModelName), else the
    // first process's. Never part of which processes are one job.
    std::string model;
    std::vector<wire::DiscoveryEntry> processes; // by first rank

    // Ranks of [0, worldSize) no live process announces.
    std::vector<int> missingRanks() const;
};

// Every live engine in dir, grouped by run; jobs in order of their ids.
std::vector<LiveJob> liveJobs(const std::string &dir);
// The live processes of the run named "ID" or "ID@RENDEZVOUS" in dir, by first rank (the
// rule is wire::selectRun's): an error that says what to type when the name picks several
// runs, or none.
wire::Result<LiveJob> liveJob(const std::string &dir, const std::string &name);

} // namespace shardscope::client

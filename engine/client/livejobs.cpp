#include "client/livejobs.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "wire/job.h"
#include "wire/jobmerge.h"

namespace shardscope::client {

namespace {

int firstRank(const wire::DiscoveryEntry &e)
{
    return e.job.ranks.empty() ? 0 : e.job.ranks.front();
}

// The processes of one run, as one job.
LiveJob jobOf(std::string id, std::vector<wire::DiscoveryEntry> processes)
{
    std::stable_sort(processes.begin(), processes.end(),
                     [](const auto &x, const auto &y) { return firstRank(x) < firstRank(y); });
    LiveJob j;
    j.id = std::move(id);
    j.named = !processes.front().job.id.empty();
    for (const wire::DiscoveryEntry &e : processes) {
        j.worldSize = std::max({j.worldSize, e.job.worldSize, e.worldSize});
        j.ranks.insert(e.job.ranks.begin(), e.job.ranks.end());
    }
    j.model = processes.front().model;
    for (const wire::DiscoveryEntry &e : processes)
        if (!wire::provisionalModelName(e.model)) {
            j.model = e.model;
            break;
        }
    j.processes = std::move(processes);
    return j;
}

} // namespace

std::vector<int> LiveJob::missingRanks() const
{
    std::vector<int> out;
    for (int r = 0; r < worldSize; ++r)
        if (!ranks.contains(r)) out.push_back(r);
    return out;
}

std::vector<LiveJob> liveJobs(const std::string &dir)
{
    // Runs in order of first appearance; within a run each endpoint once (a second file
    // naming it is dropped). Whether the process there is the one a file announces is only
    // known once it answers (wire::checkAnswered, when attaching).
    std::vector<std::vector<wire::DiscoveryEntry>> runs;
    for (wire::DiscoveryEntry &e : wire::listLiveEngines(dir)) {
        auto run = std::find_if(runs.begin(), runs.end(), [&](const auto &r) {
            return !e.job.id.empty() && wire::sameRun(r.front().job, e.job);
        });
        if (run == runs.end()) {
            runs.push_back({std::move(e)});
        } else if (std::none_of(run->begin(), run->end(),
                                [&](const auto &x) { return x.endpoint == e.endpoint; })) {
            run->push_back(std::move(e));
        }
    }
    std::map<std::string, int> runsOfId;
    for (const auto &r : runs)
        if (!r.front().job.id.empty()) ++runsOfId[r.front().job.id];
    std::vector<LiveJob> jobs;
    for (auto &r : runs) {
        const wire::JobIdentity &job = r.front().job;
        std::string id = job.id.empty()         ? "pid " + std::to_string(r.front().pid)
                         : runsOfId[job.id] > 1 ? wire::runName(job)
                                                : job.id;
        jobs.push_back(jobOf(std::move(id), std::move(r)));
    }
    std::stable_sort(jobs.begin(), jobs.end(),
                     [](const LiveJob &x, const LiveJob &y) { return x.id < y.id; });
    return jobs;
}

wire::Result<LiveJob> liveJob(const std::string &dir, const std::string &name)
{
    auto run = wire::selectRun(wire::listLiveEngines(dir), name);
    if (!run) return wire::fail(run.error());
    return jobOf(name, std::move(*run));
}

} // namespace shardscope::client

#include "client/livejobs.h"

#include <algorithm>
#include <utility>

namespace shardscope::client {

namespace {

std::string jobOf(const wire::DiscoveryEntry &e)
{
    return e.job.id.empty() ? "pid " + std::to_string(e.pid) : e.job.id;
}

int firstRank(const wire::DiscoveryEntry &e)
{
    return e.job.ranks.empty() ? 0 : e.job.ranks.front();
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
    std::vector<wire::DiscoveryEntry> engines = wire::listLiveEngines(dir);
    std::stable_sort(engines.begin(), engines.end(), [](const auto &x, const auto &y) {
        return std::make_pair(jobOf(x), firstRank(x)) < std::make_pair(jobOf(y), firstRank(y));
    });
    std::vector<LiveJob> jobs;
    for (wire::DiscoveryEntry &e : engines) {
        const std::string id = jobOf(e);
        if (jobs.empty() || jobs.back().id != id) {
            LiveJob j;
            j.id = id;
            j.named = !e.job.id.empty();
            j.worldSize = std::max(e.job.worldSize, e.worldSize);
            jobs.push_back(std::move(j));
        }
        LiveJob &j = jobs.back();
        j.ranks.insert(e.job.ranks.begin(), e.job.ranks.end());
        j.processes.push_back(std::move(e));
    }
    return jobs;
}

LiveJob liveJob(const std::string &dir, const std::string &id)
{
    for (LiveJob &j : liveJobs(dir))
        if (j.named && j.id == id) return std::move(j);
    LiveJob none;
    none.id = id;
    none.named = true;
    none.worldSize = 0;
    return none;
}

} // namespace shardscope::client

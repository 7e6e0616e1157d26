#include "wire/job.h"

#include <cstdlib>
#include <unistd.h>

namespace shardscope::wire {

namespace {

std::string env(const char *name)
{
    const char *v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

} // namespace

std::string hostName()
{
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

JobIdentity jobFromEnvironment(std::string_view name, std::vector<int> ranks, int worldSize)
{
    JobIdentity job;
    job.ranks = std::move(ranks);
    job.worldSize = worldSize;
    job.host = hostName();
    if (const std::string addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
        !addr.empty() && !port.empty())
        job.rendezvous = addr + ":" + port;
    if (!name.empty()) {
        job.id = name;
    } else if (const std::string run = env("TORCHELASTIC_RUN_ID"); !run.empty()) {
        job.id = run;
    } else if (const std::string addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
               !addr.empty() && !port.empty()) {
        job.id = addr + ":" + port;
    } else {
        job.id = job.host + "-" + std::to_string(::getpid());
    }
    return job;
}

bool sameRun(const JobIdentity &a, const JobIdentity &b)
{
    return a.id == b.id && a.rendezvous == b.rendezvous && a.worldSize == b.worldSize;
}

std::string runName(const JobIdentity &job)
{
    return job.rendezvous.empty() ? job.id : job.id + "@" + job.rendezvous;
}

detail::Json encodeJob(const JobIdentity &job)
{
    detail::Json j;
    j["id"] = job.id;
    j["ranks"] = job.ranks;
    j["world_size"] = job.worldSize;
    j["host"] = job.host;
    if (!job.rendezvous.empty()) j["rendezvous"] = job.rendezvous;
    return j;
}

JobIdentity decodeJob(const detail::Json &j, const std::string &where)
{
    detail::requireObject(j, where);
    JobIdentity job;
    job.id = detail::asString(detail::member(j, "id", where), where + ".id");
    job.worldSize = static_cast<int>(
        detail::asBounded(detail::member(j, "world_size", where), 1 << 16, where + ".world_size"));
    if (job.worldSize < 1) detail::failAt(where + ".world_size", "must be at least 1");
    const detail::Json &ranks =
        detail::asArray(detail::member(j, "ranks", where), where + ".ranks");
    if (ranks.size() > static_cast<std::size_t>(job.worldSize))
        detail::failAt(where + ".ranks", "lists more ranks than world_size");
    for (const detail::Json &r : ranks)
        job.ranks.push_back(static_cast<int>(
            detail::asBounded(r, static_cast<std::uint64_t>(job.worldSize - 1), where + ".ranks")));
    if (detail::hasMember(j, "host")) job.host = detail::asString(j["host"], where + ".host");
    if (detail::hasMember(j, "rendezvous"))
        job.rendezvous = detail::asString(j["rendezvous"], where + ".rendezvous");
    return job;
}

} // namespace shardscope::wire

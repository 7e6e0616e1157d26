#include "wire/discovery.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <dirent.h>
#include <fcntl.h>
#include <optional>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include "wire/endpoint.h"
#include "wire/jsonread.h"

namespace shardscope::wire {

using detail::Json;

std::string encodeDiscovery(const DiscoveryEntry &e)
{
    Json j;
    j["format"] = kDiscoveryFormat;
    j["version"] = 1;
    j["pid"] = e.pid;
    j["endpoint"] = e.endpoint;
    j["model"] = e.model;
    j["world_size"] = e.worldSize;
    j["backend"] = e.backend;
    j["start_unix_ms"] = e.startUnixMs;
    j["token_required"] = e.tokenRequired;
    j["job"] = encodeJob(e.job);
    return detail::dumpJson(j, true);
}

Result<DiscoveryEntry> decodeDiscovery(std::string_view json)
{
    return detail::guarded<DiscoveryEntry>("not a ShardScope discovery file", [&] {
        const Json j = detail::parseJson(json);
        detail::requireObject(j, "discovery");
        if (detail::asString(detail::member(j, "format", "discovery"), "format") !=
            kDiscoveryFormat)
            detail::failAt("format", "not \"shardscope-discovery\"");
        DiscoveryEntry e;
        e.pid = detail::asI64(detail::member(j, "pid", "discovery"), "pid");
        e.endpoint = detail::asString(detail::member(j, "endpoint", "discovery"), "endpoint");
        e.model = detail::asString(detail::member(j, "model", "discovery"), "model");
        e.worldSize = static_cast<int>(
            detail::asBounded(detail::member(j, "world_size", "discovery"), 1 << 16, "world_size"));
        e.backend = detail::asString(detail::member(j, "backend", "discovery"), "backend");
        e.startUnixMs =
            detail::asU64(detail::member(j, "start_unix_ms", "discovery"), "start_unix_ms");
        if (detail::hasMember(j, "token_required"))
            e.tokenRequired = detail::asBool(j["token_required"], "token_required");
        if (detail::hasMember(j, "job")) e.job = decodeJob(j["job"], "job");
        return e;
    });
}

std::string discoveryFilePath(const std::string &dir, std::int64_t pid)
{
    return dir + "/" + std::to_string(pid) + ".json";
}

bool processAlive(std::int64_t pid)
{
    if (pid <= 0 || pid > 0x7FFFFFFF) return false;
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

namespace {

constexpr std::size_t kMaxDiscoveryFileBytes = 64 * 1024;

// A file or directory another user could have planted or can write to is not trusted.
bool ownedAndPrivate(const struct stat &st)
{
    return st.st_uid == ::getuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

// The text of a discovery file in the directory dirFd, or nothing: only regular files of
// ours, opened without following links and without blocking (a FIFO would wait forever).
std::optional<std::string> readEntryFile(int dirFd, const char *name)
{
    const int fd = ::openat(dirFd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    struct stat st
    {
    };
    std::optional<std::string> text;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ownedAndPrivate(st) &&
        static_cast<std::uint64_t>(st.st_size) <= kMaxDiscoveryFileBytes) {
        std::string buf(kMaxDiscoveryFileBytes, '\0');
        std::size_t got = 0;
        for (;;) {
            const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += static_cast<std::size_t>(n);
            if (got == buf.size()) break;
        }
        buf.resize(got);
        text = std::move(buf);
    }
    ::close(fd);
    return text;
}

} // namespace

std::vector<DiscoveryEntry> listLiveEngines(const std::string &dir)
{
    std::vector<DiscoveryEntry> out;
    // The directory must be ours and writable by nobody else (the engine makes it 0700):
    // one created first by another user, e.g. /tmp/shardscope-<uid>, lists nothing.
    const int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dirFd < 0) return out;
    struct stat st
    {
    };
    if (::fstat(dirFd, &st) != 0 || !ownedAndPrivate(st)) {
        ::close(dirFd);
        return out;
    }
    DIR *d = ::fdopendir(dirFd);
    if (!d) {
        ::close(dirFd);
        return out;
    }
    while (const dirent *ent = ::readdir(d)) {
        const std::string name = ent->d_name;
        if (name.size() < 6 || !name.ends_with(".json")) continue;
        const std::string file = dir + "/" + name;
        const auto text = readEntryFile(dirFd, ent->d_name);
        if (!text) continue;
        auto entry = decodeDiscovery(*text);
        if (!entry || !processAlive(entry->pid)) continue;
        entry->file = file;
        out.push_back(std::move(entry.value()));
    }
    ::closedir(d);
    std::sort(out.begin(), out.end(),
              [](const DiscoveryEntry &a, const DiscoveryEntry &b) { return a.pid < b.pid; });
    return out;
}

std::vector<DiscoveryEntry> listLiveEngines()
{
    return listLiveEngines(defaultRuntimeDir());
}

Result<std::vector<DiscoveryEntry>> selectRun(const std::vector<DiscoveryEntry> &live,
                                              const std::string &name)
{
    // "ID@RENDEZVOUS" names one run; a plain "ID" is the run of that id, if it is one.
    const auto matches = [&](const DiscoveryEntry &e) {
        return e.job.id == name || (!e.job.rendezvous.empty() && runName(e.job) == name);
    };
    std::vector<DiscoveryEntry> out;
    std::vector<const JobIdentity *> runs;
    std::set<std::string> endpoints;
    for (const DiscoveryEntry &e : live) {
        if (!matches(e) || !endpoints.insert(e.endpoint).second) continue;
        if (std::none_of(runs.begin(), runs.end(),
                         [&](const JobIdentity *r) { return sameRun(*r, e.job); }))
            runs.push_back(&e.job);
        out.push_back(e);
    }
    if (out.empty()) return fail("no live process of job " + name);
    if (runs.size() > 1) {
        std::string list;
        for (const JobIdentity *r : runs)
            list += (list.empty() ? "" : ", ") + runName(*r) + " (world size " +
                    std::to_string(r->worldSize) + ")";
        const bool sameRendezvous =
            std::all_of(runs.begin(), runs.end(),
                        [&](const JobIdentity *r) { return r->rendezvous == runs[0]->rendezvous; });
        return fail(
            "job " + name + " names " + std::to_string(runs.size()) + " runs: " + list +
            (sameRendezvous
                 ? "; their processes disagree on the world size: not one job. Attach "
                   "a process on its own"
                 : "; attach one of them as job:ID@RENDEZVOUS, e.g. job:" + runName(*runs[0])));
    }
    std::stable_sort(out.begin(), out.end(), [](const DiscoveryEntry &a, const DiscoveryEntry &b) {
        return (a.job.ranks.empty() ? 0 : a.job.ranks.front()) <
               (b.job.ranks.empty() ? 0 : b.job.ranks.front());
    });
    return out;
}

std::string checkAnswered(const DiscoveryEntry &entry, std::int64_t welcomePid,
                          const JobIdentity &welcomeJob)
{
    if (welcomePid != entry.pid)
        return "the discovery file " + entry.file + " announces pid " + std::to_string(entry.pid) +
               " at " + entry.endpoint + ", but pid " + std::to_string(welcomePid) +
               " answered there: not this job's process; skipped";
    if (!entry.job.id.empty() && !sameRun(welcomeJob, entry.job))
        return "the process at " + entry.endpoint + " belongs to job " + runName(welcomeJob) +
               " (world size " + std::to_string(welcomeJob.worldSize) + "), not " +
               runName(entry.job) + "; skipped";
    return {};
}

} // namespace shardscope::wire

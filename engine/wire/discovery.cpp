#include "wire/discovery.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <dirent.h>
#include <fstream>

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

std::vector<DiscoveryEntry> listLiveEngines(const std::string &dir)
{
    std::vector<DiscoveryEntry> out;
    DIR *d = ::opendir(dir.c_str());
    if (!d) return out;
    while (const dirent *ent = ::readdir(d)) {
        const std::string name = ent->d_name;
        if (name.size() < 6 || !name.ends_with(".json")) continue;
        const std::string file = dir + "/" + name;
        std::ifstream in(file, std::ios::binary);
        if (!in) continue;
        std::string text(64 * 1024, '\0');
        in.read(text.data(), static_cast<std::streamsize>(text.size()));
        text.resize(static_cast<std::size_t>(in.gcount()));
        auto entry = decodeDiscovery(text);
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

} // namespace shardscope::wire

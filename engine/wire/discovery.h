#pragma once
// Discovery files: one JSON file per live engine in the runtime directory, so a GUI or
// shardscope-capture can list running engines. Files of dead processes are ignored.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "wire/job.h"
#include "wire/result.h"

namespace shardscope::wire {

inline constexpr std::string_view kDiscoveryFormat = "shardscope-discovery";

struct DiscoveryEntry
{
    std::int64_t pid = 0;
    std::string endpoint; // "unix:..." or "tcp:HOST:PORT"
    std::string model;
    int worldSize = 1;
    std::string backend;
    std::uint64_t startUnixMs = 0;
    bool tokenRequired = false;
    JobIdentity job;  // absent in files of releases before jobs: id "" (a job of its own)
    std::string file; // the discovery file it was read from (not serialized)
};

std::string encodeDiscovery(const DiscoveryEntry &entry);
Result<DiscoveryEntry> decodeDiscovery(std::string_view json);

std::string discoveryFilePath(const std::string &dir, std::int64_t pid); // <dir>/<pid>.json
// True while a process with this pid exists (kill(pid, 0)).
bool processAlive(std::int64_t pid);
// Every readable discovery file in dir whose process is alive, sorted by pid. Unreadable,
// foreign and stale files are skipped.
std::vector<DiscoveryEntry> listLiveEngines(const std::string &dir);
std::vector<DiscoveryEntry> listLiveEngines();

// The processes of the run a user names "ID" or "ID@RENDEZVOUS" (runName) among live: each
// endpoint once (a file listing an endpoint already listed is dropped), sorted by first rank.
// An error saying what to type when the id names several runs (two jobs of one name, or
// processes that disagree on the world size), or none.
Result<std::vector<DiscoveryEntry>> selectRun(const std::vector<DiscoveryEntry> &live,
                                              const std::string &name);
// Whether the process that answered at an entry's endpoint (its Welcome's pid and job) is
// the one the discovery file announced: "" if so, else why not (a file naming another
// process's endpoint is not merged into a job).
std::string checkAnswered(const DiscoveryEntry &entry, std::int64_t welcomePid,
                          const JobIdentity &welcomeJob);

} // namespace shardscope::wire

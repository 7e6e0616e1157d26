#pragma once
// Reading a snapshot file (docs/snapshot.md) in tests of real runs: the document, and the
// records a test looks up in it by name. One copy for the agents' tests (DeepSpeed, FSDP2,
// shardscope-check); the schema checks and the event list are snapshotschema.h's.

#include <QFile>
#include <QString>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "snapshotschema.h"

namespace shardscope::test {

// The file's JSON, or a discarded value when it cannot be read or parsed.
inline nlohmann::json readJson(const QString &path)
{
    QFile f(path);
    if (!f.open(QIODevice::ReadOnly)) return nlohmann::json();
    return nlohmann::json::parse(f.readAll().toStdString(), nullptr, false);
}

inline const nlohmann::json *findParam(const nlohmann::json &snap, const std::string &name)
{
    for (const nlohmann::json &p : snap["params"])
        if (p["name"] == name) return &p;
    return nullptr;
}

inline const nlohmann::json *moduleOf(const nlohmann::json &snap, const std::string &path)
{
    for (const nlohmann::json &m : snap["modules"])
        if (m["path"] == path) return &m;
    return nullptr;
}

inline int moduleIdOf(const nlohmann::json &snap, const std::string &path)
{
    const nlohmann::json *m = moduleOf(snap, path);
    return m ? (*m)["id"].get<int>() : -1;
}

// The violation rows of one kind.
inline std::vector<nlohmann::json> violations(const nlohmann::json &snap, const std::string &kind)
{
    std::vector<nlohmann::json> out;
    for (const nlohmann::json &v : snap["violations"])
        if (v["kind"] == kind) out.push_back(v);
    return out;
}

// The (reason, causing module or -1) of every fetch_end of the parameter called name.
inline std::set<std::pair<int, std::int64_t>> fetchesOf(const nlohmann::json &snap,
                                                        const std::string &name)
{
    std::set<std::pair<int, std::int64_t>> out;
    const nlohmann::json *p = findParam(snap, name);
    if (!p) return out;
    for (const nlohmann::json &e : eventList(snap))
        if (e["type"] == "fetch_end" && e["a"] == (*p)["id"])
            out.emplace(e["flags"].get<int>(), e["b"].get<std::uint32_t>() == 0xffffffffu
                                                   ? -1
                                                   : e["b"].get<std::int64_t>());
    return out;
}

inline int countEvents(const nlohmann::json &snap, const std::string &type)
{
    int n = 0;
    for (const nlohmann::json &e : eventList(snap))
        n += e["type"] == type;
    return n;
}

// One collective a rank issued (issue 51: collective_begin, docs/protocol.md), as the job's
// aligner compares them across ranks: by module path, not id. ended: its collective_end is in
// the snapshot too.
struct Collective
{
    std::uint32_t group = 0;
    std::uint64_t seq = 0;
    int kind = 0;       // 0 all_gather, 1 reduce_scatter, 2 broadcast
    std::string module; // its path ("" the root), "-" none
    int reason = 0;     // a fetch reason's number
    std::uint64_t bytes = 0;
    std::uint32_t params = 0;
    int step = 0;
    bool ended = false;
    // The signature the aligner compares, with the place: equal on every rank of a healthy job.
    auto key() const { return std::tuple(group, seq, kind, module, reason, bytes, params); }
};

// Every collective_begin of a rank's snapshot, in order, each with whether it ended.
inline std::vector<Collective> collectivesOf(const nlohmann::json &snap)
{
    std::map<std::int64_t, std::string> paths;
    for (const nlohmann::json &m : snap["modules"])
        paths[m["id"].get<std::int64_t>()] = m.value("path", std::string());
    std::vector<Collective> out;
    std::set<std::pair<std::uint32_t, std::uint64_t>> ended;
    for (const nlohmann::json &e : eventList(snap)) {
        if (e["type"] == "collective_end")
            ended.emplace(e["b"].get<std::uint32_t>(), e["u0"].get<std::uint64_t>());
        if (e["type"] != "collective_begin") continue;
        Collective c;
        c.group = e["b"].get<std::uint32_t>();
        c.seq = e["u0"].get<std::uint64_t>();
        c.kind = e["flags"].get<int>();
        const std::int64_t module = e["a"].get<std::int64_t>();
        c.module = paths.contains(module) ? paths[module] : "-";
        c.bytes = e["u1"].get<std::uint64_t>();
        const auto u2 = e["u2"].get<std::uint64_t>();
        c.reason = int(u2 & 0xff);
        c.params = std::uint32_t(u2 >> 32);
        c.step = e["step"].get<int>();
        out.push_back(c);
    }
    for (Collective &c : out)
        c.ended = ended.contains({c.group, c.seq});
    return out;
}

// The numbers of the steps begun, in order (a step_begin's `step`).
inline std::vector<int> stepsBegun(const nlohmann::json &snap)
{
    std::vector<int> out;
    for (const nlohmann::json &e : eventList(snap))
        if (e["type"] == "step_begin") out.push_back(e["step"].get<int>());
    return out;
}

// How a run's snapshot differs in what was observed from another of the same run (compiled
// and eager, say): the number of events of each type (some scopes and fetches at least), the
// parameters by name and their gather counts. Empty when they agree.
inline std::string observedDifferently(const nlohmann::json &a, const nlohmann::json &b)
{
    const auto counts = [](const nlohmann::json &s) {
        std::map<std::string, int> n;
        for (const nlohmann::json &e : eventList(s))
            ++n[e["type"].get<std::string>()];
        return n;
    };
    const auto ca = counts(a), cb = counts(b);
    if (ca != cb)
        return "events per type: " + nlohmann::json(ca).dump() + " against " +
               nlohmann::json(cb).dump();
    if (!ca.contains("module_enter") || !ca.contains("fetch_end"))
        return "no module_enter or fetch_end: " + nlohmann::json(ca).dump();
    if (a["params"].size() != b["params"].size()) return "parameters: " + a["params"].dump();
    for (std::size_t i = 0; i < a["params"].size(); ++i) {
        const nlohmann::json &pa = a["params"][i], &pb = b["params"][i];
        if (pa["name"] != pb["name"] || pa["gather_count"] != pb["gather_count"])
            return "parameter " + pa.dump() + " against " + pb.dump();
    }
    return {};
}

} // namespace shardscope::test

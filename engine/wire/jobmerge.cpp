#include "wire/jobmerge.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "state/violationledger.h"

namespace shardscope::wire {

std::string checkOneJob(const state::EngineState &part, const std::string &partName,
                        const state::EngineState &others)
{
    if (part.worldSize == others.worldSize) return {};
    return partName + " runs a world of " + std::to_string(part.worldSize) + " ranks, the others " +
           std::to_string(others.worldSize) +
           ": not one job; attach to it on its own (its endpoint, not job:NAME)";
}

bool provisionalModelName(std::string_view name)
{
    return name.find("(model not ") != std::string_view::npos;
}

Result<state::EngineState> mergeJobStates(std::span<const state::EngineState *const> parts,
                                          std::span<const std::string> names)
{
    if (parts.empty()) return fail("no process to merge");
    // A process whose model is not built yet (it stopped or failed before, or is slower)
    // lists no parameters: it brings its ranks, step and violations, not the structure. Its
    // model's name, provisional or not, is no sign of another job (checkOneJob).
    const auto built = [](const state::EngineState &s) { return !s.params.empty(); };
    const auto first =
        std::find_if(parts.begin(), parts.end(), [&](const auto *p) { return built(*p); });
    state::EngineState st = first == parts.end() ? *parts.front() : **first;
    const auto partName = [&](std::size_t i) {
        return i < names.size() ? names[i] : "part " + std::to_string(i);
    };
    std::unordered_map<ParamId, std::size_t> index;
    for (std::size_t i = 0; i < st.params.size(); ++i) {
        index.emplace(st.params[i].id, i);
        st.params[i].gatherCount = st.params[i].gatherBytes = st.params[i].gatherNs = 0;
    }
    std::set<int> localRanks;
    state::ViolationLedger violations;
    bool appended = false;
    for (std::size_t k = 0; k < parts.size(); ++k) {
        const state::EngineState &ps = *parts[k];
        if (std::string wrong = checkOneJob(ps, partName(k), st); !wrong.empty())
            return fail(std::move(wrong));
        if (provisionalModelName(st.modelName) && !provisionalModelName(ps.modelName))
            st.modelName = ps.modelName;
        for (const state::ParamRecord &p : ps.params) {
            auto it = index.find(p.id);
            if (it == index.end()) {
                // A parameter only this part lists (a process that observes part of the
                // model): kept as it describes it, when its owner is in the merged tree.
                if (p.owner != kNoModule && p.owner >= st.modules.size()) continue;
                index.emplace(p.id, st.params.size());
                st.params.push_back(p);
                appended = true;
                continue;
            }
            state::ParamRecord &m = st.params[it->second];
            for (int r : ps.localRanks)
                if (r >= 0 && static_cast<std::size_t>(r) < m.status.size() &&
                    static_cast<std::size_t>(r) < p.status.size())
                    m.status[static_cast<std::size_t>(r)] = p.status[static_cast<std::size_t>(r)];
            m.gatherCount += p.gatherCount;
            m.gatherBytes += p.gatherBytes;
            m.gatherNs += p.gatherNs;
            m.lastGatherTsNs = std::max(m.lastGatherTsNs, p.lastGatherTsNs);
            for (const state::ExternalRecord &e : p.externals)
                if (std::none_of(
                        m.externals.begin(), m.externals.end(),
                        [&](const state::ExternalRecord &x) { return x.module == e.module; }))
                    m.externals.push_back(e);
            for (ModuleId a : p.activeModules)
                if (std::find(m.activeModules.begin(), m.activeModules.end(), a) ==
                    m.activeModules.end())
                    m.activeModules.push_back(a);
        }
        localRanks.insert(ps.localRanks.begin(), ps.localRanks.end());
        // Each record is its process's total for its rank: the same (violation, rank) listed
        // by two processes is one, not two, and the larger total stands, whatever the order.
        for (const state::ViolationRecord &v : ps.violations)
            violations.add(v, state::Tally::Max);
        st.step = std::max(st.step, ps.step);
    }
    st.localRanks.assign(localRanks.begin(), localRanks.end());
    st.violations = violations.records();
    if (appended)
        std::sort(
            st.params.begin(), st.params.end(),
            [](const state::ParamRecord &a, const state::ParamRecord &b) { return a.id < b.id; });
    return st;
}

Result<Snapshot> mergeJobSnapshots(const std::vector<Snapshot> &parts, const std::string &job,
                                   const std::vector<std::string> &partNames)
{
    if (parts.empty()) return fail("no rank of job " + job + " was captured");
    std::vector<const state::EngineState *> states;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        const Snapshot &p = parts[i];
        states.push_back(&p.state);
        names.push_back(i < partNames.size() ? partNames[i]
                                             : "the process " + std::to_string(p.meta.pid) + " (" +
                                                   p.meta.endpoint + ")");
    }
    auto state = mergeJobStates(states, names);
    if (!state) return fail(state.error());
    Snapshot out;
    out.meta = parts.front().meta;
    out.state = std::move(state).value();
    for (const Snapshot &p : parts) {
        out.events.insert(out.events.end(), p.events.begin(), p.events.end());
        out.droppedEvents += p.droppedEvents;
    }
    std::stable_sort(
        out.events.begin(), out.events.end(),
        [](const telemetry::Event &a, const telemetry::Event &b) { return a.tsNs < b.tsNs; });
    out.meta.endpoint = "job:" + job;
    out.meta.pid = 0;
    return out;
}

namespace {

// "run" for ".../run.rank0.json.gz", "snap" for "snap.json", "rank3" stays "rank3".
std::string jobNameOfFile(const std::string &path)
{
    std::string name = path.substr(path.find_last_of('/') + 1);
    for (const char *ext : {".gz", ".json"})
        if (name.size() > std::strlen(ext) && name.ends_with(ext))
            name.resize(name.size() - std::strlen(ext));
    const std::size_t dot = name.rfind(".rank");
    if (dot != std::string::npos && dot > 0 && dot + 5 < name.size() &&
        std::all_of(name.begin() + std::ptrdiff_t(dot + 5), name.end(),
                    [](char c) { return c >= '0' && c <= '9'; }))
        name.resize(dot);
    return name;
}

} // namespace

Result<Snapshot> mergeSnapshotFiles(const std::vector<std::string> &paths,
                                    std::vector<Snapshot> *partsOut)
{
    if (paths.empty()) return fail("no snapshot file to open");
    std::vector<Snapshot> parts;
    std::vector<std::string> names;
    std::unordered_map<int, std::string> rankFile; // rank -> the file holding it
    for (const std::string &path : paths) {
        auto snap = readSnapshotFile(path);
        if (!snap)
            return fail("cannot open `" + path + "` as a ShardScope snapshot: " + snap.error());
        for (int r : snap->state.localRanks) {
            const auto [at, fresh] = rankFile.emplace(r, path);
            if (!fresh)
                return fail("`" + at->second + "` and `" + path + "` both hold rank " +
                            std::to_string(r) +
                            ": open the files of one run, one file for each rank process");
        }
        parts.push_back(std::move(snap).value());
        names.push_back("`" + path + "`");
    }
    auto merged = mergeJobSnapshots(parts, jobNameOfFile(paths.front()), names);
    if (!merged) return merged;
    merged->meta.endpoint = "files:" + jobNameOfFile(paths.front());
    if (partsOut) *partsOut = std::move(parts);
    return merged;
}

} // namespace shardscope::wire

// Inspection: Engine::state() (the plain copy a snapshot and the wire's State carry) and
// the queries of status, violations and counters.

#include <algorithm>

#include "base/hugepages.h"
#include "core/engine.h"
#include "core/engineimpl.h"
#include "state/statecolumns.h"

namespace shardscope::core {

// ---------------------------------------------------------------- status
ParamStatus Engine::status(int rank, ParamId p) const
{
    const RankState &rs = d->rankState(rank);
    if (p >= rs.params.size())
        throw EngineError("parameter id " + std::to_string(p) + " does not exist");
    return rs.status[p].load(std::memory_order_acquire);
}

std::vector<ModuleId> Engine::activeModules(int rank, ParamId p) const
{
    const RankState &rs = d->rankState(rank);
    std::lock_guard rl(rs.mu);
    if (p >= rs.params.size()) return {};
    return rs.params[p].active;
}

// ---------------------------------------------------------------- inspection

state::EngineState Engine::state() const
{
    state::StateColumns c;
    stateColumns(c);
    return state::stateOf(c);
}

void Engine::stateColumns(state::StateColumns &c) const
{
    c.clear();
    c.modelName = m_config.modelName;
    c.worldSize = m_config.worldSize;
    c.backend = std::string(comm::backendName(backend()));
    c.config.persistenceThreshold = m_config.persistenceThreshold;
    c.config.prefetchBucketSize = m_config.prefetchBucketSize;
    c.config.maxLiveParameters = m_config.maxLiveParameters;
    c.config.guard = m_config.guard;
    c.localRanks = m_localRanks;
    for (const auto &rs : d->ranks)
        c.step = std::max(c.step, rs->step.load());

    std::shared_lock lock(d->structure);
    const std::size_t M = d->modules.size(), N = d->params.size();
    // The parameters are read twice: here for their rows, the dimensions and the bytes of
    // their names, then once for every column (each record is 152 bytes: a pass per column
    // read them all again, 15 MB each time at 100,000 parameters). recordOf maps an id to
    // its row (removed parameters have none).
    std::vector<std::int32_t> recordOf(N, -1);
    std::size_t P = 0, nDims = 0, bytes = 0;
    for (const ParamInfo &info : d->params) {
        if (info.removed) continue;
        recordOf[info.id] = static_cast<std::int32_t>(P++);
        nDims += std::min(info.shape.size(), state::kMaxColumnDims);
        bytes += info.name.size();
    }
    for (const ModuleInfo &m : d->modules)
        bytes += m.path.size();
    c.strings.reserve(M + P + 64, bytes + bytes / 64 + 4096);
    state::forEachModuleColumn(c, [M](auto &v) { reserveHuge(v, M); });
    for (const ModuleInfo &m : d->modules) {
        c.modulePath.push_back(c.strings.add(m.path));
        c.moduleType.push_back(c.strings.intern(m.type));
        c.moduleParent.push_back(m.parent);
    }
    // The engine has no FSDP units and no DTensors.
    c.moduleUnitGroup.assign(M, kNoModule);
    c.moduleReshard.assign(M, state::kNoString);
    c.moduleMesh.assign(M, state::kNoString);

    // What late parameters replace is added to the table after every name, as columnsOf
    // does, so a state makes one table.
    state::forEachParamColumn(c, [P](auto &v) { reserveHuge(v, P); });
    reserveHuge(c.dims, nDims);
    std::vector<ParamId> late;
    for (const ParamInfo &info : d->params) {
        if (info.removed) continue;
        c.addParam(info.id, info.name, info.owner, info.dtype, info.persistent, info.partitioned,
                   info.late, info.shape, info.numel, info.layout.paddedNumel,
                   info.layout.partitionNumel);
        const GatherTotals &tot = d->gatherTotals[info.id];
        c.gatherCount.push_back(tot.count.load(std::memory_order_relaxed));
        c.gatherBytes.push_back(tot.bytes.load(std::memory_order_relaxed));
        c.gatherNs.push_back(tot.ns.load(std::memory_order_relaxed));
        c.lastGatherTsNs.push_back(tot.lastTs.load(std::memory_order_relaxed));
        c.paramReplaces.push_back(state::kNoString);
        c.paramPlacements.push_back(state::kNoString);
        if (info.late) late.push_back(info.id);
    }
    for (ParamId id : late) {
        const std::string replaced = d->replacedBy(id);
        if (!replaced.empty())
            c.paramReplaces[static_cast<std::size_t>(recordOf[id])] = c.strings.intern(replaced);
    }

    // Statuses, 2 bits a rank, in blocks of parameters with every rank's dense array read in
    // order within a block: the block's rows stay in cache while 64 ranks write into them.
    // Ranks another process runs read as the initial status.
    const std::size_t row = state::statusRowBytes(m_config.worldSize);
    if (m_partitioned) {
        static_assert(static_cast<unsigned>(ParamStatus::NotAvailable) == 0);
        reserveHuge(c.statusRows, P * row);
        c.statusRows.assign(P * row, 0);
        constexpr std::size_t kBlock = 256;
        for (std::size_t first = 0; first < N; first += kBlock) {
            for (const auto &rsp : d->ranks) {
                const RankState &rs = *rsp;
                const auto rank = static_cast<std::size_t>(rs.rank);
                const std::size_t byte = rank / 4, shift = 2 * (rank % 4);
                const std::size_t last = std::min({first + kBlock, N, rs.status.size()});
                if (first >= last) continue;
                // An iterator: the statuses are a deque, and indexing one divides each time.
                auto it = rs.status.begin() + static_cast<std::ptrdiff_t>(first);
                for (std::size_t p = first; p < last; ++p, ++it)
                    if (const std::int32_t i = recordOf[p]; i >= 0)
                        c.statusRows[static_cast<std::size_t>(i) * row + byte] |=
                            static_cast<std::uint8_t>(
                                (static_cast<unsigned>(it->load(std::memory_order_acquire)) & 3)
                                << shift);
            }
        }
    } else {
        // Before partition() every rank holds every parameter.
        std::vector<std::uint8_t> available(row, 0);
        for (int r = 0; r < m_config.worldSize; ++r)
            available[static_cast<std::size_t>(r) / 4] |= static_cast<std::uint8_t>(
                static_cast<unsigned>(ParamStatus::Available) << (2 * (r % 4)));
        reserveHuge(c.statusRows, P * row);
        for (std::size_t i = 0; i < P; ++i)
            c.statusRows.insert(c.statusRows.end(), available.begin(), available.end());
    }

    // Only the lists a rank changes under its lock (the modules using a parameter, the
    // externals) are read under every rank's lock. The records above are the structure's
    // (under its shared lock), the statuses and gather totals atomics a rank writes without
    // its lock. A rank fetching a parameter takes its lock (useParam), so holding them over
    // the whole build stalled every rank's fetches for all of it: 112 ms (63-175) every
    // State at 100,000 parameters x 64 ranks; 4-7 ms with the locks around these lists
    // alone, while they still scanned every module's externals; under bench_attach's
    // 0.1 ms resolution since they read only the modules that have some ("a rank's
    // longest wait").
    struct Entry
    {
        std::uint32_t row;
        ModuleId module;
        std::uint8_t automatic;
    };
    std::vector<Entry> active, externals;
    {
        std::vector<std::unique_lock<std::mutex>> rankLocks;
        for (const auto &rs : d->ranks)
            rankLocks.emplace_back(rs->mu);
        for (const auto &rsp : d->ranks) {
            const RankState &rs = *rsp;
            for (ParamId p : rs.activeParams)
                if (const std::int32_t i = recordOf[p]; i >= 0)
                    for (ModuleId m : rs.params[p].active)
                        active.push_back(Entry{static_cast<std::uint32_t>(i), m, 0});
            for (ModuleId m : rs.externalModules)
                for (const ExternalEntry &e : rs.externals[m])
                    if (e.param < N)
                        if (const std::int32_t i = recordOf[e.param]; i >= 0)
                            externals.push_back(Entry{static_cast<std::uint32_t>(i), m,
                                                      static_cast<std::uint8_t>(e.automatic)});
        }
    }
    // Each a union over the local ranks, by module, in the order first seen: rank by rank
    // (and, for externals, by module id within a rank).
    auto flatten = [P](std::vector<Entry> &entries, std::vector<std::uint32_t> &count,
                       std::vector<ModuleId> &modules, std::vector<std::uint8_t> *automatic) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const Entry &a, const Entry &b) { return a.row < b.row; });
        reserveHuge(count, P);
        count.assign(P, 0);
        for (std::size_t k = 0, first = 0; k < entries.size(); ++k) {
            if (k > 0 && entries[k].row != entries[k - 1].row) first = modules.size();
            const auto begin = modules.begin() + static_cast<std::ptrdiff_t>(first);
            if (std::find(begin, modules.end(), entries[k].module) != modules.end()) continue;
            modules.push_back(entries[k].module);
            if (automatic) automatic->push_back(entries[k].automatic);
            ++count[entries[k].row];
        }
    };
    flatten(active, c.activeCount, c.activeModule, nullptr);
    flatten(externals, c.externalCount, c.externalModule, &c.externalAutomatic);
    lock.unlock();
    c.violations = violations();
}

std::vector<state::ViolationRecord> Engine::violations() const
{
    std::lock_guard lock(d->violationMutex);
    return d->violations.records();
}

std::uint64_t Engine::stateVersion() const
{
    return d->version.load(std::memory_order_relaxed);
}

std::uint64_t Engine::unregisteredAccessCount() const
{
    return d->unregisteredCount.load(std::memory_order_relaxed);
}

std::uint64_t Engine::lateParameterCount() const
{
    return d->lateCount.load(std::memory_order_relaxed);
}

std::uint64_t Engine::gatheredBytes(int rank) const
{
    return d->rankState(rank).totalGatheredBytes.load(std::memory_order_relaxed);
}

} // namespace shardscope::core

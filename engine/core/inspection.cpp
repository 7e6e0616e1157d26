// Inspection: Engine::state() (the plain copy a snapshot and the wire's State carry) and
// the queries of status, violations and counters.

#include <algorithm>

#include "base/hugepages.h"
#include "core/engine.h"
#include "core/engineimpl.h"

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

EngineState Engine::state() const
{
    EngineState s;
    s.modelName = m_config.modelName;
    s.worldSize = m_config.worldSize;
    s.backend = std::string(comm::backendName(backend()));
    s.config.persistenceThreshold = m_config.persistenceThreshold;
    s.config.prefetchBucketSize = m_config.prefetchBucketSize;
    s.config.maxLiveParameters = m_config.maxLiveParameters;
    s.config.guard = m_config.guard;
    s.localRanks = m_localRanks;
    for (const auto &rs : d->ranks)
        s.step = std::max(s.step, rs->step.load());

    std::shared_lock lock(d->structure);
    reserveHuge(s.modules, d->modules.size());
    for (const ModuleInfo &m : d->modules)
        s.modules.push_back(ModuleRecord{m.id, m.path, m.type, m.parent});

    // Parameter-major for what is per parameter, then rank-major over each rank's dense
    // status array: at 64 ranks x 100k parameters this reads 6.4 MB of statuses in order
    // instead of 6.4 million scattered per-rank records.
    const ParamStatus initial = m_partitioned ? ParamStatus::NotAvailable : ParamStatus::Available;
    std::vector<std::int32_t> recordOf(d->params.size(), -1);
    reserveHuge(s.params, d->params.size());
    for (const ParamInfo &info : d->params) {
        if (info.removed) continue;
        recordOf[info.id] = static_cast<std::int32_t>(s.params.size());
        ParamRecord &r = s.params.emplace_back();
        r.id = info.id;
        r.name = info.name;
        r.owner = info.owner;
        r.shape = info.shape;
        r.dtype = info.dtype;
        r.numel = info.numel;
        r.paddedNumel = info.layout.paddedNumel;
        r.partitionNumel = info.layout.partitionNumel;
        r.persistent = info.persistent;
        r.late = info.late;
        if (info.late) r.replaces = d->replacedBy(info.id);
        r.partitioned = info.partitioned;
        r.status.assign(static_cast<std::size_t>(m_config.worldSize), initial);
        const GatherTotals &tot = d->gatherTotals[info.id];
        r.gatherCount = tot.count.load(std::memory_order_relaxed);
        r.gatherBytes = tot.bytes.load(std::memory_order_relaxed);
        r.gatherNs = tot.ns.load(std::memory_order_relaxed);
        r.lastGatherTsNs = tot.lastTs.load(std::memory_order_relaxed);
    }
    // The statuses in blocks of parameters, every rank's dense array in order within a block:
    // the block's records stay in cache while 64 ranks write into them, where a whole rank at
    // a time touched all 100,000 records again for each rank.
    if (m_partitioned) {
        constexpr std::size_t kBlock = 256;
        for (std::size_t first = 0; first < recordOf.size(); first += kBlock) {
            for (const auto &rsp : d->ranks) {
                const RankState &rs = *rsp;
                const auto rank = static_cast<std::size_t>(rs.rank);
                const std::size_t last = std::min({first + kBlock, recordOf.size(), rs.status.size()});
                if (first >= last) continue;
                auto it = rs.status.begin() + static_cast<std::ptrdiff_t>(first);
                for (std::size_t p = first; p < last; ++p, ++it)
                    if (const std::int32_t i = recordOf[p]; i >= 0)
                        s.params[static_cast<std::size_t>(i)].status[rank] =
                            it->load(std::memory_order_acquire);
            }
        }
    }
    // Only the lists a rank changes under its lock (the modules using a parameter, the
    // externals) are read under every rank's lock. The records above are the structure's
    // (under its shared lock), the statuses and gather totals atomics a rank writes without
    // its lock. A rank fetching a parameter takes its lock (useParam), so holding them over
    // the whole build stalled every rank's fetches for all of it: 112 ms (63-175) every
    // State at 100,000 parameters x 64 ranks, 4-7 ms now (bench_attach, "a rank's longest
    // wait").
    std::vector<std::unique_lock<std::mutex>> rankLocks;
    for (const auto &rs : d->ranks)
        rankLocks.emplace_back(rs->mu);
    for (const auto &rsp : d->ranks) {
        const RankState &rs = *rsp;
        for (ParamId p : rs.activeParams) {
            const std::int32_t i = recordOf[p];
            if (i < 0) continue;
            auto &act = s.params[static_cast<std::size_t>(i)].activeModules;
            for (ModuleId m : rs.params[p].active)
                if (std::find(act.begin(), act.end(), m) == act.end()) act.push_back(m);
        }
    }
    // Externals: union over local ranks, by module.
    for (const auto &rsp : d->ranks) {
        const RankState &rs = *rsp;
        for (ModuleId m = 0; m < rs.externals.size(); ++m) {
            for (const ExternalEntry &e : rs.externals[m]) {
                auto it =
                    std::lower_bound(s.params.begin(), s.params.end(), e.param,
                                     [](const ParamRecord &r, ParamId id) { return r.id < id; });
                if (it == s.params.end() || it->id != e.param) continue;
                auto &ext = it->externals;
                if (std::none_of(ext.begin(), ext.end(),
                                 [m](const ExternalRecord &x) { return x.module == m; }))
                    ext.push_back(ExternalRecord{m, e.automatic});
            }
        }
    }
    rankLocks.clear();
    s.violations = violations();
    return s;
}

std::vector<ViolationRecord> Engine::violations() const
{
    std::lock_guard lock(d->violationMutex);
    return d->violations;
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

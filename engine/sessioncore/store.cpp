#include "sessioncore/store.h"

#include "state/violationtext.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <unistd.h>

#include "telemetry/clock.h"
#include "telemetry/eventfields.h"
#include "wire/jobmerge.h"

namespace shardscope::sessioncore {

namespace {

const std::vector<state::ExternalRecord> kNoExternals;

// Whether state b continues a's run. Another model's name is another run, except a
// provisional name giving way to the model's (the run built its model: issue #49, defect 8).
bool sameRun(const state::EngineState &a, const state::EngineState &b)
{
    if ((a.modelName != b.modelName && !wire::provisionalModelName(a.modelName)) ||
        a.worldSize != b.worldSize || a.backend != b.backend ||
        a.modules.size() != b.modules.size())
        return false;
    for (std::size_t i = 0; i < a.modules.size(); ++i) {
        if (a.modules[i].path != b.modules[i].path || a.modules[i].parent != b.modules[i].parent)
            return false;
    }
    return true;
}

// Of a continuing run (sameRun): whether what the module tree shows beyond statuses and
// figures is unchanged: modules' types and FSDP units, parameters and their registrations.
bool sameStructure(const state::EngineState &a, const state::EngineState &b)
{
    for (std::size_t i = 0; i < a.modules.size() && i < b.modules.size(); ++i) {
        const state::ModuleRecord &x = a.modules[i], &y = b.modules[i];
        if (x.type != y.type || x.unitGroup != y.unitGroup ||
            x.reshardAfterForward != y.reshardAfterForward || x.mesh != y.mesh)
            return false;
    }
    if (a.params.size() != b.params.size()) return false;
    for (std::size_t i = 0; i < a.params.size(); ++i) {
        const state::ParamRecord &x = a.params[i];
        const state::ParamRecord &y = b.params[i];
        if (x.id != y.id || x.owner != y.owner || x.name != y.name ||
            x.placements != y.placements || x.externals.size() != y.externals.size())
            return false;
        for (std::size_t e = 0; e < x.externals.size(); ++e) {
            if (x.externals[e].module != y.externals[e].module ||
                x.externals[e].automatic != y.externals[e].automatic)
                return false;
        }
    }
    return true;
}

// The key of a fetch in flight: one per (rank, parameter).
std::uint64_t fetchKey(std::uint16_t rank, ParamId param)
{
    return (std::uint64_t{rank} << 32) | param;
}

} // namespace

Store::Store() : m_collectiveClock(&telemetry::nowNs)
{
    m_collectiveOptions.stallNs =
        stallNsFromEnvironment(m_collectiveOptions.stallNs, nullptr); // a bad value: the default
    m_collectives = CollectiveAligner(1, m_collectiveOptions);
}

void Store::setCollectiveOptions(const AlignerOptions &options)
{
    m_collectiveOptions = options;
    m_collectiveOptionsSet = true;
    m_collectives.setOptions(options);
}

void Store::setCollectiveClock(std::uint64_t (*now)())
{
    m_collectiveClock = now;
}

void Store::tickCollectives(std::uint64_t nowNs)
{
    m_collectives.tick(nowNs);
    syncCollectives();
}

void Store::rankFinished(int rank, const std::string &how)
{
    m_collectives.rankFinished(rank, how);
    syncCollectives();
}

void Store::finishCollectives()
{
    m_collectives.finish(0);
    syncCollectives();
}

// The aligner's records into the one ledger: each its own row (a record's final words and
// sites replace the earlier ones of its row).
void Store::syncCollectives()
{
    if (m_collectives.revision() == m_collectiveRevision) return;
    m_collectiveRevision = m_collectives.revision();
    if (m_collectives.records().empty()) return;
    for (const state::ViolationRecord &v : m_collectives.records())
        m_violations.add(v, state::Tally::Total);
    rebuildViolationCounts();
    m_pending.violations = true;
}

void Store::clear()
{
    m_state = state::EngineState{};
    m_hasState = false;
    m_paramIndex.clear();
    m_sparseParamIndex.clear();
    m_childModulesAt.clear();
    m_childModules.clear();
    m_ownedParamsAt.clear();
    m_ownedParams.clear();
    m_externalsOn.clear();
    m_paramViolations.clear();
    m_moduleViolations.clear();
    m_paramSeverity.clear();
    m_moduleSeverity.clear();
    m_violations.clear();
    m_knownParamNames.clear();
    m_lanes.clear();
    m_late.clear();
    m_fetchBegin.clear();
    m_memory.clear();
    m_totalEvents = 0;
    m_duplicates = 0;
    m_droppedFromEvents = 0;
    m_droppedReported = 0;
    m_hasLoss = false;
    m_completedStep = 0;
    m_loss = 0.0;
    m_dedupe = false;
    m_timeOrigin = 0;
    m_pending = StoreChanges{};
    m_pending.reset = true;
    m_paramMarked.clear();
    m_collectives = CollectiveAligner(1, m_collectiveOptions);
    m_collectiveRevision = 0;
}

state::EngineState Store::applyState(state::EngineState state)
{
    const bool continuing = m_hasState && sameRun(m_state, state);
    state::EngineState replaced = std::move(m_state);
    if (!continuing) {
        const bool readOnly = m_readOnly;
        const std::string source = m_source;
        clear();
        m_readOnly = readOnly;
        m_source = source;
    } else {
        m_dedupe = true;
        if (!sameStructure(replaced, state)) m_pending.structure = true;
    }
    m_state = std::move(state);
    m_hasState = true;
    rebuildIndex();
    // Names of the parameters this state no longer lists; the listed ones are looked up in it.
    if (continuing)
        for (const state::ParamRecord &p : replaced.params)
            if (paramSlot(p.id) < 0) m_knownParamNames[p.id] = p.name;

    // Each record is its producer's total for its rank so far.
    for (const state::ViolationRecord &v : m_state.violations)
        m_violations.add(v, state::Tally::Total);
    // The aligner: the job's structure and dialect, its ranks' own stall lines.
    if (!continuing) {
        AlignerOptions options = m_collectiveOptions;
        if (!m_collectiveOptionsSet)
            options.stallNs = stallNsFromEnvironment(defaultStallNs(m_state.backend), nullptr);
        state::parseFixDialect(m_state.fixDialect, options.dialect);
        m_collectives = CollectiveAligner(m_state.worldSize, options);
    }
    m_collectives.setModulePaths(m_state.modules);
    for (const state::ViolationRecord &v : m_state.violations)
        m_collectives.addRankRecord(v);
    m_collectiveRevision = ~std::uint64_t(0); // the ledger was rebuilt from the state
    syncCollectives();
    rebuildViolationCounts();
    if (m_lanes.size() < static_cast<std::size_t>(std::max(1, m_state.worldSize))) {
        m_lanes.resize(static_cast<std::size_t>(std::max(1, m_state.worldSize)));
        m_late.resize(m_lanes.size());
        setMaxEvents(m_maxEvents);
    }
    if (m_memory.size() < m_lanes.size()) m_memory.resize(m_lanes.size());
    m_pending.violations = true;
    m_pending.summary = true;
    if (continuing) {
        for (const state::ParamRecord &p : m_state.params)
            markParam(p.id);
    }
    return replaced;
}

void Store::rebuildIndex()
{
    const std::size_t nModules = m_state.modules.size();
    m_externalsOn.assign(nModules, {});
    // Counted first, then each module's range filled in the order the state lists them.
    auto group = [nModules](std::vector<std::uint32_t> &at, std::vector<std::uint32_t> &items,
                            const auto &records, auto keyOf, auto valueOf) {
        at.assign(nModules + 1, 0);
        for (const auto &r : records)
            if (const std::size_t k = keyOf(r); k < nModules) ++at[k + 1];
        for (std::size_t m = 0; m < nModules; ++m)
            at[m + 1] += at[m];
        items.resize(at[nModules]);
        std::vector<std::uint32_t> next(at.begin(), at.end() - 1);
        for (const auto &r : records)
            if (const std::size_t k = keyOf(r); k < nModules) items[next[k]++] = valueOf(r);
    };
    group(
        m_childModulesAt, m_childModules, m_state.modules,
        [](const state::ModuleRecord &m) {
            return m.parent != kNoModule && m.parent != m.id ? std::size_t{m.parent}
                                                             : std::size_t(-1);
        },
        [](const state::ModuleRecord &m) { return m.id; });
    group(
        m_ownedParamsAt, m_ownedParams, m_state.params,
        [](const state::ParamRecord &p) { return std::size_t{p.owner}; },
        [](const state::ParamRecord &p) { return p.id; });
    const std::size_t nParams = m_state.params.size();
    std::size_t maxId = 0;
    for (const state::ParamRecord &p : m_state.params)
        maxId = std::max<std::size_t>(maxId, p.id);
    m_paramIndex.clear();
    m_sparseParamIndex.clear();
    const bool dense = nParams == 0 || maxId < 4 * nParams + 65536;
    if (dense)
        m_paramIndex.assign(nParams == 0 ? 0 : maxId + 1, -1);
    else
        m_sparseParamIndex.reserve(nParams);
    for (std::size_t i = 0; i < nParams; ++i) {
        const state::ParamRecord &p = m_state.params[i];
        if (dense)
            m_paramIndex[p.id] = static_cast<std::int32_t>(i);
        else
            m_sparseParamIndex[p.id] = static_cast<std::int32_t>(i);
        for (const state::ExternalRecord &e : p.externals) {
            if (e.module < nModules)
                m_externalsOn[e.module].push_back(state::ExternalRecord{p.id, e.automatic});
        }
    }
    // Parameters may have moved: mark the pending ones again at their new places.
    m_paramMarked.assign(nParams, 0);
    for (ParamId id : m_pending.params)
        if (const std::int32_t slot = paramSlot(id); slot >= 0)
            m_paramMarked[static_cast<std::size_t>(slot)] = 1;
}

std::int32_t Store::paramSlot(ParamId id) const
{
    if (!m_sparseParamIndex.empty()) {
        const auto it = m_sparseParamIndex.find(id);
        return it == m_sparseParamIndex.end() ? -1 : it->second;
    }
    return id < m_paramIndex.size() ? m_paramIndex[id] : -1;
}

void Store::rebuildViolationCounts()
{
    m_paramViolations.assign(m_state.params.size(), 0);
    m_moduleViolations.assign(m_state.modules.size(), 0);
    m_paramSeverity.assign(m_state.params.size(), kNoSeverity);
    m_moduleSeverity.assign(m_state.modules.size(), kNoSeverity);
    for (const state::ViolationRow &g : m_violations.rows()) {
        countSeverity(g);
        if (const std::int32_t slot = paramSlot(g.param); slot >= 0)
            m_paramViolations[static_cast<std::size_t>(slot)] += g.count;
        if (g.accessor < m_moduleViolations.size()) m_moduleViolations[g.accessor] += g.count;
        if (g.owner < m_moduleViolations.size() && g.owner != g.accessor)
            m_moduleViolations[g.owner] += g.count;
    }
}

void Store::appendEvents(std::span<const telemetry::Event> events, bool history)
{
    if (events.empty()) return;
    // A live store measures collectives' waits from when it received them (its clock).
    const std::uint64_t seen = !m_readOnly && m_collectiveClock ? m_collectiveClock() : 0;
    // Events older than the newest stored one are merged per lane after the loop: one by
    // one, each would move every later event (quadratic for a reversed file).
    for (const telemetry::Event &ev : events) {
        EventLane &lane = laneFor(ev.rank);
        std::vector<telemetry::Event> &late = m_late[ev.rank];
        if (m_dedupe && !lane.empty() && ev.tsNs <= lane.lastTs() &&
            ((lane.evicted() > 0 && ev.tsNs < lane.firstTs()) || lane.contains(ev))) {
            ++m_duplicates; // seen before (or older than what the memory bound keeps)
            continue;
        }
        if (late.empty() && (lane.empty() || ev.tsNs >= lane.lastTs()))
            lane.insert(ev);
        else
            late.push_back(ev);
        ++m_totalEvents;
        m_collectives.add(ev, seen);
        switch (ev.type) {
        case EventType::StepBegin:
            if (ev.step > m_state.step) {
                m_state.step = ev.step;
                m_pending.summary = true;
            }
            break;
        case EventType::StepEnd:
            m_completedStep = std::max(m_completedStep, ev.step);
            m_loss = telemetry::readStepEnd(ev);
            m_hasLoss = true;
            m_pending.summary = true;
            break;
        case EventType::MemorySample: {
            RankMemory &m = m_memory[ev.rank];
            if (ev.tsNs >= m.tsNs) {
                const telemetry::MemoryFields f = telemetry::readMemory(ev);
                m.tsNs = ev.tsNs;
                m.partitionedBytes = f.partitionedBytes;
                m.gatheredBytes = f.gatheredBytes;
                m.peakGatheredBytes = f.peakGatheredBytes;
                m.liveElements = f.liveElements;
                m_pending.summary = true;
            }
            break;
        }
        default:
            if (!history) applyLive(ev);
            break;
        }
    }
    for (std::size_t r = 0; r < m_late.size(); ++r) {
        if (m_late[r].empty()) continue;
        m_lanes[r].insertMany(m_late[r]);
        m_late[r].clear();
    }
    syncCollectives();
    m_pending.events = true;
}

EventLane &Store::laneFor(int rank)
{
    const std::size_t r = static_cast<std::size_t>(rank);
    if (r >= m_lanes.size()) {
        m_lanes.resize(r + 1);
        m_late.resize(r + 1);
        m_memory.resize(r + 1);
        setMaxEvents(m_maxEvents);
    }
    return m_lanes[r];
}

void Store::setMaxEvents(std::size_t events)
{
    m_maxEvents = events;
    const std::size_t lanes = std::max<std::size_t>(1, m_lanes.size());
    for (EventLane &lane : m_lanes)
        lane.setCapacity(events == 0 ? 0 : std::max<std::size_t>(1, events / lanes));
}

std::uint64_t Store::evictedEvents() const
{
    std::uint64_t n = 0;
    for (const EventLane &lane : m_lanes)
        n += lane.evicted();
    return n;
}

state::ParamRecord *Store::mutParam(ParamId id)
{
    const std::int32_t slot = paramSlot(id);
    return slot < 0 ? nullptr : &m_state.params[static_cast<std::size_t>(slot)];
}

void Store::applyLive(const telemetry::Event &ev)
{
    switch (ev.type) {
    case EventType::FetchBegin: {
        const telemetry::FetchFields f = telemetry::readFetch(ev);
        if (state::ParamRecord *p = mutParam(f.param)) {
            if (ev.rank < p->status.size()) p->status[ev.rank] = ParamStatus::Inflight;
            m_fetchBegin[fetchKey(ev.rank, f.param)] = ev.tsNs;
            markParam(f.param);
        }
        break;
    }
    case EventType::FetchEnd: {
        const telemetry::FetchFields f = telemetry::readFetch(ev);
        if (state::ParamRecord *p = mutParam(f.param)) {
            if (ev.rank < p->status.size()) p->status[ev.rank] = ParamStatus::Available;
            ++p->gatherCount;
            p->gatherBytes += f.bytes;
            auto it = m_fetchBegin.find(fetchKey(ev.rank, f.param));
            if (it != m_fetchBegin.end()) {
                if (ev.tsNs >= it->second) p->gatherNs += ev.tsNs - it->second;
                m_fetchBegin.erase(it);
            }
            p->lastGatherTsNs = std::max(p->lastGatherTsNs, ev.tsNs);
            markParam(f.param);
        }
        break;
    }
    case EventType::Release: {
        const telemetry::ReleaseFields f = telemetry::readRelease(ev);
        if (state::ParamRecord *p = mutParam(f.param)) {
            if (ev.rank < p->status.size()) p->status[ev.rank] = ParamStatus::NotAvailable;
            markParam(f.param);
        }
        break;
    }
    case EventType::ExternalRegister: {
        const telemetry::ExternalFields f = telemetry::readExternal(ev);
        if (state::ParamRecord *p = mutParam(f.param)) {
            auto it =
                std::find_if(p->externals.begin(), p->externals.end(),
                             [&](const state::ExternalRecord &e) { return e.module == f.module; });
            if (it == p->externals.end() && f.module < m_state.modules.size()) {
                p->externals.push_back(state::ExternalRecord{f.module, f.automatic});
                m_externalsOn[f.module].push_back(state::ExternalRecord{f.param, f.automatic});
                m_pending.structure = true;
                markParam(f.param);
            }
        }
        break;
    }
    case EventType::ExternalUnregister: {
        const telemetry::ExternalFields f = telemetry::readExternal(ev);
        if (state::ParamRecord *p = mutParam(f.param)) {
            auto it =
                std::find_if(p->externals.begin(), p->externals.end(),
                             [&](const state::ExternalRecord &e) { return e.module == f.module; });
            if (it != p->externals.end()) {
                p->externals.erase(it);
                rebuildIndex();
                m_pending.structure = true;
                markParam(f.param);
            }
        }
        break;
    }
    case EventType::UnregisteredAccess:
    case EventType::TraceInvalidated:
    case EventType::GatheredWriteError:
        if (auto v = violationOf(ev)) addViolation(std::move(*v));
        break;
    case EventType::LateParameter: {
        // The parameter is late from now on; the violation is not this event but the
        // producer's record when a step begins with it unadopted (it may be adopted first),
        // which its State brings with the producer's accessor, location and words: counting
        // the event too made a second row (capture, which reads the State alone, had one).
        const telemetry::LateFields f = telemetry::readLate(ev);
        if (state::ParamRecord *p = mutParam(f.param)) {
            p->late = true;
            markParam(f.param);
        }
        break;
    }
    case EventType::ParameterAdopted: {
        const telemetry::LateFields f = telemetry::readLate(ev);
        if (state::ParamRecord *p = mutParam(f.param)) {
            p->partitioned = true;
            markParam(f.param);
        }
        break;
    }
    case EventType::DroppedEvents:
        m_droppedFromEvents += telemetry::readDroppedEvents(ev);
        m_pending.summary = true;
        break;
    default:
        break;
    }
}

std::optional<state::ViolationRecord> Store::violationOf(const telemetry::Event &ev) const
{
    state::ViolationRecord v;
    switch (ev.type) {
    case EventType::UnregisteredAccess: {
        const telemetry::AccessFields f = telemetry::readAccess(ev);
        v.kind = ViolationKind::UnregisteredAccess;
        v.accessor = f.accessor;
        v.param = f.param;
        v.owner = f.owner;
        v.status = f.status;
        v.action = f.action;
        v.read = f.read;
        break;
    }
    case EventType::LateParameter: {
        // `a` is the owner: no module read it. The producer's row of this parameter, when
        // the store has one, says which accessor it records (none, or ours: the owner).
        const telemetry::LateFields f = telemetry::readLate(ev);
        const state::ParamRecord *p = param(f.param);
        v.kind = ViolationKind::LateParameter;
        v.accessor = kNoModule;
        v.param = f.param;
        v.owner = p ? p->owner : f.module;
        v.status = ParamStatus::Available;
        for (const state::ViolationRow &row : m_violations.rows())
            if (row.kind == ViolationKind::LateParameter && row.param == f.param) {
                v.accessor = row.accessor;
                v.owner = row.owner;
                break;
            }
        break;
    }
    case EventType::TraceInvalidated: {
        const telemetry::TraceInvalidatedFields f = telemetry::readTraceInvalidated(ev);
        v.kind = ViolationKind::TraceInvalidated;
        v.accessor = f.got;
        v.owner = f.expected;
        break;
    }
    case EventType::GatheredWriteError: {
        const ParamId id = telemetry::readGatheredWriteError(ev);
        const state::ParamRecord *p = param(id);
        v.kind = ViolationKind::GatheredWriteWithoutModifier;
        v.param = id;
        v.owner = p ? p->owner : kNoModule;
        v.status = ParamStatus::Available;
        v.action = GuardAction::Raised;
        break;
    }
    default:
        return std::nullopt;
    }
    v.rank = ev.rank;
    v.step = v.lastStep = ev.step;
    v.tsNs = ev.tsNs;
    v.count = 1;
    return v;
}

const state::ViolationRow *Store::violationGroup(const state::ViolationRecord &v) const
{
    return m_violations.find(state::keyOf(v));
}

void Store::addViolation(state::ViolationRecord v)
{
    // Words only for a row not seen before: a row keeps the words it was first shown with.
    state::Words words = state::Words::Final;
    if (!m_violations.find(state::keyOf(v))) {
        const state::ParamRecord *p = param(v.param);
        if (v.param != kNoParam) {
            v.paramName = paramName(v.param);
            if (v.paramName.starts_with("<parameter ")) words = state::Words::Provisional;
        }
        state::ViolationSubject subject;
        subject.kind = v.kind;
        subject.hasAccessor = v.accessor != kNoModule;
        if (const state::ModuleRecord *m = module(v.accessor)) subject.accessor = m->path;
        subject.param = v.paramName;
        subject.hasOwner = v.owner != kNoModule;
        if (const state::ModuleRecord *m = module(v.owner)) subject.owner = m->path;
        subject.status = v.status;
        if (v.read == ViolationRead::Attribute) subject.use = state::AccessUse::Attribute;
        if (p) subject.replaces = p->replaces;
        subject.modifierRank = v.rank;
        state::FixDialect dialect = state::FixDialect::ShardScope;
        state::parseFixDialect(m_state.fixDialect, dialect);
        state::ViolationText text = state::describeViolation(subject, dialect);
        v.fix = std::move(text.fix);
        v.message = std::move(text.message);
    }
    countSeverity(m_violations.rows()[m_violations.add(v, state::Tally::Add, words).row]);
    if (const std::int32_t slot = paramSlot(v.param);
        slot >= 0 && static_cast<std::size_t>(slot) < m_paramViolations.size())
        ++m_paramViolations[static_cast<std::size_t>(slot)];
    if (v.accessor < m_moduleViolations.size()) ++m_moduleViolations[v.accessor];
    if (v.owner < m_moduleViolations.size() && v.owner != v.accessor) ++m_moduleViolations[v.owner];
    if (v.param != kNoParam) markParam(v.param);
    m_pending.violations = true;
}

void Store::setDroppedEvents(std::uint64_t dropped)
{
    if (dropped == m_droppedReported && m_droppedFromEvents == 0) return;
    m_droppedReported = dropped;
    m_droppedFromEvents = 0;
    m_pending.summary = true;
}

std::string Store::applySourceState(int source, state::EngineState state, const std::string &name)
{
    if (source < 0) return "bad source " + std::to_string(source);
    for (std::size_t k = 0; k < m_sources.size(); ++k) {
        const Source &other = m_sources[k];
        if (!other.hasState || static_cast<int>(k) == source) continue;
        // The one rule (wire::checkOneJob): never the model's name, which changes while the
        // ranks build the model.
        if (std::string wrong = wire::checkOneJob(
                state, name.empty() ? "process " + std::to_string(source) : name, other.state);
            !wrong.empty())
            return wrong;
    }
    if (static_cast<std::size_t>(source) >= m_sources.size())
        m_sources.resize(static_cast<std::size_t>(source) + 1);
    Source &s = m_sources[static_cast<std::size_t>(source)];
    s.hasState = true;
    s.state = std::move(state);
    if (!name.empty()) s.name = name;
    if (s.name.empty()) s.name = "process " + std::to_string(source);
    m_mergePending = true;
    // The first state of a job is shown at once; later ones are coalesced.
    if (!m_hasState || !m_lastMerge || mergeDue()) mergeSources();
    return {};
}

bool Store::mergeDue() const
{
    using namespace std::chrono;
    return !m_lastMerge || steady_clock::now() - *m_lastMerge >=
                               milliseconds(std::max<std::int64_t>(100, 3 * m_mergeCostMs));
}

void Store::mergeSources()
{
    if (!m_mergePending) return;
    m_mergePending = false;
    const auto cost = std::chrono::steady_clock::now();
    std::vector<const state::EngineState *> parts;
    std::vector<std::string> names;
    for (const Source &s : m_sources) {
        if (!s.hasState) continue;
        parts.push_back(&s.state);
        names.push_back(s.name);
    }
    if (parts.empty()) return;
    auto merged = wire::mergeJobStates(parts, names);
    if (merged) applyState(std::move(merged).value()); // checked on entry: cannot fail here
    // Module ids are per process: each rank's collectives read its own process's paths.
    for (const state::EngineState *part : parts)
        if (!part->modules.empty()) setRankPaths(m_collectives, *part);
    m_lastMerge = std::chrono::steady_clock::now();
    m_mergeCostMs =
        std::chrono::duration_cast<std::chrono::milliseconds>(*m_lastMerge - cost).count();
}

void Store::setSourceDropped(int source, std::uint64_t dropped)
{
    if (source < 0) return;
    if (static_cast<std::size_t>(source) >= m_sources.size())
        m_sources.resize(static_cast<std::size_t>(source) + 1);
    m_sources[static_cast<std::size_t>(source)].dropped = dropped;
    std::uint64_t total = 0;
    for (const Source &s : m_sources)
        total += s.dropped;
    setDroppedEvents(total);
}

void Store::clearSources()
{
    m_sources.clear();
    m_mergePending = false;
    m_lastMerge.reset();
    m_mergeCostMs = 0;
}

bool Store::hasSourceState(int source) const
{
    return source >= 0 && static_cast<std::size_t>(source) < m_sources.size() &&
           m_sources[static_cast<std::size_t>(source)].hasState;
}

void Store::setReadOnly(bool readOnly, const std::string &source)
{
    m_readOnly = readOnly;
    m_source = source;
    m_pending.summary = true;
}

const state::ModuleRecord *Store::module(ModuleId id) const
{
    return id < m_state.modules.size() ? &m_state.modules[id] : nullptr;
}

const state::ParamRecord *Store::param(ParamId id) const
{
    const std::int32_t slot = paramSlot(id);
    return slot < 0 ? nullptr : &m_state.params[static_cast<std::size_t>(slot)];
}

std::string Store::modulePath(ModuleId id) const
{
    if (id == kNoModule) return "<none>";
    const state::ModuleRecord *m = module(id);
    if (!m) return "<module " + std::to_string(id) + ">";
    return m->path.empty() ? std::string("<root>") : m->path;
}

std::string Store::paramName(ParamId id) const
{
    if (id == kNoParam) return "<none>";
    if (const state::ParamRecord *p = param(id)) return p->name;
    // Removed since (weight_norm replaces `weight`): an earlier state or a violation named it.
    if (auto it = m_knownParamNames.find(id); it != m_knownParamNames.end()) return it->second;
    for (const state::ViolationRecord &v : m_state.violations)
        if (v.param == id && !v.paramName.empty()) return v.paramName;
    return "<parameter " + std::to_string(id) + ">";
}

std::span<const ModuleId> Store::childModules(ModuleId id) const
{
    if (std::size_t{id} + 1 >= m_childModulesAt.size()) return {};
    return std::span<const ModuleId>(m_childModules)
        .subspan(m_childModulesAt[id], m_childModulesAt[id + 1] - m_childModulesAt[id]);
}

std::span<const ParamId> Store::ownedParams(ModuleId id) const
{
    if (std::size_t{id} + 1 >= m_ownedParamsAt.size()) return {};
    return std::span<const ParamId>(m_ownedParams)
        .subspan(m_ownedParamsAt[id], m_ownedParamsAt[id + 1] - m_ownedParamsAt[id]);
}

const std::vector<state::ExternalRecord> &Store::externalsOn(ModuleId module) const
{
    return module < m_externalsOn.size() ? m_externalsOn[module] : kNoExternals;
}

std::uint64_t Store::paramViolations(ParamId id) const
{
    const std::int32_t slot = paramSlot(id);
    return slot >= 0 && static_cast<std::size_t>(slot) < m_paramViolations.size()
               ? m_paramViolations[static_cast<std::size_t>(slot)]
               : 0;
}

std::uint64_t Store::moduleViolations(ModuleId id) const
{
    return id < m_moduleViolations.size() ? m_moduleViolations[id] : 0;
}

void Store::countSeverity(const state::ViolationRow &row)
{
    const auto s = static_cast<std::uint8_t>(row.severity);
    auto worst = [s](std::vector<std::uint8_t> &v, std::size_t i) {
        if (i < v.size() && s < v[i]) v[i] = s; // Error is 0: the smaller, the worse
    };
    if (const std::int32_t slot = paramSlot(row.param); slot >= 0)
        worst(m_paramSeverity, static_cast<std::size_t>(slot));
    worst(m_moduleSeverity, row.accessor);
    worst(m_moduleSeverity, row.owner);
}

std::optional<Severity> Store::paramSeverity(ParamId id) const
{
    const std::int32_t slot = paramSlot(id);
    if (slot < 0 || static_cast<std::size_t>(slot) >= m_paramSeverity.size() ||
        m_paramSeverity[static_cast<std::size_t>(slot)] == kNoSeverity)
        return std::nullopt;
    return static_cast<Severity>(m_paramSeverity[static_cast<std::size_t>(slot)]);
}

std::optional<Severity> Store::moduleSeverity(ModuleId id) const
{
    if (id >= m_moduleSeverity.size() || m_moduleSeverity[id] == kNoSeverity) return std::nullopt;
    return static_cast<Severity>(m_moduleSeverity[id]);
}

std::vector<const state::ViolationRow *> Store::violationsOf(ParamId id) const
{
    std::vector<const state::ViolationRow *> out;
    for (const state::ViolationRow &g : m_violations.rows()) {
        if (g.param == id) out.push_back(&g);
    }
    return out;
}

std::uint64_t Store::firstTs() const
{
    std::uint64_t t = std::numeric_limits<std::uint64_t>::max();
    for (const EventLane &l : m_lanes) {
        if (!l.empty()) t = std::min(t, l.at(0).tsNs);
    }
    return t == std::numeric_limits<std::uint64_t>::max() ? 0 : t;
}

std::uint64_t Store::timeOrigin() const
{
    if (m_timeOrigin != 0) return m_timeOrigin;
    const std::uint64_t first = firstTs();
    std::uint64_t t = first;
    for (const state::ViolationRow &g : m_violations.rows())
        if (g.firstTsNs != 0 && (t == 0 || g.firstTsNs < t)) t = g.firstTsNs;
    if (first != 0) m_timeOrigin = t; // latched once events are known
    return t;
}

std::uint64_t Store::lastTs() const
{
    std::uint64_t t = 0;
    for (const EventLane &l : m_lanes)
        t = std::max(t, l.lastTs());
    return t;
}

void Store::markParam(ParamId id)
{
    const std::int32_t slot = paramSlot(id);
    if (slot < 0) return; // no such parameter: nothing shows it
    std::uint8_t &marked = m_paramMarked[static_cast<std::size_t>(slot)];
    if (!marked) {
        marked = 1;
        m_pending.params.push_back(id);
    }
}

StoreChanges Store::takeChanges()
{
    if (m_mergePending && mergeDue()) mergeSources();
    if (!m_readOnly && m_collectiveClock && m_hasState) tickCollectives(m_collectiveClock());
    if (!m_pending.any()) return {};
    StoreChanges changes = std::move(m_pending);
    m_pending = StoreChanges{};
    for (ParamId id : changes.params)
        if (const std::int32_t slot = paramSlot(id); slot >= 0)
            m_paramMarked[static_cast<std::size_t>(slot)] = 0;
    return changes;
}

void loadSnapshot(Store &store, wire::Snapshot snapshot, const std::string &source)
{
    store.clear();
    store.setReadOnly(true, source);
    store.applyState(std::move(snapshot.state));
    store.appendEvents(snapshot.events, true);
    store.setDroppedEvents(snapshot.droppedEvents);
    store.finishCollectives();
}

wire::Snapshot snapshotOf(const Store &store)
{
    wire::Snapshot s;
    s.meta.producer = "shardscope";
    s.meta.pid = ::getpid();
    s.meta.createdUnixMs = wire::unixTimeMs();
    s.meta.endpoint = store.readOnly() ? std::string() : store.source();
    s.state = store.state();
    // One record per (violation, rank), as docs/snapshot.md promises.
    s.state.violations = store.violationLedger().records();
    // Merge the per-rank lanes into one time-ordered list.
    using Head = std::pair<std::uint64_t, int>; // ts, lane
    std::priority_queue<Head, std::vector<Head>, std::greater<>> heads;
    std::vector<std::size_t> pos(static_cast<std::size_t>(store.laneCount()), 0);
    std::size_t total = 0;
    for (int r = 0; r < store.laneCount(); ++r) {
        total += store.lane(r).size();
        if (!store.lane(r).empty()) heads.emplace(store.lane(r).at(0).tsNs, r);
    }
    s.events.reserve(total);
    while (!heads.empty()) {
        const int r = heads.top().second;
        heads.pop();
        const EventLane &lane = store.lane(r);
        std::size_t &i = pos[static_cast<std::size_t>(r)];
        s.events.push_back(lane.at(i));
        if (++i < lane.size()) heads.emplace(lane.at(i).tsNs, r);
    }
    s.droppedEvents = store.droppedEvents();
    return s;
}

} // namespace shardscope::sessioncore

#include "agent/agentstate.h"

#include <algorithm>

#include "telemetry/clock.h"
#include "telemetry/eventfields.h"

namespace shardscope::agent {

namespace {

std::string parentPath(const std::string &path)
{
    const auto dot = path.rfind('.');
    return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

} // namespace

AgentState::AgentState(AgentConfig config) : m_config(std::move(config))
{
    state::ModuleRecord root;
    root.id = 0;
    root.type = "Module";
    m_modules.push_back(root);
    m_moduleByPath.emplace("", 0);
}

void AgentState::post(const telemetry::Event &fields, std::uint64_t tsNs)
{
    telemetry::EventSink *sink = m_sink.load(std::memory_order_acquire);
    if (!sink || !m_telemetry.load(std::memory_order_relaxed)) return;
    sink->write(telemetry::stamped(fields, tsNs ? tsNs : telemetry::nowNs(), m_step,
                                   static_cast<std::uint16_t>(m_config.rank)));
}

ModuleId AgentState::ensureModule(const std::string &path, const std::string &type)
{
    std::lock_guard lock(m_mutex);
    if (auto it = m_moduleByPath.find(path); it != m_moduleByPath.end()) {
        if (!type.empty() && m_modules[it->second].type != type) {
            m_modules[it->second].type = type;
            touch();
        }
        return it->second;
    }
    // Ancestors first, so a parent's id is always known when its child is added.
    std::vector<std::string> missing{path};
    for (std::string p = parentPath(path); !m_moduleByPath.contains(p); p = parentPath(p))
        missing.push_back(p);
    ModuleId id = kNoModule;
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        state::ModuleRecord m;
        m.id = static_cast<ModuleId>(m_modules.size());
        m.path = *it;
        m.type = *it == path ? type : std::string("Module");
        m.parent = m_moduleByPath.at(parentPath(*it));
        m_moduleByPath.emplace(m.path, m.id);
        m_modules.push_back(m);
        id = m.id;
    }
    touch();
    return id;
}

void AgentState::setModuleType(ModuleId id, const std::string &type)
{
    std::lock_guard lock(m_mutex);
    if (id < m_modules.size() && m_modules[id].type != type) {
        m_modules[id].type = type;
        touch();
    }
}

void AgentState::setUnit(ModuleId id, ModuleId group, const std::string &reshardAfterForward,
                         const std::string &mesh)
{
    std::lock_guard lock(m_mutex);
    if (id >= m_modules.size() || group >= m_modules.size()) return;
    state::ModuleRecord &m = m_modules[id];
    if (m.unitGroup == group && m.reshardAfterForward == reshardAfterForward && m.mesh == mesh)
        return;
    m.unitGroup = group;
    m.reshardAfterForward = reshardAfterForward;
    m.mesh = mesh;
    touch();
}

void AgentState::setModelName(const std::string &name)
{
    std::lock_guard lock(m_mutex);
    m_config.modelName = name;
    touch();
}

std::string AgentState::modelName() const
{
    std::lock_guard lock(m_mutex);
    return m_config.modelName;
}

void AgentState::setConfig(const state::EngineConfigRecord &config)
{
    std::lock_guard lock(m_mutex);
    m_config.config = config;
    touch();
}

void AgentState::countLocked(const AgentParam &p, bool add)
{
    const std::uint64_t es = p.elementBytes;
    // What this rank keeps: its partition (and hpZ's secondary one while it has it), or the
    // whole tensor where it is not partitioned (persistent, late); and while a partitioned one
    // is gathered, the padded full tensor.
    const std::uint64_t held =
        static_cast<std::uint64_t>(p.record.partitioned ? p.record.partitionNumel
                                                        : p.record.numel) *
            es +
        p.secondaryBytes;
    const bool gathered = p.record.partitioned && p.status == ParamStatus::Available;
    const std::uint64_t padded = static_cast<std::uint64_t>(p.record.paddedNumel);
    m_memoryChanged.store(true, std::memory_order_release);
    if (add) {
        m_memory.held += held;
        if (gathered) {
            m_memory.gathered += padded * es;
            m_memory.liveElements += padded;
            m_memory.peak = std::max(m_memory.peak, m_memory.gathered);
        }
    } else {
        m_memory.held -= std::min(m_memory.held, held);
        if (gathered) {
            m_memory.gathered -= std::min(m_memory.gathered, padded * es);
            m_memory.liveElements -= std::min(m_memory.liveElements, padded);
        }
    }
}

void AgentState::setStatusLocked(AgentParam &p, ParamStatus status)
{
    countLocked(p, false);
    p.status = status;
    countLocked(p, true);
}

telemetry::MemoryFields AgentState::memoryLocked() const
{
    return {.partitionedBytes = m_memory.held,
            .gatheredBytes = m_memory.gathered,
            .peakGatheredBytes = m_memory.peak,
            .liveElements = m_memory.liveElements};
}

void AgentState::postMemory()
{
    // Most module exits follow no status change: they take no lock (issue #26).
    if (!m_memoryChanged.load(std::memory_order_acquire) ||
        !m_memoryChanged.exchange(false, std::memory_order_acq_rel))
        return;
    telemetry::MemoryFields m;
    {
        std::lock_guard lock(m_mutex);
        m = memoryLocked();
        // A module exit that released nothing (most non-leaf modules) says nothing new.
        if (m_memoryPosted && m.partitionedBytes == m_lastMemory.partitionedBytes &&
            m.gatheredBytes == m_lastMemory.gatheredBytes &&
            m.peakGatheredBytes == m_lastMemory.peakGatheredBytes &&
            m.liveElements == m_lastMemory.liveElements)
            return;
        m_lastMemory = m;
        m_memoryPosted = true;
    }
    post(telemetry::makeMemorySample(m));
}

void AgentState::setParam(const AgentParam &given)
{
    std::lock_guard lock(m_mutex);
    AgentParam p = given;
    if (AgentParam *old = findLocked(p.record.id)) {
        countLocked(*old, false);
        p.secondaryBytes = old->secondaryBytes; // DeepSpeed's, not the record's
    }
    countLocked(p, true);
    AgentParam &slot = m_params[p.record.id];
    slot = p;
    if (p.record.id < kIndexed) { // std::map's nodes stay where they are
        if (p.record.id >= m_paramIndex.size()) m_paramIndex.resize(p.record.id + 1, nullptr);
        m_paramIndex[p.record.id] = &slot;
    }
    m_removedNames.erase(p.record.id);
    touch();
}

void AgentState::removeParam(ParamId id)
{
    std::lock_guard lock(m_mutex);
    if (auto it = m_params.find(id); it != m_params.end()) {
        countLocked(it->second, false);
        m_removedNames[id] = it->second.record.name;
        if (id < m_paramIndex.size()) m_paramIndex[id] = nullptr;
        m_params.erase(it);
        m_lateUnadopted.erase(id);
        m_lateSites.erase(id);
        touch();
    }
}

void AgentState::setSecondary(ParamId id, std::uint64_t bytes)
{
    std::lock_guard lock(m_mutex);
    AgentParam *p = findLocked(id);
    if (!p || p->secondaryBytes == bytes) return;
    countLocked(*p, false);
    p->secondaryBytes = bytes;
    countLocked(*p, true);
}

bool AgentState::hasParam(ParamId id) const
{
    std::lock_guard lock(m_mutex);
    return m_params.contains(id);
}

void AgentState::setActive(ParamId id, std::vector<ModuleId> modules)
{
    std::lock_guard lock(m_mutex);
    m_active[id] = std::move(modules);
    touch();
}

void AgentState::setActive(std::vector<std::pair<ParamId, std::vector<ModuleId>>> changes)
{
    std::lock_guard lock(m_mutex);
    for (auto &[id, modules] : changes)
        m_active[id] = std::move(modules);
    touch();
}

void AgentState::setStatuses(const std::vector<std::pair<ParamId, ParamStatus>> &statuses)
{
    std::lock_guard lock(m_mutex);
    for (const auto &[id, status] : statuses)
        if (AgentParam *ap = findLocked(id)) setStatusLocked(*ap, status);
    touch();
}

AgentParam *AgentState::findLocked(ParamId id)
{
    if (id < kIndexed) return id < m_paramIndex.size() ? m_paramIndex[id] : nullptr;
    auto it = m_params.find(id);
    return it == m_params.end() ? nullptr : &it->second;
}

AgentState::Gathers &AgentState::gathersLocked(ParamId id)
{
    if (id >= kIndexed) return m_gathers[id];
    if (id >= m_gatherIndex.size()) m_gatherIndex.resize(id + 1, nullptr);
    Gathers *&g = m_gatherIndex[id];
    if (!g) g = &m_gathers[id];
    return *g;
}

std::string AgentState::paramNameLocked(ParamId id) const
{
    if (auto it = m_params.find(id); it != m_params.end()) return it->second.record.name;
    if (auto it = m_removedNames.find(id); it != m_removedNames.end()) return it->second;
    return "<ds_id " + std::to_string(id) + ">";
}

void AgentState::moduleEnter(ModuleId m, Phase phase)
{
    post(telemetry::makeModuleEnter({.module = m, .phase = phase}));
}

void AgentState::moduleExit(ModuleId m, Phase phase)
{
    post(telemetry::makeModuleExit({.module = m, .phase = phase}));
    postMemory();
}

void AgentState::fetchBegin(ParamId p, ModuleId cause, std::uint64_t bytes, FetchReason reason)
{
    const std::uint64_t now = telemetry::nowNs();
    {
        std::lock_guard lock(m_mutex);
        if (AgentParam *ap = findLocked(p)) setStatusLocked(*ap, ParamStatus::Inflight);
        gathersLocked(p).beganTs = now;
        touch();
    }
    post(telemetry::makeFetchBegin({.param = p, .cause = cause, .bytes = bytes, .reason = reason}),
         now);
}

void AgentState::fetchEnd(ParamId p, ModuleId cause, std::uint64_t bytes, FetchReason reason)
{
    const std::uint64_t now = telemetry::nowNs();
    {
        std::lock_guard lock(m_mutex);
        if (AgentParam *ap = findLocked(p)) setStatusLocked(*ap, ParamStatus::Available);
        Gathers &g = gathersLocked(p);
        ++g.count;
        g.bytes += bytes;
        if (g.beganTs != 0 && now >= g.beganTs) g.ns += now - g.beganTs;
        g.beganTs = 0;
        g.lastTs = now;
        touch();
    }
    post(telemetry::makeFetchEnd({.param = p, .cause = cause, .bytes = bytes, .reason = reason}),
         now);
}

void AgentState::release(ParamId p, ModuleId cause, std::uint64_t bytes)
{
    {
        std::lock_guard lock(m_mutex);
        if (AgentParam *ap = findLocked(p)) setStatusLocked(*ap, ParamStatus::NotAvailable);
        touch();
    }
    post(telemetry::makeRelease({.param = p, .cause = cause, .bytes = bytes}));
}

void AgentState::statusChanged(ParamId p, ParamStatus from, ParamStatus to, ModuleId cause,
                               std::uint64_t bytes, FetchReason reason)
{
    if (to == ParamStatus::NotAvailable) {
        if (from != ParamStatus::NotAvailable) release(p, cause, bytes);
    } else if (to == ParamStatus::Inflight) {
        if (from == ParamStatus::NotAvailable) fetchBegin(p, cause, bytes, reason);
    } else if (from != ParamStatus::Available) {
        if (from == ParamStatus::NotAvailable) fetchBegin(p, cause, bytes, reason);
        fetchEnd(p, cause, bytes, reason);
    }
}

void AgentState::broadcast(ParamId p, int root, std::uint64_t bytes)
{
    post(telemetry::makeBroadcast(
        {.param = p, .root = static_cast<std::uint32_t>(root), .bytes = bytes}));
}

void AgentState::registerExternal(ModuleId m, ParamId p, bool automatic)
{
    {
        std::lock_guard lock(m_mutex);
        auto &list = m_externals[p];
        auto it = std::find_if(list.begin(), list.end(),
                               [&](const state::ExternalRecord &e) { return e.module == m; });
        if (it == list.end())
            list.push_back(state::ExternalRecord{m, automatic});
        else
            it->automatic = it->automatic && automatic;
        touch();
    }
    post(telemetry::makeExternalRegister({.module = m, .param = p, .automatic = automatic}));
}

void AgentState::unregisterExternal(ModuleId m, ParamId p)
{
    {
        std::lock_guard lock(m_mutex);
        std::erase_if(m_externals[p],
                      [&](const state::ExternalRecord &e) { return e.module == m; });
        touch();
    }
    post(telemetry::makeExternalUnregister({.module = m, .param = p}));
}

state::ViolationRecord AgentState::violationLocked(ViolationKind kind,
                                                   const state::ViolationText &text) const
{
    state::ViolationRecord v;
    v.kind = kind;
    v.step = m_step;
    v.lastStep = m_step;
    v.rank = m_config.rank;
    v.action = GuardAction::Recorded;
    v.count = 1;
    v.tsNs = telemetry::nowNs();
    v.fix = text.fix;
    v.message = text.message;
    return v;
}

void AgentState::recordLocked(const state::ViolationRecord &v)
{
    m_violations.add(v, state::Tally::Add);
    touch();
}

state::ViolationText AgentState::unregisteredAccess(ModuleId accessor, ParamId p,
                                                    GuardAction action, state::AccessUse use,
                                                    const state::SourceLocation &where,
                                                    const std::string &building,
                                                    const std::string &paramCode,
                                                    std::optional<ParamStatus> statusAtRead)
{
    const ViolationRead read =
        use == state::AccessUse::Attribute ? ViolationRead::Attribute : ViolationRead::Values;
    state::ViolationText text;
    ParamStatus status = ParamStatus::NotAvailable;
    ModuleId owner = kNoModule;
    bool first = false;
    {
        std::lock_guard lock(m_mutex);
        const AgentParam *ap = findLocked(p);
        if (ap) {
            status = ap->status;
            owner = ap->record.owner;
        }
        if (statusAtRead) status = *statusAtRead;
        state::ViolationSubject subject;
        subject.kind = ViolationKind::UnregisteredAccess;
        subject.hasAccessor = accessor != kNoModule && accessor < m_modules.size();
        if (subject.hasAccessor) subject.accessor = m_modules[accessor].path;
        subject.param = paramNameLocked(p);
        subject.owner = owner < m_modules.size() ? m_modules[owner].path : std::string();
        subject.status = status;
        subject.use = use;
        subject.paramCode = paramCode;
        text = state::describeViolation(subject, m_config.dialect);
        first = m_thisStep.emplace(0, accessor, p, where.file, where.line).second;
        if (first) {
            state::ViolationRecord v = violationLocked(ViolationKind::UnregisteredAccess, text);
            v.accessor = subject.hasAccessor ? accessor : kNoModule;
            v.param = p;
            v.paramName = subject.param;
            v.owner = owner;
            v.status = status;
            v.action = action;
            v.read = read;
            v.location = where;
            v.building = building;
            recordLocked(v);
        }
    }
    if (first)
        post(telemetry::makeUnregisteredAccess({.accessor = accessor,
                                                .param = p,
                                                .owner = owner,
                                                .status = status,
                                                .action = action,
                                                .read = read}));
    return text;
}

void AgentState::completeBuildNames(const std::map<ModuleId, ModuleId> &moved)
{
    std::lock_guard lock(m_mutex);
    bool changed = false;
    std::vector<state::ViolationRecord> records = m_violations.records();
    auto remap = [&](ModuleId m) {
        const auto it = moved.find(m);
        return it == moved.end() ? m : it->second;
    };
    for (state::ViolationRecord &v : records) {
        const ModuleId accessor = remap(v.accessor), owner = remap(v.owner);
        if (v.building.empty() && accessor == v.accessor && owner == v.owner) continue;
        v.accessor = accessor;
        v.owner = owner;
        if (m_params.contains(v.param) || m_removedNames.contains(v.param))
            v.paramName = paramNameLocked(v.param);
        if (v.kind == ViolationKind::UnregisteredAccess) {
            state::ViolationSubject subject;
            subject.kind = v.kind;
            subject.hasAccessor = v.accessor != kNoModule && v.accessor < m_modules.size();
            if (subject.hasAccessor) subject.accessor = m_modules[v.accessor].path;
            subject.param = v.paramName;
            subject.owner = v.owner < m_modules.size() ? m_modules[v.owner].path : std::string();
            subject.status = v.status;
            // Read while building is model-building code changing it (AccessUse::Write).
            subject.use = v.read == ViolationRead::Attribute ? state::AccessUse::Attribute
                          : v.building.empty()               ? state::AccessUse::Read
                                                             : state::AccessUse::Write;
            const state::ViolationText text = state::describeViolation(subject, m_config.dialect);
            v.fix = text.fix;
            v.message = text.message;
        }
        changed = true;
    }
    if (!changed) return;
    m_violations.clear();
    for (const state::ViolationRecord &v : records)
        m_violations.add(v, state::Tally::Total);
    touch();
}

void AgentState::lateParameter(ParamId p, const state::SourceLocation &where)
{
    ModuleId owner = kNoModule;
    {
        std::lock_guard lock(m_mutex);
        if (AgentParam *ap = findLocked(p)) {
            countLocked(*ap, false);
            ap->record.late = true;
            ap->record.partitioned = false;
            ap->status = ParamStatus::Available;
            countLocked(*ap, true);
            owner = ap->record.owner;
        }
        m_lateUnadopted.insert(p);
        if (where.known()) m_lateSites[p] = where;
        touch();
    }
    post(telemetry::makeLateParameter({.module = owner, .param = p}));
}

void AgentState::parameterAdopted(ParamId p)
{
    ModuleId owner = kNoModule;
    {
        std::lock_guard lock(m_mutex);
        if (AgentParam *ap = findLocked(p)) {
            countLocked(*ap, false);
            ap->record.late = true;
            ap->record.partitioned = !ap->record.persistent;
            countLocked(*ap, true);
            owner = ap->record.owner;
        }
        m_lateUnadopted.erase(p);
        touch();
    }
    post(telemetry::makeParameterAdopted({.module = owner, .param = p}));
}

state::ViolationText AgentState::traceInvalidated(std::optional<ModuleId> expected, ModuleId got,
                                                  Phase phase)
{
    state::ViolationText text;
    {
        std::lock_guard lock(m_mutex);
        state::ViolationSubject subject;
        subject.kind = ViolationKind::TraceInvalidated;
        subject.hasAccessor = true;
        subject.accessor = got < m_modules.size() ? m_modules[got].path : std::string();
        subject.hasOwner = expected && *expected < m_modules.size();
        if (subject.hasOwner) subject.owner = m_modules[*expected].path;
        text = state::describeViolation(subject, m_config.dialect);
        state::ViolationRecord v = violationLocked(ViolationKind::TraceInvalidated, text);
        v.accessor = got;
        v.owner = subject.hasOwner ? *expected : kNoModule;
        recordLocked(v);
    }
    post(telemetry::makeTraceInvalidated(
        {.expected = expected ? *expected : kNoModule, .got = got, .phase = phase}));
    return text;
}

state::ViolationText AgentState::tiedAcrossGroups(ParamId p, ModuleId first, ModuleId second,
                                                  bool refusedByTorch,
                                                  const std::vector<ModuleId> &more)
{
    std::lock_guard lock(m_mutex);
    state::ViolationSubject subject;
    subject.kind = ViolationKind::TiedAcrossGroups;
    subject.refusedByTorch = refusedByTorch;
    subject.hasAccessor = second < m_modules.size();
    if (subject.hasAccessor) subject.accessor = m_modules[second].path;
    subject.param = paramNameLocked(p);
    if (first < m_modules.size()) subject.owner = m_modules[first].path;
    for (ModuleId m : more)
        if (m < m_modules.size()) subject.alsoTiedInto.push_back(m_modules[m].path);
    const state::ViolationText text = state::describeViolation(subject, m_config.dialect);
    state::ViolationRecord v = violationLocked(ViolationKind::TiedAcrossGroups, text);
    v.accessor = subject.hasAccessor ? second : kNoModule;
    v.param = p;
    v.paramName = subject.param;
    v.owner = first < m_modules.size() ? first : kNoModule;
    v.status = ParamStatus::NotAvailable;
    recordLocked(v);
    return text;
}

state::ViolationText AgentState::backwardUnfinished(ModuleId root, const std::string &raised,
                                                    bool compiledAutograd,
                                                    const state::SourceLocation &where,
                                                    std::size_t bucketed)
{
    std::lock_guard lock(m_mutex);
    state::ViolationSubject subject;
    subject.kind = ViolationKind::BackwardUnfinished;
    if (root < m_modules.size()) subject.owner = m_modules[root].path;
    subject.raised = raised;
    subject.compiledAutograd = compiledAutograd;
    subject.bucketed = bucketed;
    const state::ViolationText text = state::describeViolation(subject, m_config.dialect);
    state::ViolationRecord v = violationLocked(ViolationKind::BackwardUnfinished, text);
    v.owner = root < m_modules.size() ? root : kNoModule;
    // What FSDP2 leaves every parameter from then on; DeepSpeed: the bucketed parameters,
    // partitioned with their gradients unreduced.
    v.status = m_config.dialect == state::FixDialect::DeepSpeed ? ParamStatus::NotAvailable
                                                                : ParamStatus::Available;
    v.location = where;
    recordLocked(v);
    return text;
}

state::ViolationText AgentState::shardOrder(ModuleId parent, ModuleId child,
                                            const std::string &param,
                                            const state::SourceLocation &parentCall,
                                            const state::SourceLocation &where)
{
    std::lock_guard lock(m_mutex);
    state::ViolationSubject subject;
    subject.kind = ViolationKind::ShardOrder;
    subject.hasAccessor = child < m_modules.size();
    if (subject.hasAccessor) subject.accessor = m_modules[child].path;
    if (parent < m_modules.size()) subject.owner = m_modules[parent].path;
    subject.param = param;
    subject.parentCall = parentCall;
    subject.childCall = where;
    const state::ViolationText text = state::describeViolation(subject, m_config.dialect);
    state::ViolationRecord v = violationLocked(ViolationKind::ShardOrder, text);
    v.accessor = subject.hasAccessor ? child : kNoModule;
    v.owner = parent < m_modules.size() ? parent : kNoModule;
    v.paramName = param;
    v.status = ParamStatus::NotAvailable; // sharded by the parent's group
    v.location = where;
    recordLocked(v);
    return text;
}

state::ViolationText AgentState::checkpoint(const Checkpoint &c)
{
    std::lock_guard lock(m_mutex);
    const bool hasRoot = c.root < m_modules.size();
    state::ViolationSubject subject;
    subject.kind = c.kind;
    if (hasRoot) subject.owner = m_modules[c.root].path;
    subject.param = c.param;
    subject.call = c.call;
    subject.params = c.params;
    subject.bytes = c.bytes;
    subject.checkpoint = c.checkpoint;
    subject.savedWorld = c.savedWorld;
    subject.world = c.world;
    subject.withoutModifier = c.withoutModifier;
    const state::ViolationText text = state::describeViolation(subject, m_config.dialect);
    state::ViolationRecord v = violationLocked(c.kind, text);
    v.owner = hasRoot ? c.root : kNoModule;
    v.param = m_params.contains(c.paramId) ? c.paramId : kNoParam;
    v.paramName = c.param;
    // partitioned (ZeRO-3) or sharded (FSDP2); gathered by a GatheredParameters that discards
    v.status = c.withoutModifier ? ParamStatus::Available : ParamStatus::NotAvailable;
    v.location = c.where;
    recordLocked(v);
    return text;
}

void AgentState::stepBegin(std::uint32_t step)
{
    {
        std::lock_guard lock(m_mutex);
        m_step = step > m_step ? step : m_step + 1;
        m_inStep = true;
        m_thisStep.clear();
        // A step that starts with late parameters DeepSpeed never partitioned.
        for (ParamId p : m_lateUnadopted) {
            const AgentParam *ap = findLocked(p);
            if (!ap) continue;
            state::ViolationSubject subject;
            subject.kind = ViolationKind::LateParameter;
            subject.param = ap->record.name;
            subject.owner = ap->record.owner < m_modules.size() ? m_modules[ap->record.owner].path
                                                                : std::string();
            subject.replaces = ap->record.replaces;
            const state::ViolationText text = state::describeViolation(subject, m_config.dialect);
            state::ViolationRecord v = violationLocked(ViolationKind::LateParameter, text);
            v.accessor = ap->record.owner;
            v.param = p;
            v.paramName = ap->record.name;
            v.owner = ap->record.owner;
            v.status = ap->status;
            if (const auto site = m_lateSites.find(p); site != m_lateSites.end())
                v.location = site->second;
            recordLocked(v);
        }
        touch();
    }
    post(telemetry::makeStepBegin());
}

void AgentState::stepEnd(double loss)
{
    {
        std::lock_guard lock(m_mutex);
        m_inStep = false;
        touch();
    }
    post(telemetry::makeStepEnd(loss));
    postMemory();
}

void AgentState::reduceScatterBegin(ModuleId module, ParamId param, std::uint64_t bytes,
                                    std::uint32_t params)
{
    post(telemetry::makeReduceScatterBegin(
        {.module = module, .param = param, .bytes = bytes, .params = params}));
}

void AgentState::reduceScatterEnd(ModuleId module, ParamId param, std::uint64_t bytes,
                                  std::uint32_t params)
{
    post(telemetry::makeReduceScatterEnd(
        {.module = module, .param = param, .bytes = bytes, .params = params}));
}

void AgentState::allocatorSample(std::uint64_t allocated, std::uint64_t reserved,
                                 std::uint64_t peakAllocated)
{
    post(telemetry::makeAllocatorSample({.allocatedBytes = allocated,
                                         .reservedBytes = reserved,
                                         .peakAllocatedBytes = peakAllocated}));
}

std::uint64_t AgentState::collectiveBegin(CollectiveKind kind, std::uint32_t group, ModuleId module,
                                          FetchReason reason, std::uint64_t bytes,
                                          std::uint32_t params)
{
    const std::uint64_t now = telemetry::nowNs();
    InFlight c{group, 0, kind, module, reason, bytes, params, now};
    {
        std::lock_guard lock(m_collectiveMutex);
        if (group >= m_collectiveGroups.size()) m_collectiveGroups.resize(std::size_t(group) + 1);
        CollectiveGroup &g = m_collectiveGroups[group];
        c.seq = ++g.lastSeq;
        if (g.inFlight.capacity() == 0) g.inFlight.reserve(16);
        g.inFlight.push_back(c);
    }
    post(telemetry::makeCollectiveBegin({.kind = kind,
                                         .module = module,
                                         .group = group,
                                         .seq = c.seq,
                                         .bytes = bytes,
                                         .reason = reason,
                                         .params = params}),
         now);
    return c.seq;
}

void AgentState::collectiveEnd(std::uint32_t group, std::uint64_t seq)
{
    InFlight c;
    {
        std::lock_guard lock(m_collectiveMutex);
        if (group >= m_collectiveGroups.size()) return;
        std::vector<InFlight> &in = m_collectiveGroups[group].inFlight;
        const auto it =
            std::find_if(in.begin(), in.end(), [&](const InFlight &f) { return f.seq == seq; });
        if (it == in.end()) return;
        c = *it;
        in.erase(it);
    }
    post(telemetry::makeCollectiveEnd({.kind = c.kind,
                                       .module = c.module,
                                       .group = group,
                                       .seq = seq,
                                       .bytes = c.bytes,
                                       .reason = c.reason,
                                       .params = c.params}));
}

std::optional<AgentState::InFlight> AgentState::oldestInFlight() const
{
    std::lock_guard lock(m_collectiveMutex);
    std::optional<InFlight> oldest;
    for (const CollectiveGroup &g : m_collectiveGroups)
        if (!g.inFlight.empty() && (!oldest || g.inFlight.front().sinceNs < oldest->sinceNs))
            oldest = g.inFlight.front();
    return oldest;
}

std::optional<AgentState::InFlight> AgentState::inFlight(std::uint32_t group,
                                                         std::uint64_t seq) const
{
    std::lock_guard lock(m_collectiveMutex);
    if (group >= m_collectiveGroups.size()) return std::nullopt;
    for (const InFlight &f : m_collectiveGroups[group].inFlight)
        if (f.seq == seq) return f;
    return std::nullopt;
}

void AgentState::collectiveStalled(const InFlight &c, double waitedSeconds,
                                   state::SourceLocation where,
                                   std::vector<state::SourceLocation> stack)
{
    {
        std::lock_guard lock(m_collectiveMutex);
        if (c.group >= m_collectiveGroups.size()) return;
        const std::vector<InFlight> &in = m_collectiveGroups[c.group].inFlight;
        if (std::none_of(in.begin(), in.end(), [&](const InFlight &f) { return f.seq == c.seq; }))
            return;
        if (!m_stalled.emplace(c.group, c.seq).second) return;
    }
    if (where.chain.empty())
        for (const state::SourceLocation &frame : stack)
            if (frame.known())
                where.chain.push_back(frame.fileLine() +
                                      (frame.function.empty() ? "" : " in " + frame.function));
    std::lock_guard lock(m_mutex);
    state::ViolationSubject subject;
    subject.kind = ViolationKind::RankStalled;
    subject.ownRank = true;
    state::CollectiveDetail &d = subject.collective;
    d.group = c.group;
    d.seq = c.seq;
    const auto waitedMs = static_cast<std::uint64_t>(std::max(0.0, waitedSeconds) * 1000.0 + 0.5);
    d.waitedMs = waitedMs;
    state::CollectiveSide side;
    side.ranks = {m_config.rank};
    side.position = CollectivePosition::Waiting;
    side.kind = c.kind;
    side.hasModule = c.module < m_modules.size();
    if (side.hasModule) side.module = m_modules[c.module].path;
    side.reason = c.reason;
    side.bytes = c.bytes;
    side.params = c.params;
    side.lastSeq = c.seq;
    d.sides.push_back(side);
    d.sites.push_back({m_config.rank, c.seq, waitedMs, where});
    const state::ViolationText text = state::describeViolation(subject, m_config.dialect);
    state::ViolationRecord v = violationLocked(ViolationKind::RankStalled, text);
    v.accessor = side.hasModule ? c.module : kNoModule;
    v.location = where;
    v.collective = d;
    recordLocked(v);
}

std::uint32_t AgentState::step() const
{
    std::lock_guard lock(m_mutex);
    return m_step;
}

state::EngineState AgentState::state() const
{
    std::lock_guard lock(m_mutex);
    state::EngineState s;
    s.modelName = m_config.modelName;
    s.fixDialect = std::string(state::fixDialectName(m_config.dialect));
    s.worldSize = m_config.worldSize;
    s.backend = m_config.backend;
    s.step = m_step;
    s.config = m_config.config;
    s.localRanks = {m_config.rank};
    s.modules.reserve(m_modules.size());
    for (const state::ModuleRecord &m : m_modules)
        s.modules.push_back(m);
    s.params.reserve(m_params.size());
    for (const auto &[id, ap] : m_params) {
        state::ParamRecord &r = s.params.emplace_back(ap.record);
        r.id = id;
        // Only this rank's status is observed; other ranks are shown as their shard alone
        // (or whole, for what is never partitioned), as the Engine reports remote ranks.
        const ParamStatus others =
            ap.record.partitioned ? ParamStatus::NotAvailable : ParamStatus::Available;
        r.status.assign(static_cast<std::size_t>(m_config.worldSize), others);
        if (m_config.rank >= 0 && m_config.rank < m_config.worldSize)
            r.status[static_cast<std::size_t>(m_config.rank)] = ap.status;
        if (auto it = m_externals.find(id); it != m_externals.end()) r.externals = it->second;
        if (auto it = m_active.find(id); it != m_active.end()) r.activeModules = it->second;
        if (auto it = m_gathers.find(id); it != m_gathers.end()) {
            r.gatherCount = it->second.count;
            r.gatherBytes = it->second.bytes;
            r.gatherNs = it->second.ns;
            r.lastGatherTsNs = it->second.lastTs;
        }
    }
    s.violations = m_violations.records();
    return s;
}

} // namespace shardscope::agent

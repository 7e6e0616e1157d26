#include "state/statecolumns.h"

#include <algorithm>

#include "base/hugepages.h"

namespace shardscope::state {

// ---------------------------------------------------------------- StringColumn

std::uint32_t StringColumn::add(std::string_view s)
{
    m_bytes.append(s);
    m_lengths.push_back(static_cast<std::uint32_t>(s.size()));
    return static_cast<std::uint32_t>(m_lengths.size() - 1);
}

std::uint32_t StringColumn::intern(std::string_view s)
{
    const auto it = m_interned.find(s);
    if (it != m_interned.end()) return it->second;
    const std::uint32_t i = add(s);
    m_interned.emplace(std::string(s), i);
    return i;
}

void StringColumn::reserve(std::size_t strings, std::size_t bytes)
{
    reserveHuge(m_lengths, strings);
    reserveHuge(m_bytes, bytes);
}

void StringColumn::clear()
{
    m_bytes.clear();
    m_lengths.clear();
    m_interned.clear();
}

std::vector<std::string_view> StringColumn::views() const
{
    std::vector<std::string_view> v;
    v.reserve(m_lengths.size());
    std::size_t at = 0;
    for (std::uint32_t n : m_lengths) {
        v.emplace_back(m_bytes.data() + at, n);
        at += n;
    }
    return v;
}

// ---------------------------------------------------------------- StateColumns

namespace {

// Every column, for what is done to all of them alike.
template <class C, class F> void forEachColumn(C &c, F f)
{
    f(c.localRanks);
    forEachModuleColumn(c, f);
    forEachParamColumn(c, f);
    f(c.dims), f(c.statusRows);
    f(c.externalModule), f(c.externalAutomatic), f(c.activeModule);
    f(c.violations);
}

std::uint64_t sum(const std::vector<std::uint32_t> &v)
{
    std::uint64_t n = 0;
    for (std::uint32_t x : v)
        n += x;
    return n;
}

} // namespace

void StateColumns::clear()
{
    modelName.clear();
    fixDialect = "shardscope";
    backend.clear();
    worldSize = 1;
    step = 0;
    config = {};
    strings.clear();
    forEachColumn(*this, [](auto &v) { v.clear(); });
}

void StateColumns::release()
{
    *this = StateColumns{};
}

void StateColumns::addParam(ParamId id, std::string_view name, ModuleId owner, DType dtype,
                            bool persistent, bool partitioned, bool late, const Shape &shape,
                            std::int64_t elements, std::int64_t padded, std::int64_t partition)
{
    paramId.push_back(id);
    paramName.push_back(strings.add(name));
    paramOwner.push_back(owner);
    paramDtype.push_back(static_cast<std::uint8_t>(dtype));
    paramFlags.push_back(static_cast<std::uint8_t>((persistent ? kParamPersistent : 0) |
                                                   (partitioned ? kParamPartitioned : 0) |
                                                   (late ? kParamLate : 0)));
    const std::size_t nd = std::min(shape.size(), kMaxColumnDims);
    paramDims.push_back(static_cast<std::uint8_t>(nd));
    dims.insert(dims.end(), shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(nd));
    numel.push_back(elements);
    paddedNumel.push_back(padded);
    partitionNumel.push_back(partition);
}

std::string StateColumns::checkConsistent() const
{
    const std::size_t P = paramCount(), M = modulePath.size();
    std::string e; // the first disagreement
    auto check = [&e](const char *name, std::size_t got, std::size_t want) {
        if (e.empty() && got != want)
            e = std::string(name) + " has " + std::to_string(got) + " entries, expected " +
                std::to_string(want);
    };
    check("moduleType", moduleType.size(), M);
    check("moduleParent", moduleParent.size(), M);
    check("moduleUnitGroup", moduleUnitGroup.size(), M);
    check("moduleReshard", moduleReshard.size(), M);
    check("moduleMesh", moduleMesh.size(), M);
    check("paramName", paramName.size(), P);
    check("paramOwner", paramOwner.size(), P);
    check("paramDtype", paramDtype.size(), P);
    check("paramFlags", paramFlags.size(), P);
    check("paramDims", paramDims.size(), P);
    check("numel", numel.size(), P);
    check("paddedNumel", paddedNumel.size(), P);
    check("partitionNumel", partitionNumel.size(), P);
    check("statusRows", statusRows.size(), P * statusRowBytes(worldSize));
    check("externalCount", externalCount.size(), P);
    check("activeCount", activeCount.size(), P);
    check("gatherCount", gatherCount.size(), P);
    check("gatherBytes", gatherBytes.size(), P);
    check("gatherNs", gatherNs.size(), P);
    check("lastGatherTsNs", lastGatherTsNs.size(), P);
    check("paramReplaces", paramReplaces.size(), P);
    check("paramPlacements", paramPlacements.size(), P);
    if (!e.empty()) return e;
    std::uint64_t nDims = 0;
    for (std::uint8_t n : paramDims)
        nDims += n;
    check("dims", dims.size(), nDims);
    check("externalModule", externalModule.size(), sum(externalCount));
    check("externalAutomatic", externalAutomatic.size(), externalModule.size());
    check("activeModule", activeModule.size(), sum(activeCount));
    return e;
}

// ---------------------------------------------------------------- conversions

void columnsOf(const EngineState &s, StateColumns &c)
{
    c.clear();
    c.modelName = s.modelName;
    c.fixDialect = s.fixDialect;
    c.backend = s.backend;
    c.worldSize = s.worldSize;
    c.step = s.step;
    c.config = s.config;
    c.localRanks = s.localRanks;

    std::size_t bytes = 0;
    for (const ModuleRecord &m : s.modules)
        bytes += m.path.size();
    for (const ParamRecord &p : s.params)
        bytes += p.name.size();
    c.strings.reserve(s.modules.size() + s.params.size() + 64, bytes + bytes / 64 + 4096);

    const std::size_t M = s.modules.size(), P = s.params.size();
    forEachModuleColumn(c, [M](auto &v) { v.reserve(M); });
    for (const ModuleRecord &m : s.modules) {
        c.modulePath.push_back(c.strings.add(m.path));
        c.moduleType.push_back(c.strings.intern(m.type));
        c.moduleParent.push_back(m.parent);
        c.moduleUnitGroup.push_back(m.unitGroup);
    }

    const std::size_t row = statusRowBytes(s.worldSize);
    const auto world = static_cast<std::size_t>(std::max(s.worldSize, 1));
    c.statusRows.assign(P * row, 0);
    forEachParamColumn(c, [P](auto &v) { v.reserve(P); });
    for (std::size_t i = 0; i < P; ++i) {
        const ParamRecord &p = s.params[i];
        c.addParam(p.id, p.name, p.owner, p.dtype, p.persistent, p.partitioned, p.late, p.shape,
                   p.numel, p.paddedNumel, p.partitionNumel);
        std::uint8_t *bits = c.statusRows.data() + i * row;
        const std::size_t ranks = std::min(p.status.size(), world);
        for (std::size_t r = 0; r < ranks; ++r)
            bits[r / 4] |= static_cast<std::uint8_t>((static_cast<unsigned>(p.status[r]) & 3)
                                                     << (2 * (r % 4)));
        c.externalCount.push_back(static_cast<std::uint32_t>(p.externals.size()));
        for (const ExternalRecord &x : p.externals) {
            c.externalModule.push_back(x.module);
            c.externalAutomatic.push_back(x.automatic ? 1 : 0);
        }
        c.activeCount.push_back(static_cast<std::uint32_t>(p.activeModules.size()));
        c.activeModule.insert(c.activeModule.end(), p.activeModules.begin(), p.activeModules.end());
        c.gatherCount.push_back(p.gatherCount);
        c.gatherBytes.push_back(p.gatherBytes);
        c.gatherNs.push_back(p.gatherNs);
        c.lastGatherTsNs.push_back(p.lastGatherTsNs);
    }
    // After every name, as Engine::stateColumns fills its table column by column: the same
    // state makes the same table, and the same bytes.
    auto optional = [&c](const std::string &v) {
        return v.empty() ? kNoString : c.strings.intern(v);
    };
    for (const ParamRecord &p : s.params)
        c.paramReplaces.push_back(optional(p.replaces));
    // FSDP2's settings and placements last: a state without them (the engine's) makes the
    // table Engine::stateColumns makes.
    // A unit's two strings are strings even when empty (protocol.md: none exactly where the
    // module is no unit), so a unit whose mesh is "" travels as it was read.
    for (const ModuleRecord &m : s.modules) {
        c.moduleReshard.push_back(m.fsdpUnit() ? c.strings.intern(m.reshardAfterForward)
                                               : optional(m.reshardAfterForward));
        c.moduleMesh.push_back(m.fsdpUnit() ? c.strings.intern(m.mesh) : optional(m.mesh));
    }
    for (const ParamRecord &p : s.params)
        c.paramPlacements.push_back(optional(p.placements));
    c.violations = s.violations;
}

EngineState stateOf(const StateColumns &c)
{
    EngineState s;
    s.modelName = c.modelName;
    s.fixDialect = c.fixDialect;
    s.backend = c.backend;
    s.worldSize = c.worldSize;
    s.step = c.step;
    s.config = c.config;
    s.localRanks = c.localRanks;

    const std::vector<std::string_view> str = c.strings.views();
    auto text = [&](std::uint32_t i) {
        return i == kNoString || i >= str.size() ? std::string() : std::string(str[i]);
    };
    const std::size_t M = c.modulePath.size();
    reserveHuge(s.modules, M);
    for (std::size_t i = 0; i < M; ++i) {
        ModuleRecord &m = s.modules.emplace_back();
        m.id = static_cast<ModuleId>(i);
        m.path = text(c.modulePath[i]);
        m.type = text(c.moduleType[i]);
        m.parent = c.moduleParent[i];
        m.unitGroup = c.moduleUnitGroup[i];
        m.reshardAfterForward = text(c.moduleReshard[i]);
        m.mesh = text(c.moduleMesh[i]);
    }

    const std::size_t P = c.paramCount(), row = statusRowBytes(c.worldSize);
    const auto world = static_cast<std::size_t>(std::max(c.worldSize, 1));
    std::size_t dimAt = 0, extAt = 0, activeAt = 0;
    reserveHuge(s.params, P);
    for (std::size_t i = 0; i < P; ++i) {
        ParamRecord &p = s.params.emplace_back();
        p.id = c.paramId[i];
        p.name = text(c.paramName[i]);
        p.owner = c.paramOwner[i];
        p.shape.assign(c.dims.begin() + static_cast<std::ptrdiff_t>(dimAt),
                       c.dims.begin() + static_cast<std::ptrdiff_t>(dimAt + c.paramDims[i]));
        dimAt += c.paramDims[i];
        p.dtype = static_cast<DType>(c.paramDtype[i]);
        p.numel = c.numel[i];
        p.paddedNumel = c.paddedNumel[i];
        p.partitionNumel = c.partitionNumel[i];
        p.persistent = c.paramFlags[i] & kParamPersistent;
        p.partitioned = c.paramFlags[i] & kParamPartitioned;
        p.late = c.paramFlags[i] & kParamLate;
        p.replaces = text(c.paramReplaces[i]);
        p.placements = text(c.paramPlacements[i]);
        const std::uint8_t *bits = c.statusRows.data() + i * row;
        p.status.resize(world);
        for (std::size_t r = 0; r < world; ++r)
            p.status[r] = static_cast<ParamStatus>((bits[r / 4] >> (2 * (r % 4))) & 3);
        p.externals.reserve(c.externalCount[i]);
        for (std::uint32_t k = 0; k < c.externalCount[i]; ++k, ++extAt)
            p.externals.push_back(
                ExternalRecord{c.externalModule[extAt], c.externalAutomatic[extAt] != 0});
        p.activeModules.assign(c.activeModule.begin() + static_cast<std::ptrdiff_t>(activeAt),
                               c.activeModule.begin() +
                                   static_cast<std::ptrdiff_t>(activeAt + c.activeCount[i]));
        activeAt += c.activeCount[i];
        p.gatherCount = c.gatherCount[i];
        p.gatherBytes = c.gatherBytes[i];
        p.gatherNs = c.gatherNs[i];
        p.lastGatherTsNs = c.lastGatherTsNs[i];
    }
    s.violations = c.violations;
    return s;
}

} // namespace shardscope::state

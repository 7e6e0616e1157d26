#include "wire/snapshot.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>
#include <unordered_set>

#include "state/severity.h"
#include "state/violationtext.h"
#include "wire/compress.h"
#include "wire/domread.h"
#include "wire/frame.h"
#include "wire/jsonwrite.h"
#include "wire/messages.h"

namespace shardscope::wire {

namespace {

using detail::sj::Element;
using detail::sj::Where;
namespace sj = detail::sj;

constexpr int kMaxWorldSize = 1 << 16;
constexpr std::size_t kMaxRank = 0xFFFF;
// Version 1 wrote each parameter's status as an array of names; it is still read.
constexpr std::uint64_t kOldestReadableVersion = 1;

char statusLetter(ParamStatus s)
{
    switch (s) {
    case ParamStatus::NotAvailable:
        return 'N';
    case ParamStatus::Inflight:
        return 'I';
    case ParamStatus::Available:
        return 'A';
    }
    return '?';
}

// Appends JSON text; `pretty` puts each top-level member and each element of the big
// arrays on its own line (files), compact otherwise (State frames).
class Writer
{
  public:
    Writer(std::string &out, bool pretty) : m_out(out), m_pretty(pretty) {}

    Writer &raw(std::string_view s)
    {
        m_out.append(s);
        return *this;
    }
    Writer &str(std::string_view s)
    {
        detail::appendJsonString(m_out, s);
        return *this;
    }
    Writer &num(std::uint64_t v)
    {
        detail::appendJsonNumber(m_out, v);
        return *this;
    }
    Writer &inum(std::int64_t v)
    {
        detail::appendJsonNumber(m_out, v);
        return *this;
    }
    Writer &boolean(bool v)
    {
        detail::appendJsonBool(m_out, v);
        return *this;
    }
    Writer &idOrNull(std::uint32_t id, std::uint32_t none)
    {
        return id == none ? raw("null") : num(id);
    }
    Writer &pathOrNull(const state::EngineState &s, ModuleId id)
    {
        return id < s.modules.size() ? str(s.modules[id].path) : raw("null");
    }
    // Starts a top-level member: `"key": `.
    Writer &member(std::string_view key, bool first = false)
    {
        if (!first) m_out.push_back(',');
        if (m_pretty) m_out.append("\n ");
        str(key);
        return raw(m_pretty ? ": " : ":");
    }
    // Separates the elements of a top-level array.
    Writer &element(std::size_t index)
    {
        if (index) m_out.push_back(',');
        if (m_pretty) m_out.append("\n  ");
        return *this;
    }
    Writer &endArray(std::size_t count)
    {
        if (m_pretty && count) m_out.append("\n ");
        return raw("]");
    }

  private:
    std::string &m_out;
    bool m_pretty;
};

void writePathList(Writer &w, const state::EngineState &s, const std::vector<ModuleId> &ids)
{
    w.raw("[");
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) w.raw(",");
        w.str(ids[i] < s.modules.size() ? std::string_view(s.modules[ids[i]].path) : "");
    }
    w.raw("]");
}

void writeParam(Writer &w, const state::EngineState &s, const state::ParamRecord &p,
                std::string &scratch)
{
    w.raw("{\"id\":").num(p.id);
    w.raw(",\"name\":").str(p.name);
    w.raw(",\"module\":").pathOrNull(s, p.owner);
    w.raw(",\"module_id\":").idOrNull(p.owner, kNoModule);
    w.raw(",\"shape\":[");
    for (std::size_t i = 0; i < p.shape.size(); ++i) {
        if (i) w.raw(",");
        w.inum(p.shape[i]);
    }
    w.raw("],\"dtype\":").str(dtypeName(p.dtype));
    w.raw(",\"numel\":").inum(p.numel);
    w.raw(",\"padded_numel\":").inum(p.paddedNumel);
    w.raw(",\"partition_numel\":").inum(p.partitionNumel);
    w.raw(",\"persistent\":").boolean(p.persistent);
    w.raw(",\"partitioned\":").boolean(p.partitioned);
    w.raw(",\"late\":").boolean(p.late);
    scratch.clear();
    for (ParamStatus st : p.status)
        scratch.push_back(statusLetter(st));
    w.raw(",\"status\":\"").raw(scratch).raw("\"");
    std::vector<ModuleId> ext, extAuto;
    for (const state::ExternalRecord &e : p.externals) {
        ext.push_back(e.module);
        if (e.automatic) extAuto.push_back(e.module);
    }
    w.raw(",\"external_modules\":");
    writePathList(w, s, ext);
    w.raw(",\"external_auto_modules\":");
    writePathList(w, s, extAuto);
    w.raw(",\"active_modules\":");
    writePathList(w, s, p.activeModules);
    w.raw(",\"gather_count\":").num(p.gatherCount);
    w.raw(",\"gather_bytes\":").num(p.gatherBytes);
    w.raw(",\"gather_ns\":").num(p.gatherNs);
    w.raw(",\"last_gather_ts_ns\":").num(p.lastGatherTsNs);
    if (!p.replaces.empty()) w.raw(",\"replaces\":").str(p.replaces);
    if (!p.placements.empty()) w.raw(",\"placements\":").str(p.placements);
    w.raw("}");
}

void writeLocation(Writer &w, const state::SourceLocation &l)
{
    w.raw("{\"file\":").str(l.file);
    w.raw(",\"line\":").num(l.line);
    w.raw(",\"function\":").str(l.function);
    w.raw(",\"chain\":[");
    for (std::size_t i = 0; i < l.chain.size(); ++i)
        (i ? w.raw(",") : w).str(l.chain[i]);
    w.raw("]}");
}

// collective_mismatch, rank_stalled (docs/snapshot.md, a violation's `collective`).
void writeCollective(Writer &w, const state::CollectiveDetail &d)
{
    w.raw("{\"group\":").num(d.group);
    w.raw(",\"seq\":").num(d.seq);
    w.raw(",\"waited_ms\":").num(d.waitedMs);
    w.raw(",\"sides\":[");
    for (std::size_t i = 0; i < d.sides.size(); ++i) {
        const state::CollectiveSide &c = d.sides[i];
        w.raw(i ? ",{\"ranks\":[" : "{\"ranks\":[");
        for (std::size_t r = 0; r < c.ranks.size(); ++r)
            (r ? w.raw(",") : w).inum(c.ranks[r]);
        w.raw("],\"position\":").str(collectivePositionName(c.position));
        w.raw(",\"kind\":").str(collectiveKindName(c.kind));
        w.raw(",\"module\":");
        if (c.hasModule)
            w.str(c.module);
        else
            w.raw("null");
        w.raw(",\"reason\":").str(fetchReasonName(c.reason));
        w.raw(",\"bytes\":").num(c.bytes);
        w.raw(",\"params\":").num(c.params);
        w.raw(",\"last_seq\":").num(c.lastSeq);
        w.raw("}");
    }
    w.raw("],\"sites\":[");
    for (std::size_t i = 0; i < d.sites.size(); ++i) {
        const state::CollectiveSite &site = d.sites[i];
        w.raw(i ? ",{\"rank\":" : "{\"rank\":").inum(site.rank);
        w.raw(",\"seq\":").num(site.seq);
        w.raw(",\"waited_ms\":").num(site.waitedMs);
        w.raw(",\"location\":");
        writeLocation(w, site.where);
        w.raw("}");
    }
    w.raw("]}");
}

void writeViolation(Writer &w, const state::EngineState &s, const state::ViolationRecord &v,
                    const std::unordered_map<ParamId, const state::ParamRecord *> &paramById)
{
    w.raw("{\"kind\":").str(violationKindName(v.kind));
    w.raw(",\"step\":").num(v.step);
    w.raw(",\"last_step\":").num(v.lastStep);
    w.raw(",\"rank\":").inum(v.rank);
    w.raw(",\"accessor\":").pathOrNull(s, v.accessor);
    w.raw(",\"accessor_id\":").idOrNull(v.accessor, kNoModule);
    auto p = paramById.find(v.param);
    w.raw(",\"param\":");
    if (p != paramById.end())
        w.str(p->second->name);
    else if (!v.paramName.empty())
        w.str(v.paramName); // removed since (e.g. by weight_norm): the engine kept its name
    else
        w.raw("null");
    w.raw(",\"param_id\":").idOrNull(v.param, kNoParam);
    w.raw(",\"owner\":").pathOrNull(s, v.owner);
    w.raw(",\"owner_id\":").idOrNull(v.owner, kNoModule);
    w.raw(",\"status\":").str(statusName(v.status));
    w.raw(",\"action\":").str(guardActionName(v.action));
    w.raw(",\"severity\":").str(severityName(v.severity));
    if (v.read != ViolationRead::Values) w.raw(",\"read\":").str(violationReadName(v.read));
    w.raw(",\"count\":").num(v.count);
    w.raw(",\"ts_ns\":").num(v.tsNs);
    w.raw(",\"fix\":").str(v.fix);
    w.raw(",\"message\":").str(v.message);
    if (v.location.known()) {
        w.raw(",\"location\":");
        writeLocation(w, v.location);
    }
    if (!v.building.empty()) w.raw(",\"building\":").str(v.building);
    if (!v.collective.empty()) {
        w.raw(",\"collective\":");
        writeCollective(w, v.collective);
    }
    w.raw("}");
}

// Version 3: the events as columns, one array per record field (docs/snapshot.md, events);
// times and steps as differences from the previous event, types as indexes into the
// names that occur. Version 2's array of objects was 115 bytes of text per event.
void writeEventColumns(Writer &w, const std::vector<telemetry::Event> &events, bool pretty)
{
    if (events.empty()) {
        w.raw("[]");
        return;
    }
    std::array<int, 256> typeIndex;
    typeIndex.fill(-1);
    std::vector<EventType> names;
    for (const telemetry::Event &e : events) {
        int &k = typeIndex[static_cast<std::uint8_t>(e.type)];
        if (k < 0) {
            k = static_cast<int>(names.size());
            names.push_back(e.type);
        }
    }
    const char *sep = pretty ? ",\n  " : ",";
    w.raw(pretty ? "{\n  " : "{").raw("\"count\":").num(events.size());
    w.raw(sep).raw("\"type_names\":[");
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (i) w.raw(",");
        w.str(eventTypeName(names[i]));
    }
    w.raw("]");
    // Differences wrap around 2^64 and are written as signed numbers, so any sequence of
    // u64 values round-trips; in time order they are small and positive.
    auto column = [&](std::string_view key, auto value) {
        w.raw(sep).raw("\"").raw(key).raw("\":[");
        for (std::size_t i = 0; i < events.size(); ++i) {
            if (i) w.raw(",");
            value(i);
        }
        w.raw("]");
    };
    auto delta = [&](std::size_t i, auto field) {
        const std::uint64_t prev = i ? field(events[i - 1]) : 0;
        w.inum(static_cast<std::int64_t>(field(events[i]) - prev));
    };
    column("ts_ns",
           [&](std::size_t i) { delta(i, [](const telemetry::Event &e) { return e.tsNs; }); });
    column("step", [&](std::size_t i) {
        delta(i, [](const telemetry::Event &e) { return std::uint64_t(e.step); });
    });
    column("rank", [&](std::size_t i) { w.num(events[i].rank); });
    column("type", [&](std::size_t i) {
        w.num(std::uint64_t(typeIndex[static_cast<std::uint8_t>(events[i].type)]));
    });
    column("flags", [&](std::size_t i) { w.num(events[i].flags); });
    column("a", [&](std::size_t i) { w.num(events[i].a); });
    column("b", [&](std::size_t i) { w.num(events[i].b); });
    column("u0", [&](std::size_t i) { w.num(events[i].u0); });
    column("u1", [&](std::size_t i) { w.num(events[i].u1); });
    column("u2", [&](std::size_t i) { w.num(events[i].u2); });
    w.raw(pretty ? "\n }" : "}");
}

std::uint32_t readId(Element j, std::uint32_t none, const Where &where)
{
    if (j.is_null()) return none;
    return static_cast<std::uint32_t>(sj::asBounded(j, 0xFFFFFFFEu, where));
}

// The enum value the JSON string names, through base/names.h's inverse (fromName).
template <class E>
E readEnum(Element j, std::optional<E> (*fromName)(std::string_view), const Where &where)
{
    const std::string_view s = sj::asStringView(j, where);
    if (const std::optional<E> v = fromName(s)) return *v;
    sj::failAt(where, "unknown value \"" + std::string(s) + "\"");
}

template <class T> T bounded(sj::Object o, std::string_view key, std::uint64_t max, const Where &w)
{
    return static_cast<T>(sj::asBounded(sj::member(o, key, w), max, w / key));
}

std::uint64_t u64(sj::Object o, std::string_view key, const Where &w)
{
    return sj::asU64(sj::member(o, key, w), w / key);
}

constexpr std::array<std::string_view, 10> kEventFields = {"ts_ns", "step", "rank", "type", "flags",
                                                           "a",     "b",    "u0",   "u1",   "u2"};

telemetry::Event decodeEvent(Element j, const Where &w)
{
    const sj::Fields f(sj::asObject(j, w), kEventFields, w);
    auto bounded = [&](std::size_t k, std::uint64_t max) {
        return sj::asBounded(f[k], max, f.at(k));
    };
    telemetry::Event e{};
    e.tsNs = sj::asU64(f[0], f.at(0));
    e.step = static_cast<std::uint32_t>(bounded(1, 0xFFFFFFFFu));
    e.rank = static_cast<std::uint16_t>(bounded(2, kMaxRank));
    const std::string_view type = sj::asStringView(f[3], f.at(3));
    const auto t = eventTypeFromName(std::string(type));
    if (!t) sj::failAt(f.at(3), "unknown event type \"" + std::string(type) + "\"");
    e.type = *t;
    e.flags = static_cast<std::uint8_t>(bounded(4, 0xFF));
    e.a = static_cast<std::uint32_t>(bounded(5, 0xFFFFFFFFu));
    e.b = static_cast<std::uint32_t>(bounded(6, 0xFFFFFFFFu));
    e.u0 = sj::asU64(f[7], f.at(7));
    e.u1 = sj::asU64(f[8], f.at(8));
    e.u2 = sj::asU64(f[9], f.at(9));
    return e;
}

constexpr std::array<std::string_view, 12> kColumnFields = {
    "count", "type_names", "ts_ns", "step", "rank", "type", "flags", "a", "b", "u0", "u1", "u2"};

void decodeEventColumns(sj::Object o, std::vector<telemetry::Event> &out, const Where &w)
{
    const sj::Fields f(o, kColumnFields, w);
    const std::uint64_t count = sj::asU64(f[0], f.at(0));
    std::vector<EventType> types;
    {
        const Where tw = f.at(1);
        std::size_t i = 0;
        for (Element name : sj::asArray(f[1], tw)) {
            const std::string_view n = sj::asStringView(name, tw[i]);
            const auto t = eventTypeFromName(n);
            if (!t) sj::failAt(tw[i], "unknown event type \"" + std::string(n) + "\"");
            types.push_back(*t);
            ++i;
        }
    }
    std::array<sj::Array, 10> columns;
    for (std::size_t k = 0; k < columns.size(); ++k) {
        columns[k] = sj::asArray(f[k + 2], f.at(k + 2));
        if (columns[k].size() != count)
            sj::failAt(f.at(k + 2), std::to_string(columns[k].size()) +
                                        " values where \"count\" is " + std::to_string(count));
    }
    out.assign(static_cast<std::size_t>(count), telemetry::Event{});
    // Column by column: each array is walked once, in order.
    auto each = [&](std::size_t k, auto apply) {
        const Where cw = f.at(k + 2);
        std::size_t i = 0;
        for (Element v : columns[k]) {
            apply(out[i], v, cw, i);
            ++i;
        }
    };
    auto delta = [](Element v, const Where &cw, std::size_t i) {
        return static_cast<std::uint64_t>(sj::asI64(v, cw[i]));
    };
    std::uint64_t ts = 0, step = 0;
    each(0, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        ts += delta(v, cw, i);
        e.tsNs = ts;
    });
    each(1, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        step += delta(v, cw, i);
        if (step > 0xFFFFFFFFu) sj::failAt(cw[i], "the step leaves 0 to 4294967295");
        e.step = static_cast<std::uint32_t>(step);
    });
    each(2, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        e.rank = static_cast<std::uint16_t>(sj::asBounded(v, kMaxRank, cw[i]));
    });
    each(3, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        const std::uint64_t t = sj::asU64(v, cw[i]);
        if (t >= types.size())
            sj::failAt(cw[i], "type index " + std::to_string(t) + " is not in type_names");
        e.type = types[static_cast<std::size_t>(t)];
    });
    each(4, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        e.flags = static_cast<std::uint8_t>(sj::asBounded(v, 0xFF, cw[i]));
    });
    each(5, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        e.a = static_cast<std::uint32_t>(sj::asBounded(v, 0xFFFFFFFFu, cw[i]));
    });
    each(6, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        e.b = static_cast<std::uint32_t>(sj::asBounded(v, 0xFFFFFFFFu, cw[i]));
    });
    each(7, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        e.u0 = sj::asU64(v, cw[i]);
    });
    each(8, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        e.u1 = sj::asU64(v, cw[i]);
    });
    each(9, [&](telemetry::Event &e, Element v, const Where &cw, std::size_t i) {
        e.u2 = sj::asU64(v, cw[i]);
    });
}

struct ModuleIndex
{
    std::unordered_map<std::string_view, ModuleId> byPath; // views into the records' paths
    std::size_t count = 0;

    ModuleId resolve(Element j, const Where &where) const
    {
        const std::string_view path = sj::asStringView(j, where);
        auto it = byPath.find(path);
        if (it == byPath.end())
            sj::failAt(where, "no module with path \"" + std::string(path) + "\"");
        return it->second;
    }
    ModuleId checkId(Element j, const Where &where) const
    {
        const ModuleId id = readId(j, kNoModule, where);
        if (id != kNoModule && id >= count)
            sj::failAt(where, "module id " + std::to_string(id) + " does not exist");
        return id;
    }
};

// A list of module paths as ids, in first-seen order with repeats dropped: a module is
// registered on a parameter (or active) once at most, so the result never holds more
// entries than the model has modules, whatever the file repeats.
std::vector<ModuleId> resolvePaths(Element list, const ModuleIndex &index, const Where &w)
{
    std::vector<ModuleId> out;
    std::unordered_set<ModuleId> seen;
    std::size_t i = 0;
    for (Element e : sj::asArray(list, w)) {
        const ModuleId id = index.resolve(e, w[i++]);
        if (seen.insert(id).second) out.push_back(id);
    }
    return out;
}

void readStatus(Element j, std::uint64_t version, int worldSize, std::vector<ParamStatus> &out,
                const Where &w)
{
    const auto ranks = static_cast<std::size_t>(worldSize);
    if (version == 1) {
        std::vector<Element> names;
        for (Element e : sj::asArray(j, w))
            names.push_back(e);
        if (names.size() != ranks)
            sj::failAt(w, std::to_string(names.size()) + " entries for a world of " +
                              std::to_string(worldSize) + " ranks");
        for (std::size_t i = 0; i < names.size(); ++i)
            out.push_back(readEnum(names[i], statusFromName, w[i]));
        return;
    }
    const std::string_view letters = sj::asStringView(j, w);
    if (letters.size() != ranks)
        sj::failAt(w, std::to_string(letters.size()) + " letters for a world of " +
                          std::to_string(worldSize) + " ranks");
    out.resize(ranks);
    for (std::size_t i = 0; i < ranks; ++i) {
        switch (letters[i]) {
        case 'N':
            out[i] = ParamStatus::NotAvailable;
            break;
        case 'I':
            out[i] = ParamStatus::Inflight;
            break;
        case 'A':
            out[i] = ParamStatus::Available;
            break;
        default: {
            const auto c = static_cast<unsigned char>(letters[i]);
            const std::string shown = c >= 0x20 && c < 0x7F ? "'" + std::string(1, letters[i]) + "'"
                                                            : "byte " + std::to_string(c);
            sj::failAt(w, "unknown status letter " + shown + " for rank " + std::to_string(i) +
                              " (expected N, I or A)");
        }
        }
    }
}

enum ParamField : std::size_t
{
    kId,
    kName,
    kModuleId,
    kShape,
    kDtype,
    kNumel,
    kPaddedNumel,
    kPartitionNumel,
    kPersistent,
    kPartitioned,
    kLate,
    kStatus,
    kExternal,
    kExternalAuto,
    kActive,
    kGatherCount,
    kGatherBytes,
    kGatherNs,
    kLastGather,
    kReplaces,
    kPlacements,
    kParamFieldCount
};
constexpr std::array<std::string_view, kParamFieldCount> kParamFields = {"id",
                                                                         "name",
                                                                         "module_id",
                                                                         "shape",
                                                                         "dtype",
                                                                         "numel",
                                                                         "padded_numel",
                                                                         "partition_numel",
                                                                         "persistent",
                                                                         "partitioned",
                                                                         "late",
                                                                         "status",
                                                                         "external_modules",
                                                                         "external_auto_modules",
                                                                         "active_modules",
                                                                         "gather_count",
                                                                         "gather_bytes",
                                                                         "gather_ns",
                                                                         "last_gather_ts_ns",
                                                                         "replaces",
                                                                         "placements"};

state::ParamRecord decodeParam(Element j, const ModuleIndex &index, int worldSize,
                               std::uint64_t version, const Where &w)
{
    const sj::Fields f(sj::asObject(j, w), kParamFields, w);
    state::ParamRecord p;
    p.id = readId(f[kId], kNoParam, f.at(kId));
    p.name = sj::asString(f[kName], f.at(kName));
    p.owner = index.checkId(f[kModuleId], f.at(kModuleId));
    const Where ws = f.at(kShape);
    std::size_t dims = 0;
    const sj::Array shape = sj::asArray(f[kShape], ws);
    p.shape.reserve(std::min<std::size_t>(shape.size(), 16));
    for (Element d : shape) {
        if (++dims > 16) sj::failAt(ws, "more than 16 dimensions");
        const std::int64_t v = sj::asI64(d, ws[dims - 1]);
        if (v < 0) sj::failAt(ws[dims - 1], "negative dimension");
        p.shape.push_back(v);
    }
    p.dtype = readEnum(f[kDtype], dtypeFromName, f.at(kDtype));
    auto nonNegative = [&](ParamField k) {
        const std::int64_t v = sj::asI64(f[k], f.at(k));
        if (v < 0) sj::failAt(f.at(k), "negative");
        return v;
    };
    p.numel = nonNegative(kNumel);
    p.paddedNumel = nonNegative(kPaddedNumel);
    p.partitionNumel = nonNegative(kPartitionNumel);
    p.persistent = sj::asBool(f[kPersistent], f.at(kPersistent));
    p.partitioned = sj::asBool(f[kPartitioned], f.at(kPartitioned));
    p.late = sj::asBool(f[kLate], f.at(kLate));
    readStatus(f[kStatus], version, worldSize, p.status, f.at(kStatus));
    const std::vector<ModuleId> ext = resolvePaths(f[kExternal], index, f.at(kExternal));
    const std::vector<ModuleId> extAuto =
        resolvePaths(f[kExternalAuto], index, f.at(kExternalAuto));
    const std::unordered_set<ModuleId> automatic(extAuto.begin(), extAuto.end());
    p.externals.reserve(ext.size());
    for (ModuleId m : ext)
        p.externals.push_back(state::ExternalRecord{m, automatic.contains(m)});
    p.activeModules = resolvePaths(f[kActive], index, f.at(kActive));
    p.gatherCount = sj::asU64(f[kGatherCount], f.at(kGatherCount));
    p.gatherBytes = sj::asU64(f[kGatherBytes], f.at(kGatherBytes));
    p.gatherNs = sj::asU64(f[kGatherNs], f.at(kGatherNs));
    p.lastGatherTsNs = sj::asU64(f[kLastGather], f.at(kLastGather));
    if (f.has(kReplaces)) p.replaces = sj::asString(f[kReplaces], f.at(kReplaces));
    if (f.has(kPlacements)) {
        p.placements = sj::asString(f[kPlacements], f.at(kPlacements));
        if (p.placements.empty())
            sj::failAt(f.at(kPlacements), "is empty; leave the field out instead");
    }
    return p;
}

state::SourceLocation decodeLocation(Element e, const Where &lw)
{
    state::SourceLocation out;
    const sj::Object l = sj::asObject(e, lw);
    out.file = sj::asString(sj::member(l, "file", lw), lw / "file");
    out.line = bounded<std::uint32_t>(l, "line", 0xFFFFFFFFu, lw);
    out.function = sj::asString(sj::member(l, "function", lw), lw / "function");
    const Where cw = lw / "chain";
    for (Element c : sj::asArray(sj::member(l, "chain", lw), cw))
        out.chain.push_back(sj::asString(c, cw[out.chain.size()]));
    return out;
}

std::vector<int> decodeRanks(Element e, const Where &w)
{
    std::vector<int> out;
    for (Element r : sj::asArray(e, w)) {
        const Where rw = w[out.size()];
        const int rank = static_cast<int>(sj::asBounded(r, kMaxRank, rw));
        if (!out.empty() && rank <= out.back()) sj::failAt(rw, "ranks must ascend");
        out.push_back(rank);
    }
    if (out.empty()) sj::failAt(w, "is empty");
    return out;
}

state::CollectiveDetail decodeCollective(Element e, const Where &w)
{
    const sj::Object o = sj::asObject(e, w);
    state::CollectiveDetail d;
    d.group = bounded<std::uint32_t>(o, "group", 0xFFFFFFFFu, w);
    d.seq = u64(o, "seq", w);
    d.waitedMs = u64(o, "waited_ms", w);
    const Where sw = w / "sides";
    for (Element se : sj::asArray(sj::member(o, "sides", w), sw)) {
        const Where iw = sw[d.sides.size()];
        const sj::Object so = sj::asObject(se, iw);
        state::CollectiveSide c;
        c.ranks = decodeRanks(sj::member(so, "ranks", iw), iw / "ranks");
        c.position =
            readEnum(sj::member(so, "position", iw), collectivePositionFromName, iw / "position");
        c.kind = readEnum(sj::member(so, "kind", iw), collectiveKindFromName, iw / "kind");
        if (const Element m = sj::member(so, "module", iw); !m.is_null()) {
            c.hasModule = true;
            c.module = sj::asString(m, iw / "module");
        }
        c.reason = readEnum(sj::member(so, "reason", iw), fetchReasonFromName, iw / "reason");
        c.bytes = u64(so, "bytes", iw);
        c.params = bounded<std::uint32_t>(so, "params", 0xFFFFFFFFu, iw);
        c.lastSeq = u64(so, "last_seq", iw);
        d.sides.push_back(std::move(c));
    }
    const Where tw = w / "sites";
    for (Element te : sj::asArray(sj::member(o, "sites", w), tw)) {
        const Where iw = tw[d.sites.size()];
        const sj::Object to = sj::asObject(te, iw);
        state::CollectiveSite site;
        site.rank = bounded<int>(to, "rank", kMaxRank, iw);
        site.seq = u64(to, "seq", iw);
        site.waitedMs = u64(to, "waited_ms", iw);
        site.where = decodeLocation(sj::member(to, "location", iw), iw / "location");
        d.sites.push_back(std::move(site));
    }
    return d;
}

state::ViolationRecord decodeViolation(Element j, const ModuleIndex &index, const Where &w)
{
    const sj::Object o = sj::asObject(j, w);
    state::ViolationRecord v;
    v.kind = readEnum(sj::member(o, "kind", w), violationKindFromName, w / "kind");
    v.step = bounded<std::uint32_t>(o, "step", 0xFFFFFFFFu, w);
    v.lastStep = bounded<std::uint32_t>(o, "last_step", 0xFFFFFFFFu, w);
    v.rank = bounded<int>(o, "rank", kMaxRank, w);
    v.accessor = index.checkId(sj::member(o, "accessor_id", w), w / "accessor_id");
    v.param = readId(sj::member(o, "param_id", w), kNoParam, w / "param_id");
    if (const Element name = sj::member(o, "param", w); !name.is_null())
        v.paramName = sj::asString(name, w / "param");
    v.owner = index.checkId(sj::member(o, "owner_id", w), w / "owner_id");
    v.status = readEnum(sj::member(o, "status", w), statusFromName, w / "status");
    v.action = readEnum(sj::member(o, "action", w), guardActionFromName, w / "action");
    v.count = u64(o, "count", w);
    v.tsNs = u64(o, "ts_ns", w);
    v.fix = sj::asString(sj::member(o, "fix", w), w / "fix");
    v.message = sj::asString(sj::member(o, "message", w), w / "message");
    // Optional members (snapshots written before locations have neither).
    Element e;
    if (sj::optionalMember(o, "location", e)) v.location = decodeLocation(e, w / "location");
    if (sj::optionalMember(o, "collective", e))
        v.collective = decodeCollective(e, w / "collective");
    if (sj::optionalMember(o, "building", e)) v.building = sj::asString(e, w / "building");
    if (sj::optionalMember(o, "read", e)) v.read = readEnum(e, violationReadFromName, w / "read");
    // A snapshot written before severities has none: the one rule gives it.
    v.severity = sj::optionalMember(o, "severity", e)
                     ? readEnum(e, severityFromName, w / "severity")
                     : state::severityOf(v.kind, v.action, v.read);
    return v;
}

constexpr std::array<std::string_view, 5> kModuleFields = {"id", "path", "type", "parent",
                                                           "fsdp_unit"};
constexpr std::array<std::string_view, 3> kUnitFields = {"group_id", "reshard_after_forward",
                                                         "mesh"};

Snapshot decodeSnapshotDom(Element rootElement)
{
    const Where rw = Where::root();
    const sj::Object root = sj::asObject(rootElement, rw);
    const std::string_view format = sj::asStringView(sj::member(root, "format", rw), rw / "format");
    if (format != kSnapshotFormat)
        sj::failAt(rw / "format", "\"" + std::string(format) + "\" is not \"shardscope-snapshot\"");
    const std::uint64_t version = u64(root, "version", rw);
    if (version < kOldestReadableVersion || version > static_cast<std::uint64_t>(kSnapshotVersion))
        sj::failAt(rw / "version", "snapshot version " + std::to_string(version) +
                                       " is not supported; this build reads versions " +
                                       std::to_string(kOldestReadableVersion) + " to " +
                                       std::to_string(kSnapshotVersion));
    Snapshot s;
    Element e;
    if (sj::optionalMember(root, "producer", e)) s.meta.producer = sj::asString(e, rw / "producer");
    if (sj::optionalMember(root, "pid", e)) s.meta.pid = sj::asI64(e, rw / "pid");
    if (sj::optionalMember(root, "created_unix_ms", e))
        s.meta.createdUnixMs = sj::asU64(e, rw / "created_unix_ms");
    if (sj::optionalMember(root, "endpoint", e)) s.meta.endpoint = sj::asString(e, rw / "endpoint");

    state::EngineState &st = s.state;
    const Where ew = rw / "engine";
    const sj::Object engine = sj::asObject(sj::member(root, "engine", rw), ew);
    st.modelName = sj::asString(sj::member(engine, "model", ew), ew / "model");
    st.worldSize = bounded<int>(engine, "world_size", kMaxWorldSize, ew);
    if (st.worldSize < 1) sj::failAt(ew / "world_size", "must be at least 1");
    st.backend = sj::asString(sj::member(engine, "backend", ew), ew / "backend");
    if (sj::optionalMember(engine, "fix_dialect", e)) {
        st.fixDialect = sj::asString(e, ew / "fix_dialect");
        state::FixDialect known;
        if (!state::parseFixDialect(st.fixDialect, known))
            sj::failAt(ew / "fix_dialect", "expected \"shardscope\", \"deepspeed\" or \"fsdp\"");
    }
    st.step = bounded<std::uint32_t>(engine, "step", 0xFFFFFFFFu, ew);
    if (sj::optionalMember(engine, "local_ranks", e)) {
        const Where lw = ew / "local_ranks";
        std::size_t i = 0;
        for (Element r : sj::asArray(e, lw)) {
            st.localRanks.push_back(static_cast<int>(
                sj::asBounded(r, static_cast<std::uint64_t>(st.worldSize - 1), lw[i])));
            ++i;
        }
    }
    const Where cw = ew / "config";
    const sj::Object cfg = sj::asObject(sj::member(engine, "config", ew), cw);
    st.config.persistenceThreshold =
        sj::asI64(sj::member(cfg, "persistence_threshold", cw), cw / "persistence_threshold");
    st.config.prefetchBucketSize =
        sj::asI64(sj::member(cfg, "prefetch_bucket_size", cw), cw / "prefetch_bucket_size");
    st.config.maxLiveParameters =
        sj::asI64(sj::member(cfg, "max_live_parameters", cw), cw / "max_live_parameters");
    st.config.guard = readEnum(sj::member(cfg, "guard", cw), guardPolicyFromName, cw / "guard");

    const Where mw = rw / "modules";
    const sj::Array modules = sj::asArray(sj::member(root, "modules", rw), mw);
    for (Element m : modules) {
        const std::size_t i = st.modules.size();
        const Where w = mw[i];
        const sj::Fields f(sj::asObject(m, w), kModuleFields, w);
        state::ModuleRecord r;
        r.id = readId(f[0], kNoModule, f.at(0));
        if (r.id != i)
            sj::failAt(f.at(0),
                       "is " + std::to_string(r.id) + "; module ids must equal their index");
        r.path = sj::asString(f[1], f.at(1));
        r.type = sj::asString(f[2], f.at(2));
        r.parent = readId(f[3], kNoModule, f.at(3));
        if (r.parent != kNoModule && r.parent >= r.id)
            sj::failAt(f.at(3), "a parent must come before its children");
        if (f.has(4)) {
            const Where uw = f.at(4);
            const sj::Fields u(sj::asObject(f[4], uw), kUnitFields, uw);
            r.unitGroup = readId(u[0], kNoModule, u.at(0));
            if (r.unitGroup == kNoModule)
                sj::failAt(u.at(0), "an FSDP unit needs its group's module");
            r.reshardAfterForward = sj::asString(u[1], u.at(1));
            r.mesh = sj::asString(u[2], u.at(2));
        }
        st.modules.push_back(std::move(r));
    }
    for (const state::ModuleRecord &r : st.modules)
        if (const std::string bad = state::unitGroupError(st.modules, r); !bad.empty())
            sj::failAt(mw[r.id] / "fsdp_unit" / "group_id", bad);
    ModuleIndex index;
    index.count = st.modules.size();
    index.byPath.reserve(st.modules.size());
    for (const state::ModuleRecord &r : st.modules)
        index.byPath.emplace(r.path, r.id);

    const Where pw = rw / "params";
    const sj::Array params = sj::asArray(sj::member(root, "params", rw), pw);
    st.params.reserve(params.size());
    for (Element p : params)
        st.params.push_back(decodeParam(p, index, st.worldSize, version, pw[st.params.size()]));

    const Where vw = rw / "violations";
    for (Element v : sj::asArray(sj::member(root, "violations", rw), vw))
        st.violations.push_back(decodeViolation(v, index, vw[st.violations.size()]));

    const Where evw = rw / "events";
    const Element events = sj::member(root, "events", rw);
    if (version >= 3 && events.is_object()) {
        decodeEventColumns(sj::asObject(events, evw), s.events, evw);
    } else {
        const sj::Array list = sj::asArray(events, evw);
        s.events.reserve(list.size());
        for (Element ev : list)
            s.events.push_back(decodeEvent(ev, evw[s.events.size()]));
    }
    s.droppedEvents = u64(root, "dropped_events", rw);
    return s;
}

} // namespace

namespace detail {

std::string collectiveJson(const state::CollectiveDetail &d)
{
    std::string out;
    Writer w(out, false);
    writeCollective(w, d);
    return out;
}

Result<state::CollectiveDetail> decodeCollectiveJson(std::string_view json)
{
    return guarded<state::CollectiveDetail>("not a valid collective", [&] {
        simdjson::dom::parser parser;
        return decodeCollective(sj::parse(parser, json, false), Where::root());
    });
}

} // namespace detail

std::uint64_t unixTimeMs()
{
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
}

std::string encodeSnapshot(const Snapshot &snapshot, bool pretty)
{
    const state::EngineState &s = snapshot.state;
    std::string out;
    out.reserve(4096 + s.modules.size() * 96 +
                s.params.size() * (400 + static_cast<std::size_t>(std::max(s.worldSize, 0))) +
                s.violations.size() * 512 + snapshot.events.size() * 160);
    Writer w(out, pretty);
    w.raw("{");
    w.member("format", true).str(kSnapshotFormat);
    // Without events versions 2 and 3 are the same document: State frames stay readable by
    // clients built before version 3.
    w.member("version").num(snapshot.events.empty() ? 2 : kSnapshotVersion);
    w.member("producer").str(snapshot.meta.producer);
    w.member("pid").inum(snapshot.meta.pid);
    w.member("created_unix_ms").num(snapshot.meta.createdUnixMs);
    w.member("endpoint").str(snapshot.meta.endpoint);

    w.member("engine").raw("{\"model\":").str(s.modelName);
    w.raw(",\"world_size\":").inum(s.worldSize);
    w.raw(",\"backend\":").str(s.backend);
    w.raw(",\"fix_dialect\":").str(s.fixDialect);
    w.raw(",\"step\":").num(s.step);
    w.raw(",\"local_ranks\":[");
    for (std::size_t i = 0; i < s.localRanks.size(); ++i) {
        if (i) w.raw(",");
        w.inum(s.localRanks[i]);
    }
    w.raw("],\"config\":{\"persistence_threshold\":").inum(s.config.persistenceThreshold);
    w.raw(",\"prefetch_bucket_size\":").inum(s.config.prefetchBucketSize);
    w.raw(",\"max_live_parameters\":").inum(s.config.maxLiveParameters);
    w.raw(",\"guard\":").str(guardPolicyName(s.config.guard)).raw("}}");

    w.member("modules").raw("[");
    for (std::size_t i = 0; i < s.modules.size(); ++i) {
        const state::ModuleRecord &m = s.modules[i];
        w.element(i).raw("{\"id\":").num(m.id);
        w.raw(",\"path\":").str(m.path);
        w.raw(",\"type\":").str(m.type);
        w.raw(",\"parent\":").idOrNull(m.parent, kNoModule);
        if (m.fsdpUnit()) {
            w.raw(",\"fsdp_unit\":{\"group_id\":").num(m.unitGroup);
            w.raw(",\"reshard_after_forward\":").str(m.reshardAfterForward);
            w.raw(",\"mesh\":").str(m.mesh).raw("}");
        }
        w.raw("}");
    }
    w.endArray(s.modules.size());

    std::string scratch;
    w.member("params").raw("[");
    for (std::size_t i = 0; i < s.params.size(); ++i)
        writeParam(w.element(i), s, s.params[i], scratch);
    w.endArray(s.params.size());

    std::unordered_map<ParamId, const state::ParamRecord *> paramById;
    if (!s.violations.empty())
        for (const state::ParamRecord &p : s.params)
            paramById[p.id] = &p;
    w.member("violations").raw("[");
    for (std::size_t i = 0; i < s.violations.size(); ++i)
        writeViolation(w.element(i), s, s.violations[i], paramById);
    w.endArray(s.violations.size());

    w.member("events");
    writeEventColumns(w, snapshot.events, pretty);
    w.member("dropped_events").num(snapshot.droppedEvents);
    w.raw(pretty ? "\n}\n" : "}");
    return out;
}

namespace {

Result<Snapshot> decodeSnapshotText(std::string_view json, bool padded)
{
    return detail::guarded<Snapshot>("not a valid ShardScope snapshot", [&] {
        simdjson::dom::parser parser;
        return decodeSnapshotDom(sj::parse(parser, json, padded));
    });
}

} // namespace

Result<Snapshot> decodeSnapshot(std::string_view json)
{
    return decodeSnapshotText(json, false);
}

static_assert(kPayloadPadding >= simdjson::SIMDJSON_PADDING);

Result<Snapshot> decodeSnapshot(const std::string &json)
{
    return decodeSnapshotText(json, json.capacity() - json.size() >= kPayloadPadding);
}

std::string outputOfRank(const std::string &path, int rank, int worldSize)
{
    static constexpr std::string_view kRank = "{rank}";
    if (path.empty()) return path;
    if (path.find(kRank) != std::string::npos) {
        std::string out = path;
        for (auto at = out.find(kRank); at != std::string::npos; at = out.find(kRank, at + 1))
            out.replace(at, kRank.size(), std::to_string(rank));
        return out;
    }
    if (worldSize <= 1 || rank == 0) return path;
    return path + ".rank" + std::to_string(rank);
}

Status writeSnapshotFile(const std::string &path, const Snapshot &snapshot)
{
    const std::string text = encodeSnapshot(snapshot, true);
    return writeFileAtomically(path, wantsGzip(path) ? gzipCompress(text) : text);
}

Result<Snapshot> decodeSnapshotFile(std::string bytes, std::uint64_t maxText)
{
    if (isGzip(bytes)) {
        auto text = gzipDecompress(bytes, maxText);
        if (!text) return fail("not a valid gzip'd snapshot: " + text.error());
        bytes = std::move(*text);
    }
    bytes.reserve(bytes.size() + kPayloadPadding); // parsed where it lies, without a copy
    return decodeSnapshot(bytes);
}

Result<Snapshot> readSnapshotFile(const std::string &path)
{
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; only regular files
    // are read, and reads from those never block anyway.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail("cannot open snapshot " + path + ": " + std::strerror(errno));
    struct stat st
    {
    };
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail("cannot read snapshot " + path +
                    ": not a regular file (a FIFO, a device or a directory); save the "
                    "snapshot to a file first");
    }
    if (static_cast<std::uint64_t>(st.st_size) > kMaxSnapshotFileBytes) {
        ::close(fd);
        return fail("snapshot " + path + " is larger than " +
                    std::to_string(kMaxSnapshotFileBytes >> 20) + " MiB; refusing to load it");
    }
    std::string text;
    text.reserve(static_cast<std::size_t>(st.st_size) + kPayloadPadding);
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const std::string reason = std::strerror(errno);
            ::close(fd);
            return fail("cannot read snapshot " + path + ": " + reason);
        }
        if (n == 0) break;
        text.append(buf, static_cast<std::size_t>(n));
        if (text.size() > kMaxSnapshotFileBytes) {
            ::close(fd);
            return fail("snapshot " + path + " is too large; refusing to load it");
        }
    }
    ::close(fd);
    auto snap = decodeSnapshotFile(std::move(text));
    if (!snap) return fail(path + ": " + snap.error());
    return snap;
}

} // namespace shardscope::wire

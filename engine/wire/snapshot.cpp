#include "wire/snapshot.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>

#include "wire/jsonread.h"
#include "wire/messages.h"

namespace shardscope::wire {

using detail::Json;

namespace {

constexpr int kMaxWorldSize = 1 << 16;
constexpr std::size_t kMaxRank = 0xFFFF;

std::string at(const std::string &where, std::size_t i)
{
    return where + "[" + std::to_string(i) + "]";
}

Json idOrNull(std::uint32_t id, std::uint32_t none)
{
    return id == none ? Json(nullptr) : Json(id);
}

std::uint32_t readId(const Json &j, std::uint32_t none, const std::string &where)
{
    if (j.is_null()) return none;
    return static_cast<std::uint32_t>(detail::asBounded(j, 0xFFFFFFFEu, where));
}

std::string modulePathOf(const EngineState &s, ModuleId id)
{
    return id < s.modules.size() ? s.modules[id].path : std::string();
}

Json modulePathOrNull(const EngineState &s, ModuleId id)
{
    return id < s.modules.size() ? Json(s.modules[id].path) : Json(nullptr);
}

// Finds an enum value whose name (given by nameOf) equals the JSON string.
template <class E, class NameOf>
E readEnum(const Json &j, int count, NameOf nameOf, const std::string &where)
{
    const std::string s = detail::asString(j, where);
    for (int v = 0; v < count; ++v)
        if (nameOf(static_cast<E>(v)) == s) return static_cast<E>(v);
    detail::failAt(where, "unknown value \"" + s + "\"");
}

Json encodeEvent(const Event &e)
{
    Json j;
    j["ts_ns"] = e.tsNs;
    j["step"] = e.step;
    j["rank"] = e.rank;
    j["type"] = eventTypeName(e.type);
    j["flags"] = e.flags;
    j["a"] = e.a;
    j["b"] = e.b;
    j["u0"] = e.u0;
    j["u1"] = e.u1;
    j["u2"] = e.u2;
    return j;
}

Event decodeEvent(const Json &j, const std::string &where)
{
    detail::requireObject(j, where);
    Event e{};
    e.tsNs = detail::asU64(detail::member(j, "ts_ns", where), where + ".ts_ns");
    e.step = static_cast<std::uint32_t>(
        detail::asBounded(detail::member(j, "step", where), 0xFFFFFFFFu, where + ".step"));
    e.rank = static_cast<std::uint16_t>(
        detail::asBounded(detail::member(j, "rank", where), kMaxRank, where + ".rank"));
    const std::string type = detail::asString(detail::member(j, "type", where), where + ".type");
    const auto t = eventTypeFromName(type);
    if (!t) detail::failAt(where + ".type", "unknown event type \"" + type + "\"");
    e.type = *t;
    e.flags = static_cast<std::uint8_t>(
        detail::asBounded(detail::member(j, "flags", where), 0xFF, where + ".flags"));
    e.a = static_cast<std::uint32_t>(
        detail::asBounded(detail::member(j, "a", where), 0xFFFFFFFFu, where + ".a"));
    e.b = static_cast<std::uint32_t>(
        detail::asBounded(detail::member(j, "b", where), 0xFFFFFFFFu, where + ".b"));
    e.u0 = detail::asU64(detail::member(j, "u0", where), where + ".u0");
    e.u1 = detail::asU64(detail::member(j, "u1", where), where + ".u1");
    e.u2 = detail::asU64(detail::member(j, "u2", where), where + ".u2");
    return e;
}

Json encodeParam(const EngineState &s, const ParamRecord &p)
{
    Json j;
    j["id"] = p.id;
    j["name"] = p.name;
    j["module"] = modulePathOrNull(s, p.owner);
    j["module_id"] = idOrNull(p.owner, kNoModule);
    j["shape"] = p.shape;
    j["dtype"] = dtypeName(p.dtype);
    j["numel"] = p.numel;
    j["padded_numel"] = p.paddedNumel;
    j["partition_numel"] = p.partitionNumel;
    j["persistent"] = p.persistent;
    j["partitioned"] = p.partitioned;
    j["late"] = p.late;
    Json status = Json::array();
    for (ParamStatus st : p.status)
        status.push_back(statusName(st));
    j["status"] = status;
    Json ext = Json::array();
    Json extAuto = Json::array();
    for (const ExternalRecord &e : p.externals) {
        ext.push_back(modulePathOf(s, e.module));
        if (e.automatic) extAuto.push_back(modulePathOf(s, e.module));
    }
    j["external_modules"] = ext;
    j["external_auto_modules"] = extAuto;
    Json active = Json::array();
    for (ModuleId m : p.activeModules)
        active.push_back(modulePathOf(s, m));
    j["active_modules"] = active;
    j["gather_count"] = p.gatherCount;
    j["gather_bytes"] = p.gatherBytes;
    j["gather_ns"] = p.gatherNs;
    j["last_gather_ts_ns"] = p.lastGatherTsNs;
    return j;
}

Json encodeViolation(const EngineState &s, const ViolationRecord &v)
{
    Json j;
    j["kind"] = violationKindName(v.kind);
    j["step"] = v.step;
    j["last_step"] = v.lastStep;
    j["rank"] = v.rank;
    j["accessor"] = modulePathOrNull(s, v.accessor);
    j["accessor_id"] = idOrNull(v.accessor, kNoModule);
    Json paramName = nullptr;
    for (const ParamRecord &p : s.params)
        if (p.id == v.param) paramName = p.name;
    j["param"] = paramName;
    j["param_id"] = idOrNull(v.param, kNoParam);
    j["owner"] = modulePathOrNull(s, v.owner);
    j["owner_id"] = idOrNull(v.owner, kNoModule);
    j["status"] = statusName(v.status);
    j["action"] = guardActionName(v.action);
    j["count"] = v.count;
    j["ts_ns"] = v.tsNs;
    j["fix"] = v.fix;
    j["message"] = v.message;
    return j;
}

struct ModuleIndex
{
    std::unordered_map<std::string, ModuleId> byPath;
    std::size_t count = 0;

    ModuleId resolve(const Json &j, const std::string &where) const
    {
        const std::string path = detail::asString(j, where);
        auto it = byPath.find(path);
        if (it == byPath.end()) detail::failAt(where, "no module with path \"" + path + "\"");
        return it->second;
    }
    ModuleId checkId(const Json &j, const std::string &where) const
    {
        const ModuleId id = readId(j, kNoModule, where);
        if (id != kNoModule && id >= count)
            detail::failAt(where, "module id " + std::to_string(id) + " does not exist");
        return id;
    }
};

std::vector<ModuleId> resolvePaths(const Json &obj, const char *key, const ModuleIndex &index,
                                   const std::string &where)
{
    std::vector<ModuleId> out;
    const std::string w = where + "." + key;
    const Json &a = detail::asArray(detail::member(obj, key, where), w);
    for (std::size_t i = 0; i < a.size(); ++i)
        out.push_back(index.resolve(a[i], at(w, i)));
    return out;
}

ParamRecord decodeParam(const Json &j, const ModuleIndex &index, int worldSize,
                        const std::string &w)
{
    detail::requireObject(j, w);
    ParamRecord p;
    p.id = readId(detail::member(j, "id", w), kNoParam, w + ".id");
    p.name = detail::asString(detail::member(j, "name", w), w + ".name");
    p.owner = index.checkId(detail::member(j, "module_id", w), w + ".module_id");
    const Json &shape = detail::asArray(detail::member(j, "shape", w), w + ".shape");
    if (shape.size() > 16) detail::failAt(w + ".shape", "more than 16 dimensions");
    for (std::size_t i = 0; i < shape.size(); ++i) {
        const std::int64_t d = detail::asI64(shape[i], at(w + ".shape", i));
        if (d < 0) detail::failAt(at(w + ".shape", i), "negative dimension");
        p.shape.push_back(d);
    }
    p.dtype = readEnum<DType>(detail::member(j, "dtype", w), 2, dtypeName, w + ".dtype");
    auto nonNegative = [&](const char *key) {
        const std::int64_t v = detail::asI64(detail::member(j, key, w), w + "." + key);
        if (v < 0) detail::failAt(w + "." + key, "negative");
        return v;
    };
    p.numel = nonNegative("numel");
    p.paddedNumel = nonNegative("padded_numel");
    p.partitionNumel = nonNegative("partition_numel");
    p.persistent = detail::asBool(detail::member(j, "persistent", w), w + ".persistent");
    p.partitioned = detail::asBool(detail::member(j, "partitioned", w), w + ".partitioned");
    p.late = detail::asBool(detail::member(j, "late", w), w + ".late");
    const Json &status = detail::asArray(detail::member(j, "status", w), w + ".status");
    if (status.size() != static_cast<std::size_t>(worldSize))
        detail::failAt(w + ".status", std::to_string(status.size()) + " entries for a world of " +
                                          std::to_string(worldSize) + " ranks");
    for (std::size_t i = 0; i < status.size(); ++i)
        p.status.push_back(readEnum<ParamStatus>(status[i], 3, statusName, at(w + ".status", i)));
    const std::vector<ModuleId> ext = resolvePaths(j, "external_modules", index, w);
    const std::vector<ModuleId> extAuto = resolvePaths(j, "external_auto_modules", index, w);
    for (ModuleId m : ext) {
        bool automatic = false;
        for (ModuleId a : extAuto)
            automatic = automatic || a == m;
        p.externals.push_back(ExternalRecord{m, automatic});
    }
    p.activeModules = resolvePaths(j, "active_modules", index, w);
    p.gatherCount = detail::asU64(detail::member(j, "gather_count", w), w + ".gather_count");
    p.gatherBytes = detail::asU64(detail::member(j, "gather_bytes", w), w + ".gather_bytes");
    p.gatherNs = detail::asU64(detail::member(j, "gather_ns", w), w + ".gather_ns");
    p.lastGatherTsNs =
        detail::asU64(detail::member(j, "last_gather_ts_ns", w), w + ".last_gather_ts_ns");
    return p;
}

ViolationRecord decodeViolation(const Json &j, const ModuleIndex &index, const std::string &w)
{
    detail::requireObject(j, w);
    ViolationRecord v;
    v.kind =
        readEnum<ViolationKind>(detail::member(j, "kind", w), 4, violationKindName, w + ".kind");
    v.step = static_cast<std::uint32_t>(
        detail::asBounded(detail::member(j, "step", w), 0xFFFFFFFFu, w + ".step"));
    v.lastStep = static_cast<std::uint32_t>(
        detail::asBounded(detail::member(j, "last_step", w), 0xFFFFFFFFu, w + ".last_step"));
    v.rank =
        static_cast<int>(detail::asBounded(detail::member(j, "rank", w), kMaxRank, w + ".rank"));
    v.accessor = index.checkId(detail::member(j, "accessor_id", w), w + ".accessor_id");
    v.param = readId(detail::member(j, "param_id", w), kNoParam, w + ".param_id");
    v.owner = index.checkId(detail::member(j, "owner_id", w), w + ".owner_id");
    v.status = readEnum<ParamStatus>(detail::member(j, "status", w), 3, statusName, w + ".status");
    v.action =
        readEnum<GuardAction>(detail::member(j, "action", w), 4, guardActionName, w + ".action");
    v.count = detail::asU64(detail::member(j, "count", w), w + ".count");
    v.tsNs = detail::asU64(detail::member(j, "ts_ns", w), w + ".ts_ns");
    v.fix = detail::asString(detail::member(j, "fix", w), w + ".fix");
    v.message = detail::asString(detail::member(j, "message", w), w + ".message");
    return v;
}

Snapshot decodeSnapshotJson(const Json &root)
{
    detail::requireObject(root, "snapshot");
    const std::string format =
        detail::asString(detail::member(root, "format", "snapshot"), "format");
    if (format != kSnapshotFormat)
        detail::failAt("format", "\"" + format + "\" is not \"shardscope-snapshot\"");
    const std::uint64_t version =
        detail::asU64(detail::member(root, "version", "snapshot"), "version");
    if (version != static_cast<std::uint64_t>(kSnapshotVersion))
        detail::failAt("version", "snapshot version " + std::to_string(version) +
                                      " cannot be read by this build, which reads version " +
                                      std::to_string(kSnapshotVersion));
    Snapshot s;
    if (detail::hasMember(root, "producer"))
        s.meta.producer = detail::asString(root["producer"], "producer");
    if (detail::hasMember(root, "pid")) s.meta.pid = detail::asI64(root["pid"], "pid");
    if (detail::hasMember(root, "created_unix_ms"))
        s.meta.createdUnixMs = detail::asU64(root["created_unix_ms"], "created_unix_ms");
    if (detail::hasMember(root, "endpoint"))
        s.meta.endpoint = detail::asString(root["endpoint"], "endpoint");

    EngineState &st = s.state;
    const Json &engine =
        detail::requireObject(detail::member(root, "engine", "snapshot"), "engine");
    st.modelName = detail::asString(detail::member(engine, "model", "engine"), "engine.model");
    st.worldSize = static_cast<int>(detail::asBounded(
        detail::member(engine, "world_size", "engine"), kMaxWorldSize, "engine.world_size"));
    if (st.worldSize < 1) detail::failAt("engine.world_size", "must be at least 1");
    st.backend = detail::asString(detail::member(engine, "backend", "engine"), "engine.backend");
    st.step = static_cast<std::uint32_t>(
        detail::asBounded(detail::member(engine, "step", "engine"), 0xFFFFFFFFu, "engine.step"));
    if (detail::hasMember(engine, "local_ranks")) {
        const Json &lr = detail::asArray(engine["local_ranks"], "engine.local_ranks");
        for (std::size_t i = 0; i < lr.size(); ++i)
            st.localRanks.push_back(static_cast<int>(detail::asBounded(
                lr[i], static_cast<std::uint64_t>(st.worldSize - 1), at("engine.local_ranks", i))));
    }
    const Json &cfg =
        detail::requireObject(detail::member(engine, "config", "engine"), "engine.config");
    st.config.persistenceThreshold =
        detail::asI64(detail::member(cfg, "persistence_threshold", "engine.config"),
                      "engine.config.persistence_threshold");
    st.config.prefetchBucketSize =
        detail::asI64(detail::member(cfg, "prefetch_bucket_size", "engine.config"),
                      "engine.config.prefetch_bucket_size");
    st.config.maxLiveParameters =
        detail::asI64(detail::member(cfg, "max_live_parameters", "engine.config"),
                      "engine.config.max_live_parameters");
    st.config.guard = readEnum<GuardPolicy>(detail::member(cfg, "guard", "engine.config"), 3,
                                            guardPolicyName, "engine.config.guard");

    const Json &modules = detail::asArray(detail::member(root, "modules", "snapshot"), "modules");
    ModuleIndex index;
    index.count = modules.size();
    for (std::size_t i = 0; i < modules.size(); ++i) {
        const std::string w = at("modules", i);
        const Json &m = detail::requireObject(modules[i], w);
        ModuleRecord r;
        r.id = readId(detail::member(m, "id", w), kNoModule, w + ".id");
        if (r.id != i)
            detail::failAt(w + ".id",
                           "is " + std::to_string(r.id) + "; module ids must equal their index");
        r.path = detail::asString(detail::member(m, "path", w), w + ".path");
        r.type = detail::asString(detail::member(m, "type", w), w + ".type");
        r.parent = readId(detail::member(m, "parent", w), kNoModule, w + ".parent");
        if (r.parent != kNoModule && r.parent >= r.id)
            detail::failAt(w + ".parent", "a parent must come before its children");
        index.byPath.emplace(r.path, r.id);
        st.modules.push_back(std::move(r));
    }

    const Json &params = detail::asArray(detail::member(root, "params", "snapshot"), "params");
    for (std::size_t i = 0; i < params.size(); ++i)
        st.params.push_back(decodeParam(params[i], index, st.worldSize, at("params", i)));

    const Json &violations =
        detail::asArray(detail::member(root, "violations", "snapshot"), "violations");
    for (std::size_t i = 0; i < violations.size(); ++i)
        st.violations.push_back(decodeViolation(violations[i], index, at("violations", i)));

    const Json &events = detail::asArray(detail::member(root, "events", "snapshot"), "events");
    s.events.reserve(events.size());
    for (std::size_t i = 0; i < events.size(); ++i)
        s.events.push_back(decodeEvent(events[i], at("events", i)));
    s.droppedEvents =
        detail::asU64(detail::member(root, "dropped_events", "snapshot"), "dropped_events");
    return s;
}

} // namespace

std::uint64_t unixTimeMs()
{
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
}

std::string encodeSnapshot(const Snapshot &snapshot, bool pretty)
{
    const EngineState &s = snapshot.state;
    Json root;
    root["format"] = kSnapshotFormat;
    root["version"] = kSnapshotVersion;
    root["producer"] = snapshot.meta.producer;
    root["pid"] = snapshot.meta.pid;
    root["created_unix_ms"] = snapshot.meta.createdUnixMs;
    root["endpoint"] = snapshot.meta.endpoint;

    Json engine;
    engine["model"] = s.modelName;
    engine["world_size"] = s.worldSize;
    engine["backend"] = s.backend;
    engine["step"] = s.step;
    engine["local_ranks"] = s.localRanks;
    Json cfg;
    cfg["persistence_threshold"] = s.config.persistenceThreshold;
    cfg["prefetch_bucket_size"] = s.config.prefetchBucketSize;
    cfg["max_live_parameters"] = s.config.maxLiveParameters;
    cfg["guard"] = guardPolicyName(s.config.guard);
    engine["config"] = cfg;
    root["engine"] = engine;

    Json modules = Json::array();
    for (const ModuleRecord &m : s.modules) {
        Json j;
        j["id"] = m.id;
        j["path"] = m.path;
        j["type"] = m.type;
        j["parent"] = idOrNull(m.parent, kNoModule);
        modules.push_back(std::move(j));
    }
    root["modules"] = std::move(modules);

    Json params = Json::array();
    for (const ParamRecord &p : s.params)
        params.push_back(encodeParam(s, p));
    root["params"] = std::move(params);

    Json violations = Json::array();
    for (const ViolationRecord &v : s.violations)
        violations.push_back(encodeViolation(s, v));
    root["violations"] = std::move(violations);

    Json events = Json::array();
    for (const Event &e : snapshot.events)
        events.push_back(encodeEvent(e));
    root["events"] = std::move(events);
    root["dropped_events"] = snapshot.droppedEvents;
    return detail::dumpJson(root, pretty);
}

Result<Snapshot> decodeSnapshot(std::string_view json)
{
    return detail::guarded<Snapshot>("not a valid ShardScope snapshot",
                                     [&] { return decodeSnapshotJson(detail::parseJson(json)); });
}

Status writeFileAtomically(const std::string &path, std::string_view contents)
{
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    auto failWith = [&](const char *what) {
        const std::string reason = std::strerror(errno);
        ::unlink(tmp.c_str());
        return fail(std::string("cannot ") + what + " " + path + ": " + reason);
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fail("cannot write " + path + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < contents.size()) {
        const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ::close(fd);
            return failWith("write");
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
        ::close(fd);
        return failWith("write");
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) return failWith("replace");
    return success();
}

Status writeSnapshotFile(const std::string &path, const Snapshot &snapshot)
{
    return writeFileAtomically(path, encodeSnapshot(snapshot, true));
}

Result<Snapshot> readSnapshotFile(const std::string &path)
{
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("cannot open snapshot " + path + ": " + std::strerror(errno));
    struct stat st
    {
    };
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail("cannot read snapshot " + path + ": not a regular file");
    }
    if (static_cast<std::uint64_t>(st.st_size) > kMaxSnapshotFileBytes) {
        ::close(fd);
        return fail("snapshot " + path + " is larger than " +
                    std::to_string(kMaxSnapshotFileBytes >> 20) + " MiB; refusing to load it");
    }
    std::string text;
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
    auto snap = decodeSnapshot(text);
    if (!snap) return fail(path + ": " + snap.error());
    return snap;
}

} // namespace shardscope::wire

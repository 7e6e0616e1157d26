#pragma once
// The snapshot schema of docs/snapshot.md as a checker: every documented field present
// with its documented JSON type. Returns the problems found (empty: valid). Written from
// the document, not from the codec, so it catches a codec that drifts from it.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardscope::test {

// The events of a document as version 2 wrote them (one object per event), also for a
// version 3 document, whose events are columns: times and steps as differences from the
// previous event, types as indexes into type_names.
inline nlohmann::json eventList(const nlohmann::json &doc)
{
    using nlohmann::json;
    const json &ev = doc.at("events");
    if (ev.is_array()) return ev;
    json out = json::array();
    std::uint64_t ts = 0, step = 0;
    for (std::size_t i = 0; i < ev.at("count").get<std::size_t>(); ++i) {
        ts += static_cast<std::uint64_t>(ev["ts_ns"][i].get<std::int64_t>());
        step += static_cast<std::uint64_t>(ev["step"][i].get<std::int64_t>());
        json e = {{"ts_ns", ts}, {"step", step}};
        e["rank"] = ev["rank"][i];
        e["type"] = ev["type_names"][ev["type"][i].get<std::size_t>()];
        for (const char *k : {"flags", "a", "b", "u0", "u1", "u2"})
            e[k] = ev[k][i];
        out.push_back(std::move(e));
    }
    return out;
}

inline std::vector<std::string> snapshotSchemaProblems(const nlohmann::json &j)
{
    using nlohmann::json;
    std::vector<std::string> problems;
    enum Kind
    {
        Str,
        UInt,
        Int,
        Bool,
        Arr,
        Obj,
        StrOrNull,
        UIntOrNull
    };
    auto check = [&](const json &obj, const std::string &where, const char *key, Kind kind) {
        if (!obj.is_object() || !obj.contains(key)) {
            problems.push_back(where + "." + key + " missing");
            return;
        }
        const json &v = obj[key];
        bool ok = false;
        switch (kind) {
        case Str:
            ok = v.is_string();
            break;
        case UInt:
            ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<long long>() >= 0);
            break;
        case Int:
            ok = v.is_number_integer();
            break;
        case Bool:
            ok = v.is_boolean();
            break;
        case Arr:
            ok = v.is_array();
            break;
        case Obj:
            ok = v.is_object();
            break;
        case StrOrNull:
            ok = v.is_string() || v.is_null();
            break;
        case UIntOrNull:
            ok = v.is_null() || v.is_number_unsigned() ||
                 (v.is_number_integer() && v.get<long long>() >= 0);
            break;
        }
        if (!ok) problems.push_back(where + "." + key + " has the wrong type");
    };
    check(j, "", "format", Str);
    if (j.value("format", "") != "shardscope-snapshot")
        problems.push_back(".format is not shardscope-snapshot");
    check(j, "", "version", UInt);
    if (j.contains("version") && j["version"] != 2 && j["version"] != 3)
        problems.push_back(".version is not 2 or 3");
    for (const char *k : {"producer", "endpoint"})
        check(j, "", k, Str);
    check(j, "", "pid", Int);
    check(j, "", "created_unix_ms", UInt);
    check(j, "", "engine", Obj);
    check(j, "", "modules", Arr);
    check(j, "", "params", Arr);
    check(j, "", "violations", Arr);
    // Version 3 (with events): the events as columns; version 2 (none): an empty array.
    check(j, "", "events", j.value("version", 0) == 3 ? Obj : Arr);
    check(j, "", "dropped_events", UInt);
    if (!problems.empty()) return problems;
    const json &e = j["engine"];
    check(e, "engine", "model", Str);
    check(e, "engine", "world_size", UInt);
    check(e, "engine", "backend", Str);
    check(e, "engine", "step", UInt);
    check(e, "engine", "local_ranks", Arr);
    check(e, "engine", "config", Obj);
    if (e.contains("config"))
        for (const char *k :
             {"persistence_threshold", "prefetch_bucket_size", "max_live_parameters"})
            check(e["config"], "engine.config", k, Int);
    if (e.contains("config")) check(e["config"], "engine.config", "guard", Str);
    for (const json &m : j["modules"]) {
        check(m, "modules[]", "id", UInt);
        check(m, "modules[]", "path", Str);
        check(m, "modules[]", "type", Str);
        check(m, "modules[]", "parent", UIntOrNull);
        // Optional: an FSDP2 unit.
        if (m.contains("fsdp_unit")) {
            check(m["fsdp_unit"], "modules[].fsdp_unit", "group_id", UInt);
            for (const char *k : {"reshard_after_forward", "mesh"})
                check(m["fsdp_unit"], "modules[].fsdp_unit", k, Str);
        }
    }
    for (const json &p : j["params"]) {
        for (const char *k : {"id", "module_id", "numel", "padded_numel", "partition_numel",
                              "gather_count", "gather_bytes", "gather_ns", "last_gather_ts_ns"})
            check(p, "params[]", k, UInt);
        for (const char *k : {"name", "module", "dtype"})
            check(p, "params[]", k, Str);
        for (const char *k : {"persistent", "partitioned", "late"})
            check(p, "params[]", k, Bool);
        for (const char *k :
             {"shape", "external_modules", "external_auto_modules", "active_modules"})
            check(p, "params[]", k, Arr);
        // Version 2: one letter per rank, N (NOT_AVAILABLE), I (INFLIGHT) or A (AVAILABLE).
        check(p, "params[]", "status", Str);
        for (const char *k : {"replaces", "placements"}) // optional
            if (p.contains(k)) check(p, "params[]", k, Str);
        if (p.contains("status") && p["status"].is_string() && j["engine"].contains("world_size")) {
            const std::string letters = p["status"].get<std::string>();
            if (letters.size() != j["engine"]["world_size"].get<std::size_t>())
                problems.push_back("params[].status does not have one letter per rank");
            if (letters.find_first_not_of("NIA") != std::string::npos)
                problems.push_back("params[].status has a letter other than N, I and A");
        }
    }
    for (const json &v : j["violations"]) {
        for (const char *k : {"kind", "status", "action", "fix", "message"})
            check(v, "violations[]", k, Str);
        for (const char *k : {"step", "last_step", "rank", "count", "ts_ns"})
            check(v, "violations[]", k, UInt);
        for (const char *k : {"accessor", "param", "owner"})
            check(v, "violations[]", k, StrOrNull);
        for (const char *k : {"accessor_id", "param_id", "owner_id"})
            check(v, "violations[]", k, UIntOrNull);
        // Optional: where in the user's code, and the modules being built.
        if (v.contains("location")) {
            const json &l = v["location"];
            for (const char *k : {"file", "function"})
                check(l, "violations[].location", k, Str);
            check(l, "violations[].location", "line", UInt);
            check(l, "violations[].location", "chain", Arr);
        }
        if (v.contains("building")) check(v, "violations[]", "building", Str);
        // Written by this release; a snapshot of an earlier one has neither.
        if (v.contains("severity")) {
            check(v, "violations[]", "severity", Str);
            const std::string sev =
                v["severity"].is_string() ? v["severity"].get<std::string>() : "";
            if (sev != "error" && sev != "cost" && sev != "info")
                problems.push_back("violations[].severity is not error, cost or info");
        }
        if (v.contains("read") && v["read"] != "values" && v["read"] != "attribute")
            problems.push_back("violations[].read is not values or attribute");
    }
    if (j["events"].is_object()) {
        const json &c = j["events"];
        check(c, "events", "count", UInt);
        check(c, "events", "type_names", Arr);
        for (const char *k :
             {"ts_ns", "step", "rank", "type", "flags", "a", "b", "u0", "u1", "u2"}) {
            check(c, "events", k, Arr);
            if (problems.empty() && c[k].size() != c["count"].get<std::size_t>())
                problems.push_back(std::string("events.") + k + " does not hold count values");
        }
        if (!problems.empty()) return problems;
    }
    if (j["version"] == 2 && !j["events"].empty())
        problems.push_back(".version is 2 but the document has events (written as version 3)");
    for (const json &ev : eventList(j)) {
        check(ev, "events[]", "type", Str);
        for (const char *k : {"ts_ns", "step", "rank", "flags", "a", "b", "u0", "u1", "u2"})
            check(ev, "events[]", k, UInt);
        if (!problems.empty()) break;
    }
    return problems;
}

} // namespace shardscope::test

#include <QtTest>

#include <QTemporaryDir>
#include <csignal>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "samplesnapshot.h"
#include "snapshotcompare.h"
#include "snapshotschema.h"
#include "wire/compress.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"
#include "wire/snapshot.h"

using namespace shardscope;
using namespace shardscope::wire;
using shardscope::test::compareStates;

namespace {

std::string readAll(const std::string &path)
{
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeRaw(const std::string &path, std::string_view bytes)
{
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

} // namespace

class TestSnapshot : public QObject
{
    Q_OBJECT
  private slots:
    void roundTripKeepsEveryFieldAndEveryEventType();
    void jsonUsesTheDocumentedNames();
    void invalidUtf8InNamesIsReplacedNotFatal();
    void refusesForeignAndInconsistentDocuments();
    void statusIsOneLetterPerRank();
    void versionOneDocumentsAreStillRead();
    void versionTwoEventsAreStillRead();
    void severityIsWrittenAndDerivedForOlderSnapshots();
    void nestingLimitIsThirtyTwoLevels();
    void fileWriteIsAtomicAndReadable();
    void killedWriterLeavesNoTemporaryFile();
    void corruptAndForeignFilesAreCleanErrors();
    void gzipFilesAreToldByTheirBytesNotTheirName();
    void damagedGzipFilesAreCleanErrors();
    void endpointsParseAndFormat();
    void attachTargetsParse();
    void discoveryListsLiveEnginesAndIgnoresStaleOnes();
    void discoveryTrustsOnlyAPrivateDirectoryAndRegularFiles();
    void repeatedRegistrationsAreReadOnce();
    void longRegistrationListsDecodeInLinearTime();
};

void TestSnapshot::roundTripKeepsEveryFieldAndEveryEventType()
{
    const Snapshot s = test::sampleSnapshot();
    for (bool pretty : {false, true}) {
        auto back = decodeSnapshot(encodeSnapshot(s, pretty));
        QVERIFY2(back.ok(), back.error().c_str());
        compareStates(s.state, back->state);
        QCOMPARE(back->meta.producer, s.meta.producer);
        QCOMPARE(back->meta.pid, s.meta.pid);
        QCOMPARE(back->meta.createdUnixMs, s.meta.createdUnixMs);
        QCOMPARE(back->meta.endpoint, s.meta.endpoint);
        QCOMPARE(back->droppedEvents, s.droppedEvents);
        QCOMPARE(back->events.size(), s.events.size());
        for (std::size_t i = 0; i < s.events.size(); ++i)
            QVERIFY2(std::memcmp(&back->events[i], &s.events[i], sizeof(telemetry::Event)) == 0,
                     std::string(eventTypeName(s.events[i].type)).c_str());
    }
}

void TestSnapshot::jsonUsesTheDocumentedNames()
{
    const auto j = nlohmann::json::parse(encodeSnapshot(test::sampleSnapshot()));
    QCOMPARE(j["format"].get<std::string>(), std::string("shardscope-snapshot"));
    QCOMPARE(j["version"].get<int>(), 3); // it has events
    QCOMPARE(j["engine"]["config"]["guard"].get<std::string>(), std::string("auto"));
    QCOMPARE(j["engine"]["world_size"].get<int>(), 2);
    const auto &p = j["params"][0];
    QCOMPARE(p["module"].get<std::string>(), std::string("embed"));
    QCOMPARE(p["status"].get<std::string>(), std::string("AI"));
    QCOMPARE(j["params"][1]["status"].get<std::string>(), std::string("NN"));
    QCOMPARE(p["external_modules"], nlohmann::json({"lm_head", "conv"}));
    QCOMPARE(p["external_auto_modules"], nlohmann::json({"lm_head"}));
    QCOMPARE(p["dtype"].get<std::string>(), std::string("float32"));
    QCOMPARE(j["params"][1]["dtype"].get<std::string>(), std::string("bfloat16"));
    QVERIFY(j["modules"][0]["parent"].is_null());
    QCOMPARE(j["modules"][2]["fsdp_unit"], nlohmann::json({{"group_id", 1},
                                                           {"reshard_after_forward", "True"},
                                                           {"mesh", "replicate=1, shard=2"}}));
    QVERIFY(!j["modules"][3].contains("fsdp_unit")); // not a unit: no field
    QCOMPARE(p["placements"].get<std::string>(), std::string("(Replicate(), Shard(0))"));
    QVERIFY(!j["params"][1].contains("placements"));
    const auto &v = j["violations"][0];
    QCOMPARE(v["kind"].get<std::string>(), std::string("unregistered_access"));
    QCOMPARE(v["accessor"].get<std::string>(), std::string("lm_head"));
    QCOMPARE(v["param"].get<std::string>(), std::string("embed.weight"));
    QCOMPARE(v["owner"].get<std::string>(), std::string("embed"));
    QCOMPARE(v["action"].get<std::string>(), std::string("gathered"));
    QCOMPARE(v["fix"].get<std::string>(),
             std::string("register_external_parameter(lm_head, embed.weight)"));
    // a removed parameter keeps its name; its id is in no params[] entry
    QCOMPARE(j["violations"][1]["param"].get<std::string>(), std::string("conv.weight"));
    QCOMPARE(j["violations"][1]["param_id"].get<int>(), 1);
    QVERIFY(j["violations"][2]["param"].is_null()); // trace_invalidated: no parameter
    QVERIFY(j["violations"][1]["accessor"].is_null());
    QVERIFY(!j["violations"][0].contains("collective")); // every kind but the two below
    // collective_mismatch with its collective (docs/snapshot.md).
    const auto &c = j["violations"][6]["collective"];
    QCOMPARE(j["violations"][6]["kind"].get<std::string>(), std::string("collective_mismatch"));
    QCOMPARE(c["group"].get<int>(), 1);
    QCOMPARE(c["seq"].get<int>(), 57);
    QCOMPARE(c["waited_ms"].get<int>(), 6500);
    QCOMPARE(c["sides"][0], nlohmann::json({{"ranks", {0}},
                                            {"position", "waiting"},
                                            {"kind", "all_gather"},
                                            {"module", "lm_head"},
                                            {"reason", "forward"},
                                            {"bytes", 4096},
                                            {"params", 2},
                                            {"last_seq", 57}}));
    QCOMPARE(c["sides"][1]["ranks"], nlohmann::json({1, 3}));
    QCOMPARE(c["sides"][1]["module"].get<std::string>(), std::string(""));
    QCOMPARE(c["sides"][1]["kind"].get<std::string>(), std::string("reduce_scatter"));
    QCOMPARE(c["sides"][2]["position"].get<std::string>(), std::string("finished"));
    QVERIFY(c["sides"][2]["module"].is_null());
    QCOMPARE(c["sides"][2]["last_seq"].get<int>(), 56);
    QCOMPARE(c["sites"][0]["rank"].get<int>(), 0);
    QCOMPARE(c["sites"][0]["waited_ms"].get<int>(), 6500);
    QCOMPARE(c["sites"][0]["location"]["line"].get<int>(), 42);
    QCOMPARE(c["sites"][1]["location"]["chain"], nlohmann::json::array());
    // Version 3: the events as columns; times and steps as differences, types as indexes.
    const auto &ev = j["events"];
    QCOMPARE(ev["count"].get<std::size_t>(), test::everyEventType().size());
    QCOMPARE(ev["type_names"][ev["type"][8].get<std::size_t>()].get<std::string>(),
             std::string("unregistered_access"));
    QCOMPARE(ev["u0"][0].get<std::uint64_t>(), 0xFFFFFFFFFFFFFFFFull - 1);
    QCOMPARE(ev["ts_ns"][0].get<std::uint64_t>(), test::everyEventType()[0].tsNs);
    QCOMPARE(ev["ts_ns"][1].get<std::int64_t>(), 17); // makeEvent spaces them 17 ns apart
    QCOMPARE(ev["a"][0].get<std::uint64_t>(), std::uint64_t(0xFFFFFFFFu - 1));
    QCOMPARE(j["dropped_events"].get<int>(), 17);
}

void TestSnapshot::invalidUtf8InNamesIsReplacedNotFatal()
{
    Snapshot s = test::sampleSnapshot();
    s.state.params[0].name = "embed.\xFF\xFEweight";
    const std::string json = encodeSnapshot(s);
    auto back = decodeSnapshot(json);
    QVERIFY2(back.ok(), back.error().c_str());
    QCOMPARE(back->state.params[0].name, std::string("embed.\xEF\xBF\xBD\xEF\xBF\xBDweight"));
    std::string raw = json;
    const auto at = raw.find("lm_head");
    raw[at] = static_cast<char>(0xC3); // a truncated two-byte sequence
    auto bad = decodeSnapshot(raw);
    QVERIFY(!bad.ok());
    QVERIFY2(bad.error().find("malformed JSON") != std::string::npos, bad.error().c_str());
}

void TestSnapshot::refusesForeignAndInconsistentDocuments()
{
    auto base = nlohmann::json::parse(encodeSnapshot(test::sampleSnapshot()));
    auto expectError = [&](nlohmann::json j, const char *needle) {
        auto r = decodeSnapshot(j.dump());
        QVERIFY2(!r.ok(), needle);
        QVERIFY2(r.error().find(needle) != std::string::npos, r.error().c_str());
    };
    auto j = base;
    j["format"] = "other";
    expectError(j, "is not \"shardscope-snapshot\"");
    j = base;
    j["version"] = 4;
    expectError(j, "snapshot version 4 is not supported; this build reads versions 1 to 3");
    j = base;
    j["version"] = 0;
    expectError(j, "snapshot version 0 is not supported");
    j = base;
    j["params"][0]["status"] = "AIN";
    expectError(j, "params[0].status: 3 letters for a world of 2 ranks");
    j = base;
    j["params"][0]["status"] = "";
    expectError(j, "params[0].status: 0 letters for a world of 2 ranks");
    j = base;
    j["params"][0]["status"] = "AX";
    expectError(j, "params[0].status: unknown status letter 'X' for rank 1 (expected N, I or A)");
    j = base;
    j["params"][1]["status"] = "na";
    expectError(j, "params[1].status: unknown status letter 'n' for rank 0");
    j = base;
    j["params"][0]["status"] = "A\n";
    expectError(j, "unknown status letter byte 10 for rank 1");
    j = base;
    j["params"][0]["status"] = nlohmann::json::array({"AVAILABLE", "INFLIGHT"});
    expectError(j, "params[0].status: expected a string");
    j = base;
    j["params"][0]["module_id"] = 99;
    expectError(j, "params[0].module_id: module id 99 does not exist");
    j = base;
    j["params"][0]["external_modules"][0] = "nowhere";
    expectError(j, "no module with path \"nowhere\"");
    j = base;
    j["modules"][2]["parent"] = 2;
    expectError(j, "a parent must come before its children");
    j = base;
    j["modules"][1]["id"] = 5;
    expectError(j, "module ids must equal their index");
    j = base;
    j["modules"][1]["fsdp_unit"]["group_id"] = 9;
    expectError(j, "modules[1].fsdp_unit.group_id: module id 9 does not exist (4 modules)");
    j = base;
    j["modules"][1]["fsdp_unit"]["group_id"] = 2;
    expectError(j, "modules[1].fsdp_unit.group_id: module 2 does not head an FSDP unit group");
    j = base;
    j["modules"][1]["fsdp_unit"].erase("mesh");
    expectError(j, "modules[1].fsdp_unit: missing field \"mesh\"");
    j = base;
    j["params"][0]["placements"] = "";
    expectError(j, "params[0].placements: is empty");
    j = base;
    j["events"]["type_names"][0] = "teleport";
    expectError(j, "events.type_names[0]: unknown event type \"teleport\"");
    j = base;
    j["events"]["type"][3] = 99;
    expectError(j, "events.type[3]: type index 99 is not in type_names");
    j = base;
    j["events"]["rank"][0] = 70000;
    expectError(j, "events.rank[0]");
    j = base;
    j["events"]["u1"].erase(0);
    expectError(j, "events.u1: 22 values where \"count\" is 23");
    j = base;
    j["events"]["step"][0] = -1;
    expectError(j, "events.step[0]: the step leaves 0 to 4294967295");
    j = base;
    j["events"].erase("a");
    expectError(j, "events: missing field \"a\"");
    j = base;
    j["events"] = nlohmann::json::array(); // version 3 with events as version 2 wrote them
    QVERIFY(decodeSnapshot(j.dump()).ok());
    j = base;
    j["engine"]["world_size"] = 4000000000ull;
    expectError(j, "engine.world_size");
    j = base;
    j["params"][0]["numel"] = "30";
    expectError(j, "params[0].numel: expected an integer");
    j = base;
    j.erase("dropped_events");
    expectError(j, "missing field \"dropped_events\"");
    j = base;
    j["violations"][0]["kind"] = "speeding";
    expectError(j, "unknown value \"speeding\"");
    j = base;
    j["violations"][6]["collective"]["sides"][1]["ranks"] = {3, 1};
    expectError(j, "violations[6].collective.sides[1].ranks[1]: ranks must ascend");
    j = base;
    j["violations"][6]["collective"]["sides"][0]["ranks"] = nlohmann::json::array();
    expectError(j, "violations[6].collective.sides[0].ranks: is empty");
    j = base;
    j["violations"][6]["collective"]["sides"][0]["position"] = "lost";
    expectError(j, "unknown value \"lost\"");
    j = base;
    j["violations"][6]["collective"]["sides"][0]["kind"] = "all_reduce";
    expectError(j, "violations[6].collective.sides[0].kind");
    j = base;
    j["violations"][6]["collective"]["sites"][0].erase("location");
    expectError(j, "missing field \"location\"");
    j = base;
    j["violations"][6]["collective"]["sites"][0]["rank"] = 70000;
    expectError(j, "violations[6].collective.sites[0].rank");

    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    auto r = decodeSnapshot(deep);
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("nested deeper") != std::string::npos, r.error().c_str());
    QVERIFY(!decodeSnapshot("").ok());
    QVERIFY(!decodeSnapshot("null").ok());
}

void TestSnapshot::statusIsOneLetterPerRank()
{
    Snapshot s = test::sampleSnapshot();
    s.state.worldSize = 64;
    const std::vector<ParamStatus> cycle = {ParamStatus::NotAvailable, ParamStatus::Inflight,
                                            ParamStatus::Available};
    std::string expected;
    for (state::ParamRecord &p : s.state.params) {
        p.status.clear();
        for (int r = 0; r < 64; ++r)
            p.status.push_back(cycle[static_cast<std::size_t>(r * (p.id + 1)) % 3]);
    }
    for (int r = 0; r < 64; ++r)
        expected.push_back("NIA"[(r * (s.state.params[0].id + 1)) % 3]);
    const std::string json = encodeSnapshot(s);
    const auto j = nlohmann::json::parse(json);
    QCOMPARE(j["params"][0]["status"].get<std::string>(), expected);
    for (const auto &p : j["params"])
        QCOMPARE(p["status"].get<std::string>().size(), std::size_t(64));
    auto back = decodeSnapshot(json);
    QVERIFY2(back.ok(), back.error().c_str());
    for (std::size_t i = 0; i < s.state.params.size(); ++i)
        QVERIFY(back->state.params[i].status == s.state.params[i].status);

    auto bad = j;
    bad["params"][0]["status"] = expected.substr(0, 63);
    auto r = decodeSnapshot(bad.dump());
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("params[0].status: 63 letters for a world of 64 ranks") !=
                 std::string::npos,
             r.error().c_str());
}

void TestSnapshot::versionOneDocumentsAreStillRead()
{
    const Snapshot s = test::sampleSnapshot();
    auto j = nlohmann::json::parse(encodeSnapshot(s));
    j["version"] = 1;
    j["events"] = test::eventList(j); // one object per event, as versions 1 and 2 wrote them
    for (auto &p : j["params"]) {
        nlohmann::json names = nlohmann::json::array();
        for (char c : p["status"].get<std::string>())
            names.push_back(c == 'N' ? "NOT_AVAILABLE" : c == 'I' ? "INFLIGHT" : "AVAILABLE");
        p["status"] = names;
    }
    auto back = decodeSnapshot(j.dump());
    QVERIFY2(back.ok(), back.error().c_str());
    compareStates(s.state, back->state);
    QCOMPARE(back->events.size(), s.events.size());
    QCOMPARE(std::memcmp(back->events.data(), s.events.data(),
                         s.events.size() * sizeof(telemetry::Event)),
             0);

    auto bad = j;
    bad["params"][0]["status"].push_back("AVAILABLE");
    auto r = decodeSnapshot(bad.dump());
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("params[0].status: 3 entries for a world of 2 ranks") !=
                 std::string::npos,
             r.error().c_str());
    bad = j;
    bad["params"][0]["status"][1] = "GONE";
    r = decodeSnapshot(bad.dump());
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("params[0].status[1]: unknown value \"GONE\"") != std::string::npos,
             r.error().c_str());
    bad = j;
    bad["params"][0]["status"] = "AI";
    r = decodeSnapshot(bad.dump());
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("params[0].status: expected an array") != std::string::npos,
             r.error().c_str());
}

// Each violation carries its severity (and an attribute read says so); a snapshot written
// before severities existed still opens, each violation given the one rule's severity.
void TestSnapshot::severityIsWrittenAndDerivedForOlderSnapshots()
{
    const Snapshot s = test::sampleSnapshot();
    auto j = nlohmann::json::parse(encodeSnapshot(s));
    const auto &v = j["violations"];
    QCOMPARE(v[0]["severity"].get<std::string>(), std::string("cost"));  // gathered for it
    QCOMPARE(v[1]["severity"].get<std::string>(), std::string("error")); // late_parameter
    QCOMPARE(v[2]["severity"].get<std::string>(), std::string("cost"));  // trace_invalidated
    QCOMPARE(v[3]["severity"].get<std::string>(), std::string("error")); // write without modifier
    QCOMPARE(v[4]["severity"].get<std::string>(), std::string("info"));  // T5's .dtype
    QCOMPARE(v[4]["read"].get<std::string>(), std::string("attribute"));
    QCOMPARE(v[5]["kind"].get<std::string>(), std::string("partitioned_save"));
    QCOMPARE(v[5]["severity"].get<std::string>(), std::string("error")); // the weights lost
    QVERIFY(!v[0].contains("read")); // a read of the values: the default, not written
    const auto round = decodeSnapshot(j.dump());
    QVERIFY2(round.ok(), round.error().c_str());
    QCOMPARE(round->state.violations[4].read, ViolationRead::Attribute);
    QCOMPARE(round->state.violations[4].severity, Severity::Info);

    // An earlier release's snapshot: neither member. Each severity comes from its kind and
    // action; an unregistered access that raised is an error.
    auto old = j;
    for (auto &e : old["violations"]) {
        e.erase("severity");
        e.erase("read");
    }
    old["violations"][0]["action"] = "error";
    auto back = decodeSnapshot(old.dump());
    QVERIFY2(back.ok(), back.error().c_str());
    const std::vector<Severity> expected = {Severity::Error, Severity::Error, Severity::Cost,
                                            Severity::Error, Severity::Cost,  Severity::Error,
                                            Severity::Error};
    QCOMPARE(back->state.violations.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
        QCOMPARE(back->state.violations[i].severity, expected[i]);
        QCOMPARE(back->state.violations[i].read, ViolationRead::Values);
    }
    QVERIFY(test::snapshotSchemaProblems(old).empty());
    QVERIFY(test::snapshotSchemaProblems(j).empty());

    // A value this build does not know is refused by name.
    auto bad = j;
    bad["violations"][0]["severity"] = "fatal";
    auto r = decodeSnapshot(bad.dump());
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("violations[0].severity: unknown value \"fatal\"") != std::string::npos,
             r.error().c_str());
    bad = j;
    bad["violations"][4]["read"] = "peek";
    r = decodeSnapshot(bad.dump());
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("violations[4].read: unknown value \"peek\"") != std::string::npos,
             r.error().c_str());
}

// Version 2 wrote each event as an object; a reader of version 3 reads those the same,
// and a version 3 document without events is written as version 2 (State frames, which
// older clients must still read).
void TestSnapshot::versionTwoEventsAreStillRead()
{
    Snapshot s = test::sampleSnapshot();
    s.events.push_back(s.events.front()); // out of time order: a negative difference
    s.events.back().tsNs = 5;
    s.events.back().step = 0;
    auto j = nlohmann::json::parse(encodeSnapshot(s));
    QVERIFY(test::snapshotSchemaProblems(j).empty());
    QCOMPARE(test::eventList(j).back()["ts_ns"].get<std::uint64_t>(), std::uint64_t(5));
    j["version"] = 2;
    j["events"] = test::eventList(j);
    auto back = decodeSnapshot(j.dump());
    QVERIFY2(back.ok(), back.error().c_str());
    QCOMPARE(back->events.size(), s.events.size());
    QCOMPARE(std::memcmp(back->events.data(), s.events.data(),
                         s.events.size() * sizeof(telemetry::Event)),
             0);
    QCOMPARE(encodeSnapshot(*back), encodeSnapshot(s));

    Snapshot state = s; // what a State frame carries
    state.events.clear();
    const auto frame = nlohmann::json::parse(encodeSnapshot(state));
    QCOMPARE(frame["version"].get<int>(), 2);
    QCOMPARE(frame["events"], nlohmann::json::array());
}

void TestSnapshot::nestingLimitIsThirtyTwoLevels()
{
    auto j = nlohmann::json::parse(encodeSnapshot(test::sampleSnapshot()));
    // The document itself is one level, "params" two, a parameter three, "shape" four.
    auto nested = [](int levels) {
        nlohmann::json v = 1;
        for (int i = 0; i < levels; ++i)
            v = nlohmann::json::array({v});
        return v;
    };
    j["extra"] = nested(31);
    auto ok = decodeSnapshot(j.dump());
    QVERIFY2(ok.ok(), ok.error().c_str());
    j["extra"] = nested(32);
    auto r = decodeSnapshot(j.dump());
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("JSON nested deeper than 32 levels") != std::string::npos,
             r.error().c_str());
}

void TestSnapshot::fileWriteIsAtomicAndReadable()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("run.json").toStdString();
    writeRaw(path, "old contents");
    const Snapshot s = test::sampleSnapshot();
    auto ok = writeSnapshotFile(path, s);
    QVERIFY2(ok.ok(), ok.error().c_str());
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files), QStringList{"run.json"}); // no temporary left
    auto back = readSnapshotFile(path);
    QVERIFY2(back.ok(), back.error().c_str());
    compareStates(s.state, back->state);
    QCOMPARE(back->events.size(), s.events.size());
    QVERIFY(readAll(path).find("\n") != std::string::npos); // the file is pretty-printed

    auto denied = writeSnapshotFile(dir.filePath("missing/run.json").toStdString(), s);
    QVERIFY(!denied.ok());
    QVERIFY2(denied.error().find("missing/run.json") != std::string::npos, denied.error().c_str());
}

// Issue #14, defect 13: a writer killed half-way left FILE.tmp.PID behind. The contents
// are written to an unnamed file that disappears with the process.
void TestSnapshot::killedWriterLeavesNoTemporaryFile()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("big.json").toStdString();
    int ready[2];
    QCOMPARE(::pipe(ready), 0);
    const pid_t child = ::fork();
    QVERIFY(child >= 0);
    if (child == 0) {
        const std::string contents(std::size_t(128) << 20, 'x');
        [[maybe_unused]] const ssize_t w = ::write(ready[1], "g", 1);
        for (;;)
            (void)writeFileAtomically(path, contents); // killed somewhere in here
    }
    char go = 0;
    QCOMPARE(::read(ready[0], &go, 1), ssize_t(1));
    ::usleep(50 * 1000);
    ::kill(child, SIGKILL);
    int status = 0;
    QCOMPARE(::waitpid(child, &status, 0), child);
    ::close(ready[0]);
    ::close(ready[1]);
    QDir d(dir.path());
    QCOMPARE(d.entryList({"*.tmp.*"}, QDir::Files | QDir::Hidden), QStringList());
}

void TestSnapshot::corruptAndForeignFilesAreCleanErrors()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("s.json").toStdString();
    const std::string good = encodeSnapshot(test::sampleSnapshot());
    writeRaw(path, good.substr(0, good.size() / 2));
    auto truncated = readSnapshotFile(path);
    QVERIFY(!truncated.ok());
    QVERIFY2(truncated.error().find(path) != std::string::npos, truncated.error().c_str());
    writeRaw(path, "\x89PNG\r\n\x1a\n binary");
    QVERIFY(!readSnapshotFile(path).ok());
    writeRaw(path, "{\"format\":\"shardscope-discovery\",\"version\":1}");
    QVERIFY(!readSnapshotFile(path).ok());
    auto missing = readSnapshotFile(dir.filePath("nope.json").toStdString());
    QVERIFY(!missing.ok());
    QVERIFY2(missing.error().find("cannot open snapshot") != std::string::npos,
             missing.error().c_str());
    auto isDir = readSnapshotFile(dir.path().toStdString());
    QVERIFY(!isDir.ok());
    // Issue #14, defect 11: opening a FIFO waited forever for a writer.
    const std::string fifo = dir.filePath("fifo.json").toStdString();
    QCOMPARE(::mkfifo(fifo.c_str(), 0600), 0);
    auto isFifo = readSnapshotFile(fifo);
    QVERIFY(!isFifo.ok());
    QVERIFY2(isFifo.error().find("not a regular file") != std::string::npos,
             isFifo.error().c_str());
}

// A name ending in .gz is written gzip'd and holds exactly the plain file's text; readers
// tell the two apart by gzip's magic bytes, so a renamed file still opens.
void TestSnapshot::gzipFilesAreToldByTheirBytesNotTheirName()
{
    QTemporaryDir dir;
    Snapshot s = test::sampleSnapshot();
    for (int i = 0; i < 2000; ++i) // enough text for compression to show
        s.events.push_back(test::makeEvent(static_cast<EventType>(1 + i % 18), std::uint32_t(i)));
    const std::string plain = dir.filePath("run.json").toStdString();
    const std::string gz = dir.filePath("run.json.GZ").toStdString();
    QVERIFY(writeSnapshotFile(plain, s).ok());
    QVERIFY(writeSnapshotFile(gz, s).ok());
    const std::string plainBytes = readAll(plain), gzBytes = readAll(gz);
    QVERIFY(!isGzip(plainBytes));
    QVERIFY(isGzip(gzBytes));
    QVERIFY2(gzBytes.size() * 5 < plainBytes.size(), std::to_string(gzBytes.size()).c_str());
    auto text = gzipDecompress(gzBytes, kMaxSnapshotFileBytes);
    QVERIFY2(text.ok(), text.error().c_str());
    QCOMPARE(*text, plainBytes); // the same document, byte for byte

    const std::string renamedGz = dir.filePath("gz-named.json").toStdString();
    const std::string renamedPlain = dir.filePath("plain-named.json.gz").toStdString();
    writeRaw(renamedGz, gzBytes);
    writeRaw(renamedPlain, plainBytes);
    for (const std::string &path : {plain, gz, renamedGz, renamedPlain}) {
        auto back = readSnapshotFile(path);
        QVERIFY2(back.ok(), (path + ": " + back.error()).c_str());
        QCOMPARE(encodeSnapshot(*back), encodeSnapshot(s));
    }
    // Members joined with cat read as their concatenated text (here: not one document).
    auto joined = decodeSnapshotFile(gzBytes + gzBytes);
    QVERIFY(!joined.ok());
    QVERIFY2(joined.error().find("gzip") == std::string::npos, joined.error().c_str());
    QCOMPARE(gzipDecompress(gzipCompress("ab") + gzipCompress("cd"), 16).value(),
             std::string("abcd"));
}

void TestSnapshot::damagedGzipFilesAreCleanErrors()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("s.json.gz").toStdString();
    const std::string gz = gzipCompress(encodeSnapshot(test::sampleSnapshot(), true));
    auto expectError = [&](const std::string &bytes, const std::string &what) {
        writeRaw(path, bytes);
        auto r = readSnapshotFile(path);
        QVERIFY(!r.ok());
        QVERIFY2(r.error().find(path) != std::string::npos, r.error().c_str());
        QVERIFY2(r.error().find(what) != std::string::npos, r.error().c_str());
    };
    expectError(gz.substr(0, gz.size() / 2), "truncated");
    std::string flipped = gz;
    flipped[gz.size() / 2] = static_cast<char>(flipped[gz.size() / 2] ^ 0x55);
    expectError(flipped, "gzip");
    std::string badCrc = gz;
    badCrc[gz.size() - 6] = static_cast<char>(badCrc[gz.size() - 6] ^ 1);
    expectError(badCrc, "damaged");
    expectError(gz + "trailing", "after the end of the gzip stream");
    expectError(std::string("\x1f\x8b"), "gzip");
    // A small file whose text is larger than a reader accepts is refused, not inflated.
    const std::string bomb = gzipCompress(std::string(std::size_t(8) << 20, ' '));
    QVERIFY(bomb.size() < 64 * 1024);
    auto refused = decodeSnapshotFile(bomb, std::size_t(1) << 20);
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().find("more than 1 MiB") != std::string::npos, refused.error().c_str());
}

// What a user attaches to: a job, or endpoints separated by commas (issue #49, defect 12).
void TestSnapshot::attachTargetsParse()
{
    auto job = parseAttachTarget(" job:none@127.0.0.1:29500 ");
    QVERIFY(job.ok());
    QCOMPARE(job->job, std::string("none@127.0.0.1:29500"));
    QVERIFY(job->endpoints.empty());
    auto list =
        parseAttachTarget("tcp:node1:7000, tcp:[::1]:7001,unix:/run/a,b.sock,tcp:node1:7000");
    QVERIFY2(list.ok(), list.ok() ? "" : list.error().c_str());
    QCOMPARE(list->endpoints,
             (std::vector<std::string>{"tcp:node1:7000", "tcp:[::1]:7001", "unix:/run/a,b.sock"}));
    auto one = parseAttachTarget("unix:/run/user/1/shardscope/7.sock");
    QVERIFY(one.ok());
    QCOMPARE(one->endpoints.size(), std::size_t(1));
    const std::pair<const char *, const char *> bad[] = {
        {"job:", "needs the job's name"},  {"", "no endpoint given"},
        {",", "no endpoint given"},        {"tcp:a:1,garbage", "unknown endpoint \"garbage\""},
        {"tcp:a:1,tcp:::1:7", "brackets"}, {"tcp:a:1,tcp:b", "has no port"}};
    for (const auto &[text, words] : bad) {
        auto r = parseAttachTarget(text);
        QVERIFY2(!r.ok(), text);
        QVERIFY2(r.error().find(words) != std::string::npos, r.error().c_str());
    }
    auto reached = checkReachable("unix:/nonexistent-dir/nobody.sock");
    QVERIFY(!reached.ok());
    QVERIFY2(reached.error().find("cannot connect to unix:/nonexistent-dir/nobody.sock: No such "
                                  "file or directory; is the engine running?") != std::string::npos,
             reached.error().c_str());
}

void TestSnapshot::endpointsParseAndFormat()
{
    auto u = parseEndpoint("unix:/run/user/1/shardscope/7.sock");
    QVERIFY(u.ok());
    QCOMPARE(u->kind, Endpoint::Kind::Unix);
    QCOMPARE(u->path, std::string("/run/user/1/shardscope/7.sock"));
    auto t = parseEndpoint("tcp:127.0.0.1:0");
    QVERIFY(t.ok());
    QCOMPARE(t->host, std::string("127.0.0.1"));
    QCOMPARE(t->port, std::uint16_t(0));
    auto v6 = parseEndpoint("tcp:[::1]:7000");
    QVERIFY(v6.ok());
    QCOMPARE(v6->host, std::string("::1"));
    QCOMPARE(formatEndpoint(*v6), std::string("tcp:[::1]:7000"));
    QCOMPARE(formatEndpoint(*t), std::string("tcp:127.0.0.1:0"));
    for (const char *bad : {"", "tcp:", "tcp:host", "tcp:host:99999", "tcp::80",
                            "unix:", "http://x", "tcp:::1:80", "tcp:[::1]80", "tcp:h:-1"}) {
        auto r = parseEndpoint(bad);
        QVERIFY2(!r.ok(), bad);
        QVERIFY2(r.error().find("tcp:HOST:PORT") != std::string::npos ||
                     r.error().find("brackets") != std::string::npos,
                 r.error().c_str());
    }
    QVERIFY(isLoopbackHost("127.0.0.1"));
    QVERIFY(isLoopbackHost("127.5.4.3"));
    QVERIFY(isLoopbackHost("localhost"));
    QVERIFY(isLoopbackHost("::1"));
    QVERIFY(!isLoopbackHost("0.0.0.0"));
    QVERIFY(!isLoopbackHost("10.0.0.1"));
    QVERIFY(!isLoopbackHost("127.evil.com"));
}

void TestSnapshot::discoveryListsLiveEnginesAndIgnoresStaleOnes()
{
    QTemporaryDir dir;
    const std::string d = dir.path().toStdString();
    DiscoveryEntry live;
    live.pid = ::getpid();
    live.endpoint = "tcp:127.0.0.1:4444";
    live.model = "tied";
    live.worldSize = 2;
    live.backend = "cpu";
    live.startUnixMs = 1764470000000ull;
    live.tokenRequired = true;
    QVERIFY(writeFileAtomically(discoveryFilePath(d, live.pid), encodeDiscovery(live)).ok());
    DiscoveryEntry stale = live;
    stale.pid = 0x7FFFFFF0; // no such process
    QVERIFY(writeFileAtomically(discoveryFilePath(d, stale.pid), encodeDiscovery(stale)).ok());
    writeRaw(d + "/999.json", "not json at all");
    writeRaw(d + "/notes.txt", "ignored");

    const auto engines = listLiveEngines(d);
    QCOMPARE(engines.size(), std::size_t(1));
    QCOMPARE(engines[0].pid, live.pid);
    QCOMPARE(engines[0].endpoint, live.endpoint);
    QCOMPARE(engines[0].model, std::string("tied"));
    QCOMPARE(engines[0].worldSize, 2);
    QCOMPARE(engines[0].backend, std::string("cpu"));
    QCOMPARE(engines[0].startUnixMs, live.startUnixMs);
    QVERIFY(engines[0].tokenRequired);
    QCOMPARE(engines[0].file, discoveryFilePath(d, live.pid));
    QVERIFY(listLiveEngines(d + "/absent").empty());
    QVERIFY(!processAlive(0x7FFFFFF0));
    QVERIFY(processAlive(::getpid()));
}

// Issue #14, defect 6: a directory another user created first (or can write to) with a
// planted entry was listed, and a FIFO named like an entry hung the listing.
void TestSnapshot::discoveryTrustsOnlyAPrivateDirectoryAndRegularFiles()
{
    QTemporaryDir dir;
    const std::string d = dir.path().toStdString();
    DiscoveryEntry live;
    live.pid = ::getpid();
    live.endpoint = "unix:/nonexistent.sock";
    live.backend = "cpu";
    QVERIFY(writeFileAtomically(discoveryFilePath(d, live.pid), encodeDiscovery(live)).ok());
    QCOMPARE(::mkfifo((d + "/1.json").c_str(), 0600), 0); // pid 1 is alive: would be read
    QCOMPARE(::symlink(discoveryFilePath(d, live.pid).c_str(), (d + "/2.json").c_str()), 0);
    const auto engines = listLiveEngines(d); // returns although nobody writes to the FIFO
    QCOMPARE(engines.size(), std::size_t(1));
    QCOMPARE(engines[0].pid, live.pid);

    QCOMPARE(::chmod(d.c_str(), 0777), 0); // anyone could have planted entries
    QVERIFY(listLiveEngines(d).empty());
    QCOMPARE(::chmod(d.c_str(), 0700), 0);
    QCOMPARE(listLiveEngines(d).size(), std::size_t(1));
    QCOMPARE(::chmod(discoveryFilePath(d, live.pid).c_str(), 0666), 0);
    QVERIFY(listLiveEngines(d).empty()); // an entry others may rewrite
    QCOMPARE(::chmod(discoveryFilePath(d, live.pid).c_str(), 0644), 0);
    if (::getuid() == 0) { // only root can give a file to another user
        QCOMPARE(::chown(discoveryFilePath(d, live.pid).c_str(), 65534, 65534), 0);
        QVERIFY(listLiveEngines(d).empty());
        QCOMPARE(::chown(discoveryFilePath(d, live.pid).c_str(), 0, 0), 0);
        QCOMPARE(::chown(d.c_str(), 65534, 65534), 0);
        QVERIFY(listLiveEngines(d).empty());
        QCOMPARE(::chown(d.c_str(), 0, 0), 0);
    }
}

// Issue #14, defect 1: a parameter listing `embed` 10^6 times (8 MB) froze the GUI.
// A module is registered on a parameter once at most, so repeats are read as one entry.
void TestSnapshot::repeatedRegistrationsAreReadOnce()
{
    std::string text = encodeSnapshot(test::sampleSnapshot());
    const std::string ext = "\"external_modules\":[\"lm_head\",\"conv\"]";
    const std::string autoExt = "\"external_auto_modules\":[\"lm_head\"]";
    const std::string active = "\"active_modules\":[\"embed\",\"lm_head\"]";
    QVERIFY(text.find(ext) != std::string::npos);
    QVERIFY(text.find(autoExt) != std::string::npos);
    QVERIFY(text.find(active) != std::string::npos);
    auto repeated = [](std::string_view key, const std::string &path, std::size_t n) {
        std::string out = "\"" + std::string(key) + "\":[";
        out.reserve(out.size() + n * (path.size() + 3));
        for (std::size_t i = 0; i < n; ++i)
            out += (i ? ",\"" : "\"") + path + "\"";
        return out + "]";
    };
    text.replace(text.find(ext), ext.size(), repeated("external_modules", "embed", 1'000'000));
    text.replace(text.find(autoExt), autoExt.size(),
                 repeated("external_auto_modules", "embed", 1'000'000));
    text.replace(text.find(active), active.size(), repeated("active_modules", "lm_head", 500'000));
    QVERIFY(text.size() > 8'000'000);

    const auto snap = decodeSnapshot(text);
    QVERIFY2(snap.ok(), snap.ok() ? "" : snap.error().c_str());
    const state::ParamRecord &p = snap->state.params[0];
    QCOMPARE(p.externals.size(), std::size_t(1));
    QCOMPARE(p.externals[0].module, ModuleId(1)); // embed
    QVERIFY(p.externals[0].automatic);
    QCOMPARE(p.activeModules, std::vector<ModuleId>{2});
}

// Issue #14, defect 4: decodeParam compared every registration with every automatic one
// (300k distinct entries took 34 s). The registrations of a 300k-module model on one
// parameter must decode completely; CTest's timeout is the watchdog, nothing is timed.
void TestSnapshot::longRegistrationListsDecodeInLinearTime()
{
    constexpr std::uint32_t kModules = 300'000;
    Snapshot s = test::sampleSnapshot();
    s.state.violations.clear();
    s.state.modules.resize(1);
    s.state.modules.reserve(kModules);
    for (std::uint32_t i = 1; i < kModules; ++i)
        s.state.modules.push_back({i, "m" + std::to_string(i), "Linear", 0});
    state::ParamRecord &p = s.state.params[0];
    p.owner = 1;
    p.externals.clear();
    p.activeModules.clear();
    for (std::uint32_t i = 1; i < kModules; ++i) {
        p.externals.push_back({i, i % 2 == 0});
        p.activeModules.push_back(i);
    }
    s.state.params.resize(1);
    const auto back = decodeSnapshot(encodeSnapshot(s));
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
    const state::ParamRecord &q = back->state.params[0];
    QCOMPARE(q.externals.size(), std::size_t(kModules - 1));
    for (std::uint32_t i = 1; i < kModules; ++i) {
        QCOMPARE(q.externals[i - 1].module, i);
        QCOMPARE(q.externals[i - 1].automatic, i % 2 == 0);
    }
    QCOMPARE(q.activeModules.size(), std::size_t(kModules - 1));
}

QTEST_APPLESS_MAIN(TestSnapshot)
#include "tst_snapshot.moc"

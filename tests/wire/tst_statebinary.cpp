// The binary State (docs/protocol.md, "StateBinary"): it carries exactly what the JSON State
// carries, for a synthetic snapshot that uses every field and for a real engine caught in
// the middle of a step, and it refuses truncated and corrupt payloads with a clear reason.

#include <QtTest>

#include <barrier>
#include <cstring>
#include <random>

#include "base/names.h"
#include "client/clientstate.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "samplesnapshot.h"
#include "snapshotcompare.h"
#include "wire/statebinary.h"

using namespace shardscope;
using namespace shardscope::wire;

namespace {

// A payload with one field overwritten at a byte offset.
template <class T> std::string patched(std::string bytes, std::size_t offset, T value)
{
    std::memcpy(bytes.data() + offset, &value, sizeof value);
    return bytes;
}

template <class T> T readAt(const std::string &bytes, std::size_t offset)
{
    T v;
    std::memcpy(&v, bytes.data() + offset, sizeof v);
    return v;
}

void expectError(const std::string &payload, const std::string &needle)
{
    auto r = decodeBinaryState(payload);
    QVERIFY2(!r.ok(), "a bad payload was accepted");
    QVERIFY2(r.error().find(needle) != std::string::npos, r.error().c_str());
    QVERIFY2(r.error().starts_with("not a valid binary State: "), r.error().c_str());
}

// The header's counts, at their documented offsets.
enum Count
{
    kStrings,
    kStringBytes,
    kWorld,
    kLocalRanks,
    kModules,
    kParams,
    kDims,
    kExternals,
    kActive,
    kViolations,
    kEvents
};
std::size_t countOffset(Count c)
{
    return 8 + 4 * static_cast<std::size_t>(c);
}

// Where each part starts, from the header's counts (docs/protocol.md, "StateBinary").
struct Offsets
{
    std::size_t strings, stringBytes, localRanks, modules, params;
    std::size_t paramDtype, paramFlags, statusRows, extModules, activeModules;
};
Offsets offsetsOf(const std::string &p)
{
    auto n = [&](Count c) { return std::size_t(readAt<std::uint32_t>(p, countOffset(c))); };
    Offsets o{};
    o.strings = 128;
    o.stringBytes = o.strings + 4 * n(kStrings);
    o.localRanks = o.stringBytes + n(kStringBytes);
    o.modules = o.localRanks + 4 * n(kLocalRanks);
    o.params = o.modules + 12 * n(kModules);
    const std::size_t P = n(kParams);
    o.paramDtype = o.params + 12 * P;
    o.paramFlags = o.paramDtype + P;
    o.statusRows = o.paramFlags + 2 * P + 24 * P + 8 * n(kDims);
    o.extModules = o.statusRows + P * ((n(kWorld) + 3) / 4) + 4 * P;
    o.activeModules = o.extModules + 5 * n(kExternals) + 4 * P;
    return o;
}

// A model with a tied embedding read by lm_head (guard `auto`: registered automatically and
// recorded), a manual registration, a weight_norm-style late parameter, and persistent ones.
struct LiveEngine
{
    std::unique_ptr<core::Engine> engine;
    ModuleId embed = 0, block = 0, lmHead = 0, conv = 0;
    ParamId embedW = 0, blockW = 0, headB = 0, convW = 0, convG = 0;

    explicit LiveEngine(int world)
    {
        core::EngineConfig cfg;
        cfg.worldSize = world;
        cfg.persistenceThreshold = 8;
        cfg.guard = GuardPolicy::Auto;
        cfg.modelName = "tied \xC3\xA9";
        engine = std::make_unique<core::Engine>(cfg, comm::makeCpuWorld(world));
        core::Engine &e = *engine;
        embed = e.addModule(e.root(), "embed", "Embedding");
        block = e.addModule(e.root(), "block", "Linear");
        lmHead = e.addModule(e.root(), "lm_head", "Linear");
        conv = e.addModule(e.root(), "pos_conv", "Conv1d");
        std::vector<float> init(64, 0.5f);
        embedW = e.addParameter(embed, "weight", {6, 5}, DType::F32, init.data());
        blockW = e.addParameter(block, "weight", {5, 5}, DType::BF16, nullptr);
        headB = e.addParameter(lmHead, "bias", {6}, DType::F32, init.data());
        convW = e.addParameter(conv, "weight", {4, 2, 3}, DType::F32, init.data());
        e.partition();
        e.registerExternalParameter(block, embedW);
        convG = e.addParameter(conv, "weight_g", {1, 1, 3}, DType::F32, init.data());
        e.addParameter(conv, "weight_v", {4, 2, 3}, DType::F32, init.data());
        e.removeParameter(convW);
    }

    // One full step, then a second one in which every rank is inside `lm_head` (so parameters
    // are AVAILABLE and have active modules) when fn runs on rank 0.
    template <class F> void midStep(F fn)
    {
        core::Engine &e = *engine;
        std::barrier sync(static_cast<std::ptrdiff_t>(e.worldSize()));
        e.forEachLocalRank([&](int r) {
            for (int step = 0; step < 2; ++step) {
                e.beginStep(r);
                {
                    core::ModuleScope s(e, r, embed, Phase::Forward);
                    (void)e.access(r, embedW);
                }
                {
                    core::ModuleScope b(e, r, block, Phase::Forward);
                    (void)e.access(r, embedW); // registered on block
                    (void)e.access(r, blockW);
                }
                {
                    core::ModuleScope h(e, r, lmHead, Phase::Forward);
                    (void)e.access(r, embedW); // unregistered on lm_head: auto-registered
                    (void)e.access(r, headB);
                    if (step == 1) {
                        sync.arrive_and_wait();
                        if (r == 0) fn();
                        sync.arrive_and_wait();
                    }
                }
                e.endStep(r, 0.5);
            }
        });
    }
};

} // namespace

class TestStateBinary : public QObject
{
    Q_OBJECT
  private slots:
    void everyFieldOfTheSampleRoundTrips();
    void everyViolationKindTravels();
    void binaryAndJsonDecodeAliveEngineAlike();
    void invalidUtf8IsReplacedAsInTheJson();
    void statesOfEitherTypeReachTheClientState();
    void everyTruncationIsACleanError();
    void corruptFieldsAreNamed();
    void unitsTravelInLayout3AndLayout2StillDecodes();
    void severityTravelsInLayout4AndLayout3StillDecodes();
    void locationsTravelInLayout2AndLayout1StillDecodes();
    void referencesCannotMultiplyTheMemory();
    void randomDamageNeverCrashes();
    void theEnginesColumnsAreWhatItsQueriesSay();
    void columnsAreRefilledInPlace();
    void anEngineBeforePartitionHoldsEverything();
    void columnsAndStatesConvertWithoutLoss();
    void columnsThatDisagreeAreRefused();
};

// Every violation kind names.h lists decodes from the binary State as from the JSON one
// (the binary decoder once stopped at kind 4: a State with backward_unfinished or shard_order
// was refused by every C++ client while the JSON State of the same run was read).
void TestStateBinary::everyViolationKindTravels()
{
    Snapshot s = test::sampleSnapshot();
    const state::ViolationRecord first = s.state.violations[0];
    s.state.violations.clear();
    const state::CollectiveDetail collective =
        test::sampleSnapshot().state.violations[6].collective;
    for (std::size_t k = 0; k < kViolationKindNames.size(); ++k) {
        state::ViolationRecord v = first;
        v.kind = static_cast<ViolationKind>(k);
        v.location.line = std::uint32_t(100 + k); // one row each
        if (v.kind == ViolationKind::CollectiveMismatch || v.kind == ViolationKind::RankStalled) {
            v.collective = collective;
            v.collective.seq += k;
        }
        s.state.violations.push_back(v);
    }
    auto binary = decodeBinaryState(encodeBinaryState(s));
    QVERIFY2(binary.ok(), binary.ok() ? "" : binary.error().c_str());
    auto json = decodeSnapshot(encodeSnapshot(s));
    QVERIFY2(json.ok(), json.ok() ? "" : json.error().c_str());
    QCOMPARE(binary->state.violations.size(), kViolationKindNames.size());
    QCOMPARE(json->state.violations.size(), kViolationKindNames.size());
    for (std::size_t k = 0; k < kViolationKindNames.size(); ++k) {
        QCOMPARE(binary->state.violations[k].kind, static_cast<ViolationKind>(k));
        QCOMPARE(json->state.violations[k].kind, static_cast<ViolationKind>(k));
        QCOMPARE(binary->state.violations[k].collective, s.state.violations[k].collective);
        QCOMPARE(json->state.violations[k].collective, s.state.violations[k].collective);
    }
    QCOMPARE(binary->state.violations[std::size_t(ViolationKind::RankStalled)].collective.seq,
             std::uint64_t(57 + 11));
}

void TestStateBinary::everyFieldOfTheSampleRoundTrips()
{
    Snapshot s = test::sampleSnapshot();
    s.state.params[1].replaces = "conv.weight";
    s.state.fixDialect = "deepspeed";
    s.state.worldSize = 5; // a status row with unused bits
    for (state::ParamRecord &p : s.state.params)
        p.status = {ParamStatus::Available, ParamStatus::Inflight, ParamStatus::NotAvailable,
                    ParamStatus::Available, ParamStatus::Inflight};
    const std::string bytes = encodeBinaryState(s);
    QCOMPARE(readAt<std::uint32_t>(bytes, 0), kBinaryStateMagic);
    QCOMPARE(std::string(bytes.data(), 4), std::string("SSTB"));
    auto back = decodeBinaryState(bytes);
    QVERIFY2(back.ok(), back.error().c_str());
    test::compareSnapshots(*back, s);
    // The violation of the removed parameter keeps its name; the one with none has none.
    QCOMPARE(back->state.violations[1].paramName, std::string("conv.weight"));
    QCOMPARE(back->state.violations[2].paramName, std::string());

    Snapshot empty;
    auto e = decodeBinaryState(encodeBinaryState(empty));
    QVERIFY2(e.ok(), e.error().c_str());
    test::compareSnapshots(*e, empty);
}

void TestStateBinary::binaryAndJsonDecodeAliveEngineAlike()
{
    LiveEngine live(4);
    Snapshot snap;
    live.midStep([&] { snap.state = live.engine->state(); });
    snap.meta.producer = "tst_statebinary";
    snap.meta.pid = 31337;
    snap.meta.createdUnixMs = unixTimeMs();
    snap.meta.endpoint = "tcp:127.0.0.1:4000";
    snap.droppedEvents = 3;
    const state::EngineState &st = snap.state;
    // What the comparison below must cover, or it proves little.
    bool available = false, active = false, automatic = false, manual = false, replaces = false;
    for (const state::ParamRecord &p : st.params) {
        available =
            available || std::count(p.status.begin(), p.status.end(), ParamStatus::Available) > 0;
        active = active || !p.activeModules.empty();
        for (const state::ExternalRecord &x : p.externals)
            (x.automatic ? automatic : manual) = true;
        replaces = replaces || !p.replaces.empty();
    }
    QVERIFY(available);
    QVERIFY(active);
    QVERIFY(automatic);
    QVERIFY(manual);
    QVERIFY(replaces);
    QVERIFY(st.violations.size() >= 4 + 2); // an access per rank, two late parameters
    QVERIFY(st.step == 2);

    const std::string json = encodeSnapshot(snap);
    const std::string binary = encodeBinaryState(snap);
    auto fromJson = decodeSnapshot(json);
    auto fromBinary = decodeBinaryState(binary);
    QVERIFY2(fromJson.ok(), fromJson.error().c_str());
    QVERIFY2(fromBinary.ok(), fromBinary.error().c_str());
    test::compareSnapshots(*fromBinary, *fromJson);
    if (QTest::currentTestFailed()) return;
    test::compareSnapshots(*fromBinary, snap);
}

void TestStateBinary::invalidUtf8IsReplacedAsInTheJson()
{
    Snapshot s = test::sampleSnapshot();
    s.events.clear();
    s.state.params[0].name = "embed.\xFF"
                             "weight\xC3";
    s.state.modules[2].type = "Lin\x80"
                              "ear";
    s.state.violations[0].message = "bad \xE2\x82 tail";
    auto fromJson = decodeSnapshot(encodeSnapshot(s));
    auto fromBinary = decodeBinaryState(encodeBinaryState(s));
    QVERIFY2(fromJson.ok(), fromJson.error().c_str());
    QVERIFY2(fromBinary.ok(), fromBinary.error().c_str());
    QCOMPARE(fromBinary->state.params[0].name, std::string("embed.\xEF\xBF\xBD"
                                                           "weight\xEF\xBF\xBD"));
    test::compareSnapshots(*fromBinary, *fromJson);
}

void TestStateBinary::statesOfEitherTypeReachTheClientState()
{
    Snapshot s = test::sampleSnapshot();
    s.events.clear();
    client::ClientState a, b;
    QVERIFY(a.apply(Frame{MessageType::State, encodeSnapshot(s)}).ok());
    QVERIFY(b.apply(Frame{MessageType::StateBinary, encodeBinaryState(s)}).ok());
    test::compareSnapshots(a.snapshot(), b.snapshot());
    QCOMPARE(b.stateCount(), std::uint64_t(1));
    // A binary payload in a JSON State frame, and the reverse, are errors that say so.
    auto crossed = b.apply(Frame{MessageType::State, encodeBinaryState(s)});
    QVERIFY(!crossed.ok());
    QVERIFY2(crossed.error().starts_with("bad state from the engine: "), crossed.error().c_str());
    auto reversed = decodeStateFrame(Frame{MessageType::StateBinary, encodeSnapshot(s)});
    QVERIFY(!reversed.ok());
    QVERIFY2(reversed.error().find("does not start with \"SSTB\"") != std::string::npos,
             reversed.error().c_str());
    auto other = decodeStateFrame(Frame{MessageType::EventBatch, {}});
    QVERIFY(!other.ok());
    QCOMPARE(other.error(), std::string("a event_batch frame is not a state"));
    QCOMPARE(b.stateCount(), std::uint64_t(1)); // the failed ones changed nothing
    QCOMPARE(b.snapshot().state.modelName, s.state.modelName);
}

void TestStateBinary::everyTruncationIsACleanError()
{
    const std::string bytes = encodeBinaryState(test::sampleSnapshot());
    for (std::size_t n = 0; n < bytes.size(); ++n) {
        auto r = decodeBinaryState(std::string_view(bytes).substr(0, n));
        QVERIFY2(!r.ok(),
                 qPrintable(QStringLiteral("accepted %1 of %2 bytes").arg(n).arg(bytes.size())));
        const bool clear =
            r.error().find(n < 128 ? "shorter than the 128-byte header"
                                   : "it was truncated or corrupted") != std::string::npos;
        QVERIFY2(clear, r.error().c_str());
    }
    expectError(bytes + std::string(1, '\0'), "it was truncated or corrupted");
}

void TestStateBinary::corruptFieldsAreNamed()
{
    Snapshot s = test::sampleSnapshot();
    s.events.resize(2);
    const std::string good = encodeBinaryState(s);
    QVERIFY(decodeBinaryState(good).ok());
    const Offsets o = offsetsOf(good);

    expectError(patched(good, 0, std::uint32_t(0x42545354)), "does not start with \"SSTB\"");
    expectError(patched(good, 4, std::uint16_t(6)),
                "layout 6 is not supported; this build reads layouts 1 to 5");
    expectError(patched(good, 6, std::uint16_t(1)), "reserved bytes 6-7 are not 0");
    expectError(patched(good, countOffset(kWorld), std::uint32_t(0)),
                "world_size: 0 is outside 1 to 65536");
    expectError(patched(good, countOffset(kWorld), std::uint32_t(65537)), "outside 1 to 65536");
    // A count that claims more than was sent.
    expectError(patched(good, countOffset(kParams), std::uint32_t(0xFFFFFFFF)),
                "it was truncated or corrupted");
    expectError(patched(good, 104, std::uint8_t(3)), "header.guard: value 3 is outside 0 to 2");
    expectError(patched(good, 108, std::uint32_t(999)),
                "header.producer: string 999 is not in the table");
    // The first string's length made longer than the bytes.
    expectError(patched(good, o.strings, std::uint32_t(1u << 30)), "runs past the string bytes");
    {
        std::string bad = good; // an invalid UTF-8 byte inside a string
        bad[o.stringBytes + 1] = static_cast<char>(0xFF);
        expectError(bad, "is not valid UTF-8");
    }
    expectError(patched(good, o.localRanks, std::uint32_t(2)), "local_ranks[0]: 2 is not a rank");
    // Module 1's parent: itself.
    expectError(patched(good,
                        o.modules + 8 * readAt<std::uint32_t>(good, countOffset(kModules)) + 4,
                        std::uint32_t(1)),
                "modules[1].parent: a parent must come before its children");
    expectError(patched(good, o.params, std::uint32_t(0xFFFFFFFF)), "params[0].id: 4294967295");
    expectError(patched(good, o.paramDtype, std::uint8_t(2)), "params[0].dtype: value 2");
    expectError(patched(good, o.paramFlags, std::uint8_t(8)), "params[0].flags: unknown bits");
    // Rank 1 of parameter 0 with the status code 3.
    expectError(patched(good, o.statusRows, std::uint8_t(0x0E)),
                "params[0].status: rank 1 has status code 3");
    expectError(patched(good, o.statusRows, std::uint8_t(0x16)),
                "params[0].status: the unused bits after rank 1 are not zero");
    expectError(patched(good, o.extModules, std::uint32_t(4)),
                "params[0].external_modules[0]: module id 4 does not exist");
    expectError(patched(good, o.extModules, std::uint32_t(3)),
                "params[0].external_modules[1]: module 3 is listed twice");
    expectError(patched(good, o.activeModules + 4, std::uint32_t(1)), "module 1 is listed twice");
    // The last event's type.
    expectError(patched(good, good.size() - 48 + 14, std::uint8_t(200)),
                "events[1]: unknown event type 200");
    // Layout 5's collective column comes last before the events, a string a violation; before
    // it layout 4's severity and read columns, a byte each per violation; before them layout
    // 3's unit and placement columns: 12 bytes a module, 4 a parameter.
    const std::size_t M = s.state.modules.size(), P = s.state.params.size();
    const std::size_t collectives = good.size() - 2 * 48 - 4 * s.state.violations.size();
    const std::size_t severities = collectives - 2 * s.state.violations.size();
    {
        // Violation 6's collective pointed at a string that is no collective (the producer's
        // name), and violation 0's (none) at a bad index.
        const std::size_t last = collectives + 4 * 6;
        const auto producer = readAt<std::uint32_t>(good, 108);
        expectError(patched(good, last, producer),
                    "violations[6].collective: not a valid collective");
        expectError(patched(good, collectives, std::uint32_t(0xFFFFFFF0)),
                    "violations[0].collective: string 4294967280 is not in the table");
    }
    const std::size_t units = severities - 12 * M - 4 * P;
    expectError(patched(good, severities, std::uint8_t(3)), "violations[0].severity: value 3");
    expectError(patched(good, severities + s.state.violations.size(), std::uint8_t(2)),
                "violations[0].read: value 2");
    // The violations' counts: the first kind byte is right after the parameters' columns.
    const std::size_t violations = units - (55 + 20) * s.state.violations.size();
    const auto kinds = std::uint8_t(kViolationKindNames.size());
    expectError(patched(good, violations, kinds), "violations[0].kind: value " +
                                                      std::to_string(kinds) + " is outside 0 to " +
                                                      std::to_string(kinds - 1));
    // Layout 2's location columns follow the messages: file, line, function, chain, building.
    const std::size_t V = s.state.violations.size();
    const std::size_t file = units - 20 * V;
    expectError(patched(good, file, std::uint32_t(0xFFFFFFF0)),
                "violations[0].location.file: string 4294967280 is not in the table");
    // Violation 1 has no location: a line without a file is refused.
    expectError(patched(good, file + 4 * V + 4, std::uint32_t(7)),
                "violations[1].location: a line or function without a file");
    // Units: embed (module 1) in the group of a module that does not exist, then in lm_head's
    // (module 2), which heads none; a mesh on a module that is not a unit; a unit without its
    // settings; an empty placements string.
    const std::size_t group = units, mesh = units + 8 * M, placements = units + 12 * M;
    expectError(patched(good, group + 4, std::uint32_t(9)),
                "modules[1].unit_group_id: module id 9 does not exist (4 modules)");
    expectError(patched(good, group + 4, std::uint32_t(2)),
                "modules[1].unit_group_id: module 2 does not head an FSDP unit group of its own");
    expectError(patched(good, mesh + 12, readAt<std::uint32_t>(good, mesh)),
                "modules[3].fsdp_unit: reshard_after_forward and mesh are set on a module that is "
                "not an FSDP unit");
    expectError(patched(good, group + 12, std::uint32_t(1)),
                "modules[3].reshard_after_forward: string 4294967295 is not in the table");
    {
        // Parameter 0's placements pointed at an empty string: the root's path.
        expectError(patched(good, placements, readAt<std::uint32_t>(good, o.modules)),
                    "params[0].placements: is empty");
    }
}

void TestStateBinary::unitsTravelInLayout3AndLayout2StillDecodes()
{
    const Snapshot s = test::sampleSnapshot();
    const auto three = decodeBinaryState(encodeBinaryState(s, 3));
    QVERIFY2(three.ok(), three.error().c_str());
    QCOMPARE(readAt<std::uint16_t>(encodeBinaryState(s, 3), 4), std::uint16_t(3));
    Snapshot withoutReads = s; // layout 3 cannot say a read touched attributes only
    withoutReads.state.violations[4].read = ViolationRead::Values;
    withoutReads.state.violations[4].severity = Severity::Cost;
    withoutReads.state.violations[6].collective = {}; // nor a collective (layout 5)
    test::compareSnapshots(*three, withoutReads);
    QCOMPARE(three->state.modules[2].unitGroup, ModuleId(1));
    QCOMPARE(three->state.params[0].placements, std::string("(Replicate(), Shard(0))"));
    // A client that listed "state_binary_2" but not "state_binary_3" gets layout 2: the same
    // state without units and placements, everything else as before.
    const std::string twoBytes = encodeBinaryState(s, 2);
    QCOMPARE(readAt<std::uint16_t>(twoBytes, 4), std::uint16_t(2));
    const auto two = decodeBinaryState(twoBytes);
    QVERIFY2(two.ok(), two.error().c_str());
    for (const state::ModuleRecord &m : two->state.modules) {
        QVERIFY(!m.fsdpUnit());
        QVERIFY(m.mesh.empty() && m.reshardAfterForward.empty());
    }
    QVERIFY(two->state.params[0].placements.empty());
    QCOMPARE(two->state.violations[0].location, s.state.violations[0].location);
    // Which layout a Hello's capabilities ask for.
    QCOMPARE(binaryLayoutOf({"state", "events"}), std::uint16_t(0));
    QCOMPARE(binaryLayoutOf({"state_binary"}), std::uint16_t(1));
    QCOMPARE(binaryLayoutOf({"state_binary", "state_binary_2"}), std::uint16_t(2));
    QCOMPARE(binaryLayoutOf({"state_binary_3", "state_binary", "state_binary_2"}),
             std::uint16_t(3));
    QCOMPARE(binaryLayoutOf({"state_binary_3"}), std::uint16_t(0)); // no "state_binary": JSON
    QCOMPARE(binaryLayoutOf({"state_binary", "state_binary_2", "state_binary_3", "state_binary_4"}),
             std::uint16_t(4));
    QCOMPARE(binaryLayoutOf({"state_binary", "state_binary_2", "state_binary_3", "state_binary_4",
                             "state_binary_5"}),
             std::uint16_t(5));
    QCOMPARE(binaryLayoutOf(Hello{}.capabilities), kBinaryStateLayout);
}

// Layout 4 carries each violation's severity and read; a client that did not list
// "state_binary_4" gets layout 3, from which a reader gives each the one rule's severity
// (the attribute read, which layout 3 cannot say, reads as a read of the values).
void TestStateBinary::severityTravelsInLayout4AndLayout3StillDecodes()
{
    const Snapshot s = test::sampleSnapshot();
    const std::string fourBytes = encodeBinaryState(s, 4);
    QCOMPARE(readAt<std::uint16_t>(fourBytes, 4), std::uint16_t(4));
    auto four = decodeBinaryState(fourBytes);
    QVERIFY2(four.ok(), four.error().c_str());
    QCOMPARE(four->state.violations[4].read, ViolationRead::Attribute);
    QCOMPARE(four->state.violations[4].severity, Severity::Info);
    QCOMPARE(four->state.violations[1].severity, Severity::Error);
    QCOMPARE(four->state.violations[0].severity, Severity::Cost);
    // Against the JSON of the same state, field by field.
    // Layout 4 has no collective: the rest of the mismatch travels, its detail does not.
    QCOMPARE(four->state.violations[6].kind, ViolationKind::CollectiveMismatch);
    QVERIFY(four->state.violations[6].collective.empty());
    four->state.violations[6].collective = s.state.violations[6].collective;
    const auto json = decodeSnapshot(encodeSnapshot(s));
    QVERIFY2(json.ok(), json.error().c_str());
    test::compareSnapshots(*four, *json);

    const auto three = decodeBinaryState(encodeBinaryState(s, 3));
    QVERIFY2(three.ok(), three.error().c_str());
    QCOMPARE(three->state.violations.size(), s.state.violations.size());
    for (std::size_t i = 0; i < 4; ++i)
        QCOMPARE(three->state.violations[i].severity, s.state.violations[i].severity);
    QCOMPARE(three->state.violations[4].read, ViolationRead::Values);
    QCOMPARE(three->state.violations[4].severity, Severity::Cost); // auto_registered values read
}

void TestStateBinary::locationsTravelInLayout2AndLayout1StillDecodes()
{
    const Snapshot s = test::sampleSnapshot();
    const auto two = decodeBinaryState(encodeBinaryState(s));
    QVERIFY2(two.ok(), two.error().c_str());
    QCOMPARE(two->state.violations[0].location, s.state.violations[0].location);
    QCOMPARE(two->state.violations[0].building, s.state.violations[0].building);
    QVERIFY(!two->state.violations[1].location.known());
    // What a server sends a client of an earlier release (only "state_binary"): layout 1,
    // without the locations, which that client reads as before.
    const std::string oneBytes = encodeBinaryState(s, kBinaryStateOldestLayout);
    QCOMPARE(readAt<std::uint16_t>(oneBytes, 4), std::uint16_t(1));
    // 20 bytes of columns per violation, and the location's strings, fewer.
    QVERIFY(oneBytes.size() + 20 * s.state.violations.size() < encodeBinaryState(s).size());
    const auto one = decodeBinaryState(oneBytes);
    QVERIFY2(one.ok(), one.error().c_str());
    QVERIFY(!one->state.violations[0].location.known());
    QCOMPARE(one->state.violations[0].fix, s.state.violations[0].fix);
}

void TestStateBinary::referencesCannotMultiplyTheMemory()
{
    // 4096 modules of one type of 64 KiB: the table holds it once (a 300 KB payload), the
    // records would copy it 4096 times (256 MiB). Refused; the same with a sane name is fine.
    Snapshot s;
    s.state.modules.push_back({0, "", std::string(64 << 10, 'T'), kNoModule});
    for (ModuleId i = 1; i < 4096; ++i)
        s.state.modules.push_back({i, "m" + std::to_string(i), s.state.modules[0].type, 0});
    const std::string bytes = encodeBinaryState(s);
    QVERIFY(bytes.size() < (1u << 20));
    expectError(bytes, "add up to more than 16 times the payload's size");
    for (state::ModuleRecord &m : s.state.modules)
        m.type = "Linear";
    QVERIFY(decodeBinaryState(encodeBinaryState(s)).ok());
}

void TestStateBinary::randomDamageNeverCrashes()
{
    Snapshot s = test::sampleSnapshot();
    const std::string good = encodeBinaryState(s);
    std::mt19937_64 rng(16);
    int rejected = 0, accepted = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string bad = good;
        for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k)
            bad[rng() % bad.size()] = static_cast<char>(rng());
        auto r = decodeBinaryState(bad);
        if (r.ok()) {
            ++accepted;
            // What is accepted is a state: it encodes again, and from then on decodes to itself
            // (the first pass may name a violation's parameter after the listed one).
            auto again = decodeBinaryState(encodeBinaryState(*r));
            QVERIFY2(again.ok(), again.error().c_str());
            auto third = decodeBinaryState(encodeBinaryState(*again));
            QVERIFY2(third.ok(), third.error().c_str());
            test::compareSnapshots(*third, *again);
            if (QTest::currentTestFailed()) return;
        } else {
            ++rejected;
        }
    }
    qInfo("%d damaged payloads rejected, %d accepted (changed counters and times)", rejected,
          accepted);
    QVERIFY(rejected > 5000);
}

// The columns the server encodes (Engine::stateColumns) against the engine's own per-parameter
// queries, taken at the same moment in the middle of a step: every rank's status, the
// modules using each parameter and the externals; and they write the very bytes that
// encoding Engine::state() writes.
void TestStateBinary::theEnginesColumnsAreWhatItsQueriesSay()
{
    for (int world : {4, 5}) {
        LiveEngine live(world);
        core::Engine &e = *live.engine;
        state::StateColumns columns;
        Snapshot snap;
        struct Expected
        {
            ParamId id;
            std::string name;
            std::vector<ParamStatus> status;
            std::vector<ModuleId> active, externals;
        };
        std::vector<Expected> expected;
        live.midStep([&] {
            e.stateColumns(columns);
            snap.state = e.state();
            for (ParamId p = 0; p < e.paramCount(); ++p) {
                std::string name;
                try {
                    name = e.param(p).name;
                } catch (const core::EngineError &) {
                    continue; // removed (pos_conv.weight)
                }
                Expected x{p, name, {}, {}, {}};
                for (int r = 0; r < world; ++r) {
                    x.status.push_back(e.status(r, p));
                    for (ModuleId m : e.activeModules(r, p))
                        if (std::find(x.active.begin(), x.active.end(), m) == x.active.end())
                            x.active.push_back(m);
                }
                for (ModuleId m = 0; m < e.moduleCount(); ++m)
                    for (int r = 0; r < world; ++r)
                        if (e.isExternal(r, m, p) &&
                            std::find(x.externals.begin(), x.externals.end(), m) ==
                                x.externals.end())
                            x.externals.push_back(m);
                expected.push_back(std::move(x));
            }
        });
        QVERIFY2(columns.checkConsistent().empty(), columns.checkConsistent().c_str());
        snap.meta.producer = "tst_statebinary";
        snap.meta.pid = 4242;
        snap.meta.endpoint = "unix:/tmp/x";
        snap.droppedEvents = 7;
        const std::string bytes = encodeBinaryState(columns, snap.meta, snap.droppedEvents);
        QVERIFY(bytes == encodeBinaryState(snap));

        auto back = decodeBinaryState(bytes);
        QVERIFY2(back.ok(), back.error().c_str());
        const state::EngineState &st = back->state;
        QCOMPARE(st.params.size(), expected.size());
        bool anyActive = false, anyExternal = false, anyAvailable = false;
        for (std::size_t i = 0; i < expected.size(); ++i) {
            const state::ParamRecord &p = st.params[i];
            QCOMPARE(p.id, expected[i].id);
            QCOMPARE(p.name, expected[i].name);
            QCOMPARE(p.status, expected[i].status);
            QCOMPARE(p.activeModules, expected[i].active);
            std::vector<ModuleId> ext;
            for (const state::ExternalRecord &x : p.externals)
                ext.push_back(x.module);
            std::sort(ext.begin(), ext.end());
            QCOMPARE(ext, expected[i].externals);
            anyActive = anyActive || !p.activeModules.empty();
            anyExternal = anyExternal || !p.externals.empty();
            anyAvailable = anyAvailable ||
                           std::count(p.status.begin(), p.status.end(), ParamStatus::Available) > 0;
        }
        QVERIFY(anyActive && anyExternal && anyAvailable);
        QCOMPARE(st.step, std::uint32_t(2));
        QCOMPARE(back->droppedEvents, std::uint64_t(7));
        QCOMPARE(back->meta.endpoint, std::string("unix:/tmp/x"));
        QVERIFY(st.violations.size() >= static_cast<std::size_t>(world) + 2);
    }
}

// A server refills one set of columns for every State: what a column held before, the
// interned module types included, must not leak into the next state.
void TestStateBinary::columnsAreRefilledInPlace()
{
    LiveEngine live(4);
    core::Engine &e = *live.engine;
    state::StateColumns reused;
    e.stateColumns(reused);
    const std::size_t before = reused.paramCount();
    const ModuleId extra = e.addModule(e.root(), "drop", "Dropout");
    e.addParameter(extra, "scale", {3}, DType::F32, nullptr);
    e.removeParameter(live.headB);
    e.removeParameter(live.blockW);
    // embed.weight's registrations move: off block, onto drop and then lm_head (a lower id,
    // registered later: a parameter's externals are listed by module id).
    e.unregisterExternalParameter(live.block, live.embedW);
    e.registerExternalParameter(extra, live.embedW);
    e.registerExternalParameter(live.lmHead, live.embedW);
    e.stateColumns(reused);
    QCOMPARE(reused.paramCount(), before - 1);
    state::StateColumns fresh;
    e.stateColumns(fresh);
    const SnapshotMeta meta{"tst_statebinary", 1, 2, "tcp:127.0.0.1:1"};
    QVERIFY(encodeBinaryState(reused, meta, 0) == encodeBinaryState(fresh, meta, 0));
    auto back = decodeBinaryState(encodeBinaryState(reused, meta, 0));
    QVERIFY2(back.ok(), back.error().c_str());
    QCOMPARE(back->state.modules.back().type, std::string("Dropout"));
    QCOMPARE(back->state.modules[live.lmHead].type, std::string("Linear"));
    QCOMPARE(back->state.params.back().name, std::string("drop.scale"));
    const state::ParamRecord &embed = back->state.params.front();
    QCOMPARE(embed.name, std::string("embed.weight"));
    QCOMPARE(embed.externals.size(), std::size_t(2));
    QCOMPARE(embed.externals[0].module, live.lmHead);
    QCOMPARE(embed.externals[1].module, extra);
    e.unregisterExternalParameter(live.lmHead, live.embedW);
    e.unregisterExternalParameter(extra, live.embedW);
    e.stateColumns(reused);
    QCOMPARE(reused.externalCount.front(), std::uint32_t(0));
    QVERIFY(reused.externalModule.empty());
}

// Before partition() every rank holds every parameter; a world of 5 leaves unused bits in
// each status row, which must stay zero for the row to decode.
void TestStateBinary::anEngineBeforePartitionHoldsEverything()
{
    core::EngineConfig cfg;
    cfg.worldSize = 5;
    core::Engine e(cfg, comm::makeCpuWorld(5));
    const ModuleId fc = e.addModule(e.root(), "fc", "Linear");
    e.addParameter(fc, "weight", {40, 40}, DType::F32, nullptr);
    e.addParameter(fc, "bias", {40}, DType::F32, nullptr);
    state::StateColumns c;
    e.stateColumns(c);
    QCOMPARE(c.statusRows, (std::vector<std::uint8_t>{0xAA, 0x02, 0xAA, 0x02}));
    e.partition();
    e.stateColumns(c);
    auto back = decodeBinaryState(encodeBinaryState(c, {}, 0));
    QVERIFY2(back.ok(), back.error().c_str());
    for (const state::ParamRecord &p : back->state.params)
        for (int r = 0; r < 5; ++r)
            QCOMPARE(p.status[static_cast<std::size_t>(r)], e.status(r, p.id));
}

void TestStateBinary::columnsAndStatesConvertWithoutLoss()
{
    Snapshot s = test::sampleSnapshot();
    s.state.worldSize = 5;
    s.state.params[0].name = "embed.\xFF"
                             "weight"; // raw bytes stay raw in the columns
    s.state.params[1].replaces = "conv.weight";
    for (state::ParamRecord &p : s.state.params)
        p.status = {ParamStatus::Inflight, ParamStatus::Available, ParamStatus::NotAvailable,
                    ParamStatus::Available, ParamStatus::Inflight};
    state::StateColumns c;
    state::columnsOf(s.state, c);
    QVERIFY2(c.checkConsistent().empty(), c.checkConsistent().c_str());
    test::compareStates(state::stateOf(c), s.state);
    // Into columns that held something else before.
    state::StateColumns other;
    state::columnsOf(test::sampleSnapshot().state, other);
    state::columnsOf(s.state, other);
    test::compareStates(state::stateOf(other), s.state);
}

void TestStateBinary::columnsThatDisagreeAreRefused()
{
    state::StateColumns c;
    state::columnsOf(test::sampleSnapshot().state, c);
    c.numel.pop_back();
    QCOMPARE(c.checkConsistent(), "numel has " + std::to_string(c.paramCount() - 1) +
                                      " entries, expected " + std::to_string(c.paramCount()));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, encodeBinaryState(c, {}, 0));
    state::columnsOf(test::sampleSnapshot().state, c);
    c.activeModule.push_back(0);
    QVERIFY(c.checkConsistent().starts_with("activeModule has "));
}

QTEST_APPLESS_MAIN(TestStateBinary)
#include "tst_statebinary.moc"

// The session store: live ingest, grouping of violations, history vs live events,
// a reconnect continuing the history without duplicates, and coalesced updates.

#include <QSignalSpy>
#include <QTest>

#include <algorithm>
#include <cstring>
#include <sys/resource.h>
#include <vector>

#include "session/sessionstore.h"
#include "session/snapshotio.h"
#include "state/violationtext.h"
#include "syntheticstate.h"

using namespace shardscope;
using namespace shardscope::test;

class TestSessionStore : public QObject
{
    Q_OBJECT
  private slots:
    void appliesStateAndIndexes();
    void liveEventsUpdateStatusAndGathers();
    void historyEventsAreStoredNotCounted();
    void lanesKeepWideTimesStepsAndValues();
    void violationsGroupByKindAccessorParam();
    void aRowKeepsItsWordsWhenAStateLands();
    void updatesAreCoalesced();
    void reconnectContinuesHistoryWithoutDuplicates();
    void differentRunStartsOver();
    void aRunThatBuiltItsModelGoesOn();
    void applyStateReturnsTheStateItReplaced();
    void namesOfRemovedParametersOutliveTheirState();
    void lanesAreSortedAndSearchable();
    void lanesKeepEveryFieldThroughOutOfOrderInserts();
    void externalRegisterChangesStructure();
    void badEventsDoNotCrash();
    void memoryIsBounded();
    void hugeParameterIdsCostNoMemory();
    void reversedEventsAreMergedNotShifted();
};

void TestSessionStore::appliesStateAndIndexes()
{
    session::SessionStore store;
    store.applyState(smallState());
    QVERIFY(store.hasState());
    QCOMPARE(store.worldSize(), 4);
    QCOMPARE(store.paramName(0), QStringLiteral("embed.weight"));
    QCOMPARE(store.modulePath(7), QStringLiteral("lm_head"));
    QCOMPARE(store.modulePath(0), QStringLiteral("<root>"));
    QCOMPARE(store.modulePath(kNoModule), QStringLiteral("<none>"));
    QCOMPARE(store.ownedParams(4).size(), std::size_t(2));  // blocks.0.fc
    QCOMPARE(store.childModules(0).size(), std::size_t(4)); // embed, blocks, lm_head, pos_conv
    QCOMPARE(store.laneCount(), 4);
}

void TestSessionStore::liveEventsUpdateStatusAndGathers()
{
    session::SessionStore store;
    store.applyState(smallState());
    std::vector<telemetry::Event> evs{
        eventAt(100, 2, telemetry::makeFetchBegin({.param = 1, .cause = 4, .bytes = 1024})),
        eventAt(350, 2, telemetry::makeFetchEnd({.param = 1, .cause = 4, .bytes = 1024}))};
    store.appendEvents(evs, false);
    QCOMPARE(store.param(1)->status[2], ParamStatus::Available);
    QCOMPARE(store.param(1)->status[0], ParamStatus::NotAvailable);
    QCOMPARE(store.param(1)->gatherCount, std::uint64_t(1));
    QCOMPARE(store.param(1)->gatherBytes, std::uint64_t(1024));
    QCOMPARE(store.param(1)->gatherNs, std::uint64_t(250));
    QCOMPARE(store.param(1)->lastGatherTsNs, std::uint64_t(350));
    const telemetry::Event rel =
        eventAt(400, 2, telemetry::makeRelease({.param = 1, .cause = 4, .bytes = 1024}));
    store.appendEvents({&rel, 1}, false);
    QCOMPARE(store.param(1)->status[2], ParamStatus::NotAvailable);
    telemetry::Event loss = eventAt(500, 0, telemetry::makeStepEnd(2.5), 3);
    telemetry::Event step = eventAt(510, 0, telemetry::makeStepBegin(), 4);
    store.appendEvents(std::vector<telemetry::Event>{loss, step}, false);
    QVERIFY(store.hasLoss());
    QCOMPARE(store.loss(), 2.5);
    QCOMPARE(store.step(), 4u);
    QCOMPARE(store.totalEvents(), std::uint64_t(5));
}

void TestSessionStore::historyEventsAreStoredNotCounted()
{
    session::SessionStore store;
    state::EngineState st = smallState();
    st.params[1].gatherCount = 7;
    store.applyState(st);
    std::vector<telemetry::Event> evs{
        eventAt(100, 0, telemetry::makeFetchBegin({.param = 1, .cause = 0})),
        eventAt(200, 0, telemetry::makeFetchEnd({.param = 1, .cause = 0})),
        lmHeadViolation(250, 0)};
    store.appendEvents(evs, true);
    QCOMPARE(store.param(1)->gatherCount, std::uint64_t(7));
    QVERIFY(store.violationGroups().empty());
    QCOMPARE(store.lane(0).size(), std::size_t(3));
}

void TestSessionStore::violationsGroupByKindAccessorParam()
{
    session::SessionStore store;
    state::EngineState before = smallState();
    before.params[6].late = before.params[7].late = false; // created late: the events say so
    store.applyState(std::move(before));
    std::vector<telemetry::Event> evs{
        lmHeadViolation(100, 0), lmHeadViolation(101, 1), lmHeadViolation(300, 0, 2),
        eventAt(50, 0, telemetry::makeLateParameter({.module = 8, .param = 6})),
        eventAt(51, 0, telemetry::makeLateParameter({.module = 8, .param = 7}))};
    store.appendEvents(evs, false);
    // A late_parameter event marks the parameter late; its violation is the producer's
    // record when a step begins with it unadopted, which a State brings (below).
    QCOMPARE(store.violationGroups().size(), std::size_t(1));
    QVERIFY(store.param(6)->late && store.param(7)->late);
    QVERIFY(store.violationsOf(7).empty());
    state::EngineState st = smallState();
    state::ViolationRecord lateV;
    lateV.kind = ViolationKind::LateParameter;
    lateV.accessor = kNoModule; // as docs/snapshot.md has it: no module read it
    lateV.param = 6;
    lateV.paramName = "pos_conv.weight_g";
    lateV.owner = 8;
    lateV.status = ParamStatus::Available;
    lateV.action = GuardAction::Recorded;
    lateV.step = lateV.lastStep = 1;
    lateV.count = 1;
    lateV.tsNs = 60;
    lateV.fix = "with deepspeed.zero.GatheredParameters(pos_conv.weight, modifier_rank=0): ...";
    st.violations.push_back(lateV);
    store.applyState(std::move(st));
    QCOMPARE(store.violationGroups().size(), std::size_t(2));
    const state::ViolationRow &g = store.violationGroups()[0];
    QCOMPARE(g.kind, ViolationKind::UnregisteredAccess);
    QCOMPARE(g.count, std::uint64_t(3));
    QCOMPARE(g.rankMask(), std::uint64_t(0b11));
    QCOMPARE(g.firstStep, 1u);
    QCOMPARE(g.lastStep, 2u);
    QCOMPARE(g.owner, ModuleId(1));
    QCOMPARE(g.action, GuardAction::Gathered);
    QCOMPARE(QString::fromStdString(g.fix),
             QStringLiteral("register_external_parameter(lm_head, embed.weight)"));
    QVERIFY(QString::fromStdString(g.message).contains(
        QStringLiteral("`lm_head` read `embed.weight` owned by `embed`")));
    QCOMPARE(store.paramViolations(0), std::uint64_t(3));
    QCOMPARE(store.moduleViolations(7), std::uint64_t(3)); // accessor
    QCOMPARE(store.moduleViolations(1), std::uint64_t(3)); // owner
    const state::ViolationRow &late = store.violationGroups()[1];
    QCOMPARE(late.kind, ViolationKind::LateParameter);
    QCOMPARE(late.accessor, kNoModule);
    QCOMPARE(late.count, std::uint64_t(1));
    QVERIFY(QString::fromStdString(late.fix).contains(
        QStringLiteral("GatheredParameters(pos_conv.weight, modifier_rank=0)")));
    QCOMPARE(store.violationsOf(6).size(), std::size_t(1));
    QVERIFY(store.violationsOf(7).empty());
}

// One author writes the words: a row made from live events says exactly what the engine
// writes (state/violationtext), and keeps its words when the engine's state arrives, even one
// whose record says something else. Counts come per rank and are exported per rank.
void TestSessionStore::aRowKeepsItsWordsWhenAStateLands()
{
    session::SessionStore store;
    store.applyState(smallState());
    store.appendEvents(
        std::vector<telemetry::Event>{lmHeadViolation(100, 0), lmHeadViolation(101, 1)}, false);
    QCOMPARE(store.violationGroups().size(), std::size_t(1));
    const std::string fix = store.violationGroups()[0].fix;
    const std::string message = store.violationGroups()[0].message;

    state::ViolationSubject subject;
    subject.kind = ViolationKind::UnregisteredAccess;
    subject.hasAccessor = true;
    subject.accessor = "lm_head";
    subject.param = "embed.weight";
    subject.owner = "embed";
    subject.status = ParamStatus::NotAvailable;
    const state::ViolationText engineText =
        state::describeViolation(subject, state::FixDialect::ShardScope);
    QCOMPARE(fix, engineText.fix);
    QCOMPARE(message, engineText.message);

    state::EngineState st = smallState();
    st.step = 2;
    for (int rank : {0, 1}) {
        state::ViolationRecord v;
        v.kind = ViolationKind::UnregisteredAccess;
        v.rank = rank;
        v.accessor = 7;
        v.param = 0;
        v.owner = 1;
        v.count = rank == 0 ? 2 : 1;
        v.step = 1;
        v.lastStep = rank == 0 ? 2 : 1;
        v.tsNs = 100 + static_cast<std::uint64_t>(rank);
        v.action = GuardAction::Gathered;
        v.fix = rank == 0 ? engineText.fix : std::string("words of another release");
        v.message = engineText.message;
        st.violations.push_back(v);
    }
    store.applyState(st);
    QCOMPARE(store.violationGroups().size(), std::size_t(1));
    const state::ViolationRow &g = store.violationGroups()[0];
    QCOMPARE(g.fix, fix);
    QCOMPARE(g.message, message);
    QCOMPARE(g.count, std::uint64_t(3));
    QCOMPARE(g.rankMask(), std::uint64_t(0b11));

    // The export keeps one record per rank, with that rank's count and the row's words.
    const wire::Snapshot snap = session::snapshotOf(store);
    QCOMPARE(snap.state.violations.size(), std::size_t(2));
    for (const state::ViolationRecord &v : snap.state.violations) {
        QCOMPARE(v.count, std::uint64_t(v.rank == 0 ? 2 : 1));
        QCOMPARE(v.lastStep, std::uint32_t(v.rank == 0 ? 2 : 1));
        QCOMPARE(v.fix, fix);
        QCOMPARE(v.paramName, std::string("embed.weight"));
    }
}

void TestSessionStore::updatesAreCoalesced()
{
    session::SessionStore store;
    store.setRefreshIntervalMs(10000);
    QSignalSpy spy(&store, &session::SessionStore::updated);
    store.applyState(smallState());
    for (int i = 0; i < 1000; ++i) {
        const telemetry::Event e = eventAt(
            static_cast<std::uint64_t>(i) * 10, i % 4,
            telemetry::makeFetchBegin({.param = static_cast<std::uint32_t>(i % 8), .cause = 0}));
        store.appendEvents({&e, 1}, false);
    }
    QCOMPARE(spy.count(), 0);
    store.flush();
    QCOMPARE(spy.count(), 1);
    const auto changes = spy.at(0).at(0).value<session::StoreChanges>();
    QVERIFY(changes.reset);
    QVERIFY(changes.events);
    QCOMPARE(changes.params.size(), std::size_t(8)); // each param once
    store.flush();
    QCOMPARE(spy.count(), 1); // nothing new, nothing emitted
}

void TestSessionStore::reconnectContinuesHistoryWithoutDuplicates()
{
    session::SessionStore store;
    store.applyState(smallState());
    std::vector<telemetry::Event> first;
    for (int i = 0; i < 100; ++i)
        first.push_back(eventAt(1000 + static_cast<std::uint64_t>(i), i % 4,
                                telemetry::makeModuleEnter({.module = 3})));
    store.appendEvents(first, true);
    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(2000, 0)}, false);
    QCOMPARE(store.totalEvents(), std::uint64_t(101));

    // The connection drops; a new attach to the same run gets a newer state whose
    // violations already count the one above, then a history overlapping what we have.
    state::EngineState st = smallState();
    st.step = 3;
    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.accessor = 7;
    v.param = 0;
    v.owner = 1;
    v.count = 2;
    v.step = 1;
    v.lastStep = 3;
    v.tsNs = 2000;
    v.fix = "register_external_parameter(lm_head, embed.weight)";
    st.violations.push_back(v);
    store.applyState(st);
    std::vector<telemetry::Event> history(first.begin() + 50, first.end());
    history.push_back(lmHeadViolation(2000, 0));
    for (int i = 0; i < 20; ++i)
        history.push_back(eventAt(3000 + static_cast<std::uint64_t>(i), i % 4,
                                  telemetry::makeModuleExit({.module = 3})));
    store.appendEvents(history, true);
    QCOMPARE(store.totalEvents(), std::uint64_t(121));
    QCOMPARE(store.duplicateEvents(), std::uint64_t(51));
    QCOMPARE(store.step(), 3u);
    QCOMPARE(store.violationGroups().size(), std::size_t(1));
    QCOMPARE(store.violationGroups()[0].count, std::uint64_t(2));
    std::size_t total = 0;
    for (int r = 0; r < store.laneCount(); ++r)
        total += store.lane(r).size();
    QCOMPARE(total, std::size_t(121));
}

void TestSessionStore::differentRunStartsOver()
{
    session::SessionStore store;
    store.applyState(smallState());
    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(10, 0)}, false);
    QSignalSpy spy(&store, &session::SessionStore::updated);
    store.flush();
    state::EngineState other = smallState(2);
    other.modelName = "another";
    store.applyState(other);
    store.flush();
    QCOMPARE(store.worldSize(), 2);
    QCOMPARE(store.totalEvents(), std::uint64_t(0));
    QVERIFY(store.violationGroups().empty());
    QVERIFY(spy.last().at(0).value<session::StoreChanges>().reset);
}

// Issue #49, defect 8: attached while the run builds its model (DeepSpeed's zero.Init lists
// the modules and parameters under a provisional name), the run goes on when the name
// becomes the model's: what was received is kept, not started over.
void TestSessionStore::aRunThatBuiltItsModelGoesOn()
{
    session::SessionStore store;
    state::EngineState building = smallState();
    building.modelName += " (model not built yet: shown once zero.Init or deepspeed.initialize "
                          "has run)";
    store.applyState(building);
    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(10, 0)}, false);
    store.flush();
    QCOMPARE(store.totalEvents(), std::uint64_t(1));
    store.applyState(smallState());
    store.flush();
    QCOMPARE(store.totalEvents(), std::uint64_t(1));
    QCOMPARE(store.state().modelName, smallState().modelName);
    // The other way round (a built model's name, then another) is still another run.
    state::EngineState other = smallState();
    other.modelName = "another";
    store.applyState(other);
    store.flush();
    QCOMPARE(store.totalEvents(), std::uint64_t(0));
}

// Connection frees the replaced state on its worker thread; it relies on getting it back
// whole, and on the store keeping the moved-in state intact.
void TestSessionStore::applyStateReturnsTheStateItReplaced()
{
    session::SessionStore store;
    QVERIFY(store.applyState(smallState()).params.empty());

    state::EngineState refreshed = smallState();
    refreshed.step = 7;
    const state::EngineState first = store.applyState(std::move(refreshed)); // the same run
    QCOMPARE(first.step, std::uint32_t(1));
    QCOMPARE(first.params.size(), smallState().params.size());
    QCOMPARE(store.step(), std::uint32_t(7));
    QCOMPARE(store.paramName(0), QStringLiteral("embed.weight"));
    QCOMPARE(store.ownedParams(4).size(), std::size_t(2));

    state::EngineState other = smallState(2);
    other.modelName = "another";
    const state::EngineState second = store.applyState(std::move(other)); // a different run
    QCOMPARE(second.step, std::uint32_t(7));
    QCOMPARE(second.worldSize, 4);
    QCOMPARE(second.params.size(), smallState().params.size());
    QCOMPARE(store.worldSize(), 2);
    QCOMPARE(store.state().modelName, std::string("another"));
}

void TestSessionStore::lanesAreSortedAndSearchable()
{
    session::EventLane lane;
    for (std::uint64_t t = 0; t < 40000; ++t)
        lane.insert(eventAt(t * 2, 0, telemetry::makeModuleEnter({.module = 0})));
    lane.insert(eventAt(5, 0, telemetry::makeModuleExit({.module = 0}))); // out of order
    QCOMPARE(lane.size(), std::size_t(40001));
    for (std::size_t i = 1; i < lane.size(); ++i)
        QVERIFY(lane.at(i - 1).tsNs <= lane.at(i).tsNs);
    QCOMPARE(lane.at(3).tsNs, std::uint64_t(5));
    QCOMPARE(lane.at(3).type, EventType::ModuleExit);
    QCOMPARE(lane.firstIndex(5), std::size_t(3));
    QCOMPARE(lane.firstIndex(6), std::size_t(4));
    QCOMPARE(lane.lastIndex(6), std::size_t(5));
    QCOMPARE(lane.firstIndex(1u << 30), lane.size());
    QVERIFY(lane.contains(eventAt(5, 0, telemetry::makeModuleExit({.module = 0}))));
    QVERIFY(!lane.contains(eventAt(5, 0, telemetry::makeModuleEnter({.module = 0}))));
    // 20 bytes an event (no rank, step or high time bits, no wide u0/u1/u2 kept) plus at
    // most one partly filled chunk.
    QCOMPARE(sizeof(session::EventLane::Stored), std::size_t(20));
    QVERIFY(lane.bytesUsed() <= (lane.size() + session::EventLane::kChunkEvents) * 20);
}

void TestSessionStore::lanesKeepEveryFieldThroughOutOfOrderInserts()
{
    // Memory samples (the events that carry u1/u2) in order, then more of them inserted
    // out of order just before a chunk boundary, each earlier than the last: every insert
    // moves events across chunks and, past 16,384 inserts, rebuilds a chunk's side table.
    const std::size_t base = session::EventLane::kChunkEvents + 100;
    const std::size_t at = session::EventLane::kChunkEvents - 100;
    const std::size_t late = session::EventLane::kChunkEvents + 700;
    auto sample = [](std::uint64_t ts, std::uint64_t k) {
        // Raw: a flags byte on a MemorySample, which its maker never sets.
        telemetry::Event e =
            makeEvent(ts, 5, EventType::MemorySample, static_cast<std::uint32_t>(k),
                      static_cast<std::uint32_t>(k >> 3), k * 7);
        e.step = static_cast<std::uint32_t>(k % 1000);
        e.flags = static_cast<std::uint8_t>(k % 3);
        e.u1 = k + 1;
        e.u2 = ~k;
        return e;
    };
    session::EventLane lane;
    std::vector<telemetry::Event> expected;
    for (std::uint64_t i = 0; i < base; ++i) {
        expected.push_back(sample(i * 100000, i));
        lane.insert(expected.back());
    }
    for (std::uint64_t j = 0; j < late; ++j) {
        expected.push_back(sample(at * 100000 - 1 - j, base + j));
        lane.insert(expected.back());
    }
    lane.insert(
        eventAt(at * 100000 - 1 - late, 5, telemetry::makeModuleEnter({.module = 3}))); // no u1/u2
    expected.push_back(
        eventAt(at * 100000 - 1 - late, 5, telemetry::makeModuleEnter({.module = 3})));
    std::sort(expected.begin(), expected.end(),
              [](const telemetry::Event &x, const telemetry::Event &y) { return x.tsNs < y.tsNs; });
    QCOMPARE(lane.size(), expected.size());
    for (std::size_t i = 0; i < lane.size(); ++i) {
        const telemetry::Event got = lane.at(i);
        if (std::memcmp(&got, &expected[i], sizeof(telemetry::Event)) != 0)
            QFAIL(qPrintable(QStringLiteral("event %1 differs: ts %2 u1 %3 u2 %4 rank %5")
                                 .arg(i)
                                 .arg(got.tsNs)
                                 .arg(got.u1)
                                 .arg(got.u2)
                                 .arg(got.rank)));
    }
    QVERIFY(lane.contains(expected[at]));
    telemetry::Event other = expected[at];
    other.u2 += 1;
    QVERIFY(!lane.contains(other));
    QCOMPARE(lane.at(at + late).type, EventType::MemorySample);
    QCOMPARE(lane.at(at).type, EventType::ModuleEnter);
    QCOMPARE(lane.at(at).u1, std::uint64_t(0));
}

// What the lane keeps per chunk rather than per event: the high 32 bits of the time and the
// step (as runs), and u0 beyond 32 bits with u1/u2 (a side table). Times that cross 2^32
// boundaries, steps that go back and forth, wide u0 values and out-of-order inserts that cut
// chunks and runs back all come out as they went in.
void TestSessionStore::lanesKeepWideTimesStepsAndValues()
{
    session::EventLane lane;
    std::vector<telemetry::Event> expected;
    auto event = [](std::uint64_t ts, std::uint64_t k) {
        return eventAt(
            ts, 3,
            telemetry::makeFetchBegin({.param = static_cast<std::uint32_t>(k),
                                       .cause = 7,
                                       .bytes = k % 5 == 0 ? (std::uint64_t(1) << 40) + k : k}),
            static_cast<std::uint32_t>(k % 7 == 0 ? 0xFFFFFFFFu - k : k / 100));
    };
    std::uint64_t ts = (std::uint64_t(1) << 32) - 50000;
    for (std::uint64_t k = 0; k < 3 * session::EventLane::kChunkEvents; ++k) {
        ts += k % 1000 == 999 ? (std::uint64_t(3) << 32) : 1 + k % 3; // some jump 2^32 ahead
        expected.push_back(event(ts, k));
        lane.insert(expected.back());
    }
    for (std::uint64_t j = 0; j < 300; ++j) { // late: cut back into earlier runs and chunks
        const telemetry::Event &target =
            expected[static_cast<std::size_t>(j * 157 % expected.size())];
        expected.push_back(event(target.tsNs - 1, 1000000 + j));
        lane.insert(expected.back());
    }
    std::stable_sort(
        expected.begin(), expected.end(),
        [](const telemetry::Event &x, const telemetry::Event &y) { return x.tsNs < y.tsNs; });
    QCOMPARE(lane.size(), expected.size());
    for (std::size_t i = 0; i < lane.size(); ++i) {
        const telemetry::Event got = lane.at(i);
        if (std::memcmp(&got, &expected[i], sizeof(telemetry::Event)) != 0)
            QFAIL(qPrintable(QStringLiteral("event %1 differs: ts %2/%3 step %4/%5 u0 %6/%7")
                                 .arg(i)
                                 .arg(got.tsNs)
                                 .arg(expected[i].tsNs)
                                 .arg(got.step)
                                 .arg(expected[i].step)
                                 .arg(telemetry::readFetch(got).bytes)
                                 .arg(telemetry::readFetch(expected[i]).bytes)));
        QCOMPARE(lane.tsAt(i), expected[i].tsNs);
    }
    for (std::size_t i : {std::size_t(0), std::size_t(5000), expected.size() - 1}) {
        const auto first = std::lower_bound(
            expected.begin(), expected.end(), expected[i],
            [](const telemetry::Event &x, const telemetry::Event &y) { return x.tsNs < y.tsNs; });
        QCOMPARE(lane.firstIndex(expected[i].tsNs), std::size_t(first - expected.begin()));
    }
    // A fifth of the events carry a wide u0 (a 32-byte side entry each) and the step changes
    // at two events in seven: still less than the 48-byte record.
    QVERIFY(lane.bytesUsed() < lane.size() * sizeof(telemetry::Event));
}

void TestSessionStore::externalRegisterChangesStructure()
{
    session::SessionStore store;
    store.applyState(smallState());
    store.flush();
    QSignalSpy spy(&store, &session::SessionStore::updated);
    store.appendEvents(
        std::vector<telemetry::Event>{eventAt(
            10, 0, telemetry::makeExternalRegister({.module = 7, .param = 0, .automatic = true}))},
        false);
    store.flush();
    QCOMPARE(spy.count(), 1);
    QVERIFY(spy.at(0).at(0).value<session::StoreChanges>().structure);
    QCOMPARE(store.externalsOn(7).size(), std::size_t(1));
    QCOMPARE(store.externalsOn(7)[0].module, ModuleId(0)); // the param id
    QVERIFY(store.externalsOn(7)[0].automatic);
    QCOMPARE(store.param(0)->externals.size(), std::size_t(1));
    store.appendEvents(std::vector<telemetry::Event>{eventAt(
                           11, 0, telemetry::makeExternalUnregister({.module = 7, .param = 0}))},
                       false);
    QVERIFY(store.externalsOn(7).empty());
}

// weight_norm removes `weight`: a later state no longer lists it, but events and violations
// still name it, by the name the earlier state gave.
void TestSessionStore::namesOfRemovedParametersOutliveTheirState()
{
    session::SessionStore store;
    state::EngineState first = smallState();
    QVERIFY(first.params.size() >= 2);
    const state::ParamRecord removed = first.params.back();
    store.applyState(std::move(first));
    state::EngineState later = smallState();
    later.step = 9;
    later.params.pop_back();
    store.applyState(std::move(later));
    QVERIFY(store.param(removed.id) == nullptr);
    QCOMPARE(store.paramName(removed.id), QString::fromStdString(removed.name));
    QCOMPARE(store.paramName(0), QString::fromStdString(smallState().params[0].name));
    state::EngineState other = smallState();
    other.modelName = "another run"; // names of another run are forgotten
    other.params.pop_back();
    store.applyState(std::move(other));
    QCOMPARE(store.paramName(removed.id), QStringLiteral("<parameter %1>").arg(removed.id));
}

void TestSessionStore::badEventsDoNotCrash()
{
    session::SessionStore store;
    store.applyState(smallState());
    std::vector<telemetry::Event> evs{
        eventAt(1, 0, telemetry::makeFetchBegin({.param = 999999, .cause = 0})),
        eventAt(2, 0, telemetry::makeFetchEnd({.param = 999999, .cause = 0})),
        eventAt(3, 60, telemetry::makeRelease({.param = 0, .cause = 0})),
        eventAt(4, 0, telemetry::makeExternalRegister({.module = 12345, .param = 0})),
        // Raw: a status/action byte no enum names, and a kind no EventType names.
        makeEvent(5, 0, EventType::UnregisteredAccess, 12345, 999, 77, 0xff),
        makeEvent(6, 0, static_cast<EventType>(200), 1, 1)};
    store.appendEvents(evs, false);
    QCOMPARE(store.totalEvents(), std::uint64_t(6));
    QCOMPARE(store.violationGroups().size(), std::size_t(1));
    QCOMPARE(store.paramName(999), QStringLiteral("<parameter 999>"));
}

void TestSessionStore::memoryIsBounded()
{
    session::SessionStore store;
    store.setMaxEvents(4 * 2 * session::EventLane::kChunkEvents); // two chunks per rank
    store.applyState(smallState(4));
    std::vector<telemetry::Event> evs;
    const std::uint64_t perRank = 5 * session::EventLane::kChunkEvents + 100;
    for (std::uint64_t i = 0; i < perRank * 4; ++i)
        evs.push_back(
            eventAt(1000 + i, static_cast<int>(i % 4), telemetry::makeModuleEnter({.module = 3})));
    store.appendEvents(evs, false);
    QCOMPARE(store.totalEvents(), perRank * 4);
    for (int r = 0; r < 4; ++r) {
        const session::EventLane &lane = store.lane(r);
        QVERIFY(lane.size() <= 2 * session::EventLane::kChunkEvents);
        QCOMPARE(lane.evicted() + lane.size(), perRank);
        QCOMPARE(lane.lastTs(),
                 1000 + (perRank - 1) * 4 + static_cast<std::uint64_t>(r)); // the newest are kept
        QVERIFY(lane.bytesUsed() <=
                2 * session::EventLane::kChunkEvents * sizeof(telemetry::Event));
    }
    QCOMPARE(
        store.evictedEvents(), perRank * 4 - [&] {
            std::uint64_t kept = 0;
            for (int r = 0; r < 4; ++r)
                kept += store.lane(r).size();
            return kept;
        }());
    // A reconnect replaying evicted history does not bring it back.
    store.applyState(smallState(4));
    const auto before = store.lane(0).size();
    store.appendEvents(std::vector<telemetry::Event>{evs.front()}, true);
    QCOMPARE(store.lane(0).size(), before);
}

namespace {

// Lowers the data-segment limit (malloc and mmap) for a scope, so that memory sized by an
// id rather than by the input fails here at once instead of exhausting the machine.
class DataLimit
{
  public:
    explicit DataLimit(rlim_t bytes)
    {
        ::getrlimit(RLIMIT_DATA, &m_old);
        rlimit lower = m_old;
        if (m_old.rlim_cur == RLIM_INFINITY || m_old.rlim_cur > bytes) lower.rlim_cur = bytes;
        ::setrlimit(RLIMIT_DATA, &lower);
    }
    ~DataLimit() { ::setrlimit(RLIMIT_DATA, &m_old); }

  private:
    rlimit m_old{};
};

} // namespace

// Issue #14, defect 2: params[0].id = 4294967294 threw bad_alloc and id 500,000,000 in a
// 1.5 KB file took 8 GB: tables were sized by the largest id. Ids are names, not indexes.
void TestSessionStore::hugeParameterIdsCostNoMemory()
{
    state::EngineState st = smallState(4);
    st.params.resize(2);
    st.params[0].id = 500'000'000;
    st.params[1].id = 4'294'967'294u;
    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.accessor = 7;
    v.param = 4'294'967'294u;
    v.owner = 1;
    v.count = 2;
    v.fix = "register_external_parameter(lm_head, x)";
    st.violations.push_back(v);

    const DataLimit limit(std::size_t(1) << 30); // far above what this needs, far below 8 GB
    session::SessionStore store;
    store.applyState(st);
    QVERIFY(store.param(500'000'000));
    QCOMPARE(store.param(4'294'967'294u)->name, st.params[1].name);
    QVERIFY(!store.param(0));
    QCOMPARE(store.paramViolations(4'294'967'294u), std::uint64_t(2));
    QCOMPARE(store.paramSlot(4'294'967'294u), 1);
    QCOMPARE(store.paramSlot(3), -1);
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(10, 1, telemetry::makeFetchBegin({.param = 500'000'000, .cause = 0})),
            eventAt(11, 1, telemetry::makeFetchEnd({.param = 500'000'000, .cause = 0})),
            eventAt(12, 2,
                    telemetry::makeUnregisteredAccess({.accessor = 7,
                                                       .param = 4'294'967'294u,
                                                       .owner = 1,
                                                       .action = GuardAction::Gathered})),
            eventAt(13, 2,
                    telemetry::makeUnregisteredAccess({.accessor = 7,
                                                       .param = 4'294'967'293u,
                                                       .owner = 1,
                                                       .action = GuardAction::Gathered}))},
        false);
    QCOMPARE(store.param(500'000'000)->gatherCount, std::uint64_t(1));
    QCOMPARE(store.paramViolations(4'294'967'294u), std::uint64_t(3));
    QSignalSpy updated(&store, &session::SessionStore::updated);
    store.flush();
    QCOMPARE(updated.count(), 1);
    auto changes = updated.at(0).at(0).value<session::StoreChanges>();
    std::sort(changes.params.begin(), changes.params.end());
    QCOMPARE(changes.params, (std::vector<ParamId>{500'000'000, 4'294'967'294u}));
}

// Issue #14, defect 3: 300k events with descending times were still loading after 150 s;
// each was inserted at the front of its lane, moving all the others. CTest's timeout is
// the watchdog; the test checks the result, not the time.
void TestSessionStore::reversedEventsAreMergedNotShifted()
{
    constexpr std::uint64_t kEvents = 300'000;
    std::vector<telemetry::Event> evs;
    for (std::uint64_t i = 0; i < kEvents; ++i) {
        // Some carry gathered and peak bytes (u1/u2: the lane's side table).
        evs.push_back(
            eventAt(2'000'000 - i, static_cast<int>(i % 2),
                    telemetry::makeMemorySample({.gatheredBytes = i % 3 == 0 ? i + 1 : 0,
                                                 .peakGatheredBytes = i % 3 == 0 ? 2 * i : 0,
                                                 .liveElements = i})));
    }
    session::SessionStore store;
    store.applyState(smallState(2));
    store.appendEvents(evs, true); // a snapshot file, in one call
    // and the same pattern as live batches of 2048, each older than everything before it
    for (std::size_t i = 0; i < evs.size(); i += 2048) {
        std::vector<telemetry::Event> batch(
            evs.begin() + static_cast<std::ptrdiff_t>(i),
            evs.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(i + 2048, evs.size())));
        for (telemetry::Event &e : batch)
            e.tsNs -= 1'000'000; // before all of the first copy
        store.appendEvents(batch, false);
    }
    QCOMPARE(store.totalEvents(), 2 * kEvents);
    for (int r = 0; r < 2; ++r) {
        const session::EventLane &lane = store.lane(r);
        QCOMPARE(lane.size(), std::size_t(kEvents));
        for (std::size_t k = 0; k < lane.size(); ++k) {
            const telemetry::Event e = lane.at(k);
            if (k) QVERIFY(lane.tsAt(k - 1) <= e.tsNs);
            QCOMPARE(int(e.rank), r);
            const telemetry::MemoryFields m = telemetry::readMemory(e);
            QCOMPARE(m.gatheredBytes, m.liveElements % 3 == 0 ? m.liveElements + 1 : 0);
            QCOMPARE(m.peakGatheredBytes, m.liveElements % 3 == 0 ? 2 * m.liveElements : 0);
        }
    }
    QCOMPARE(store.lane(0).firstTs(), std::uint64_t(1'000'000 - (kEvents - 2)));
    QCOMPARE(store.lane(1).lastTs(), std::uint64_t(2'000'000 - 1));
}

QTEST_GUILESS_MAIN(TestSessionStore)
#include "tst_sessionstore.moc"

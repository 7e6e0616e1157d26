#include <QtTest>

#include <chrono>
#include <map>
#include <thread>
#include <tuple>

#include "core/engine.h"
#include "telemetry/eventfields.h"
#include "testworld.h"

using namespace shardscope;
using namespace shardscope::test;

namespace {

// A block (no parameters of its own) holding a layer that owns two partitioned parameters,
// entered and exited for a few steps on every rank; returns every rank's events in order.
struct Run
{
    std::unique_ptr<core::Engine> engine;
    MemorySink sink;
    ModuleId block = 0, layer = 0;

    explicit Run(int world, std::uint64_t stallNs = 0)
    {
        core::EngineConfig cfg;
        cfg.persistenceThreshold = 0;
        cfg.stallNs = stallNs;
        engine = makeEngine(world, cfg);
        block = engine->addModule(engine->root(), "block", "Block");
        layer = engine->addModule(block, "fc", "Linear");
        const auto init = iota(24);
        engine->addParameter(layer, "weight", {4, 6}, DType::F32, init.data());
        engine->addParameter(layer, "bias", {6}, DType::F32, init.data());
        engine->partition();
        engine->setEventSink(&sink);
    }

    void steps(int n)
    {
        engine->forEachLocalRank([&](int r) {
            for (int s = 0; s < n; ++s) {
                engine->beginStep(r);
                for (Phase phase : {Phase::Forward, Phase::Backward}) {
                    engine->enterModule(r, block, phase);
                    engine->enterModule(r, layer, phase);
                    (void)engine->access(r, engine->module(layer).params[0]);
                    engine->exitModule(r, layer, phase);
                    engine->exitModule(r, block, phase);
                }
                engine->endStep(r, 0.5);
            }
        });
    }

    std::vector<telemetry::Event> ofRank(int rank) const
    {
        std::vector<telemetry::Event> out;
        for (const telemetry::Event &e : sink.events())
            if (e.rank == rank) out.push_back(e);
        return out;
    }
};

} // namespace

class TestEventTimestamps : public QObject
{
    Q_OBJECT
  private slots:
    void entryAndItsFetchesShareOneTime();
    void exitAndItsReleasesShareOneTime();
    void eachRanksTimesNeverGoBack();
    void gathersEndAfterTheyBegin();
    void collectivesNumberedAlikeOnEveryRank();
    void aRankWaitingPastTheThresholdIsStalledAtItsLine();
    void aHealthyRunRecordsNoStall();
};

// One clock read per module entry: the ModuleEnter and every FetchBegin it issues carry
// the batch's time, which moves only with a gather that completed in between (FetchEnd).
void TestEventTimestamps::entryAndItsFetchesShareOneTime()
{
    Run run(2);
    run.steps(1);
    for (int r = 0; r < 2; ++r) {
        const std::vector<telemetry::Event> ev = run.ofRank(r);
        int checked = 0, sameAsEnter = 0;
        for (std::size_t i = 0; i < ev.size(); ++i) {
            if (ev[i].type != EventType::ModuleEnter ||
                telemetry::readModule(ev[i]).module != run.layer)
                continue;
            std::uint64_t batch = ev[i].tsNs;
            for (std::size_t j = i + 1; j < ev.size(); ++j) {
                if (ev[j].type == EventType::FetchEnd || ev[j].type == EventType::CollectiveEnd) {
                    batch = ev[j].tsNs; // a gather completed (its collective, then the fetch)
                } else if (ev[j].type == EventType::FetchBegin) {
                    QCOMPARE(ev[j].tsNs, batch);
                    sameAsEnter += ev[j].tsNs == ev[i].tsNs;
                    ++checked;
                } else if (ev[j].type == EventType::CollectiveBegin) {
                    QCOMPARE(ev[j].tsNs, batch); // its fetch's time
                } else {
                    break;
                }
            }
        }
        QCOMPARE(checked, 2 * 2);  // forward and backward entries each fetch weight and bias
        QVERIFY(sameAsEnter >= 2); // each entry's first fetch: the entry's own time
    }
}

// One clock read per module exit: its Releases, the ModuleExit and the MemorySample after it.
void TestEventTimestamps::exitAndItsReleasesShareOneTime()
{
    Run run(2);
    run.steps(1);
    for (int r = 0; r < 2; ++r) {
        const std::vector<telemetry::Event> ev = run.ofRank(r);
        int exits = 0;
        for (std::size_t i = 0; i < ev.size(); ++i) {
            if (ev[i].type != EventType::Release) continue;
            const std::uint64_t t = ev[i].tsNs;
            std::size_t j = i;
            while (j < ev.size() && ev[j].type == EventType::Release)
                QCOMPARE(ev[j++].tsNs, t);
            QVERIFY(j + 1 < ev.size());
            QCOMPARE(ev[j].type, EventType::ModuleExit);
            QCOMPARE(ev[j].tsNs, t);
            QCOMPARE(ev[j + 1].type, EventType::MemorySample);
            QCOMPARE(ev[j + 1].tsNs, t);
            ++exits;
            i = j + 1;
        }
        QCOMPARE(exits, 2); // the layer's forward and backward exits release its parameters
    }
}

// The GUI merges ranks by time and binary-searches each rank's events: sharing a batch's
// time must never put an event before one written earlier on the same rank.
void TestEventTimestamps::eachRanksTimesNeverGoBack()
{
    Run run(2);
    run.steps(3);
    for (int r = 0; r < 2; ++r) {
        const std::vector<telemetry::Event> ev = run.ofRank(r);
        QVERIFY(ev.size() > 20);
        for (std::size_t i = 1; i < ev.size(); ++i)
            QVERIFY2(
                ev[i].tsNs >= ev[i - 1].tsNs,
                qPrintable(QString("rank %1: event %2 (type %3) is earlier than the one before it")
                               .arg(r)
                               .arg(i)
                               .arg(int(ev[i].type))));
    }
}

// A FetchBegin carries its entry's time and a FetchEnd the time the gather completed:
// each gather's end is at or after its begin, and every begin is ended once.
void TestEventTimestamps::gathersEndAfterTheyBegin()
{
    Run run(2);
    run.steps(2);
    for (int r = 0; r < 2; ++r) {
        std::map<ParamId, std::uint64_t> open; // param -> its FetchBegin's time
        int ended = 0;
        for (const telemetry::Event &e : run.ofRank(r)) {
            if (e.type == EventType::FetchBegin) {
                QVERIFY(open.emplace(telemetry::readFetch(e).param, e.tsNs).second);
            } else if (e.type == EventType::FetchEnd) {
                const auto it = open.find(telemetry::readFetch(e).param);
                QVERIFY2(it != open.end(), "a FetchEnd without its FetchBegin");
                QVERIFY(e.tsNs >= it->second);
                open.erase(it);
                ++ended;
            }
        }
        QVERIFY(open.empty());
        QCOMPARE(ended, 2 * 2 * 2); // 2 steps x (forward, backward) x 2 parameters
    }
}

// Issue 51: each all-gather, reduce-scatter and GatheredParameters broadcast a rank issues has
// its place in the rank's sequence (CollectiveBegin before it is issued, CollectiveEnd once it
// completed, with the begin's fields): seq 1, 2, 3, ... on group 0, and every rank of the job
// issues the same collective (kind, module, reason, bytes) at the same seq.
void TestEventTimestamps::collectivesNumberedAlikeOnEveryRank()
{
    Run run(2);
    run.steps(2);
    const ParamId weight = run.engine->module(run.layer).params[0];
    const std::vector<float> grad(24, 1.0f);
    run.engine->forEachLocalRank([&](int r) {
        run.engine->reduceScatterGrad(r, weight, grad.data());
        core::GatheredParameters scope(*run.engine, r, {weight}, 0); // modifier rank 0
    });
    using Signature = std::tuple<CollectiveKind, ModuleId, FetchReason, std::uint64_t>;
    std::vector<std::vector<Signature>> byRank(2);
    for (int r = 0; r < 2; ++r) {
        std::map<std::uint64_t, telemetry::CollectiveFields> open;
        for (const telemetry::Event &e : run.ofRank(r)) {
            if (e.type == EventType::CollectiveBegin) {
                const telemetry::CollectiveFields f = telemetry::readCollective(e);
                QCOMPARE(f.group, std::uint32_t(0));
                QCOMPARE(f.seq, std::uint64_t(byRank[std::size_t(r)].size() + 1));
                QCOMPARE(f.params, std::uint32_t(1));
                open.emplace(f.seq, f);
                byRank[std::size_t(r)].emplace_back(f.kind, f.module, f.reason, f.bytes);
            } else if (e.type == EventType::CollectiveEnd) {
                const telemetry::CollectiveFields f = telemetry::readCollective(e);
                const auto it = open.find(f.seq);
                QVERIFY2(it != open.end(), "a CollectiveEnd without its CollectiveBegin");
                QCOMPARE(f.kind, it->second.kind);
                QCOMPARE(f.module, it->second.module);
                QCOMPARE(f.bytes, it->second.bytes);
                open.erase(it);
            }
        }
        QVERIFY(open.empty());
    }
    // 2 steps x (forward, backward) x 2 parameters gathered, then one reduce-scatter, one
    // gather and one broadcast of the weight.
    QCOMPARE(byRank[0].size(), std::size_t(2 * 2 * 2 + 3));
    QCOMPARE(byRank[0], byRank[1]);
    const auto &tail = byRank[0];
    QCOMPARE(std::get<0>(tail[8]), CollectiveKind::ReduceScatter);
    QCOMPARE(std::get<1>(tail[8]), run.layer);
    QCOMPARE(std::get<2>(tail[8]), FetchReason::Backward);
    QCOMPARE(std::get<0>(tail[9]), CollectiveKind::AllGather);
    QCOMPARE(std::get<2>(tail[9]), FetchReason::GatheredParameters);
    QCOMPARE(std::get<0>(tail[10]), CollectiveKind::Broadcast);
    QCOMPARE(std::get<2>(tail[10]), FetchReason::GatheredParameters);
}

// The engine's stall watchdog (issue 51): rank 1 waits in the layer's gather while rank 0
// sleeps past the threshold; rank 1's rank_stalled names its collective and the line of its
// enterModule call here, once; rank 0 never waited and has none.
void TestEventTimestamps::aRankWaitingPastTheThresholdIsStalledAtItsLine()
{
    Run run(2, 150'000'000); // 0.15 s
    int enterLine = 0;
    run.engine->forEachLocalRank([&](int r) {
        run.engine->beginStep(r);
        run.engine->enterModule(r, run.block, Phase::Forward);
        if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(700));
        if (r == 1) enterLine = __LINE__ + 1;
        run.engine->enterModule(r, run.layer, Phase::Forward);
        run.engine->exitModule(r, run.layer, Phase::Forward);
        run.engine->exitModule(r, run.block, Phase::Forward);
        run.engine->endStep(r, 0.5);
    });
    std::vector<state::ViolationRecord> stalls;
    for (const state::ViolationRecord &v : run.engine->violations())
        if (v.kind == ViolationKind::RankStalled) stalls.push_back(v);
    QCOMPARE(stalls.size(), std::size_t(1));
    const state::ViolationRecord &v = stalls.front();
    QCOMPARE(v.rank, 1);
    QCOMPARE(v.count, std::uint64_t(1));
    QVERIFY2(v.location.file.ends_with("tst_eventtimestamps.cpp"), v.location.file.c_str());
    QCOMPARE(v.location.line, std::uint32_t(enterLine));
    QCOMPARE(v.collective.sides.size(), std::size_t(1));
    const state::CollectiveSide &side = v.collective.sides.front();
    QCOMPARE(side.ranks, std::vector<int>{1});
    QCOMPARE(side.position, CollectivePosition::Waiting);
    QCOMPARE(side.kind, CollectiveKind::AllGather);
    QCOMPARE(side.module, std::string("block.fc"));
    QCOMPARE(v.collective.sites.size(), std::size_t(1));
    QCOMPARE(v.collective.sites.front().where.line, std::uint32_t(enterLine));
    QVERIFY(v.collective.waitedMs >= 150);
    QVERIFY2(v.message.find("block.fc") != std::string::npos, v.message.c_str());
}

// Collectives that complete record nothing, however many: 300 steps of 2 ms of work each
// (about 0.6 s) under a threshold of 0.15 s, the watchdog reading the ranks' marks all along.
void TestEventTimestamps::aHealthyRunRecordsNoStall()
{
    Run run(2, 150'000'000);
    const auto start = std::chrono::steady_clock::now();
    run.engine->forEachLocalRank([&](int r) {
        for (int s = 0; s < 300; ++s) {
            run.engine->beginStep(r);
            for (Phase phase : {Phase::Forward, Phase::Backward}) {
                run.engine->enterModule(r, run.block, phase);
                run.engine->enterModule(r, run.layer, phase);
                std::this_thread::sleep_for(std::chrono::milliseconds(1)); // its work
                run.engine->exitModule(r, run.layer, phase);
                run.engine->exitModule(r, run.block, phase);
            }
            run.engine->endStep(r, 0.5);
        }
    });
    QVERIFY(std::chrono::steady_clock::now() - start > std::chrono::milliseconds(600));
    for (const state::ViolationRecord &v : run.engine->violations())
        QVERIFY2(v.kind != ViolationKind::RankStalled, v.message.c_str());
}

QTEST_GUILESS_MAIN(TestEventTimestamps)
#include "tst_eventtimestamps.moc"

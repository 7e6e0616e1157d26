// The job's aligner (issue 51, sessioncore/collectivealigner.h): a healthy job makes no record;
// an extra forward on one rank, a rank stalled while another ended, a restarted rank, a rank
// without sequence numbers, stragglers, a long run's memory, and the merged snapshot's diagnosis.

#include <QTest>

#include <cstdlib>

#include "sessioncore/collectivealigner.h"
#include "sessioncore/store.h"
#include "telemetry/eventfields.h"

using namespace shardscope;
using sessioncore::CollectiveAligner;

namespace {

constexpr std::uint64_t kMs = 1'000'000ull;
constexpr std::uint64_t kS = 1000 * kMs;

struct Op
{
    CollectiveKind kind;
    ModuleId module;
    FetchReason reason;
    std::uint64_t bytes;
};

// One step of a tiny model: forward gathers of modules 1 and 2, backward's gather of 2 and
// the reduce-scatters of 2 and 1.
const std::vector<Op> kStep = {
    {CollectiveKind::AllGather, 1, FetchReason::Forward, 4096},
    {CollectiveKind::AllGather, 2, FetchReason::Forward, 8192},
    {CollectiveKind::AllGather, 2, FetchReason::Backward, 8192},
    {CollectiveKind::ReduceScatter, 2, FetchReason::Backward, 8192},
    {CollectiveKind::ReduceScatter, 1, FetchReason::Backward, 4096},
};

telemetry::Event begin(int rank, std::uint64_t seq, const Op &op, std::uint64_t ts,
                       std::uint32_t group = 0)
{
    return telemetry::stamped(
        telemetry::makeCollectiveBegin({op.kind, op.module, group, seq, op.bytes, op.reason, 1}),
        ts, 1, std::uint16_t(rank));
}

telemetry::Event end(int rank, std::uint64_t seq, const Op &op, std::uint64_t ts,
                     std::uint32_t group = 0)
{
    return telemetry::stamped(
        telemetry::makeCollectiveEnd({op.kind, op.module, group, seq, op.bytes, op.reason, 1}), ts,
        1, std::uint16_t(rank));
}

std::vector<state::ModuleRecord> modules()
{
    return {{0, "", "Model", kNoModule}, {1, "embed", "Embedding", 0}, {2, "head", "Linear", 0}};
}

// Rank r runs `ops` from seq `first`, starting at t0, `gap` between collectives and `late`
// after the others: each begin, then its end 1 ms later.
void run(CollectiveAligner &a, int r, const std::vector<Op> &ops, std::uint64_t first,
         std::uint64_t t0, std::uint64_t late = 0, std::uint64_t gap = 10 * kMs)
{
    std::uint64_t seq = first;
    for (const Op &op : ops) {
        const std::uint64_t t = t0 + (seq - first) * gap + late;
        a.add(begin(r, seq, op, t));
        a.add(end(r, seq, op, t + kMs));
        ++seq;
    }
}

std::vector<Op> steps(int n)
{
    std::vector<Op> out;
    for (int i = 0; i < n; ++i)
        out.insert(out.end(), kStep.begin(), kStep.end());
    return out;
}

state::ViolationRecord ownStall(int rank, std::uint64_t seq, std::uint32_t line)
{
    state::ViolationRecord v;
    v.kind = ViolationKind::RankStalled;
    v.rank = rank;
    v.collective.group = 0;
    v.collective.seq = seq;
    v.collective.waitedMs = 6000;
    state::CollectiveSide side;
    side.ranks = {rank};
    side.position = CollectivePosition::Waiting;
    v.collective.sides = {side};
    v.collective.sites = {{rank, seq, 6000, {"train.py", line, "main", {}}}};
    return v;
}

} // namespace

class TestCollectiveAligner : public QObject
{
    Q_OBJECT

  private slots:
    // The straggler every view names: the most lateness in all, not the most times last (rank
    // 0 is last twice by a hair, rank 2 once by a second); ties by times last; none while no
    // rank was ever last.
    void latestRankIsTheLatestInAll()
    {
        sessioncore::StragglerSummary s;
        s.ranks = {{.rank = 0, .collectives = 3, .timesLast = 2, .totalLateNs = 2'000},
                   {.rank = 1, .collectives = 3, .timesLast = 0, .totalLateNs = 0},
                   {.rank = 2, .collectives = 3, .timesLast = 1, .totalLateNs = kMs * 1000}};
        QCOMPARE(sessioncore::latestRank(s)->rank, 2);
        s.ranks[0].totalLateNs = kMs * 1000;
        QCOMPARE(sessioncore::latestRank(s)->rank, 0);
        for (sessioncore::StragglerFigures &f : s.ranks)
            f.timesLast = 0;
        QVERIFY(sessioncore::latestRank(s) == nullptr);
        QVERIFY(sessioncore::latestRank(sessioncore::StragglerSummary{}) == nullptr);
    }

    void healthyJobOfThreeRanksMakesNoRecord()
    {
        CollectiveAligner a(3);
        a.setModulePaths(modules());
        const std::vector<Op> ops = steps(200);
        // Interleaved as a live job's events arrive: rank by rank, collective by collective.
        for (std::uint64_t i = 0; i < ops.size(); ++i)
            for (int r = 0; r < 3; ++r) {
                const std::uint64_t t = i * 10 * kMs + std::uint64_t(r) * 100'000;
                a.add(begin(r, i + 1, ops[i], t));
            }
        for (std::uint64_t i = 0; i < ops.size(); ++i)
            for (int r = 0; r < 3; ++r)
                a.add(end(r, i + 1, ops[i], i * 10 * kMs + kMs));
        a.tick(ops.size() * 10 * kMs + 60 * kS);
        QVERIFY(a.records().empty());
        a.finish(0);
        QVERIFY(a.records().empty());
        QVERIFY(a.notes().empty());
        QCOMPARE(a.windowedSeqs(), std::size_t(0)); // every seq passed by every rank: dropped
        const auto s = a.stragglers();
        QCOMPARE(s.collectives, std::uint64_t(ops.size()));
        QCOMPARE(s.ranks[2].timesLast, std::uint64_t(ops.size())); // 0.1 ms after rank 1
        for (const sessioncore::RankProgress &p : a.progress()) {
            QVERIFY(p.aligned);
            QVERIFY(!p.stalled && !p.diverged && !p.inFlight);
            QCOMPARE(p.seq, std::uint64_t(ops.size()));
        }
    }

    // Rank 0 evaluates an extra batch (two more forward gathers) after step 1's forward: at
    // seq 3 it gathers `embed` for a forward while ranks 1 and 2 gather `head` for backward.
    void extraForwardOnRankZeroIsAMismatchAtTheFirstDifferingSeq()
    {
        CollectiveAligner a(3, {.dialect = state::FixDialect::DeepSpeed});
        a.setModulePaths(modules());
        std::vector<Op> zero = {kStep[0], kStep[1], kStep[0], kStep[1]};
        run(a, 1, kStep, 1, 0);
        run(a, 2, kStep, 1, 0);
        // Rank 0 waits in its third collective (the extra forward's), as a hang leaves it.
        a.add(begin(0, 1, zero[0], 0));
        a.add(end(0, 1, zero[0], kMs));
        a.add(begin(0, 2, zero[1], 10 * kMs));
        a.add(end(0, 2, zero[1], 11 * kMs));
        a.add(begin(0, 3, zero[2], 20 * kMs));
        QCOMPARE(a.records().size(), std::size_t(1));
        const state::ViolationRecord &v = a.records()[0];
        QCOMPARE(v.kind, ViolationKind::CollectiveMismatch);
        QCOMPARE(v.collective.seq, std::uint64_t(3));
        QCOMPARE(v.collective.sides.size(), std::size_t(2));
        const state::CollectiveSide &extra = v.collective.sides[0];
        QCOMPARE(extra.ranks, std::vector<int>{0});
        QCOMPARE(extra.position, CollectivePosition::Waiting);
        QCOMPARE(extra.kind, CollectiveKind::AllGather);
        QCOMPARE(extra.module, std::string("embed"));
        QCOMPARE(extra.reason, FetchReason::Forward);
        const state::CollectiveSide &others = v.collective.sides[1];
        QCOMPARE(others.ranks, (std::vector<int>{1, 2}));
        QCOMPARE(others.position, CollectivePosition::Issued);
        QCOMPARE(others.module, std::string("head"));
        QCOMPARE(others.reason, FetchReason::Backward);
        QCOMPARE(v.rank, 0);
        QVERIFY2(v.message.find("rank 0 waits in an all-gather for `embed` (forward") !=
                     std::string::npos,
                 v.message.c_str());
        QVERIFY2(v.message.find("ranks 1 and 2 issued an all-gather for `head` (backward") !=
                     std::string::npos,
                 v.message.c_str());
        QVERIFY2(v.fix.find("extra forward") != std::string::npos, v.fix.c_str());
        // Rank 0's watchdog then says its line: the record gains it, once.
        a.addRankRecord(ownStall(0, 3, 88));
        QCOMPARE(a.records().size(), std::size_t(1));
        QCOMPARE(a.records()[0].location.fileLine(), std::string("train.py:88"));
        QVERIFY(a.records()[0].message.find("at train.py:88") != std::string::npos);
        // Later seqs of the diverged group are not compared again.
        a.add(begin(0, 4, zero[3], 30 * kMs));
        QCOMPARE(a.records().size(), std::size_t(1));
        const auto progress = a.progress();
        QVERIFY(progress[0].diverged && progress[1].diverged && progress[2].diverged);
    }

    // Rank 1 ran one batch fewer and ended; rank 0 waits in its next gather past the threshold.
    void rankWaitingWhileAnotherEndedIsStalled()
    {
        CollectiveAligner a(2, {.stallNs = 5 * kS, .dialect = state::FixDialect::Fsdp});
        a.setModulePaths(modules());
        run(a, 0, kStep, 1, 0);
        run(a, 1, kStep, 1, 0);
        const std::uint64_t t = 100 * kMs;
        a.add(begin(0, 6, kStep[0], t));
        a.rankFinished(1, "training finished");
        a.tick(t + 4 * kS);
        QVERIFY(a.records().empty()); // not yet past the threshold
        a.addRankRecord(ownStall(0, 6, 42));
        a.addRankRecord(ownStall(0, 6, 42)); // said twice, kept once
        a.tick(t + 6 * kS);
        QCOMPARE(a.records().size(), std::size_t(1));
        const state::ViolationRecord &v = a.records()[0];
        QCOMPARE(v.kind, ViolationKind::RankStalled);
        QCOMPARE(v.collective.seq, std::uint64_t(6));
        QCOMPARE(v.collective.waitedMs, std::uint64_t(6000));
        QCOMPARE(v.collective.sides.size(), std::size_t(2));
        QCOMPARE(v.collective.sides[0].ranks, std::vector<int>{0});
        QCOMPARE(v.collective.sides[0].position, CollectivePosition::Waiting);
        QCOMPARE(v.collective.sides[1].ranks, std::vector<int>{1});
        QCOMPARE(v.collective.sides[1].position, CollectivePosition::Finished);
        QCOMPARE(v.collective.sides[1].lastSeq, std::uint64_t(5));
        QCOMPARE(v.location.fileLine(), std::string("train.py:42"));
        QVERIFY2(v.message.find("rank 1 had ended after #5") != std::string::npos,
                 v.message.c_str());
        QVERIFY2(v.fix.find("drop_last=True") != std::string::npos, v.fix.c_str());
        a.tick(t + 60 * kS);
        QCOMPARE(a.records().size(), std::size_t(1)); // once per (group, seq)
        // The same, but rank 1 ended by an exception: the fix names it.
        CollectiveAligner raised(2);
        raised.setModulePaths(modules());
        run(raised, 0, kStep, 1, 0);
        run(raised, 1, kStep, 1, 0);
        raised.add(begin(0, 6, kStep[0], t));
        raised.rankFinished(1, "training failed: ValueError: bad batch");
        raised.tick(t + 6 * kS);
        QCOMPARE(raised.records().size(), std::size_t(1));
        QVERIFY2(raised.records()[0].fix.find(
                     "rank 1 raised (training failed: ValueError: bad batch)") != std::string::npos,
                 raised.records()[0].fix.c_str());
        const auto progress = a.progress();
        QVERIFY(progress[0].stalled && progress[0].inFlight);
        QCOMPARE(progress[0].modulePath, std::string("embed"));
        QCOMPARE(progress[0].where.line, 42u);
        QVERIFY(progress[1].finished && !progress[1].stalled);
    }

    // A rank that restarts counts from 1 again: its alignment restarts, said once; no mismatch.
    void seqGoingBackwardsRestartsTheRankWithoutAMismatch()
    {
        CollectiveAligner a(2);
        a.setModulePaths(modules());
        run(a, 0, steps(4), 1, 0);
        run(a, 1, steps(2), 1, 0);
        // Rank 1 restarted from its checkpoint: seq 1 again, while rank 0 runs on.
        run(a, 1, steps(2), 1, 200 * kMs);
        run(a, 0, {kStep[3], kStep[4], kStep[0]}, 21, 300 * kMs);
        QVERIFY(a.records().empty());
        QCOMPARE(a.notes().size(), std::size_t(1));
        QVERIFY2(a.notes()[0].find("rank 1's collectives of group 0 went back from #10 to #1") !=
                     std::string::npos,
                 a.notes()[0].c_str());
        a.finish(0);
        QVERIFY(a.records().empty());
        // Both restart (the job resumed): aligned again, and a divergence is found again.
        CollectiveAligner b(2);
        b.setModulePaths(modules());
        run(b, 0, steps(1), 1, 0);
        run(b, 1, steps(1), 1, 0);
        run(b, 0, kStep, 1, 100 * kMs);
        run(b, 1, {kStep[0], kStep[2]}, 1, 100 * kMs);
        QCOMPARE(b.records().size(), std::size_t(1));
        QCOMPARE(b.records()[0].collective.seq, std::uint64_t(2));
    }

    // Module ids are per process: rank 1's process numbered `embed` 2 and `head` 1. Compared by
    // path, its collectives are rank 0's: no mismatch; by the merged structure's ids alone,
    // every one would differ.
    void modulesAreComparedByEachProcesssPaths()
    {
        wire::Snapshot merged;
        merged.state.worldSize = 2;
        merged.state.modules = modules();
        std::vector<wire::Snapshot> parts(2);
        parts[0].state.modules = modules();
        parts[0].state.localRanks = {0};
        parts[1].state.modules = {
            {0, "", "Model", kNoModule}, {1, "head", "Linear", 0}, {2, "embed", "Embedding", 0}};
        parts[1].state.localRanks = {1};
        for (std::uint64_t i = 0; i < kStep.size(); ++i) {
            Op swapped = kStep[i];
            swapped.module = swapped.module == 1 ? 2 : 1;
            merged.events.push_back(begin(0, i + 1, kStep[i], i * 10 * kMs));
            merged.events.push_back(begin(1, i + 1, swapped, i * 10 * kMs + 1));
            merged.events.push_back(end(0, i + 1, kStep[i], i * 10 * kMs + kMs));
            merged.events.push_back(end(1, i + 1, swapped, i * 10 * kMs + kMs));
        }
        wire::Snapshot withoutParts = merged;
        QVERIFY(sessioncore::diagnoseJob(merged, 5 * kS, &parts).records.empty());
        // Without the processes' own structures the ids are all there is: a mismatch.
        QCOMPARE(sessioncore::diagnoseJob(withoutParts, 5 * kS).records.size(), std::size_t(1));
    }

    // An older agent: steps, no collective_begin. Said once, not aligned, never in a record.
    void aRankWithoutCollectiveEventsIsSaidOnce()
    {
        CollectiveAligner a(3);
        a.setModulePaths(modules());
        run(a, 0, steps(3), 1, 0);
        run(a, 1, steps(3), 1, 0);
        for (int i = 0; i < 3; ++i)
            a.add(telemetry::stamped(telemetry::makeStepEnd(0.5), 1000 + std::uint64_t(i), 1, 2));
        a.tick(10 * kS);
        a.tick(20 * kS);
        a.finish(0);
        QVERIFY(a.records().empty());
        QCOMPARE(a.notes().size(), std::size_t(1));
        QVERIFY(a.notes()[0].find("rank 2 sent no collective sequence numbers") !=
                std::string::npos);
        QVERIFY(a.progress()[2].noSequence && !a.progress()[2].aligned);
        QCOMPARE(a.windowedSeqs(), std::size_t(0)); // ranks 0 and 1 still aligned and dropped
        QCOMPARE(a.stragglers().collectives, std::uint64_t(15));
    }

    // Rank 2 arrives 5 ms after the others at every collective: the straggler, no record.
    void stragglersAreSummedPerRank()
    {
        CollectiveAligner a(3);
        a.setModulePaths(modules());
        const std::vector<Op> ops = steps(10);
        run(a, 0, ops, 1, 0);
        run(a, 1, ops, 1, 0, kMs / 2);
        run(a, 2, ops, 1, 0, 5 * kMs);
        a.finish(0);
        QVERIFY(a.records().empty());
        const auto s = a.stragglers();
        QCOMPARE(s.collectives, std::uint64_t(ops.size()));
        QCOMPARE(s.maxSpreadNs, 5 * kMs);
        QCOMPARE(s.totalSpreadNs, ops.size() * 5 * kMs);
        QCOMPARE(s.ranks[2].timesLast, std::uint64_t(ops.size()));
        QCOMPARE(s.ranks[2].totalLateNs, ops.size() * 5 * kMs);
        QCOMPARE(s.ranks[1].timesLast, std::uint64_t(0));
        QCOMPARE(s.ranks[1].totalLateNs, ops.size() * kMs / 2);
        QCOMPARE(s.ranks[0].totalLateNs, std::uint64_t(0));
    }

    // A million collectives per rank: the windows hold only what some rank has not passed.
    void memoryStaysBoundedOnALongRun()
    {
        CollectiveAligner a(2);
        a.setModulePaths(modules());
        std::size_t most = 0;
        for (std::uint64_t seq = 1; seq <= 1'000'000; ++seq) {
            const Op &op = kStep[seq % kStep.size()];
            a.add(begin(0, seq, op, seq * 1000));
            if (seq > 3) a.add(begin(1, seq - 3, kStep[(seq - 3) % kStep.size()], seq * 1000));
            a.add(end(0, seq, op, seq * 1000 + 10));
            most = std::max(most, a.windowedSeqs());
        }
        QVERIFY(most <= 4);
        // Rank 1 stops: rank 0 runs on; the window stops at its bound.
        CollectiveAligner b(2, {.window = 100});
        for (std::uint64_t seq = 1; seq <= 10'000; ++seq)
            b.add(begin(0, seq, kStep[0], seq * 1000));
        QCOMPARE(b.windowedSeqs(), std::size_t(100));
    }

    // The live job the GUI shows (sessioncore::Store): events of every process aligned as they
    // come, stalls decided on its refresh at the store's clock, the records among its
    // violation rows, each rank's progress; a snapshot loaded into a store is diagnosed too.
    void theLiveStoreShowsTheDiagnosis()
    {
        static std::uint64_t now = 0;
        sessioncore::Store store;
        store.setCollectiveClock(+[]() -> std::uint64_t { return now; });
        store.setCollectiveOptions({.stallNs = 5 * kS});
        state::EngineState st;
        st.worldSize = 2;
        st.backend = "gloo";
        st.modules = modules();
        store.applyState(st);
        std::vector<telemetry::Event> events;
        for (int r = 0; r < 2; ++r)
            for (std::uint64_t i = 0; i < kStep.size(); ++i) {
                events.push_back(begin(r, i + 1, kStep[i], i * 10 * kMs));
                events.push_back(end(r, i + 1, kStep[i], i * 10 * kMs + kMs));
            }
        events.push_back(begin(0, 6, kStep[0], 100 * kMs)); // rank 1 never comes
        // The producers' host clock is 1000 s behind the store's: waits are measured from
        // when the store received the begin, so 2 s later nothing has stalled yet.
        now = 1000 * kS;
        store.appendEvents(events, false);
        now = 1000 * kS + 2 * kS;
        (void)store.takeChanges();
        QVERIFY(store.violationGroups().empty());
        now = 1000 * kS + 7 * kS;
        const sessioncore::StoreChanges changes = store.takeChanges();
        QVERIFY(changes.violations);
        QCOMPARE(store.violationGroups().size(), std::size_t(1));
        const state::ViolationRow &row = store.violationGroups()[0];
        QCOMPARE(row.kind, ViolationKind::RankStalled);
        QCOMPARE(row.collective.seq, std::uint64_t(6));
        QCOMPARE(row.collective.sides[1].position, CollectivePosition::Behind);
        const auto progress = store.collectiveProgress();
        QVERIFY(progress[0].stalled && progress[0].inFlight);
        QCOMPARE(progress[0].seq, std::uint64_t(6));
        QCOMPARE(progress[1].seq, std::uint64_t(5));
        QCOMPARE(store.stragglers().collectives, std::uint64_t(5));
        // Its snapshot, loaded again, shows the same row (not a second one).
        const wire::Snapshot snap = sessioncore::snapshotOf(store);
        sessioncore::Store file;
        sessioncore::loadSnapshot(file, snap, "job.json");
        QCOMPARE(file.violationGroups().size(), std::size_t(1));
        QCOMPARE(file.violationGroups()[0].collective, row.collective);
    }

    // The merged snapshot of a job (what shardscope-check and shardscope-capture read): its
    // events and its ranks' own records diagnosed, the records added through the ledger.
    void aJobsSnapshotIsDiagnosed()
    {
        wire::Snapshot s;
        s.state.worldSize = 2;
        s.state.fixDialect = "deepspeed";
        s.state.modules = modules();
        std::vector<telemetry::Event> events;
        for (int r = 0; r < 2; ++r)
            for (std::uint64_t i = 0; i < kStep.size(); ++i) {
                events.push_back(begin(r, i + 1, kStep[i], i * 10 * kMs));
                events.push_back(end(r, i + 1, kStep[i], i * 10 * kMs + kMs));
            }
        // Rank 0 hangs in seq 6 (its watchdog said so after 6 s); rank 1 has ended.
        events.push_back(begin(0, 6, kStep[0], 100 * kMs));
        s.events = events;
        s.state.violations.push_back(ownStall(0, 6, 77));
        ::setenv("SHARDSCOPE_STALL_SECONDS", "5", 1);
        auto d = sessioncore::diagnoseJob(s);
        QVERIFY2(d.error.empty(), d.error.c_str());
        QCOMPARE(d.records.size(), std::size_t(1));
        QCOMPARE(s.state.violations.size(), std::size_t(2));
        const state::ViolationRecord &v = s.state.violations[1];
        QCOMPARE(v.kind, ViolationKind::RankStalled);
        QCOMPARE(v.collective.sides.size(), std::size_t(2));
        QCOMPARE(v.collective.sides[1].position, CollectivePosition::Finished);
        QCOMPARE(v.location.line, 77u);
        QVERIFY(v.fix.find("DistributedSampler") != std::string::npos);
        // Diagnosed again (a snapshot written after a diagnosis): the same row, nothing added.
        auto again = sessioncore::diagnoseJob(s);
        QVERIFY(again.records.empty());
        QCOMPARE(s.state.violations.size(), std::size_t(2));
        // A bad threshold is said, naming the variable; the default is kept.
        ::setenv("SHARDSCOPE_STALL_SECONDS", "soon", 1);
        std::string error;
        QCOMPARE(sessioncore::stallNsFromEnvironment(7, &error), std::uint64_t(7));
        QVERIFY(error.find("SHARDSCOPE_STALL_SECONDS is `soon`") != std::string::npos);
        ::unsetenv("SHARDSCOPE_STALL_SECONDS");
    }
};

QTEST_APPLESS_MAIN(TestCollectiveAligner)
#include "tst_collectivealigner.moc"

// One snapshot of a job from its rank processes' snapshots (wire/jobmerge.h).

#include <QTemporaryDir>
#include <QTest>

#include "wire/atomicfile.h"
#include "wire/snapshot.h"

#include "testevents.h"
#include "wire/jobmerge.h"

using namespace shardscope;

namespace {

// The snapshot one rank process of a 2-rank job sends: its rank's statuses and violations.
wire::Snapshot part(int rank)
{
    wire::Snapshot s;
    s.meta.pid = 100 + rank;
    s.meta.endpoint = "unix:/r" + std::to_string(rank);
    state::EngineState &st = s.state;
    st.modelName = "TinyLM";
    st.worldSize = 2;
    st.step = static_cast<std::uint32_t>(3 + rank);
    st.localRanks = {rank};
    st.modules = {state::ModuleRecord{0, "", "TinyLM", kNoModule},
                  state::ModuleRecord{1, "embed", "Embedding", 0},
                  state::ModuleRecord{2, "lm_head", "Head", 0}};
    state::ParamRecord p;
    p.id = 0;
    p.name = "embed.weight";
    p.owner = 1;
    p.status = {ParamStatus::NotAvailable, ParamStatus::NotAvailable};
    p.status[static_cast<std::size_t>(rank)] =
        rank == 0 ? ParamStatus::Available : ParamStatus::Inflight;
    p.gatherCount = 2;
    p.gatherBytes = 100;
    p.externals = {state::ExternalRecord{2, true}};
    st.params = {p};
    state::ViolationRecord v;
    v.rank = rank;
    v.accessor = 2;
    v.param = 0;
    v.count = 1;
    st.violations = {v};
    s.events = {test::eventAt(rank == 0 ? 20 : 10, rank, telemetry::makeStepBegin(), 0)};
    s.droppedEvents = 1;
    return s;
}

} // namespace

class TestJobMerge : public QObject
{
    Q_OBJECT

  private slots:
    void ranksComeFromTheirProcess()
    {
        auto merged = wire::mergeJobSnapshots({part(0), part(1)}, "j");
        QVERIFY2(merged, merged ? "" : merged.error().c_str());
        const state::EngineState &st = merged->state;
        QCOMPARE(st.localRanks, (std::vector<int>{0, 1}));
        QCOMPARE(st.params[0].status,
                 (std::vector<ParamStatus>{ParamStatus::Available, ParamStatus::Inflight}));
        QCOMPARE(st.params[0].gatherCount, std::uint64_t(4));
        QCOMPARE(st.params[0].externals.size(), std::size_t(1));
        QCOMPARE(st.violations.size(), std::size_t(2));
        QCOMPARE(st.step, 4u);
        QCOMPARE(merged->events.size(), std::size_t(2));
        QCOMPARE(merged->events[0].rank, std::uint16_t(1)); // ordered by time
        QCOMPARE(merged->droppedEvents, std::uint64_t(2));
        QCOMPARE(merged->meta.endpoint, std::string("job:j"));
    }

    // Issue 53: the files each rank process wrote (run.rank{rank}.json) open as one job with
    // the live job's merge; the job is named after the files; two files holding one rank
    // (two runs' files mixed up) and a file that is not a snapshot are refused, naming them.
    void aJobFromItsRanksFiles()
    {
        QTemporaryDir dir;
        const std::string base = dir.path().toStdString() + "/run.rank";
        for (int rank = 0; rank < 2; ++rank)
            QVERIFY(wire::writeFileAtomically(base + std::to_string(rank) + ".json",
                                              wire::encodeSnapshot(part(rank))));
        auto merged = wire::mergeSnapshotFiles({base + "1.json", base + "0.json"});
        QVERIFY2(merged, merged ? "" : merged.error().c_str());
        auto live = wire::mergeJobSnapshots({part(1), part(0)}, "run");
        QVERIFY(live);
        QCOMPARE(merged->state.localRanks, (std::vector<int>{0, 1}));
        QCOMPARE(merged->state.params[0].status, live->state.params[0].status);
        QCOMPARE(merged->state.violations.size(), live->state.violations.size());
        QCOMPARE(merged->events.size(), live->events.size());
        QCOMPARE(merged->meta.endpoint, std::string("files:run"));

        auto twice = wire::mergeSnapshotFiles({base + "0.json", base + "1.json", base + "0.json"});
        QVERIFY(!twice);
        QVERIFY2(twice.error().find("run.rank0.json` and `") != std::string::npos &&
                     twice.error().find("both hold rank 0") != std::string::npos,
                 twice.error().c_str());
        QVERIFY(wire::writeFileAtomically(base + "2.json", "{\"not\": \"a snapshot\"}"));
        auto bad = wire::mergeSnapshotFiles({base + "0.json", base + "2.json"});
        QVERIFY(!bad);
        QVERIFY2(bad.error().starts_with("cannot open `" + base +
                                         "2.json` as a ShardScope "
                                         "snapshot: "),
                 bad.error().c_str());
        wire::Snapshot other = part(1);
        other.state.worldSize = 4; // another run's file
        QVERIFY(wire::writeFileAtomically(base + "3.json", wire::encodeSnapshot(other)));
        auto mixed = wire::mergeSnapshotFiles({base + "0.json", base + "3.json"});
        QVERIFY(!mixed);
        QVERIFY2(mixed.error().find("run.rank3.json`") != std::string::npos, mixed.error().c_str());
    }

    // A process that observes part of the model lists only its parameters: the merge keeps
    // every part's, in id order, but not one whose owner the merged tree lacks.
    void parametersOfEveryPartAreKept()
    {
        wire::Snapshot a = part(0);
        wire::Snapshot b = part(1);
        state::ParamRecord extra = b.state.params[0];
        extra.id = 7;
        extra.name = "lm_head.weight";
        extra.owner = 2;
        extra.gatherCount = 5;
        state::ParamRecord stray = extra;
        stray.id = 8;
        stray.owner = 40; // no such module in part 0's tree
        b.state.params = {extra, stray};
        state::ParamRecord mid = a.state.params[0];
        mid.id = 9;
        a.state.params.push_back(mid);
        const state::EngineState *parts[] = {&a.state, &b.state};
        const std::string names[] = {"a", "b"};
        auto merged = wire::mergeJobStates(parts, names);
        QVERIFY2(merged, merged ? "" : merged.error().c_str());
        QCOMPARE(merged->params.size(), std::size_t(3));
        QCOMPARE(merged->params[0].id, ParamId(0));
        QCOMPARE(merged->params[1].id, ParamId(7));
        QCOMPARE(merged->params[1].name, std::string("lm_head.weight"));
        QCOMPARE(merged->params[1].gatherCount, std::uint64_t(5));
        QCOMPARE(merged->params[1].status[1], ParamStatus::Inflight);
        QCOMPARE(merged->params[2].id, ParamId(9));
    }

    void processesOfDifferentJobsAreRefused()
    {
        wire::Snapshot other = part(1);
        other.state.worldSize = 4;
        auto merged = wire::mergeJobSnapshots({part(0), other}, "j");
        QVERIFY(!merged);
        QVERIFY2(merged.error().find("not one job") != std::string::npos, merged.error().c_str());
        QVERIFY(!wire::mergeJobSnapshots({}, "j"));
    }

    // Issue #49, defect 8: the model's name is no part of a job's identity. While the ranks
    // build the model one names it provisionally and another finally (DeepSpeed's zero.Init
    // lists parameters before the name is final): one job, whichever comes first, named by
    // the final name.
    void modelNamesThatDifferWhileBuildingAreOneJob()
    {
        wire::Snapshot building = part(1);
        building.state.modelName = "TinyLM (model not built yet: shown once zero.Init or "
                                   "deepspeed.initialize has run)";
        auto merged = wire::mergeJobSnapshots({part(0), building}, "j");
        QVERIFY2(merged, merged ? "" : merged.error().c_str());
        QCOMPARE(merged->state.modelName, std::string("TinyLM"));
        QCOMPARE(merged->state.localRanks, (std::vector<int>{0, 1}));
        auto reversed = wire::mergeJobSnapshots({building, part(0)}, "j");
        QVERIFY2(reversed, reversed ? "" : reversed.error().c_str());
        QCOMPARE(reversed->state.localRanks, (std::vector<int>{0, 1}));
        QCOMPARE(reversed->state.modelName, std::string("TinyLM"));
        // An FSDP2 rank between fully_shard on its blocks and on the model: no parameters
        // listed yet, its name provisional.
        wire::Snapshot sharding = part(1);
        sharding.state.params.clear();
        sharding.state.modelName = "(model not sharded yet: shown once fully_shard's root runs "
                                   "its first forward or attach(model))";
        auto early = wire::mergeJobSnapshots({sharding, part(0)}, "j");
        QVERIFY2(early, early ? "" : early.error().c_str());
        QCOMPARE(early->state.modelName, std::string("TinyLM"));
        QCOMPARE(early->state.localRanks, (std::vector<int>{0, 1}));
        // Another world size is another job, as before.
        wire::Snapshot other = part(1);
        other.state.worldSize = 4;
        auto refused = wire::mergeJobSnapshots({part(0), other}, "j");
        QVERIFY(!refused);
        QCOMPARE(QString::fromStdString(refused.error()),
                 QString("the process 101 (unix:/r1) runs a world of 4 ranks, the others 2: not "
                         "one job; attach to it on its own (its endpoint, not job:NAME)"));
    }

    // Issue #30, defect 11: a process that failed or stopped before its model was built
    // lists no parameters and the agent's provisional name; it is one of the job, not
    // another (a capture of the job refused it and wrote nothing), whichever comes first.
    void aProcessWhoseModelIsNotBuiltYetBelongsToTheJob()
    {
        wire::Snapshot early = part(1);
        early.state.modelName = "TinyLM (model not built yet: shown once zero.Init or "
                                "deepspeed.initialize has run)";
        early.state.modules.resize(1);
        early.state.params.clear();
        for (const auto &parts : {std::vector{part(0), early}, std::vector{early, part(0)}}) {
            auto merged = wire::mergeJobSnapshots(parts, "j");
            QVERIFY2(merged, merged ? "" : merged.error().c_str());
            QCOMPARE(merged->state.modelName, std::string("TinyLM"));
            QCOMPARE(merged->state.params.size(), std::size_t(1));
            QCOMPARE(merged->state.localRanks, (std::vector<int>{0, 1}));
            QCOMPARE(merged->state.step, 4u);
        }
    }

    // Gather figures of a parameter: counts, bytes and times summed over the processes, the
    // last gather the newest of any, active modules the union (each once).
    void gatherFiguresAreSummedAndActiveModulesUnited()
    {
        wire::Snapshot a = part(0);
        wire::Snapshot b = part(1);
        state::ParamRecord &pa = a.state.params[0];
        pa.gatherCount = 2;
        pa.gatherBytes = 100;
        pa.gatherNs = 1'000;
        pa.lastGatherTsNs = 9'000; // the newest is the first part's
        pa.activeModules = {1};
        state::ParamRecord &pb = b.state.params[0];
        pb.gatherCount = 3;
        pb.gatherBytes = 250;
        pb.gatherNs = 30'000;
        pb.lastGatherTsNs = 4'000;
        pb.activeModules = {2, 1};
        const state::EngineState *parts[] = {&a.state, &b.state};
        const std::string names[] = {"a", "b"};
        auto merged = wire::mergeJobStates(parts, names);
        QVERIFY2(merged, merged ? "" : merged.error().c_str());
        const state::ParamRecord &p = merged->params[0];
        QCOMPARE(p.gatherCount, std::uint64_t(5));
        QCOMPARE(p.gatherBytes, std::uint64_t(350));
        QCOMPARE(p.gatherNs, std::uint64_t(31'000));
        QCOMPARE(p.lastGatherTsNs, std::uint64_t(9'000));
        QCOMPARE(p.activeModules, (std::vector<ModuleId>{1, 2}));

        // The other order: the newest last gather is the second part's.
        const state::EngineState *swapped[] = {&b.state, &a.state};
        auto other = wire::mergeJobStates(swapped, names);
        QVERIFY2(other, other ? "" : other.error().c_str());
        QCOMPARE(other->params[0].gatherBytes, std::uint64_t(350));
        QCOMPARE(other->params[0].lastGatherTsNs, std::uint64_t(9'000));
        QCOMPARE(other->params[0].activeModules, (std::vector<ModuleId>{2, 1}));
    }

    // Two parts may list one violation for the same rank (one process reached through two
    // endpoints, an earlier and a later capture of it): each record is that rank's total so
    // far, so the merge keeps one entry for the rank, the larger total, whichever part comes
    // first; the other ranks' entries of the violation stay beside it.
    void aViolationTwoProcessesListForOneRankIsTheLargerTotal()
    {
        wire::Snapshot a = part(0);
        wire::Snapshot b = part(1);
        state::ViolationRecord seenByA = b.state.violations[0]; // rank 1's row, listed by a
        seenByA.count = 5;
        seenByA.step = 2;
        seenByA.lastStep = 7;
        a.state.violations.push_back(seenByA);
        b.state.violations[0].count = 3;
        b.state.violations[0].step = 2;
        b.state.violations[0].lastStep = 4;
        const std::string names[] = {"a", "b"};
        for (bool aFirst : {true, false}) {
            const state::EngineState *parts[] = {aFirst ? &a.state : &b.state,
                                                 aFirst ? &b.state : &a.state};
            auto merged = wire::mergeJobStates(parts, names);
            QVERIFY2(merged, merged ? "" : merged.error().c_str());
            QCOMPARE(merged->violations.size(), std::size_t(2)); // one row, ranks 0 and 1
            std::uint64_t rank0 = 0, rank1 = 0;
            std::uint32_t rank1Last = 0;
            for (const state::ViolationRecord &v : merged->violations) {
                QCOMPARE(v.accessor, ModuleId(2));
                QCOMPARE(v.param, ParamId(0));
                if (v.rank == 0) rank0 = v.count;
                if (v.rank == 1) {
                    rank1 = v.count;
                    rank1Last = v.lastStep;
                }
            }
            QCOMPARE(rank0, std::uint64_t(1));
            QCOMPARE(rank1, std::uint64_t(5));
            QCOMPARE(rank1Last, 7u);
        }
    }
};

QTEST_GUILESS_MAIN(TestJobMerge)
#include "tst_jobmerge.moc"

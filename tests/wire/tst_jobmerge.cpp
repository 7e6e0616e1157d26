// One snapshot of a job from its rank processes' snapshots (wire/jobmerge.h).

#include <QTest>

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
};

QTEST_GUILESS_MAIN(TestJobMerge)
#include "tst_jobmerge.moc"

// A SessionStore fed by several processes of one job (its sources): their states are merged
// onto global ranks, never replace each other (a lost process keeps its part), and a state of
// another job changes nothing.

#include <QtTest>

#include "session/sessionstore.h"

using namespace shardscope;

namespace {

// What the process running `rank` of a `world`-rank job sends: its rank's view.
state::EngineState rankState(int rank, ParamStatus mine, std::uint64_t gathers, int world = 2)
{
    state::EngineState st;
    st.modelName = "TinyLM";
    st.worldSize = world;
    st.backend = "gloo";
    st.step = 5;
    st.localRanks = {rank};
    st.modules = {state::ModuleRecord{0, "", "TinyLM", kNoModule},
                  state::ModuleRecord{1, "embed", "Embedding", 0}};
    state::ParamRecord p;
    p.id = 0;
    p.name = "embed.weight";
    p.owner = 1;
    p.status.assign(static_cast<std::size_t>(world), ParamStatus::NotAvailable);
    p.status[static_cast<std::size_t>(rank)] = mine;
    p.gatherCount = gathers;
    st.params = {p};
    state::ViolationRecord v;
    v.rank = rank;
    v.accessor = 1;
    v.param = 0;
    v.count = 1;
    st.violations = {v};
    return st;
}

} // namespace

class TestSourceStates : public QObject
{
    Q_OBJECT

  private slots:
    void statesOfTheJobsProcessesAreMerged()
    {
        session::SessionStore store;
        QCOMPARE(store.applySourceState(0, rankState(0, ParamStatus::Available, 2), "rank 0"),
                 QString());
        QCOMPARE(store.applySourceState(1, rankState(1, ParamStatus::Inflight, 3), "rank 1"),
                 QString());
        store.mergeSources();
        store.flush();
        QVERIFY(store.hasState());
        QCOMPARE(store.state().localRanks, (std::vector<int>{0, 1}));
        const state::ParamRecord *p = store.param(0);
        QVERIFY(p);
        QCOMPARE(p->status,
                 (std::vector<ParamStatus>{ParamStatus::Available, ParamStatus::Inflight}));
        QCOMPARE(p->gatherCount, std::uint64_t(5));
        // One violation row, seen on both ranks.
        QCOMPARE(store.violationGroups().size(), std::size_t(1));
        QCOMPARE(store.violationGroups()[0].rankMask(), std::uint64_t(3));

        // A newer state of rank 0's process replaces only its part.
        QCOMPARE(store.applySourceState(0, rankState(0, ParamStatus::NotAvailable, 4)), QString());
        store.mergeSources();
        p = store.param(0);
        QCOMPARE(p->status,
                 (std::vector<ParamStatus>{ParamStatus::NotAvailable, ParamStatus::Inflight}));
        QCOMPARE(p->gatherCount, std::uint64_t(7));

        // A process of another job is refused and changes nothing.
        state::EngineState other = rankState(1, ParamStatus::Available, 9);
        other.worldSize = 4;
        const QString err = store.applySourceState(2, std::move(other), "tcp:elsewhere:1");
        QVERIFY2(err.contains(QStringLiteral("not one job")), qPrintable(err));
        QVERIFY(!store.hasSourceState(2));
        store.mergeSources();
        QCOMPARE(store.param(0)->gatherCount, std::uint64_t(7));

        // Dropped events are each process's own total, summed.
        store.setSourceDropped(0, 3);
        store.setSourceDropped(1, 4);
        store.setSourceDropped(0, 5);
        QCOMPARE(store.droppedEvents(), std::uint64_t(9));
    }

    // A job's processes attach together: their first states come within one merge interval.
    // The coalesced merge shows every one of them without being forced, and a process that is
    // then lost (it sends nothing more) keeps its part through the others' later merges.
    void aLostProcessKeepsItsPartOfTheJob()
    {
        session::SessionStore store;
        store.setRefreshIntervalMs(10);
        for (int r = 0; r < 3; ++r)
            QCOMPARE(store.applySourceState(r, rankState(r, ParamStatus::Inflight, 1, 3)),
                     QString());
        QTRY_COMPARE_WITH_TIMEOUT(store.state().localRanks, (std::vector<int>{0, 1, 2}), 5000);

        // Rank 1's process is killed at step 5; the others go on and send newer states.
        for (int r : {0, 2}) {
            state::EngineState later = rankState(r, ParamStatus::Available, 4, 3);
            later.step = 6;
            QCOMPARE(store.applySourceState(r, std::move(later)), QString());
        }
        store.mergeSources();
        QCOMPARE(store.step(), std::uint32_t(6));
        QCOMPARE(store.state().localRanks, (std::vector<int>{0, 1, 2}));
        const state::ParamRecord *p = store.param(0);
        QVERIFY(p);
        QCOMPARE(p->status, (std::vector<ParamStatus>{ParamStatus::Available, ParamStatus::Inflight,
                                                      ParamStatus::Available}));
        QCOMPARE(p->gatherCount, std::uint64_t(9));
        QCOMPARE(store.violationGroups().size(), std::size_t(1));
        QCOMPARE(store.violationGroups()[0].rankMask(), std::uint64_t(7));
    }

    // Issue #49, defect 8: attached while its ranks build the model, one process names it
    // provisionally (the agent's "(model not built yet: ...)"), the other finally. One job,
    // whichever comes first: the model's name is no part of its identity.
    void aProcessStillBuildingItsModelIsOfTheJob()
    {
        for (int first : {0, 1}) {
            session::SessionStore store;
            const auto stateOf = [](int rank) {
                state::EngineState st = rankState(rank, ParamStatus::Available, 1);
                if (rank == 1)
                    st.modelName = "TinyLM (model not built yet: shown once zero.Init or "
                                   "deepspeed.initialize has run)";
                return st;
            };
            QCOMPARE(store.applySourceState(first, stateOf(first)), QString());
            QCOMPARE(store.applySourceState(1 - first, stateOf(1 - first)), QString());
            store.mergeSources();
            QCOMPARE(store.state().localRanks, (std::vector<int>{0, 1}));
            QVERIFY(store.hasSourceState(0) && store.hasSourceState(1));
            QCOMPARE(store.state().modelName, std::string("TinyLM"));
        }
    }
};

QTEST_GUILESS_MAIN(TestSourceStates)
#include "tst_sourcestates.moc"

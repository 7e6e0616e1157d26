#include <QtTest>

#include <map>

#include "telemetry/eventfields.h"
#include "testworld.h"

using namespace shardscope;

// A small model: root -> enc (owns enc.weight) -> enc.inner (owns enc.inner.weight); dec (owns
// dec.weight, dec.bias small)
struct Model
{
    std::unique_ptr<core::Engine> engine;
    test::MemorySink sink;
    ModuleId enc = 0, inner = 0, dec = 0;
    ParamId encW = 0, innerW = 0, decW = 0, decB = 0;

    explicit Model(int world, core::EngineConfig cfg = {})
    {
        cfg.persistenceThreshold = 8;
        engine = test::makeEngine(world, cfg);
        enc = engine->addModule(engine->root(), "enc", "Block");
        inner = engine->addModule(enc, "inner", "Linear");
        dec = engine->addModule(engine->root(), "dec", "Linear");
        auto v = test::iota(100);
        encW = engine->addParameter(enc, "weight", {10, 10}, DType::F32, v.data());
        innerW = engine->addParameter(inner, "weight", {5, 7}, DType::F32, v.data());
        decW = engine->addParameter(dec, "weight", {3, 11}, DType::F32, v.data());
        decB = engine->addParameter(dec, "bias", {3}, DType::F32, v.data());
        engine->partition();
        engine->setEventSink(&sink);
    }
    int world() const { return engine->worldSize(); }
};

class TestCoordinator : public QObject
{
    Q_OBJECT
  private slots:
    void gatherOnEntryReleaseOnExit();
    void stateGatherTimesAreTheEventsTimes();
    void nestedModules();
    void sharedParamStaysUntilBothLeave();
    void persistentNeverMoves();
    void prefetchOnStepTwo();
    void prefetchRespectsMaxLive();
    void prefetchBucketBoundsLookahead();
    void changedOrderInvalidatesTrace();
    void exitOutOfOrderIsAnError();
    void releaseWhileActiveIsAnError();
    void unregisterWhatIsNotRegistered();
};

void TestCoordinator::gatherOnEntryReleaseOnExit()
{
    Model m(4);
    std::vector<int> ok(4, 0);
    m.engine->forEachLocalRank([&](int r) {
        core::Engine &e = *m.engine;
        e.beginStep(r);
        bool good = e.status(r, m.decW) == ParamStatus::NotAvailable;
        e.enterModule(r, m.dec, Phase::Forward);
        good = good && e.status(r, m.decW) == ParamStatus::Available;
        const float *w = e.access(r, m.decW).f32();
        good = good && w[0] == 1.0f && w[32] == 33.0f;
        good = good && e.activeModules(r, m.decW) == std::vector<ModuleId>{m.dec};
        e.exitModule(r, m.dec, Phase::Forward);
        good = good && e.status(r, m.decW) == ParamStatus::NotAvailable;
        good = good && e.activeModules(r, m.decW).empty();
        e.endStep(r, 1.0);
        ok[r] = good;
    });
    for (int r = 0; r < 4; ++r)
        QVERIFY2(ok[r], qPrintable(QString("rank %1").arg(r)));
    QCOMPARE(m.sink.ofType(EventType::FetchEnd).size(), std::size_t(4));
    QCOMPARE(m.sink.ofType(EventType::Release).size(), std::size_t(4));
    const telemetry::Event fetch = m.sink.ofType(EventType::FetchBegin, 2).front();
    QCOMPARE(telemetry::readFetch(fetch).param, m.decW);
    QCOMPARE(telemetry::readFetch(fetch).cause, m.dec);
    QCOMPARE(telemetry::readFetch(fetch).reason, FetchReason::Forward);
    QCOMPARE(telemetry::readFetch(fetch).bytes, std::uint64_t(36 * 4)); // 33 padded to 36 floats
    QCOMPARE(fetch.step, 1u);
}

void TestCoordinator::nestedModules()
{
    Model m(3);
    std::vector<int> ok(3, 0);
    m.engine->forEachLocalRank([&](int r) {
        core::Engine &e = *m.engine;
        e.beginStep(r);
        core::ModuleScope outer(e, r, m.enc, Phase::Forward);
        bool good = e.status(r, m.encW) == ParamStatus::Available &&
                    e.status(r, m.innerW) == ParamStatus::NotAvailable;
        {
            core::ModuleScope in(e, r, m.inner, Phase::Forward);
            good = good && e.status(r, m.innerW) == ParamStatus::Available;
            // the parent's parameter is readable from the child: its owner is on the stack
            good = good && e.access(r, m.encW).f32()[99] == 100.0f;
        }
        good = good && e.status(r, m.innerW) == ParamStatus::NotAvailable &&
               e.status(r, m.encW) == ParamStatus::Available;
        ok[r] = good;
    });
    for (int r = 0; r < 3; ++r)
        QVERIFY(ok[r]);
    QVERIFY(m.engine->violations().empty());
}

void TestCoordinator::sharedParamStaysUntilBothLeave()
{
    Model m(2);
    m.engine->registerExternalParameter(m.inner, m.encW);
    std::vector<int> ok(2, 0);
    m.engine->forEachLocalRank([&](int r) {
        core::Engine &e = *m.engine;
        e.beginStep(r);
        e.enterModule(r, m.enc, Phase::Forward);
        e.enterModule(r, m.inner, Phase::Forward);
        auto act = e.activeModules(r, m.encW);
        bool good = act.size() == 2;
        e.exitModule(r, m.inner, Phase::Forward);
        good = good && e.status(r, m.encW) == ParamStatus::Available;
        e.exitModule(r, m.enc, Phase::Forward);
        good = good && e.status(r, m.encW) == ParamStatus::NotAvailable;
        e.endStep(r, 0.0);
        ok[r] = good;
    });
    QVERIFY(ok[0] && ok[1]);
    // gathered once per rank, not twice
    QCOMPARE(m.sink.ofType(EventType::FetchEnd, 0).size(),
             std::size_t(2)); // enc.weight, inner.weight
}

void TestCoordinator::persistentNeverMoves()
{
    Model m(4);
    QVERIFY(m.engine->param(m.decB).persistent);
    m.engine->forEachLocalRank([&](int r) {
        core::Engine &e = *m.engine;
        for (int s = 0; s < 2; ++s) {
            e.beginStep(r);
            {
                core::ModuleScope sc(e, r, m.dec, Phase::Forward);
                (void)e.access(r, m.decB);
            }
            e.refreshPersistent(r);
            e.endStep(r, 0.0);
        }
    });
    QVERIFY(!m.sink.ofType(EventType::FetchBegin).empty());
    for (const telemetry::Event &ev : m.sink.events()) {
        if (ev.type == EventType::FetchBegin) QVERIFY(telemetry::readFetch(ev).param != m.decB);
        if (ev.type == EventType::Release) QVERIFY(telemetry::readRelease(ev).param != m.decB);
    }
    for (int r = 0; r < 4; ++r)
        QCOMPARE(m.engine->status(r, m.decB), ParamStatus::Available);
}

static void runForward(Model &m, int r, bool decFirst = false)
{
    core::Engine &e = *m.engine;
    e.beginStep(r);
    auto enc = [&] {
        core::ModuleScope a(e, r, m.enc, Phase::Forward);
        core::ModuleScope b(e, r, m.inner, Phase::Forward);
    };
    auto dec = [&] { core::ModuleScope c(e, r, m.dec, Phase::Forward); };
    if (decFirst) {
        dec();
        enc();
    } else {
        enc();
        dec();
    }
    e.endStep(r, 0.0);
}

// Issue #13 (docs/protocol.md, "Timestamps in State"): a parameter's gather_ns is the sum of
// fetch_end.ts_ns - fetch_begin.ts_ns over its gathers, last_gather_ts_ns its newest
// fetch_end's ts_ns: the engine stamps both records with the instants it measures.
void TestCoordinator::stateGatherTimesAreTheEventsTimes()
{
    Model m(2);
    for (int s = 0; s < 2; ++s)
        m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
    std::map<std::pair<int, ParamId>, std::uint64_t> open;
    std::map<ParamId, std::uint64_t> ns, last;
    for (const telemetry::Event &e : m.sink.events()) {
        if (e.type == EventType::FetchBegin) open[{e.rank, telemetry::readFetch(e).param}] = e.tsNs;
        if (e.type != EventType::FetchEnd) continue;
        const ParamId p = telemetry::readFetch(e).param;
        ns[p] += e.tsNs - open.at({e.rank, p});
        last[p] = std::max(last[p], e.tsNs);
    }
    QVERIFY(!ns.empty());
    for (const state::ParamRecord &p : m.engine->state().params) {
        QCOMPARE(p.gatherNs, ns[p.id]);
        QCOMPARE(p.lastGatherTsNs, last[p.id]);
    }
}

void TestCoordinator::prefetchOnStepTwo()
{
    Model m(2);
    m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
    QVERIFY(m.sink.ofType(EventType::TraceRecorded, 0).size() == 1);
    for (const telemetry::Event &ev : m.sink.ofType(EventType::FetchBegin))
        QVERIFY(telemetry::readFetch(ev).reason != FetchReason::Prefetch);
    m.sink.clear();
    m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
    // step 2: entering enc prefetches what the trace says comes next (inner, dec)
    std::vector<ParamId> prefetched;
    for (const telemetry::Event &ev : m.sink.ofType(EventType::FetchBegin, 1))
        if (telemetry::readFetch(ev).reason == FetchReason::Prefetch)
            prefetched.push_back(telemetry::readFetch(ev).param);
    std::sort(prefetched.begin(), prefetched.end());
    QCOMPARE(prefetched, (std::vector<ParamId>{m.innerW, m.decW}));
    for (const telemetry::Event &ev : m.sink.ofType(EventType::FetchBegin))
        QCOMPARE(ev.step, 2u);
    // prefetched params are fetched exactly once in step 2
    QCOMPARE(m.sink.ofType(EventType::FetchBegin, 1).size(), std::size_t(3));
    QVERIFY(m.engine->violations().empty());
}

void TestCoordinator::prefetchRespectsMaxLive()
{
    core::EngineConfig cfg;
    cfg.maxLiveParameters = 110; // enc.weight (100) fits, nothing more
    Model m(2, cfg);
    m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
    m.sink.clear();
    m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
    // Step 2 on each rank: enc, inner and dec fetch their weights on entry (dec.bias is
    // persistent), none ahead of time, since after enc.weight nothing more fits.
    const std::vector<telemetry::Event> fetches = m.sink.ofType(EventType::FetchBegin);
    QCOMPARE(fetches.size(), std::size_t(2 * 3));
    for (int r = 0; r < 2; ++r) {
        std::vector<ParamId> fetched;
        for (const telemetry::Event &ev : m.sink.ofType(EventType::FetchBegin, r)) {
            QCOMPARE(telemetry::readFetch(ev).reason, FetchReason::Forward);
            fetched.push_back(telemetry::readFetch(ev).param);
        }
        QCOMPARE(fetched, (std::vector<ParamId>{m.encW, m.innerW, m.decW}));
    }
}

// Index of the first event on rank 0 matching pred, or -1.
template <typename Pred> static int firstIndex(const std::vector<telemetry::Event> &evs, Pred pred)
{
    for (std::size_t i = 0; i < evs.size(); ++i)
        if (evs[i].rank == 0 && pred(evs[i])) return static_cast<int>(i);
    return -1;
}

void TestCoordinator::prefetchBucketBoundsLookahead()
{
    for (std::int64_t bucket : {std::int64_t(1000), std::int64_t(30)}) {
        core::EngineConfig cfg;
        cfg.prefetchBucketSize = bucket;
        Model m(2, cfg);
        m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
        m.sink.clear();
        m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
        const auto evs = m.sink.events();
        const int decPrefetch = firstIndex(evs, [&](const telemetry::Event &e) {
            return e.type == EventType::FetchBegin && telemetry::readFetch(e).param == m.decW &&
                   telemetry::readFetch(e).reason == FetchReason::Prefetch;
        });
        const int innerEnter = firstIndex(evs, [&](const telemetry::Event &e) {
            return e.type == EventType::ModuleEnter && telemetry::readModule(e).module == m.inner;
        });
        QVERIFY(decPrefetch >= 0 && innerEnter >= 0);
        if (bucket == 1000) // everything ahead fits: dec is prefetched on entering enc
            QVERIFY(decPrefetch < innerEnter);
        else // inner's 36 elements fill the bucket: dec waits until inner has used its prefetch
            QVERIFY(decPrefetch > innerEnter);
    }
}

void TestCoordinator::changedOrderInvalidatesTrace()
{
    Model m(2);
    m.engine->forEachLocalRank([&](int r) { runForward(m, r); });
    m.engine->forEachLocalRank([&](int r) { runForward(m, r, /*decFirst=*/true); });
    auto inv = m.sink.ofType(EventType::TraceInvalidated, 0);
    QCOMPARE(inv.size(), std::size_t(1));
    QCOMPARE(inv[0].step, 2u);
    QCOMPARE(telemetry::readTraceInvalidated(inv[0]).expected, m.enc);
    QCOMPARE(telemetry::readTraceInvalidated(inv[0]).got, m.dec);
    const auto vs = m.engine->violations();
    auto it = std::find_if(vs.begin(), vs.end(), [](const state::ViolationRecord &v) {
        return v.kind == ViolationKind::TraceInvalidated && v.rank == 0;
    });
    QVERIFY(it != vs.end());
    QCOMPARE(it->step, 2u);
    QVERIFY2(it->message.find("expected module `enc`, got `dec`") != std::string::npos,
             it->message.c_str());
    // the new order is re-recorded: step 3 in the new order has no invalidation
    m.sink.clear();
    m.engine->forEachLocalRank([&](int r) { runForward(m, r, true); });
    QVERIFY(m.sink.ofType(EventType::TraceInvalidated).empty());
}

void TestCoordinator::exitOutOfOrderIsAnError()
{
    Model m(1);
    core::Engine &e = *m.engine;
    e.beginStep(0);
    e.enterModule(0, m.enc, Phase::Forward);
    e.enterModule(0, m.inner, Phase::Forward);
    try {
        e.exitModule(0, m.enc, Phase::Forward);
        QFAIL("no error");
    } catch (const core::EngineError &err) {
        QVERIFY2(std::string(err.what()).find("innermost module is 'enc.inner'") !=
                     std::string::npos,
                 err.what());
    }
}

void TestCoordinator::releaseWhileActiveIsAnError()
{
    Model m(2);
    m.engine->forEachLocalRank([&](int r) {
        m.engine->beginStep(r);
        m.engine->enterModule(r, m.dec, Phase::Forward);
    });
    try {
        m.engine->removeParameter(m.decW);
        QFAIL("no error");
    } catch (const core::EngineError &err) {
        const std::string msg = err.what();
        QVERIFY2(msg.find("dec.weight") != std::string::npos &&
                     msg.find("in use by dec") != std::string::npos,
                 err.what());
    }
}

void TestCoordinator::unregisterWhatIsNotRegistered()
{
    Model m(2);
    m.engine->registerExternalParameter(m.inner, m.decW);
    try {
        m.engine->unregisterExternalParameter(m.enc, m.decW);
        QFAIL("no error");
    } catch (const core::EngineError &err) {
        const std::string msg = err.what();
        QVERIFY2(msg.find("dec.weight is not registered on enc") != std::string::npos, err.what());
        QVERIFY2(msg.find("registered on: enc.inner") != std::string::npos, err.what());
    }
    m.engine->unregisterExternalParameter(m.inner, m.decW);
    QVERIFY(!m.engine->isExternal(0, m.inner, m.decW));
}

QTEST_APPLESS_MAIN(TestCoordinator)
#include "tst_coordinator.moc"

#include <QtTest>

#include "telemetry/eventfields.h"
#include "testworld.h"

using namespace shardscope;

struct OneParam
{
    std::unique_ptr<core::Engine> engine;
    ModuleId lin = 0;
    ParamId w = 0;
    std::vector<float> init = test::iota(10); // 10 elements: pads on 3 and 4 ranks

    explicit OneParam(int world)
    {
        core::EngineConfig cfg;
        cfg.persistenceThreshold = 0;
        engine = test::makeEngine(world, cfg);
        lin = engine->addModule(engine->root(), "lin", "Linear");
        w = engine->addParameter(lin, "weight", {2, 5}, DType::F32, init.data());
        engine->partition();
    }
    // Every rank's full tensor, gathered fresh from the shards.
    std::vector<std::vector<float>> gatherAll()
    {
        std::vector<std::vector<float>> out(engine->worldSize());
        engine->forEachLocalRank([&](int r) {
            core::GatheredParameters g(*engine, r, {w});
            out[r].assign(g[0].f32(), g[0].f32() + 10);
        });
        return out;
    }
};

class TestGatheredParameters : public QObject
{
    Q_OBJECT
  private slots:
    void gathersOnEntryReleasesOnExit();
    void modifierRankBroadcastsAndRepartitions_data();
    void modifierRankBroadcastsAndRepartitions();
    void broadcastCarriesThePaddedBytesAsFetchesDo();
    void processWideScopeFromBuildingCode();
    void writeWithoutModifierIsAnErrorAndChangesNothing();
    void nestedScopeIsAnError();
    void badModifierRank();
};

void TestGatheredParameters::gathersOnEntryReleasesOnExit()
{
    OneParam t(4);
    std::vector<int> ok(4);
    t.engine->forEachLocalRank([&](int r) {
        bool good;
        {
            core::GatheredParameters g(*t.engine, r, {t.w});
            good = t.engine->status(r, t.w) == ParamStatus::Available && g[0].f32()[9] == 10.0f;
            // reads inside the scope are not violations
            good = good && t.engine->access(r, t.w).f32()[3] == 4.0f;
        }
        ok[r] = good && t.engine->status(r, t.w) == ParamStatus::NotAvailable;
    });
    for (int r = 0; r < 4; ++r)
        QVERIFY(ok[r]);
    QVERIFY(t.engine->violations().empty());
}

void TestGatheredParameters::modifierRankBroadcastsAndRepartitions_data()
{
    QTest::addColumn<int>("world");
    QTest::addColumn<int>("modifier");
    QTest::newRow("w3 m0") << 3 << 0;
    QTest::newRow("w3 m2") << 3 << 2;
    QTest::newRow("w4 m1") << 4 << 1;
    QTest::newRow("w1 m0") << 1 << 0;
}

void TestGatheredParameters::modifierRankBroadcastsAndRepartitions()
{
    QFETCH(int, world);
    QFETCH(int, modifier);
    OneParam t(world);
    t.engine->forEachLocalRank([&](int r) {
        core::GatheredParameters g(*t.engine, r, {t.w}, modifier);
        float *full = g[0].f32();
        for (int i = 0; i < 10; ++i)
            full[i] = r == modifier ? 100.0f + static_cast<float>(i)
                                    : -1.0f; // other ranks' edits are lost
    });
    for (int r = 0; r < world; ++r) {
        const core::ParamInfo &info = t.engine->param(t.w);
        auto shard = t.engine->shardData(r, t.w);
        for (std::int64_t k = 0; k < info.layout.partitionNumel; ++k) {
            const std::int64_t gidx = info.layout.offset(r) + k;
            QCOMPARE(shard[k], gidx < 10 ? 100.0f + static_cast<float>(gidx) : 0.0f);
        }
    }
    for (const auto &full : t.gatherAll())
        for (int i = 0; i < 10; ++i)
            QCOMPARE(full[i], 100.0f + static_cast<float>(i));
}

// Issue #13: u0 of fetch_begin/fetch_end/release and broadcast is one number per parameter,
// the padded bytes (10 floats on 3 ranks pad to 12: 48 bytes, not 40).
void TestGatheredParameters::broadcastCarriesThePaddedBytesAsFetchesDo()
{
    OneParam t(3);
    test::MemorySink sink;
    t.engine->setEventSink(&sink);
    t.engine->forEachLocalRank([&](int r) { core::GatheredParameters g(*t.engine, r, {t.w}, 0); });
    const auto broadcasts = sink.ofType(EventType::Broadcast);
    const auto fetches = sink.ofType(EventType::FetchBegin);
    QCOMPARE(broadcasts.size(), std::size_t(3));
    QVERIFY(!fetches.empty());
    for (const telemetry::Event &e : broadcasts) {
        QCOMPARE(telemetry::readBroadcast(e).bytes, std::uint64_t(12 * 4));
        QCOMPARE(telemetry::readBroadcast(e).root, 0u);
    }
    QCOMPARE(telemetry::readFetch(fetches.front()).bytes, std::uint64_t(12 * 4));
    t.engine->setEventSink(nullptr);
}

void TestGatheredParameters::processWideScopeFromBuildingCode()
{
    OneParam t(3);
    {
        core::GatheredParameters g(*t.engine, {t.w}, 0);
        QCOMPARE(g[0].f32()[4], 5.0f);
        g[0].f32()[4] = 42.0f;
    }
    for (const auto &full : t.gatherAll())
        QCOMPARE(full[4], 42.0f);
}

void TestGatheredParameters::writeWithoutModifierIsAnErrorAndChangesNothing()
{
    OneParam t(2);
    std::vector<std::string> errors(2);
    t.engine->forEachLocalRank([&](int r) {
        try {
            core::GatheredParameters g(*t.engine, r, {t.w});
            if (r == 1) g[0].f32()[0] = 7.0f;
            g.close();
        } catch (const core::EngineError &e) {
            errors[r] = e.what();
        }
    });
    QVERIFY(errors[0].empty());
    QVERIFY2(errors[1].find("lin.weight was modified in place on rank 1 without modifier_rank") !=
                 std::string::npos,
             errors[1].c_str());
    QVERIFY2(errors[1].find("modifier_rank=") != std::string::npos, errors[1].c_str());
    for (const auto &full : t.gatherAll())
        QCOMPARE(full, t.init);
    const auto vs = t.engine->violations();
    QCOMPARE(vs.size(), std::size_t(1));
    QCOMPARE(vs[0].kind, ViolationKind::GatheredWriteWithoutModifier);
    QCOMPARE(vs[0].rank, 1);
}

void TestGatheredParameters::nestedScopeIsAnError()
{
    OneParam t(2);
    std::vector<std::string> errors(2);
    t.engine->forEachLocalRank([&](int r) {
        core::GatheredParameters outer(*t.engine, r, {t.w});
        try {
            core::GatheredParameters inner(*t.engine, r, {t.w});
        } catch (const core::EngineError &e) {
            errors[r] = e.what();
        }
    });
    for (const auto &e : errors)
        QVERIFY2(e.find("GatheredParameters over lin.weight is nested inside another") !=
                     std::string::npos,
                 e.c_str());
    // the outer scope still closed cleanly
    for (int r = 0; r < 2; ++r)
        QCOMPARE(t.engine->status(r, t.w), ParamStatus::NotAvailable);
}

void TestGatheredParameters::badModifierRank()
{
    OneParam t(2);
    QVERIFY_THROWS_EXCEPTION(core::EngineError, core::GatheredParameters(*t.engine, {t.w}, 5));
}

QTEST_APPLESS_MAIN(TestGatheredParameters)
#include "tst_gatheredparameters.moc"

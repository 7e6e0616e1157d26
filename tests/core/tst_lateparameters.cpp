#include <QtTest>

#include <cmath>
#include <source_location>

#include "testworld.h"

using namespace shardscope;

// Story 2: weight_norm replaces pos_conv.weight by weight_g / weight_v after partitioning.
struct ConvModel
{
    std::unique_ptr<core::Engine> engine;
    test::MemorySink sink;
    ModuleId conv = 0;
    ParamId weight = 0, bias = 0;
    std::uint_least32_t addedAt = 0; // the line that added weight_g

    explicit ConvModel(int world)
    {
        core::EngineConfig cfg;
        cfg.persistenceThreshold = 16;
        engine = test::makeEngine(world, cfg);
        engine->setEventSink(&sink);
        conv = engine->addModule(engine->root(), "pos_conv", "Conv1d");
        auto v = test::iota(4 * 2 * 3);
        weight = engine->addParameter(conv, "weight", {4, 2, 3}, DType::F32, v.data());
        bias = engine->addParameter(conv, "bias", {4}, DType::F32, v.data());
        engine->partition();
    }
    // weight_norm over dim 2: g[k] = ||w[:, :, k]||, v = w
    std::pair<ParamId, ParamId> weightNorm(const float *w)
    {
        float g[3] = {0, 0, 0};
        for (int i = 0; i < 24; ++i)
            g[i % 3] += w[i] * w[i];
        for (float &x : g)
            x = std::sqrt(x);
        const ParamId pg = engine->addParameter(conv, "weight_g", {1, 1, 3}, DType::F32, g);
        addedAt = std::source_location::current().line() - 1;
        const ParamId pv = engine->addParameter(conv, "weight_v", {4, 2, 3}, DType::F32, w);
        return {pg, pv};
    }
    void trainStep()
    {
        engine->forEachLocalRank([&](int r) {
            engine->beginStep(r);
            {
                core::ModuleScope s(*engine, r, conv, Phase::Forward);
            }
            engine->endStep(r, 0.0);
        });
    }
};

class TestLateParameters : public QObject
{
    Q_OBJECT
  private slots:
    void lateParametersAreDetected();
    void adoptionPartitionsThem();
    void storyWorkaroundGivesNoRecords();
};

void TestLateParameters::lateParametersAreDetected()
{
    ConvModel m(3);
    const auto w = m.engine->hostRead(m.weight); // the unguarded read of story 2
    std::vector<float> wf(24);
    std::memcpy(wf.data(), w.data(), w.size());
    auto [g, v] = m.weightNorm(wf.data());
    m.engine->removeParameter(m.weight);
    QVERIFY(m.engine->param(g).late);
    QVERIFY(!m.engine->param(v).partitioned);
    QCOMPARE(m.sink.ofType(EventType::LateParameter).size(), std::size_t(2 * 3));
    for (int r = 0; r < 3; ++r)
        QCOMPARE(m.engine->status(r, v), ParamStatus::Available); // whole on every rank

    m.trainStep();
    m.trainStep();
    QCOMPARE(m.engine->lateParameterCount(), std::uint64_t(2));
    std::vector<std::string> late;
    for (const auto &vr : m.engine->violations())
        if (vr.kind == ViolationKind::LateParameter && vr.rank == 0) {
            late.push_back(m.engine->param(vr.param).name);
            QCOMPARE(vr.count, std::uint64_t(2));
            QVERIFY2(vr.fix.find("register_external_parameter(pos_conv, ") != std::string::npos,
                     vr.fix.c_str());
            // where the late parameter was added: this file, the weight_norm helper's line
            QVERIFY2(vr.location.file.ends_with("tst_lateparameters.cpp"),
                     vr.location.file.c_str());
            QCOMPARE(vr.location.line, m.engine->param(vr.param).name == "pos_conv.weight_g"
                                           ? m.addedAt
                                           : m.addedAt + 2);
        }
    std::sort(late.begin(), late.end());
    QCOMPARE(late, (std::vector<std::string>{"pos_conv.weight_g", "pos_conv.weight_v"}));
    QCOMPARE(m.engine->findParam("pos_conv.weight"), kNoParam);
    // the unguarded read of the since-removed weight still names it
    const auto vs = m.engine->violations();
    auto read = std::find_if(vs.begin(), vs.end(), [](const state::ViolationRecord &vr) {
        return vr.kind == ViolationKind::UnregisteredAccess && vr.accessor == kNoModule;
    });
    QVERIFY(read != vs.end());
    QCOMPARE(read->paramName, std::string("pos_conv.weight"));
    const state::EngineState st = m.engine->state();
    QVERIFY(std::none_of(st.params.begin(), st.params.end(),
                         [&](const state::ParamRecord &r) { return r.id == read->param; }));
}

void TestLateParameters::adoptionPartitionsThem()
{
    ConvModel m(4);
    std::vector<float> w(24, 0.5f);
    auto [g, v] = m.weightNorm(w.data());
    m.engine->adoptParameter(v);
    m.engine->adoptParameter(g);
    QVERIFY(m.engine->param(v).partitioned); // 24 elements >= threshold 16
    QVERIFY(m.engine->param(g).persistent);  // 3 elements: persistent, like any small parameter
    for (int r = 0; r < 4; ++r)
        QCOMPARE(m.engine->status(r, v), ParamStatus::NotAvailable);
    QCOMPARE(m.sink.ofType(EventType::ParameterAdopted).size(), std::size_t(2 * 4));
    QVERIFY_THROWS_EXCEPTION(core::EngineError, m.engine->adoptParameter(v));
    m.trainStep();
    QCOMPARE(m.engine->lateParameterCount(), std::uint64_t(0));
    // gathered like any other parameter: the owner's entry fetches it, values intact
    std::vector<float> seen(24);
    m.engine->forEachLocalRank([&](int r) {
        m.engine->beginStep(r);
        core::ModuleScope s(*m.engine, r, m.conv, Phase::Forward);
        if (r == 2) std::memcpy(seen.data(), m.engine->access(r, v).f32(), 24 * 4);
    });
    QCOMPARE(seen, w);
}

void TestLateParameters::storyWorkaroundGivesNoRecords()
{
    ConvModel m(2);
    ParamId g, v;
    {
        core::GatheredParameters scope(*m.engine, {m.weight}, 0);
        std::tie(g, v) = m.weightNorm(scope[0].f32());
    }
    m.engine->removeParameter(m.weight);
    m.engine->adoptParameter(g);
    m.engine->adoptParameter(v);
    m.engine->registerExternalParameter(m.conv, g);
    m.engine->registerExternalParameter(m.conv, v);
    m.trainStep();
    QVERIFY(m.engine->violations().empty());
    QCOMPARE(m.engine->lateParameterCount(), std::uint64_t(0));
    QCOMPARE(m.engine->unregisteredAccessCount(), std::uint64_t(0));
}

QTEST_APPLESS_MAIN(TestLateParameters)
#include "tst_lateparameters.moc"

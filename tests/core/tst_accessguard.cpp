#include <QtTest>

#include <source_location>

#include "telemetry/eventfields.h"
#include "testworld.h"

using namespace shardscope;

// Story 1: `lm_head` computes logits from the tied `embed.weight`.
struct TiedModel
{
    std::unique_ptr<core::Engine> engine;
    test::MemorySink sink;
    ModuleId embed = 0, lmHead = 0;
    ParamId embedW = 0, headB = 0;

    TiedModel(int world, GuardPolicy policy)
    {
        core::EngineConfig cfg;
        cfg.persistenceThreshold = 4;
        cfg.guard = policy;
        engine = test::makeEngine(world, cfg);
        embed = engine->addModule(engine->root(), "embed", "Embedding");
        lmHead = engine->addModule(engine->root(), "lm_head", "Linear");
        auto v = test::iota(30);
        embedW = engine->addParameter(embed, "weight", {6, 5}, DType::F32, v.data());
        headB = engine->addParameter(lmHead, "bias", {6}, DType::F32, v.data());
        engine->partition();
        engine->setEventSink(&sink);
    }

    // One step: embed forward, then lm_head reads embed.weight twice (logits and a second use).
    float step(int r)
    {
        core::Engine &e = *engine;
        e.beginStep(r);
        {
            core::ModuleScope s(e, r, embed, Phase::Forward);
            (void)e.access(r, embedW);
        }
        float sum = 0;
        {
            core::ModuleScope s(e, r, lmHead, Phase::Forward);
            for (const std::size_t i : {29u, 0u}) // two reads from one call site
                sum += e.access(r, embedW).f32()[i];
            sum += e.access(r, headB).f32()[0];
        }
        e.endStep(r, 0.0);
        return sum;
    }
    std::size_t unregisteredRecords() const
    {
        return sink.ofType(EventType::UnregisteredAccess).size();
    }
};

class TestAccessGuard : public QObject
{
    Q_OBJECT
  private slots:
    void warnRecordsOncePerAccessorParamRankStep();
    void errorNamesTheFix();
    void autoRegistersOnceThenNeverAgain();
    void manualRegistrationGivesNoRecords();
    void readOutsideAnyModuleIsRecorded();
    void eachCallSiteIsItsOwnViolation();
};

// Engine::access records its caller's line (std::source_location): the same module reading
// the same parameter from two lines is two violations, each with its file and line.
void TestAccessGuard::eachCallSiteIsItsOwnViolation()
{
    TiedModel m(1, GuardPolicy::Warn);
    core::Engine &e = *m.engine;
    e.beginStep(0);
    std::uint32_t first = 0;
    {
        core::ModuleScope s(e, 0, m.lmHead, Phase::Forward);
        first = std::source_location::current().line() + 1;
        (void)e.access(0, m.embedW);
        (void)e.access(0, m.embedW);
    }
    e.endStep(0, 0.0);
    const state::EngineState st = e.state();
    QCOMPARE(st.violations.size(), std::size_t(2));
    QCOMPARE(st.violations[0].location.line, first);
    QCOMPARE(st.violations[1].location.line, first + 1);
    QVERIFY2(st.violations[0].location.file.ends_with("tst_accessguard.cpp"),
             st.violations[0].location.file.c_str());
    QVERIFY(st.violations[0].location.function.find("eachCallSiteIsItsOwnViolation") !=
            std::string::npos);
}

void TestAccessGuard::warnRecordsOncePerAccessorParamRankStep()
{
    TiedModel m(3, GuardPolicy::Warn);
    std::vector<float> sums(3);
    for (int s = 0; s < 2; ++s)
        m.engine->forEachLocalRank([&](int r) { sums[r] = m.step(r); });
    for (float v : sums)
        QCOMPARE(v, 30.0f + 1.0f + 1.0f); // the data read is right: gathered synchronously
    QCOMPARE(m.unregisteredRecords(), std::size_t(3 * 2)); // 3 ranks x 2 steps, not 3 x 2 x 2 reads
    QCOMPARE(m.engine->unregisteredAccessCount(), std::uint64_t(6));
    for (const telemetry::Event &ev : m.sink.ofType(EventType::UnregisteredAccess)) {
        const telemetry::AccessFields f = telemetry::readAccess(ev);
        QCOMPARE(f.accessor, m.lmHead);
        QCOMPARE(f.param, m.embedW);
        QCOMPARE(f.owner, m.embed);
        QCOMPARE(f.status, ParamStatus::NotAvailable);
        QCOMPARE(f.action, GuardAction::Gathered);
    }
    const auto vs = m.engine->violations();
    QCOMPARE(vs.size(), std::size_t(3)); // one per rank, counted
    for (const auto &v : vs) {
        QCOMPARE(v.kind, ViolationKind::UnregisteredAccess);
        QCOMPARE(v.count, std::uint64_t(2));
        QCOMPARE(v.step, 1u);
        QCOMPARE(v.lastStep, 2u);
        QCOMPARE(v.fix, std::string("register_external_parameter(lm_head, embed.weight)"));
    }
    // the guard's gather is released when lm_head exits
    for (int r = 0; r < 3; ++r)
        QCOMPARE(m.engine->status(r, m.embedW), ParamStatus::NotAvailable);
    bool guardFetch = false;
    for (const telemetry::Event &ev : m.sink.ofType(EventType::FetchBegin))
        guardFetch = guardFetch || (telemetry::readFetch(ev).param == m.embedW &&
                                    telemetry::readFetch(ev).reason == FetchReason::Guard);
    QVERIFY(guardFetch);
}

void TestAccessGuard::errorNamesTheFix()
{
    TiedModel m(2, GuardPolicy::Error);
    std::vector<std::string> errors(2);
    m.engine->forEachLocalRank([&](int r) {
        try {
            m.step(r);
        } catch (const core::UnregisteredAccessError &e) {
            errors[r] = e.what();
            QCOMPARE(e.fix(), std::string("register_external_parameter(lm_head, embed.weight)"));
        }
    });
    for (const auto &e : errors) {
        QVERIFY2(e.find("register_external_parameter(lm_head, embed.weight)") != std::string::npos,
                 e.c_str());
        QVERIFY2(e.find("module `lm_head` read `embed.weight` owned by `embed`") !=
                     std::string::npos,
                 e.c_str());
    }
    QCOMPARE(m.engine->violations().front().action, GuardAction::Raised);
}

void TestAccessGuard::autoRegistersOnceThenNeverAgain()
{
    TiedModel m(2, GuardPolicy::Auto);
    for (int s = 0; s < 3; ++s)
        m.engine->forEachLocalRank([&](int r) { m.step(r); });
    QCOMPARE(m.unregisteredRecords(), std::size_t(2)); // step 1 on each rank only
    for (const telemetry::Event &ev : m.sink.ofType(EventType::UnregisteredAccess))
        QCOMPARE(ev.step, 1u);
    QVERIFY(m.engine->isExternal(0, m.lmHead, m.embedW));
    QVERIFY(m.engine->isExternal(1, m.lmHead, m.embedW));
    auto regs = m.sink.ofType(EventType::ExternalRegister);
    QCOMPARE(regs.size(), std::size_t(2));
    QVERIFY(telemetry::readExternal(regs[0]).automatic);
    const auto state = m.engine->state();
    const auto &p = *std::find_if(state.params.begin(), state.params.end(),
                                  [&](const state::ParamRecord &r) { return r.id == m.embedW; });
    QCOMPARE(p.externals.size(), std::size_t(1));
    QCOMPARE(p.externals[0].module, m.lmHead);
    QVERIFY(p.externals[0].automatic);
}

void TestAccessGuard::manualRegistrationGivesNoRecords()
{
    TiedModel m(4, GuardPolicy::Error);
    m.engine->registerExternalParameter(m.lmHead, m.embedW);
    for (int s = 0; s < 2; ++s)
        m.engine->forEachLocalRank([&](int r) { m.step(r); });
    QCOMPARE(m.unregisteredRecords(), std::size_t(0));
    QVERIFY(m.engine->violations().empty());
    // lm_head fetched embed.weight on entry, as if it were its own
    bool fetchedByHead = false;
    for (const telemetry::Event &ev : m.sink.ofType(EventType::FetchBegin))
        fetchedByHead = fetchedByHead || (telemetry::readFetch(ev).param == m.embedW &&
                                          telemetry::readFetch(ev).cause == m.lmHead);
    QVERIFY(fetchedByHead);
}

void TestAccessGuard::readOutsideAnyModuleIsRecorded()
{
    TiedModel m(2, GuardPolicy::Warn);
    const auto bytes = m.engine->hostRead(m.embedW);
    QCOMPARE(bytes.size(), std::size_t(30 * 4));
    float last;
    std::memcpy(&last, bytes.data() + 29 * 4, 4);
    QCOMPARE(last, 30.0f);
    const auto vs = m.engine->violations();
    QCOMPARE(vs.size(), std::size_t(2));
    QCOMPARE(vs[0].accessor, kNoModule);
    QVERIFY2(vs[0].message.find("outside any module") != std::string::npos, vs[0].message.c_str());
    for (int r = 0; r < 2; ++r)
        QCOMPARE(m.engine->status(r, m.embedW), ParamStatus::NotAvailable);
}

QTEST_APPLESS_MAIN(TestAccessGuard)
#include "tst_accessguard.moc"

// NvtxEventSink, the decorator that turns the engine's fetches into NVTX ranges: it hands
// every event to the inner sink unchanged and in order, with or without a profiler, and
// copes with parameters added after it took the names. Runs without a GPU (NVTX is
// header-only and a no-op without a tool); needs a CUDA build.

#include <QtTest>

#include <cstring>
#include <mutex>
#include <vector>

#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "gputestmodel.h"
#include "nn/model.h"
#include "nn/trainer.h"

#if SHARDSCOPE_HAVE_CUDA
#include "cuda/nvtxeventsink.h"
#endif

using namespace shardscope;

class TestNvtxEventSink : public QObject
{
    Q_OBJECT

  private slots:
    void forwardsEveryEventUnchanged()
    {
#if !SHARDSCOPE_HAVE_CUDA
        QSKIP("built without CUDA: there is no NVTX sink");
#else
        core::EngineConfig cfg;
        cfg.worldSize = 2;
        cfg.persistenceThreshold = 4;
        core::Engine engine(cfg, comm::makeCpuWorld(2));
        test::RecordingSink inner;
        cuda::NvtxEventSink nvtx(engine, &inner); // before the model exists, as the trainer does
        QCOMPARE(nvtx.inner(), &inner);
        engine.setEventSink(&nvtx);

        const ModuleId embed = engine.addModule(engine.root(), "embed", "Embedding");
        const ModuleId head = engine.addModule(engine.root(), "lm_head", "Linear");
        std::vector<float> init(30, 1.0f);
        const ParamId w = engine.addParameter(embed, "weight", {6, 5}, DType::F32, init.data());
        engine.addParameter(head, "bias", {6}, DType::F32, init.data());
        engine.partition();
        const auto steps = [&] {
            engine.forEachLocalRank([&](int r) {
                engine.beginStep(r);
                {
                    core::ModuleScope s(engine, r, embed, Phase::Forward);
                    (void)engine.access(r, w);
                }
                {
                    core::ModuleScope s(engine, r, head, Phase::Forward);
                    (void)engine.access(r, w); // unregistered: gathered by the guard
                }
                engine.endStep(r, 0.5);
            });
        };
        steps(); // parameters unknown to the sink: labelled by id
        nvtx.refreshNames(engine);
        steps();
        {
            core::GatheredParameters g(engine, {w}, 0); // a Broadcast at close
        }
        engine.setEventSink(nullptr);

        const std::vector<telemetry::Event> events = inner.events();
        int fetchBegins = 0, fetchEnds = 0, releases = 0, broadcasts = 0;
        for (const telemetry::Event &e : events) {
            fetchBegins += e.type == EventType::FetchBegin;
            fetchEnds += e.type == EventType::FetchEnd;
            releases += e.type == EventType::Release;
            broadcasts += e.type == EventType::Broadcast;
        }
        QVERIFY(fetchBegins > 0);
        QCOMPARE(fetchEnds, fetchBegins);
        QCOMPARE(releases, fetchBegins);
        QCOMPARE(broadcasts, 2); // one per rank

        // The same events as a plain sink receives from the same run, in the same order
        // per rank (timestamps aside).
        core::Engine plain(cfg, comm::makeCpuWorld(2));
        test::RecordingSink direct;
        plain.setEventSink(&direct);
        const ModuleId e2 = plain.addModule(plain.root(), "embed", "Embedding");
        const ModuleId h2 = plain.addModule(plain.root(), "lm_head", "Linear");
        const ParamId w2 = plain.addParameter(e2, "weight", {6, 5}, DType::F32, init.data());
        plain.addParameter(h2, "bias", {6}, DType::F32, init.data());
        plain.partition();
        for (int i = 0; i < 2; ++i)
            plain.forEachLocalRank([&](int r) {
                plain.beginStep(r);
                {
                    core::ModuleScope s(plain, r, e2, Phase::Forward);
                    (void)plain.access(r, w2);
                }
                {
                    core::ModuleScope s(plain, r, h2, Phase::Forward);
                    (void)plain.access(r, w2);
                }
                plain.endStep(r, 0.5);
            });
        {
            core::GatheredParameters g(plain, {w2}, 0);
        }
        plain.setEventSink(nullptr);
        const auto perRank = [](const std::vector<telemetry::Event> &all, int rank) {
            std::vector<telemetry::Event> out;
            for (telemetry::Event e : all)
                if (e.rank == rank) {
                    e.tsNs = 0;
                    out.push_back(e);
                }
            return out;
        };
        for (int r = 0; r < 2; ++r) {
            const std::vector<telemetry::Event> a = perRank(events, r),
                                                b = perRank(direct.events(), r);
            QCOMPARE(a.size(), b.size());
            for (std::size_t i = 0; i < a.size(); ++i) {
                // Memory samples carry byte counts that are equal too; compare everything.
                QVERIFY2(std::memcmp(&a[i], &b[i], sizeof(telemetry::Event)) == 0,
                         ("rank " + std::to_string(r) + " event " + std::to_string(i)).c_str());
            }
        }
#endif
    }

    // trainOnGpu makes the sink after nn::buildModel, whose weight_norm removed
    // pos_conv.weight: the sink must take the names of such a model, and pass a training
    // step's events through.
    void takesTheNamesOfAModelWithARemovedParameter()
    {
#if !SHARDSCOPE_HAVE_CUDA
        QSKIP("built without CUDA: there is no NVTX sink");
#else
        nn::TrainConfig c;
        c.worldSize = 2;
        c.steps = 1;
        c.layers = 1;
        c.hidden = 16;
        c.vocab = 20;
        c.seq = 8;
        c.kernel = 4;
        c.groups = 2;
        c.batch = 2;
        c.externals = nn::Externals::Manual;
        c.listen = false;
        auto engine = nn::makeCpuEngine(c);
        nn::buildModel(*engine, c);
        QCOMPARE(engine->findParam("pos_conv.weight"), kNoParam); // removed by weight_norm
        test::RecordingSink inner;
        cuda::NvtxEventSink nvtx(*engine, &inner);
        engine->setEventSink(&nvtx);
        nn::trainModel(*engine, c, {});
        engine->setEventSink(nullptr);
        int fetchBegins = 0, stepEnds = 0;
        for (const telemetry::Event &e : inner.events()) {
            fetchBegins += e.type == EventType::FetchBegin;
            stepEnds += e.type == EventType::StepEnd;
        }
        QVERIFY(fetchBegins > 0);
        QCOMPARE(stepEnds, c.worldSize);
#endif
    }
};

QTEST_GUILESS_MAIN(TestNvtxEventSink)
#include "tst_nvtxeventsink.moc"

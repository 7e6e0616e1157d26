// The GPU training run (core/Engine on NCCL ranks + the CUDA layers) against the CPU
// trainer: the same loss curve (same model, data and initial values), the same
// unregistered-access and late-parameter counts, the guard's error, and telemetry that
// shows asynchronous gathers (FetchBegin before FetchEnd), prefetches and releases.
// The GPU cases skip with the reason without CUDA or a GPU.

#include <QtTest>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/engine.h"
#include "cuda/gputrainer.h"
#include "gpuavailable.h"
#include "gputestmodel.h"
#include "nn/trainer.h"
#include "telemetry/event.h"
#include "telemetry/eventfields.h"

using namespace shardscope;

namespace {

nn::TrainConfig smallConfig(int world)
{
    nn::TrainConfig c = test::smallGpuConfig(world);
    c.steps = 12;
    c.layers = 1;
    c.telemetry = false;
    return c;
}

nn::TrainResult cpuRun(const nn::TrainConfig &c)
{
    auto engine = nn::makeCpuEngine(c);
    return nn::runCpuTraining(c, *engine, {});
}

void compareLosses(const nn::TrainResult &gpu, const nn::TrainResult &cpu)
{
    QCOMPARE(gpu.losses.size(), cpu.losses.size());
    for (std::size_t s = 0; s < cpu.losses.size(); ++s) {
        const double rel = std::fabs(gpu.losses[s] - cpu.losses[s]) / cpu.losses[s];
        QVERIFY2(rel <= 1e-3,
                 ("step " + std::to_string(s + 1) + ": GPU " + std::to_string(gpu.losses[s]) +
                  " vs CPU " + std::to_string(cpu.losses[s]))
                     .c_str());
    }
}

} // namespace

class TestGpuTraining : public QObject
{
    Q_OBJECT

  private slots:
    void lossCurveMatchesTheCpuTrainer_data()
    {
        QTest::addColumn<int>("world");
        QTest::addColumn<bool>("causal");
        QTest::newRow("world 1") << 1 << true;
        QTest::newRow("world 1, symmetric conv") << 1 << false;
        if (test::gpuCount() >= 2) QTest::newRow("world 2") << 2 << true;
        if (test::gpuCount() >= 3) QTest::newRow("world 3") << 3 << true;
    }

    void lossCurveMatchesTheCpuTrainer()
    {
        SHARDSCOPE_REQUIRE_GPU();
        QFETCH(int, world);
        QFETCH(bool, causal);
        nn::TrainConfig c = smallConfig(world);
        c.causalConv = causal;
        const nn::TrainResult cpu = cpuRun(c);
        std::vector<nn::StepReport> reports;
        const nn::TrainResult gpu =
            cuda::runNcclTraining(c, [&](const nn::StepReport &r) { reports.push_back(r); });
        QCOMPARE(int(gpu.losses.size()), c.steps);
        QCOMPARE(int(reports.size()), c.steps);
        compareLosses(gpu, cpu);
        for (int s = 0; s < c.steps; ++s) {
            QCOMPARE(reports[s].step, s + 1);
            QCOMPARE(reports[s].loss, gpu.losses[s]);
        }
        QVERIFY(gpu.lastLoss < 0.9 * gpu.firstLoss);
        QCOMPARE(gpu.tokens, cpu.tokens);
        QCOMPARE(gpu.unregisteredAccesses, cpu.unregisteredAccesses);
        QCOMPARE(gpu.lateParameters, cpu.lateParameters);
        QVERIFY(gpu.megabytesGathered > 0.0);
    }

    void weightDecayMatchesTheCpuTrainer()
    {
        SHARDSCOPE_REQUIRE_GPU();
        nn::TrainConfig c = smallConfig(1);
        c.steps = 5;
        c.weightDecay = 0.1f;
        c.externals = nn::Externals::Manual;
        compareLosses(cuda::runNcclTraining(c, {}), cpuRun(c));
    }

    void manualExternalsGiveNoRecords()
    {
        SHARDSCOPE_REQUIRE_GPU();
        nn::TrainConfig c = smallConfig(1);
        c.steps = 3;
        c.externals = nn::Externals::Manual;
        const nn::TrainResult gpu = cuda::runNcclTraining(c, {});
        QCOMPARE(gpu.unregisteredAccesses, std::uint64_t(0));
        QCOMPARE(gpu.lateParameters, std::uint64_t(0));
        compareLosses(gpu, cpuRun(c));
    }

    void autoGuardRegistersTheTiedEmbeddingOnce()
    {
        SHARDSCOPE_REQUIRE_GPU();
        nn::TrainConfig c = smallConfig(1);
        c.steps = 4;
        c.guard = GuardPolicy::Auto;
        auto engine = cuda::makeNcclEngine(c);
        test::RecordingSink sink;
        engine->setEventSink(&sink);
        nn::buildModel(*engine, c);
        const nn::TrainResult gpu = cuda::trainOnGpu(*engine, c, {});
        engine->setEventSink(nullptr);
        const nn::TrainResult cpu = cpuRun(c);
        QCOMPARE(gpu.unregisteredAccesses, cpu.unregisteredAccesses);
        const ModuleId head = engine->findModule("lm_head");
        const ParamId embedW = engine->findParam("embed.weight");
        int registrations = 0, trainingAccesses = 0;
        for (const telemetry::Event &e : sink.events()) {
            if (e.type == EventType::ExternalRegister && telemetry::readExternal(e).automatic) {
                ++registrations;
                QCOMPARE(telemetry::readExternal(e).module, head);
                QCOMPARE(telemetry::readExternal(e).param, embedW);
            }
            // Step 0 is weight_norm's read while the model is built (accessor none).
            if (e.type == EventType::UnregisteredAccess && e.step > 0) {
                ++trainingAccesses;
                QCOMPARE(e.step, 1u);
                QCOMPARE(telemetry::readAccess(e).accessor, head);
                QCOMPARE(telemetry::readAccess(e).param, embedW);
            }
        }
        QCOMPARE(registrations, 1);
        QCOMPARE(trainingAccesses, 1);
        QVERIFY(engine->isExternal(0, head, embedW));
        compareLosses(gpu, cpu);
    }

    void guardErrorStopsWithTheFix()
    {
        SHARDSCOPE_REQUIRE_GPU();
        nn::TrainConfig c = smallConfig(1);
        c.steps = 2;
        c.guard = GuardPolicy::Error;
        try {
            cuda::runNcclTraining(c, {});
            QFAIL("--guard error with --externals none must stop");
        } catch (const core::UnregisteredAccessError &e) {
            QVERIFY2(std::string(e.what()).find(e.fix()) != std::string::npos, e.what());
            QVERIFY(!e.fix().empty());
        }
    }

    void telemetryShowsAsyncGathersPrefetchAndRelease()
    {
        SHARDSCOPE_REQUIRE_GPU();
        nn::TrainConfig c = smallConfig(1);
        c.steps = 3;
        c.externals = nn::Externals::Manual;
        test::RecordingSink sink;
        cuda::runNcclTraining(c, {}, &sink);
        const std::vector<telemetry::Event> events = sink.events();
        std::map<std::pair<int, std::uint32_t>, std::uint64_t>
            open; // (rank, param) -> FetchBegin ts
        int begins = 0, ends = 0, prefetches = 0, releases = 0, stepEnds = 0, broadcasts = 0;
        for (const telemetry::Event &e : events) {
            switch (e.type) {
            case EventType::FetchBegin: {
                const telemetry::FetchFields f = telemetry::readFetch(e);
                const std::pair<int, std::uint32_t> key{e.rank, f.param};
                QVERIFY2(!open.count(key), "a parameter is fetched twice without a release");
                open[key] = e.tsNs;
                ++begins;
                if (f.reason == FetchReason::Prefetch) ++prefetches;
                break;
            }
            case EventType::FetchEnd: {
                const std::pair<int, std::uint32_t> key{e.rank, telemetry::readFetch(e).param};
                QVERIFY(open.count(key));
                QVERIFY(e.tsNs >= open[key]);
                ++ends;
                break;
            }
            case EventType::Release: {
                const std::pair<int, std::uint32_t> key{e.rank, telemetry::readRelease(e).param};
                QVERIFY(open.erase(key) == 1);
                ++releases;
                break;
            }
            case EventType::StepEnd:
                ++stepEnds;
                break;
            case EventType::Broadcast:
                ++broadcasts;
                break;
            default:
                break;
            }
        }
        QVERIFY(begins > 0);
        QCOMPARE(ends, begins);
        QCOMPARE(releases, begins);
        QVERIFY2(open.empty(), "every gathered parameter is released by the end of the run");
        QVERIFY2(prefetches > 0, "the next modules' parameters are prefetched from step 2 on");
        QCOMPARE(stepEnds, c.steps);
        QVERIFY2(broadcasts > 0, "weight_norm's GatheredParameters(modifier_rank=0) broadcasts");
    }

    void tooManyRanksForTheGpusIsAClearError()
    {
        SHARDSCOPE_REQUIRE_GPU();
        nn::TrainConfig c = smallConfig(test::gpuCount() + 1);
        c.batch = 16;
        try {
            cuda::runNcclTraining(c, {});
            QFAIL("more ranks than GPUs must be refused");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find("one rank per GPU") != std::string::npos, e.what());
        }
    }

    // Needs no GPU: the refusal comes before any CUDA call.
    void trainOnGpuRefusesACpuEngine()
    {
#if !SHARDSCOPE_HAVE_CUDA
        QSKIP("built without CUDA: trainOnGpu only says so");
#endif
        nn::TrainConfig c = smallConfig(1);
        auto engine = nn::makeCpuEngine(c);
        nn::buildModel(*engine, c);
        try {
            cuda::trainOnGpu(*engine, c, {});
            QFAIL("a CPU engine has no GPU tensors to train on");
        } catch (const core::EngineError &e) {
            QVERIFY2(std::string(e.what()).find("makeNcclEngine") != std::string::npos, e.what());
        }
    }
};

QTEST_GUILESS_MAIN(TestGpuTraining)
#include "tst_gputraining.moc"

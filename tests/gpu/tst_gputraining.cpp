// The GPU training run against the CPU trainer: the same loss curve (same model, data
// and initial values), the same unregistered-access and late-parameter counts, the
// guard's error, and telemetry that shows asynchronous gathers (FetchBegin before
// FetchEnd), prefetches and releases. Skips with the reason without CUDA or a GPU.

#include <QtTest>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/engine.h"
#include "cuda/gputrainer.h"
#include "gpuavailable.h"
#include "nn/trainer.h"
#include "telemetry/event.h"

using namespace shardscope;

namespace {

class RecordingSink final : public EventSink
{
  public:
    void write(const Event &ev) noexcept override
    {
        std::lock_guard lock(m_mutex);
        m_events.push_back(ev);
    }
    std::vector<Event> events()
    {
        std::lock_guard lock(m_mutex);
        return m_events;
    }

  private:
    std::mutex m_mutex;
    std::vector<Event> m_events;
};

nn::TrainConfig smallConfig(int world)
{
    nn::TrainConfig c;
    c.worldSize = world;
    c.steps = 12;
    c.layers = 1;
    c.hidden = 32;
    c.vocab = 40;
    c.seq = 16;
    c.kernel = 4;
    c.groups = 2;
    c.batch = 7; // does not divide 2 or 3 ranks
    c.lr = 1e-2f;
    c.persistenceThreshold = 500; // partitions embed.weight and the fc weights
    c.listen = false;
    c.telemetry = false;
    return c;
}

nn::TrainResult cpuRun(const nn::TrainConfig &c)
{
    auto engine = nn::makeCpuEngine(c);
    return nn::runCpuTraining(c, *engine, {});
}

} // namespace

class TestGpuTraining : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase() { SHARDSCOPE_REQUIRE_GPU(); }

    void lossCurveMatchesTheCpuTrainer_data()
    {
        QTest::addColumn<int>("world");
        QTest::newRow("world 1") << 1;
        if (test::gpuCount() >= 2) QTest::newRow("world 2") << 2;
        if (test::gpuCount() >= 3) QTest::newRow("world 3") << 3;
    }

    void lossCurveMatchesTheCpuTrainer()
    {
        QFETCH(int, world);
        const nn::TrainConfig c = smallConfig(world);
        const nn::TrainResult cpu = cpuRun(c);
        std::vector<nn::StepReport> reports;
        const nn::TrainResult gpu =
            gpu::runNcclTraining(c, [&](const nn::StepReport &r) { reports.push_back(r); });
        QCOMPARE(int(gpu.losses.size()), c.steps);
        QCOMPARE(int(reports.size()), c.steps);
        for (int s = 0; s < c.steps; ++s) {
            const double rel = std::fabs(gpu.losses[s] - cpu.losses[s]) / cpu.losses[s];
            QVERIFY2(rel <= 1e-3,
                     ("step " + std::to_string(s + 1) + ": GPU " + std::to_string(gpu.losses[s]) +
                      " vs CPU " + std::to_string(cpu.losses[s]))
                         .c_str());
            QCOMPARE(reports[s].step, s + 1);
        }
        QVERIFY(gpu.lastLoss < 0.9 * gpu.firstLoss);
        QCOMPARE(gpu.tokens, cpu.tokens);
        QCOMPARE(gpu.unregisteredAccesses, cpu.unregisteredAccesses);
        QCOMPARE(gpu.lateParameters, cpu.lateParameters);
        QVERIFY(gpu.megabytesGathered > 0.0);
    }

    void manualExternalsGiveNoRecords()
    {
        nn::TrainConfig c = smallConfig(1);
        c.steps = 3;
        c.externals = nn::Externals::Manual;
        const nn::TrainResult gpu = gpu::runNcclTraining(c, {});
        QCOMPARE(gpu.unregisteredAccesses, std::uint64_t(0));
        QCOMPARE(gpu.lateParameters, std::uint64_t(0));
        const nn::TrainResult cpu = cpuRun(c);
        QVERIFY(std::fabs(gpu.lastLoss - cpu.lastLoss) <= 1e-3 * cpu.lastLoss);
    }

    void autoGuardRegistersTheTiedEmbeddingOnce()
    {
        nn::TrainConfig c = smallConfig(1);
        c.steps = 4;
        c.guard = GuardPolicy::Auto;
        RecordingSink sink;
        const nn::TrainResult gpu = gpu::runNcclTraining(c, {}, &sink);
        const nn::TrainResult cpu = cpuRun(c);
        QCOMPARE(gpu.unregisteredAccesses, cpu.unregisteredAccesses);
        int registrations = 0, accesses = 0;
        for (const Event &e : sink.events()) {
            if (e.type == EventType::ExternalRegister && e.flags == 1) ++registrations;
            if (e.type == EventType::UnregisteredAccess) {
                ++accesses;
                QCOMPARE(e.step, 1u);
            }
        }
        QCOMPARE(registrations, 1);
        QCOMPARE(accesses, 1);
        QVERIFY(std::fabs(gpu.lastLoss - cpu.lastLoss) <= 1e-3 * cpu.lastLoss);
    }

    void guardErrorStopsWithTheFix()
    {
        nn::TrainConfig c = smallConfig(1);
        c.steps = 2;
        c.guard = GuardPolicy::Error;
        try {
            gpu::runNcclTraining(c, {});
            QFAIL("--guard error with --externals none must stop");
        } catch (const UnregisteredAccessError &e) {
            QVERIFY2(std::string(e.what()).find(e.fix()) != std::string::npos, e.what());
            QVERIFY(!e.fix().empty());
        }
    }

    void telemetryShowsAsyncGathersPrefetchAndRelease()
    {
        nn::TrainConfig c = smallConfig(1);
        c.steps = 3;
        c.externals = nn::Externals::Manual;
        RecordingSink sink;
        gpu::runNcclTraining(c, {}, &sink);
        const std::vector<Event> events = sink.events();
        std::map<std::uint32_t, std::uint64_t> open; // param -> FetchBegin ts
        int begins = 0, ends = 0, prefetches = 0, releases = 0, stepEnds = 0, broadcasts = 0;
        for (const Event &e : events) {
            switch (e.type) {
            case EventType::FetchBegin:
                QVERIFY2(!open.count(e.a), "a parameter is fetched twice without a release");
                open[e.a] = e.tsNs;
                ++begins;
                if (e.flags == static_cast<std::uint8_t>(FetchReason::Prefetch)) ++prefetches;
                break;
            case EventType::FetchEnd:
                QVERIFY(open.count(e.a));
                QVERIFY(e.tsNs >= open[e.a]);
                ++ends;
                break;
            case EventType::Release:
                QVERIFY(open.erase(e.a) == 1);
                ++releases;
                break;
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
        QVERIFY2(prefetches > 0, "the next module's parameters are prefetched");
        QCOMPARE(stepEnds, c.steps);
        QVERIFY(broadcasts > 0);
    }

    void tooManyRanksForTheGpusIsAClearError()
    {
        nn::TrainConfig c = smallConfig(test::gpuCount() + 1);
        c.batch = 16;
        try {
            gpu::runNcclTraining(c, {});
            QFAIL("more ranks than GPUs must be refused");
        } catch (const CommError &e) {
            QVERIFY2(std::string(e.what()).find("one rank per GPU") != std::string::npos, e.what());
        }
    }
};

QTEST_GUILESS_MAIN(TestGpuTraining)
#include "tst_gputraining.moc"

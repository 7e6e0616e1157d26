// core/Engine on NCCL ranks, with tensors in GPU memory: what the inspector sees
// (state() with backend "nccl", per-rank statuses, the guard's automatic external), an
// Inspector serving a client, GatheredParameters with a modifier rank round-tripping
// through device memory, and prefetched gathers that overlap the next module.
// Skips with the reason without CUDA or a GPU.

#include <QtTest>

#include <QTemporaryDir>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/clientstate.h"
#include "client/inspectorclient.h"
#include "core/engine.h"
#include "core/engineprovider.h"
#include "cuda/gputrainer.h"
#include "gpuavailable.h"
#include "gputestmodel.h"
#include "nn/trainer.h"
#include "server/inspector.h"
#include "telemetry/event.h"

#if SHARDSCOPE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <chrono>

#include "comm/nccl/ncclcommunicator.h"
#include "telemetry/eventfields.h"
#endif

using namespace shardscope;
using client::InspectorClient;

namespace {

nn::TrainConfig smallConfig(int world)
{
    return test::smallGpuConfig(world);
}

#if SHARDSCOPE_HAVE_CUDA
// Records every event, and sets `go` when `rank` enters `module` (forward) in `step`.
class ReleasingSink final : public telemetry::EventSink
{
  public:
    ReleasingSink(std::atomic<bool> &go, int rank, ModuleId module, std::uint32_t step)
        : m_go(go), m_rank(rank), m_module(module), m_step(step)
    {
    }
    void write(const telemetry::Event &ev) noexcept override
    {
        if (ev.type == EventType::ModuleEnter && ev.rank == m_rank &&
            telemetry::readModule(ev).module == m_module && ev.step == m_step)
            m_go.store(true);
        std::lock_guard lock(m_mutex);
        m_events.push_back(ev);
    }
    std::vector<telemetry::Event> events()
    {
        std::lock_guard lock(m_mutex);
        return m_events;
    }

  private:
    std::atomic<bool> &m_go;
    int m_rank;
    ModuleId m_module;
    std::uint32_t m_step;
    std::mutex m_mutex;
    std::vector<telemetry::Event> m_events;
};
#endif

// Two ranks when the machine has two GPUs (padding, collectives between GPUs), else one.
int worldForTest()
{
    return std::min(test::gpuCount(), 2);
}

const state::ParamRecord *findParam(const state::EngineState &s, const std::string &name)
{
    for (const state::ParamRecord &p : s.params)
        if (p.name == name) return &p;
    return nullptr;
}

std::vector<float> deviceToHost(core::Engine &engine, int rank, const float *data, std::size_t n)
{
    std::vector<float> out(n);
    engine.memory(rank).copy(out.data(), data, n * sizeof(float), comm::CopyKind::SpaceToHost);
    return out;
}

} // namespace

class TestGpuEngine : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase()
    {
        SHARDSCOPE_REQUIRE_GPU();
        QVERIFY(m_runtime.isValid());
        // The Inspector writes its discovery file to the runtime directory.
        ::setenv("XDG_RUNTIME_DIR", m_runtime.path().toLocal8Bit().constData(), 1);
    }

    void engineMemoryIsTheGpu()
    {
        auto engine = cuda::makeNcclEngine(smallConfig(worldForTest()));
        QCOMPARE(engine->backend(), comm::Backend::Nccl);
        for (int r : engine->localRanks()) {
            QVERIFY(!engine->memory(r).isHost());
            QCOMPARE(engine->memory(r).name(), "cuda:" + std::to_string(r));
        }
    }

    void stateReportsNcclStatusesAndTheAutoExternal()
    {
        nn::TrainConfig c = smallConfig(worldForTest());
        c.guard = GuardPolicy::Auto; // lm_head's read of embed.weight registers it
        auto engine = cuda::makeNcclEngine(c);
        nn::buildModel(*engine, c);
        const int world = engine->worldSize();

        // Taken from the reporting rank's thread while the other ranks may be running.
        std::vector<state::EngineState> during;
        cuda::trainOnGpu(*engine, c,
                         [&](const nn::StepReport &) { during.push_back(engine->state()); });
        QCOMPARE(int(during.size()), c.steps);
        for (int s = 0; s < c.steps; ++s) {
            QCOMPARE(during[s].backend, std::string("nccl"));
            QVERIFY(during[s].step >= std::uint32_t(s + 1));
        }

        const state::EngineState st = engine->state();
        QCOMPARE(st.backend, std::string("nccl"));
        QCOMPARE(st.worldSize, world);
        QCOMPARE(st.localRanks, engine->localRanks());
        QCOMPARE(st.step, std::uint32_t(c.steps));

        const state::ParamRecord *embed = findParam(st, "embed.weight");
        QVERIFY(embed);
        QVERIFY(embed->partitioned);
        QCOMPARE(int(embed->status.size()), world);
        // Released at the end of every step.
        for (int r : st.localRanks)
            QCOMPARE(embed->status[r], ParamStatus::NotAvailable);
        QVERIFY(embed->gatherCount > 0);
        QVERIFY(embed->gatherBytes > 0);
        const ModuleId head = engine->findModule("lm_head");
        const auto ext =
            std::find_if(embed->externals.begin(), embed->externals.end(),
                         [&](const state::ExternalRecord &e) { return e.module == head; });
        QVERIFY2(ext != embed->externals.end(), "the guard registered embed.weight on lm_head");
        QVERIFY(ext->automatic);

        const state::ParamRecord *bias = findParam(st, "lm_head.bias"); // persistent: always whole
        QVERIFY(bias);
        QVERIFY(bias->persistent);
        for (int r : st.localRanks)
            QCOMPARE(bias->status[r], ParamStatus::Available);

        // weight_norm after partitioning (externals none): late, never partitioned.
        const state::ParamRecord *v = findParam(st, "pos_conv.weight_v");
        QVERIFY(v);
        QVERIFY(v->late);
        QVERIFY(!v->partitioned);
        QVERIFY(engine->lateParameterCount() > 0);
    }

    void inspectorServesAClientOfAnNcclEngine()
    {
        nn::TrainConfig c = smallConfig(worldForTest());
        auto engine = cuda::makeNcclEngine(c);
        server::InspectorOptions o;
        o.endpoint = "tcp:127.0.0.1:0";
        server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*engine), o);
        QVERIFY(inspector.endpoint().starts_with("tcp:127.0.0.1:"));
        nn::buildModel(*engine, c);
        cuda::trainOnGpu(*engine, c, {});

        auto client = InspectorClient::connect(inspector.endpoint(), {});
        QVERIFY2(client.ok(), client.error().c_str());
        const wire::Welcome &w = (*client)->welcome();
        QCOMPARE(w.backend, std::string("nccl"));
        QCOMPARE(w.worldSize, engine->worldSize());

        client::ClientState state;
        while (!state.historyDone()) {
            auto frame = (*client)->next(30000);
            QVERIFY2(frame.ok(), frame.ok() ? "" : frame.error().c_str());
            QVERIFY2(frame->has_value(), "no frame for 30 s");
            auto applied = state.apply(**frame);
            QVERIFY2(applied.ok(), applied.ok() ? "" : applied.error().c_str());
        }
        const state::EngineState &st = state.snapshot().state;
        QCOMPARE(st.backend, std::string("nccl"));
        QCOMPARE(st.step, std::uint32_t(c.steps));
        QVERIFY(findParam(st, "blocks.1.fc2.weight"));
        int stepEnds = 0, fetches = 0;
        for (const telemetry::Event &e : state.snapshot().events) {
            stepEnds += e.type == EventType::StepEnd;
            fetches += e.type == EventType::FetchEnd;
        }
        QCOMPARE(stepEnds, c.steps * int(engine->localRanks().size()));
        QVERIFY(fetches > 0);
        inspector.finish();
    }

    void gatheredParametersWithModifierRoundTripsOnDevice()
    {
        nn::TrainConfig c = smallConfig(worldForTest());
        c.externals = nn::Externals::Manual;
        auto engine = cuda::makeNcclEngine(c);
        nn::buildModel(*engine, c);
        const ParamId p = engine->findParam("blocks.0.fc1.weight");
        const core::ParamInfo &info = engine->param(p);
        QVERIFY(info.partitioned);
        const auto n = static_cast<std::size_t>(info.numel);
        std::vector<float> want(n);
        for (std::size_t i = 0; i < n; ++i)
            want[i] = 0.25f * static_cast<float>(i % 97) - 3.0f;

        {
            core::GatheredParameters g(*engine, {p}, 0);
            QCOMPARE(g.viewRank(), 0);
            const core::TensorView v = g[0];
            QCOMPARE(v.numel, info.numel);
            engine->memory(0).copy(v.data, want.data(), n * sizeof(float),
                                   comm::CopyKind::HostToSpace);
            g.close(); // rank 0's tensor is broadcast and every shard rewritten
        }
        for (int r : engine->localRanks()) {
            const std::span<float> shard = engine->shardData(r, p);
            QCOMPARE(shard.size(), std::size_t(info.layout.partitionNumel));
            const std::vector<float> got = deviceToHost(*engine, r, shard.data(), shard.size());
            for (std::size_t i = 0; i < got.size(); ++i) {
                const std::size_t at = static_cast<std::size_t>(info.layout.offset(r)) + i;
                const float expect = at < n ? want[at] : 0.0f; // zero padding at the tail
                QCOMPARE(got[i], expect);
            }
        }
        {
            core::GatheredParameters g(*engine, {p});
            const std::vector<std::byte> full = g.toHost(0);
            QCOMPARE(full.size(), n * sizeof(float));
            QVERIFY(std::memcmp(full.data(), want.data(), full.size()) == 0);
        }
        // Without a modifier rank an in-place change on the device is refused by name.
        try {
            core::GatheredParameters g(*engine, {p});
            const float x = 42.0f;
            engine->memory(0).copy(g[0].data, &x, sizeof x, comm::CopyKind::HostToSpace);
            g.close();
            QFAIL("a change without modifier_rank must be an EngineError");
        } catch (const core::EngineError &e) {
            QVERIFY2(std::string(e.what()).find(info.name) != std::string::npos, e.what());
        }
        const std::span<float> shard0 = engine->shardData(0, p);
        QCOMPARE(deviceToHost(*engine, 0, shard0.data(), 1).front(), want.front());
    }

    // A prefetch is issued ahead of the module that needs it and is still in flight when
    // the engine first polls it (on entering the next module): the host went on while the
    // gather ran. So that this does not depend on how fast the GPU copies, rank 0's
    // communication stream is held by a host callback from the end of step 1 until rank 0
    // enters `embed` in step 2, after step 2's prefetches were issued at the root and just
    // before that first poll. (Counting FetchEnds after any module entry instead cannot fail:
    // the engine only looks at gathers on module entries and exits.)
    void prefetchedGathersOverlapTheNextModule()
    {
#if SHARDSCOPE_HAVE_CUDA
        nn::TrainConfig c = smallConfig(worldForTest());
        c.externals = nn::Externals::Manual;
        c.layers = 4;
        c.steps = 3; // step 1 records the trace, 2 and 3 prefetch from it
        auto engine = cuda::makeNcclEngine(c);
        const int rank = engine->localRanks().front();
        // Static: the stream's callback may still read it after an early return.
        static std::atomic<bool> go;
        go.store(false);
        struct Release
        {
            ~Release() { go.store(true); } // whatever happens below
        } release;
        nn::buildModel(*engine, c);
        ReleasingSink sink(go, rank, engine->findModule("embed"), 2);
        engine->setEventSink(&sink);
        cudaError_t held = cudaErrorUnknown;
        cuda::trainOnGpu(*engine, c, [&](const nn::StepReport &r) {
            if (r.step != 1) return; // on rank 0's thread, after step 1's last collective
            auto &comm = dynamic_cast<comm::NcclCommunicator &>(engine->comm(rank));
            held = cudaLaunchHostFunc(
                comm.commStream(),
                [](void *flag) {
                    // Bounded, so that a release that never comes fails the test, not hangs it.
                    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                    while (!static_cast<std::atomic<bool> *>(flag)->load() &&
                           std::chrono::steady_clock::now() < until)
                        std::this_thread::yield();
                },
                &go);
        });
        engine->setEventSink(nullptr);
        QCOMPARE(held, cudaSuccess);

        // Per prefetched parameter: 0 issued, 1 a module was entered since (its first poll
        // follows at once, with the FetchEnds of what was complete), 2 the host went past
        // that poll while the gather was still in flight.
        std::map<std::uint32_t, int> open;
        int prefetches = 0, overlapped = 0;
        for (const telemetry::Event &e : sink.events()) {
            if (e.rank != rank || e.step < 2) continue;
            if (e.type == EventType::FetchBegin &&
                telemetry::readFetch(e).reason == FetchReason::Prefetch) {
                open[telemetry::readFetch(e).param] = 0;
                ++prefetches;
            } else if (e.type == EventType::FetchEnd) {
                const auto it = open.find(telemetry::readFetch(e).param);
                if (it == open.end()) continue;
                overlapped += it->second == 2;
                open.erase(it);
                continue;
            }
            for (auto &[param, state] : open)
                if (state == 1) state = 2;
            if (e.type == EventType::ModuleEnter)
                for (auto &[param, state] : open)
                    if (state == 0) state = 1;
        }
        QVERIFY2(prefetches > 0, "steps after the first prefetch from the recorded trace");
        QVERIFY2(overlapped > 0,
                 ("none of " + std::to_string(prefetches) +
                  " prefetched gathers was still in flight at the engine's first poll")
                     .c_str());
#endif
    }

  private:
    QTemporaryDir m_runtime;
};

QTEST_GUILESS_MAIN(TestGpuEngine)
#include "tst_gpuengine.moc"

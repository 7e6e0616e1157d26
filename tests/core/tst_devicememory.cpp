#include <QtTest>

#include <cstring>
#include <deque>
#include <functional>
#include <map>

#include "telemetry/eventfields.h"
#include "testworld.h"

using namespace shardscope;

// The engine must touch rank tensors only through the rank's MemorySpace and order its
// collectives with waitForCompute(), or it breaks on GPUs. These tests give it a
// "device" whose bytes are stored encoded (XOR 0x5A): any tensor the engine reads or
// writes directly with memcpy or host arithmetic comes out wrong when decoded. Its
// one-rank communicator completes collectives only when the test (or a wait) says so,
// as a GPU does when the comm stream gets to them, so INFLIGHT is observable.

namespace {

constexpr std::byte kKey{0x5A};

class EncodedMemory final : public comm::MemorySpace
{
  public:
    bool isHost() const override { return false; }
    std::string name() const override { return "encoded"; }
    std::byte *allocate(std::size_t bytes) override
    {
        if (!bytes) return nullptr;
        auto *p = static_cast<std::byte *>(::operator new(bytes));
        std::lock_guard lock(m_mutex);
        m_live[p] = bytes;
        ++allocations;
        return p;
    }
    void deallocate(std::byte *p, std::size_t bytes) noexcept override
    {
        if (!p) return;
        {
            std::lock_guard lock(m_mutex);
            auto it = m_live.find(p);
            if (it == m_live.end() || it->second != bytes)
                ++badFrees;
            else
                m_live.erase(it);
        }
        ::operator delete(p);
    }
    void copy(void *dst, const void *src, std::size_t bytes, comm::CopyKind kind) override
    {
        requireInside(kind == comm::CopyKind::HostToSpace ? dst : src, bytes);
        if (kind == comm::CopyKind::WithinSpace) requireInside(dst, bytes);
        std::memmove(dst, src, bytes);
        if (kind != comm::CopyKind::WithinSpace)
            for (std::size_t i = 0; i < bytes; ++i)
                static_cast<std::byte *>(dst)[i] ^= kKey;
    }
    void zero(void *dst, std::size_t bytes) override
    {
        requireInside(dst, bytes);
        std::memset(dst, static_cast<int>(kKey), bytes);
    }
    void addF32(float *dst, const float *src, std::size_t n) override
    {
        requireInside(dst, n * 4);
        requireInside(src, n * 4);
        for (std::size_t i = 0; i < n; ++i)
            store(dst + i, load(dst + i) + load(src + i));
    }

    static float load(const float *p)
    {
        std::byte b[4];
        std::memcpy(b, p, 4);
        for (auto &x : b)
            x ^= kKey;
        float f;
        std::memcpy(&f, b, 4);
        return f;
    }
    static void store(float *p, float f)
    {
        std::byte b[4];
        std::memcpy(b, &f, 4);
        for (auto &x : b)
            x ^= kKey;
        std::memcpy(p, b, 4);
    }
    // True when [p, p + bytes) lies in one live allocation.
    bool inside(const void *p, std::size_t bytes) const
    {
        std::lock_guard lock(m_mutex);
        auto it = m_live.upper_bound(static_cast<std::byte *>(const_cast<void *>(p)));
        if (it == m_live.begin()) return false;
        --it;
        const auto *b = static_cast<const std::byte *>(p);
        return b >= it->first && b + bytes <= it->first + it->second;
    }
    std::size_t liveCount() const
    {
        std::lock_guard lock(m_mutex);
        return m_live.size();
    }

    int allocations = 0;
    int badFrees = 0;
    int outside = 0;

  private:
    void requireInside(const void *p, std::size_t bytes)
    {
        if (bytes && !inside(p, bytes)) ++outside;
    }
    mutable std::mutex m_mutex;
    std::map<std::byte *, std::size_t> m_live;
};

// One rank whose collectives run when finish() is called or when they are waited on.
class DeferredComm final : public comm::Communicator
{
  public:
    explicit DeferredComm(EncodedMemory &mem) : m_mem(mem) {}

    int rank() const override { return 0; }
    int worldSize() const override { return 1; }
    comm::Backend backend() const override { return comm::Backend::Nccl; }
    bool deviceBuffers() const override { return true; }
    comm::MemorySpace &memory() override { return m_mem; }
    void waitForCompute() override { ++fences; }

    comm::CommHandle allGather(const void *send, void *recv, std::size_t bytes) override
    {
        ++issued;
        if (!m_mem.inside(send, bytes) || !m_mem.inside(recv, bytes)) ++m_mem.outside;
        return enqueue([=] { std::memmove(recv, send, bytes); });
    }
    comm::CommHandle broadcast(void *, std::size_t, int) override
    {
        ++issued;
        return enqueue([] {});
    }
    comm::CommHandle reduceScatter(const void *send, void *recv, std::size_t count, DType) override
    {
        ++issued;
        ++reduceScatters;
        fencesBeforeLastReduce = fences;
        return enqueue([=] { std::memmove(recv, send, count * 4); });
    }
    void barrier() override { finish(); }

    // Runs every collective issued so far, as the device would.
    void finish()
    {
        for (auto &op : m_ops)
            op->run();
        m_ops.clear();
    }
    std::size_t pending() const
    {
        std::size_t n = 0;
        for (auto &op : m_ops)
            n += op->done ? 0 : 1;
        return n;
    }

    bool failNext = false;
    int fences = 0;
    int fencesBeforeLastReduce = 0;
    int issued = 0;
    int reduceScatters = 0;

  private:
    struct Op final : comm::CommHandle::Impl
    {
        std::function<void()> fn;
        bool done = false;
        bool fail = false;
        void run()
        {
            if (!done) fn();
            done = true;
        }
        bool ready() override { return done; }
        void wait() override
        {
            run();
            if (fail)
                throw comm::CommError("all_gather failed on the device (injected by the test)");
        }
    };
    comm::CommHandle enqueue(std::function<void()> fn)
    {
        auto op = std::make_shared<Op>();
        op->fn = std::move(fn);
        op->fail = std::exchange(failNext, false);
        m_ops.push_back(op);
        return comm::CommHandle(op);
    }
    EncodedMemory &m_mem;
    std::vector<std::shared_ptr<Op>> m_ops;
};

std::vector<float> decode(core::Engine &e, core::TensorView v)
{
    const std::vector<std::byte> bytes = e.toHost(0, v);
    std::vector<float> out(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
}

std::vector<float> decode(core::Engine &e, std::span<float> s)
{
    return decode(e, core::TensorView{reinterpret_cast<std::byte *>(s.data()),
                                      static_cast<std::int64_t>(s.size()), DType::F32});
}

// root -> a (a.weight 40 floats), b (b.weight 30 floats, b.bias 3 floats: persistent)
struct Device
{
    EncodedMemory mem;
    DeferredComm *comm = nullptr;
    std::unique_ptr<core::Engine> engine;
    test::MemorySink sink;
    ModuleId a = 0, b = 0;
    ParamId aW = 0, bW = 0, bB = 0;

    Device()
    {
        core::EngineConfig cfg;
        cfg.worldSize = 1;
        cfg.persistenceThreshold = 8;
        std::vector<std::unique_ptr<comm::Communicator>> comms;
        auto c = std::make_unique<DeferredComm>(mem);
        comm = c.get();
        comms.push_back(std::move(c));
        engine = std::make_unique<core::Engine>(cfg, std::move(comms));
        a = engine->addModule(engine->root(), "a", "Linear");
        b = engine->addModule(engine->root(), "b", "Linear");
        const auto v = test::iota(40);
        aW = engine->addParameter(a, "weight", {4, 10}, DType::F32, v.data());
        bW = engine->addParameter(b, "weight", {3, 10}, DType::F32, v.data());
        bB = engine->addParameter(b, "bias", {3}, DType::F32, v.data());
        engine->partition();
        engine->setEventSink(&sink);
    }
    void forwardStep(bool finishAfterA = false)
    {
        core::Engine &e = *engine;
        e.beginStep(0);
        e.enterModule(0, a, Phase::Forward);
        e.access(0, aW);
        e.exitModule(0, a, Phase::Forward);
        if (finishAfterA) comm->finish();
        e.enterModule(0, b, Phase::Forward);
        e.access(0, bW);
        e.access(0, bB);
        e.exitModule(0, b, Phase::Forward);
        e.endStep(0, 0.0);
    }
};

} // namespace

class TestDeviceMemory : public QObject
{
    Q_OBJECT
  private slots:
    void tensorsLiveInTheSpace();
    void gradientsThroughTheSpace();
    void gatheredParametersOnTheDevice();
    void lateParameterAndAdoption();
    void prefetchIsInflightUntilComplete();
    void pollCompletesBeforeUse();
    void unusedPrefetchIsReleased();
    void failedGatherIsReported();
    void failedGatherInsideAScopeReachesTheCaller();
    void everyAllocationIsFreed();
};

void TestDeviceMemory::tensorsLiveInTheSpace()
{
    Device d;
    core::Engine &e = *d.engine;
    QCOMPARE(e.state().backend, std::string("nccl"));
    QCOMPARE(&e.memory(0), static_cast<comm::MemorySpace *>(&d.mem));
    QVERIFY(d.comm->fences >= 1); // partition() orders the first gathers after its uploads
    e.beginStep(0);
    e.enterModule(0, d.a, Phase::Forward);
    const core::TensorView w = e.access(0, d.aW);
    QVERIFY(d.mem.inside(w.data, 160));
    QCOMPARE(decode(e, w), test::iota(40));
    const core::TensorView bias =
        e.access(0, d.bB); // persistent: whole on the device, guarded read
    QCOMPARE(decode(e, bias), test::iota(3));
    e.exitModule(0, d.a, Phase::Forward);
    e.endStep(0, 0.0);
    QCOMPARE(decode(e, e.shardData(0, d.bW)), test::iota(30));
    const auto host = e.hostRead(d.aW);
    std::vector<float> f(40);
    std::memcpy(f.data(), host.data(), 160);
    QCOMPARE(f, test::iota(40));
    QCOMPARE(d.mem.outside, 0);
}

void TestDeviceMemory::gradientsThroughTheSpace()
{
    Device d;
    core::Engine &e = *d.engine;
    e.beginStep(0);
    e.zeroGrads(0);
    // The gradient is produced on the device, as a kernel would.
    comm::Buffer g(d.mem, 30 * 4);
    const auto values = test::iota(30, 0.5f);
    d.mem.copy(g.data(), values.data(), 30 * 4, comm::CopyKind::HostToSpace);
    const int fencesBefore = d.comm->fences;
    e.reduceScatterGrad(0, d.bW, g.f32());
    e.reduceScatterGrad(0, d.bW, g.f32()); // accumulates
    QVERIFY2(d.comm->fencesBeforeLastReduce > fencesBefore,
             "reduce_scatter must wait for the compute that wrote the gradient");
    std::vector<float> twice(values);
    for (float &x : twice)
        x *= 2.0f;
    QCOMPARE(decode(e, e.shardGrad(0, d.bW)), twice);
    e.zeroGrads(0);
    QCOMPARE(decode(e, e.shardGrad(0, d.bW)), std::vector<float>(30, 0.0f));
    e.endStep(0, 0.0);
    const int fencesAtRefresh = d.comm->fences;
    e.refreshPersistent(0);
    QVERIFY(d.comm->fences > fencesAtRefresh);
    QCOMPARE(d.mem.outside, 0);
}

void TestDeviceMemory::gatheredParametersOnTheDevice()
{
    Device d;
    core::Engine &e = *d.engine;
    {
        core::GatheredParameters g(e, 0, {d.aW}, 0);
        QCOMPARE(g.viewRank(), 0);
        std::vector<float> host(40);
        const auto bytes = g.toHost(0);
        std::memcpy(host.data(), bytes.data(), 160);
        QCOMPARE(host, test::iota(40));
        host[7] = -1.0f;
        d.mem.copy(g[0].data, host.data(), 160,
                   comm::CopyKind::HostToSpace); // an edit on the device
        g.close();
    }
    std::vector<float> want = test::iota(40);
    want[7] = -1.0f;
    QCOMPARE(decode(e, e.shardData(0, d.aW)), want);
    // Without a modifier an edit is detected through the space and discarded.
    bool threw = false;
    try {
        core::GatheredParameters g(e, 0, {d.aW});
        std::vector<float> host(40, 3.0f);
        d.mem.copy(g[0].data, host.data(), 160, comm::CopyKind::HostToSpace);
        g.close();
    } catch (const core::EngineError &err) {
        threw = QString(err.what()).contains("modifier_rank");
    }
    QVERIFY(threw);
    QCOMPARE(decode(e, e.shardData(0, d.aW)), want);
    QCOMPARE(d.mem.outside, 0);
}

void TestDeviceMemory::lateParameterAndAdoption()
{
    Device d;
    core::Engine &e = *d.engine;
    const auto v = test::iota(20, 100.0f);
    const ParamId late = e.addParameter(d.a, "late", {20}, DType::F32, v.data());
    QCOMPARE(decode(e, e.shardData(0, late)), v);
    e.adoptParameter(late);
    QVERIFY(e.param(late).partitioned);
    e.beginStep(0);
    e.enterModule(0, d.a, Phase::Forward);
    QCOMPARE(decode(e, e.access(0, late)), v);
    e.exitModule(0, d.a, Phase::Forward);
    e.endStep(0, 0.0);
    QCOMPARE(d.mem.outside, 0);
}

void TestDeviceMemory::prefetchIsInflightUntilComplete()
{
    Device d;
    core::Engine &e = *d.engine;
    d.forwardStep(); // records the trace
    d.comm->finish();
    d.sink.clear();
    e.beginStep(0);
    e.enterModule(0, d.a, Phase::Forward); // uses a.weight, prefetches b.weight
    QCOMPARE(e.status(0, d.bW), ParamStatus::Inflight);
    QCOMPARE(e.state().params[d.bW].status.front(), ParamStatus::Inflight);
    QVERIFY(d.comm->pending() >= 1);
    e.access(0, d.aW);
    e.exitModule(0, d.a, Phase::Forward);
    QCOMPARE(e.status(0, d.bW), ParamStatus::Inflight); // its collective has not run yet
    e.enterModule(0, d.b, Phase::Forward);              // use waits for it
    QCOMPARE(e.status(0, d.bW), ParamStatus::Available);
    QCOMPARE(decode(e, e.access(0, d.bW)), test::iota(30));
    e.exitModule(0, d.b, Phase::Forward);
    e.endStep(0, 0.0);
    const auto begins = d.sink.ofType(EventType::FetchBegin);
    const auto prefetch =
        std::find_if(begins.begin(), begins.end(), [&](const telemetry::Event &ev) {
            return telemetry::readFetch(ev).param == d.bW &&
                   telemetry::readFetch(ev).reason == FetchReason::Prefetch;
        });
    QVERIFY(prefetch != begins.end());
    QCOMPARE(e.state().params[d.bW].gatherCount, std::uint64_t(2));
}

void TestDeviceMemory::pollCompletesBeforeUse()
{
    Device d;
    core::Engine &e = *d.engine;
    d.forwardStep();
    d.comm->finish();
    d.sink.clear();
    e.beginStep(0);
    e.enterModule(0, d.a, Phase::Forward);
    e.access(0, d.aW);
    QCOMPARE(e.status(0, d.bW), ParamStatus::Inflight);
    d.comm->finish(); // the device finishes the gather while a computes
    QCOMPARE(e.status(0, d.bW), ParamStatus::Inflight); // not seen yet
    e.exitModule(0, d.a, Phase::Forward); // seen on exit: AVAILABLE before b is entered
    QCOMPARE(e.status(0, d.bW), ParamStatus::Available);
    e.enterModule(0, d.b, Phase::Forward);
    e.exitModule(0, d.b, Phase::Forward);
    e.endStep(0, 0.0);
    // The prefetch's FetchEnd precedes b's entry: the gather overlapped a.
    const auto events = d.sink.events();
    std::size_t fetchEnd = events.size(), enterB = events.size();
    for (std::size_t i = 0; i < events.size(); ++i) {
        if (events[i].type == EventType::FetchEnd &&
            telemetry::readFetch(events[i]).param == d.bW && fetchEnd == events.size())
            fetchEnd = i;
        if (events[i].type == EventType::ModuleEnter &&
            telemetry::readModule(events[i]).module == d.b)
            enterB = i;
    }
    QVERIFY(fetchEnd < enterB);
    QCOMPARE(telemetry::readFetch(events[fetchEnd]).reason, FetchReason::Prefetch);
}

void TestDeviceMemory::unusedPrefetchIsReleased()
{
    Device d;
    core::Engine &e = *d.engine;
    d.forwardStep();
    d.comm->finish();
    // This step leaves after a: b.weight was prefetched and is still in flight at endStep.
    e.beginStep(0);
    e.enterModule(0, d.a, Phase::Forward);
    QCOMPARE(e.status(0, d.bW), ParamStatus::Inflight);
    e.exitModule(0, d.a, Phase::Forward);
    e.endStep(0, 0.0);
    QCOMPARE(e.status(0, d.bW), ParamStatus::NotAvailable);
    QCOMPARE(d.comm->pending(), std::size_t(0));
    QCOMPARE(d.mem.badFrees, 0);
}

void TestDeviceMemory::failedGatherIsReported()
{
    Device d;
    core::Engine &e = *d.engine;
    e.beginStep(0);
    d.comm->failNext = true;
    bool threw = false;
    try {
        e.enterModule(0, d.a, Phase::Forward);
    } catch (const comm::CommError &err) {
        threw = QString(err.what()).contains("injected");
    }
    QVERIFY(threw);
    QCOMPARE(e.status(0, d.aW), ParamStatus::Inflight); // never seen complete
}

// The inner module's gather fails after its frame was pushed; the outer scope's exit then
// fails too while the CommError unwinds. The caller must get the CommError, not terminate.
void TestDeviceMemory::failedGatherInsideAScopeReachesTheCaller()
{
    Device d;
    core::Engine &e = *d.engine;
    e.beginStep(0);
    QString caught;
    try {
        core::ModuleScope outer(e, 0, d.a, Phase::Forward);
        d.comm->failNext = true;
        core::ModuleScope inner(e, 0, d.b, Phase::Forward);
    } catch (const comm::CommError &err) {
        caught = err.what();
    }
    QVERIFY2(caught.contains("injected"), qPrintable(caught));
}

void TestDeviceMemory::everyAllocationIsFreed()
{
    EncodedMemory *mem = nullptr;
    {
        Device d;
        mem = &d.mem;
        d.forwardStep();
        d.forwardStep();
        {
            core::GatheredParameters g(*d.engine, 0, {d.aW, d.bW});
        }
        QVERIFY(d.mem.allocations > 0);
        QCOMPARE(d.mem.badFrees, 0);
        // Tensors still held: shards, gradients, persistent b.bias.
        QVERIFY(d.mem.liveCount() > 0);
        d.engine.reset(); // frees through the space before the communicator goes
        QCOMPARE(d.mem.liveCount(), std::size_t(0));
        QCOMPARE(d.mem.badFrees, 0);
    }
    (void)mem;
}

QTEST_GUILESS_MAIN(TestDeviceMemory)
#include "tst_devicememory.moc"

// Clock probes against a real Inspector: the estimate finds a clock offset injected into the
// server (InspectorOptions::testClockOffsetNs), which also shifts every timestamp it sends;
// an engine of an older release (it refuses the unknown frame) gives a clean error; an idle
// live client gets heartbeats.

#include <QtTest>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "client/inspectorclient.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "core/engineprovider.h"
#include "server/inspector.h"
#include "telemetry/clock.h"
#include "wire/frame.h"
#include "wire/messages.h"

using namespace shardscope;

namespace {

std::unique_ptr<core::Engine> smallEngine()
{
    core::EngineConfig cfg;
    cfg.worldSize = 2;
    cfg.modelName = "clock";
    auto engine = std::make_unique<core::Engine>(cfg, comm::makeCpuWorld(2));
    const ModuleId m = engine->addModule(engine->root(), "fc", "Linear");
    std::vector<float> init(8, 1.0f);
    engine->addParameter(m, "weight", {8}, DType::F32, init.data());
    engine->partition();
    return engine;
}

void oneStep(core::Engine &e)
{
    e.forEachLocalRank([&](int r) {
        e.beginStep(r);
        e.endStep(r, 0.5);
    });
}

} // namespace

class TestClockProbe : public QObject
{
    Q_OBJECT

  private slots:
    void theInjectedOffsetIsFound();
    void anOlderEngineRefusesCleanly();
    void anIdleClientGetsHeartbeats();
};

void TestClockProbe::theInjectedOffsetIsFound()
{
    constexpr std::int64_t kOffset = 4'000'000'000;
    auto engine = smallEngine();
    server::InspectorOptions o;
    o.endpoint = "tcp:127.0.0.1:0";
    o.testClockOffsetNs = kOffset;
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*engine), o);
    oneStep(*engine);

    auto estimate = client::probeClock(inspector.endpoint(), 8, 5000);
    QVERIFY2(estimate, estimate ? "" : estimate.error().c_str());
    QCOMPARE(estimate->samples, 8);
    QVERIFY(estimate->valid);
    // Within the uncertainty, and the server's own turnaround (well under 2 ms here).
    QVERIFY2(std::llabs(estimate->offsetNs - kOffset) <=
                 static_cast<long long>(estimate->uncertaintyNs) + 2'000'000,
             qPrintable(QStringLiteral("estimated %1 ns ± %2 ns")
                            .arg(estimate->offsetNs)
                            .arg(estimate->uncertaintyNs)));

    // The same server's clock is not offset without the hook: the estimate is near 0.
    server::InspectorOptions plain;
    plain.endpoint = "tcp:127.0.0.1:0";
    auto engine2 = smallEngine();
    server::Inspector inspector2(std::make_unique<core::EngineStateProvider>(*engine2), plain);
    auto zero = client::probeClock(inspector2.endpoint(), 4, 5000);
    QVERIFY(zero && zero->valid);
    QVERIFY(std::llabs(zero->offsetNs) <= static_cast<long long>(zero->uncertaintyNs) + 2'000'000);

    // Every timestamp the offset server sends is on its (offset) clock.
    auto client = client::InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client, client ? "" : client.error().c_str());
    bool sawEvents = false;
    for (int i = 0; i < 200 && !sawEvents; ++i) {
        auto frame = (*client)->next(5000);
        QVERIFY(frame && frame->has_value());
        if ((**frame).type != wire::MessageType::EventBatch || (**frame).payload.empty()) continue;
        auto events = wire::decodeEvents((**frame).payload);
        QVERIFY(events);
        for (const telemetry::Event &e : *events)
            QVERIFY(e.tsNs > telemetry::nowNs() + kOffset / 2);
        sawEvents = true;
    }
    QVERIFY(sawEvents);
}

void TestClockProbe::anOlderEngineRefusesCleanly()
{
    // What a server of the release before clock probes answers to a frame of type 10: its
    // frame decoder does not know the type, so it sends bad_frame and closes.
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    QCOMPARE(::bind(listener, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
    QCOMPARE(::listen(listener, 4), 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener, reinterpret_cast<sockaddr *>(&addr), &len);
    std::thread old([listener] {
        const int fd = ::accept(listener, nullptr, nullptr);
        char buf[64];
        (void)::recv(fd, buf, sizeof buf, 0);
        const std::string err = wire::encodeFrame(
            wire::MessageType::Error,
            wire::encodeError({"bad_frame", "unknown message type 10; this endpoint speaks the "
                                            "ShardScope inspector protocol version 1"}));
        (void)::send(fd, err.data(), err.size(), MSG_NOSIGNAL);
        ::close(fd);
    });
    const std::string endpoint = "tcp:127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    auto estimate = client::probeClock(endpoint, 8, 5000);
    old.join();
    ::close(listener);
    QVERIFY(!estimate);
    QVERIFY2(estimate.error().find("does not answer clock probes (bad_frame") != std::string::npos,
             estimate.error().c_str());
    // Nobody listening at all is an error too, not a hang.
    QVERIFY(!client::probeClock(endpoint, 2, 1000));
}

void TestClockProbe::anIdleClientGetsHeartbeats()
{
    auto engine = smallEngine();
    server::InspectorOptions o;
    o.endpoint = "tcp:127.0.0.1:0";
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*engine), o);
    auto client = client::InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client, client ? "" : client.error().c_str());
    // Nothing happens in the engine; within a few seconds an empty EventBatch arrives.
    bool heartbeat = false;
    for (int i = 0; i < 50 && !heartbeat; ++i) {
        auto frame = (*client)->next(5000);
        QVERIFY(frame && frame->has_value());
        heartbeat = (**frame).type == wire::MessageType::EventBatch && (**frame).payload.empty();
    }
    QVERIFY(heartbeat);
}

QTEST_MAIN(TestClockProbe)
#include "tst_clockprobe.moc"

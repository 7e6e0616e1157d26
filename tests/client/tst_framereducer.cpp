// client::FrameReducer, the one reducer of the frames after the handshake (shardscope-capture's
// ClientState and the inspector's ConnectionWorker are its sinks): what each frame hands the
// sink, the order it enforces, and which errors say that retrying will not help.

#include <QtTest>

#include <string>
#include <vector>

#include "client/framereducer.h"
#include "telemetry/eventfields.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/statebinary.h"

using namespace shardscope;

namespace {

// Records what the reducer hands it, in order.
struct Recorder final : client::FrameSink
{
    std::vector<std::string> calls;
    std::vector<telemetry::Event> events;
    wire::Snapshot last;
    void onState(wire::Snapshot &&s) override
    {
        calls.push_back("state");
        last = std::move(s);
    }
    void onEvents(std::vector<telemetry::Event> &&e, bool history) override
    {
        calls.push_back(history ? "history events" : "live events");
        events.insert(events.end(), e.begin(), e.end());
    }
    void onHistoryBegin() override { calls.push_back("history begin"); }
    void onHistoryEnd() override { calls.push_back("history end"); }
    void onDropped(const wire::DroppedNotice &n) override
    {
        calls.push_back("dropped " + std::to_string(n.dropped) + "/" + std::to_string(n.total));
    }
    void onGoodbye(wire::Goodbye &&g) override { calls.push_back("goodbye " + g.reason); }
};

wire::Frame frame(wire::MessageType type, std::string payload)
{
    wire::FrameDecoder d;
    const std::string bytes = wire::encodeFrame(type, payload);
    d.feed(bytes.data(), bytes.size());
    auto f = d.next();
    return **f;
}

telemetry::Event stepEnd(std::uint32_t step)
{
    telemetry::Event e = telemetry::makeStepEnd(1.5);
    e.step = step;
    return e;
}

} // namespace

class TestFrameReducer : public QObject
{
    Q_OBJECT
  private slots:
    void aWholeConversationReachesTheSinkInOrder()
    {
        wire::Snapshot snap;
        snap.state.modelName = "m";
        snap.state.worldSize = 2;
        snap.state.step = 3;
        const std::vector<telemetry::Event> history{stepEnd(1), stepEnd(2)};
        const std::vector<telemetry::Event> live{stepEnd(3)};
        client::FrameReducer r;
        Recorder sink;
        for (const wire::Frame &f :
             {frame(wire::MessageType::StateBinary, wire::encodeBinaryState(snap)),
              frame(wire::MessageType::HistoryBegin, wire::encodeHistoryBegin(2)),
              frame(wire::MessageType::EventBatch, wire::encodeEvents(history)),
              frame(wire::MessageType::HistoryEnd, ""),
              frame(wire::MessageType::EventBatch, wire::encodeEvents(live)),
              frame(wire::MessageType::Dropped, wire::encodeDropped({4, 9})),
              frame(wire::MessageType::Goodbye, wire::encodeGoodbye({"done", 1, 1, 0}))}) {
            auto ok = r.apply(f, sink);
            QVERIFY2(ok.ok(), ok.error().c_str());
        }
        QCOMPARE(sink.calls, (std::vector<std::string>{"state", "history begin", "history events",
                                                       "history end", "live events", "dropped 4/9",
                                                       "goodbye done"}));
        QCOMPARE(sink.last.state.modelName, std::string("m"));
        QCOMPARE(sink.events.size(), std::size_t(3));
        QVERIFY(r.finished());
        QVERIFY(r.historyDone());
    }

    void outOfOrderFramesAreRefusedAndReachNoSink()
    {
        Recorder sink;
        {
            client::FrameReducer r;
            QVERIFY(!r.apply(frame(wire::MessageType::HistoryEnd, ""), sink).ok());
            QCOMPARE(r.lastError().message,
                     std::string("the engine ended a history it never began"));
            QVERIFY(r.lastError().refused);
        }
        {
            client::FrameReducer r;
            QVERIFY(
                r.apply(frame(wire::MessageType::HistoryBegin, wire::encodeHistoryBegin(0)), sink)
                    .ok());
            QVERIFY(r.apply(frame(wire::MessageType::HistoryEnd, ""), sink).ok());
            QVERIFY(
                !r.apply(frame(wire::MessageType::HistoryBegin, wire::encodeHistoryBegin(0)), sink)
                     .ok());
            QCOMPARE(r.lastError().message, std::string("the engine sent a second history"));
        }
        {
            client::FrameReducer r;
            QVERIFY(r.apply(frame(wire::MessageType::Goodbye, wire::encodeGoodbye({"x", 0, 0, 0})),
                            sink)
                        .ok());
            auto after =
                r.apply(frame(wire::MessageType::EventBatch, wire::encodeEvents({})), sink);
            QVERIFY(!after.ok());
            QVERIFY2(after.error().find("after its Goodbye") != std::string::npos,
                     after.error().c_str());
        }
        {
            client::FrameReducer r;
            auto hello = r.apply(frame(wire::MessageType::Hello, wire::encodeHello({})), sink);
            QCOMPARE(hello.error(), std::string("unexpected hello frame after the handshake"));
        }
        QCOMPARE(sink.calls,
                 (std::vector<std::string>{"history begin", "history end", "goodbye x"}));
    }

    void errorFramesSayWhetherRetryingCanHelp()
    {
        Recorder sink;
        client::FrameReducer r;
        QVERIFY(!r.apply(frame(wire::MessageType::Error,
                               wire::encodeError({"bad_token", "wrong token"})),
                         sink)
                     .ok());
        QCOMPARE(r.lastError().message, std::string("the engine reported an error: wrong token"));
        QVERIFY(r.lastError().refused);
        QVERIFY(!r.apply(frame(wire::MessageType::Error,
                               wire::encodeError({"too_many_clients", "busy"})),
                         sink)
                     .ok());
        QVERIFY(!r.lastError().refused);
        QVERIFY(!r.apply(frame(wire::MessageType::EventBatch, "garbage"), sink).ok());
        QVERIFY(r.lastError().refused);
        QVERIFY(sink.calls.empty());
    }
};

QTEST_GUILESS_MAIN(TestFrameReducer)
#include "tst_framereducer.moc"

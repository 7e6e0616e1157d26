#include <QtTest>

#include <QTemporaryDir>
#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <map>
#include <netinet/in.h>
#include <poll.h>
#include <set>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "agent/agentstate.h"
#include "client/clientstate.h"
#include "client/inspectorclient.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "core/engineprovider.h"
#include "server/inspector.h"
#include "server/sockets.h"
#include "snapshotcompare.h"
#include "telemetry/eventfields.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"
#include "wire/snapshot.h"

using namespace shardscope;
using client::InspectorClient;

namespace {

// Story 1 in miniature: lm_head reads the tied embed.weight without registering it.
struct TiedRun
{
    std::unique_ptr<core::Engine> engine;
    ModuleId embed = 0, lmHead = 0;
    ParamId embedW = 0, headB = 0;
    int stepsDone = 0;

    explicit TiedRun(int world)
    {
        core::EngineConfig cfg;
        cfg.worldSize = world;
        cfg.persistenceThreshold = 4;
        cfg.modelName = "tied";
        engine = std::make_unique<core::Engine>(cfg, comm::makeCpuWorld(world));
        embed = engine->addModule(engine->root(), "embed", "Embedding");
        lmHead = engine->addModule(engine->root(), "lm_head", "Linear");
        std::vector<float> init(30);
        for (std::size_t i = 0; i < init.size(); ++i)
            init[i] = static_cast<float>(i);
        embedW = engine->addParameter(embed, "weight", {6, 5}, DType::F32, init.data());
        headB = engine->addParameter(lmHead, "bias", {6}, DType::F32, init.data());
        engine->partition();
    }

    // scopes: how many times each step runs the embed/lm_head pair (more events per step).
    void steps(int n, int scopes = 1)
    {
        engine->forEachLocalRank([&](int r) {
            core::Engine &e = *engine;
            for (int s = 0; s < n; ++s) {
                e.beginStep(r);
                for (int k = 0; k < scopes; ++k) {
                    {
                        core::ModuleScope scope(e, r, embed, Phase::Forward);
                        (void)e.access(r, embedW);
                    }
                    core::ModuleScope scope(e, r, lmHead, Phase::Forward);
                    (void)e.access(r, embedW);
                    (void)e.access(r, headB);
                }
                e.endStep(r, 0.25);
            }
        });
        stepsDone += n;
    }
};

server::InspectorOptions tcpOptions(std::size_t history = 65536)
{
    server::InspectorOptions o;
    o.endpoint = "tcp:127.0.0.1:0";
    o.historyEvents = history;
    return o;
}

// Reads frames into state until done() holds; false if the stream ended or stalled for 30 s.
template <class Done>
bool readUntil(InspectorClient &client, client::ClientState &state, Done done,
               std::string *error = nullptr)
{
    while (!done()) {
        auto frame = client.next(30000);
        if (!frame || !frame->has_value()) {
            if (error) *error = frame ? "no frame for 30 s" : frame.error();
            return false;
        }
        auto applied = state.apply(**frame);
        if (!applied) {
            if (error) *error = applied.error();
            return false;
        }
    }
    return true;
}

const state::ViolationRecord *
findUnregistered(const state::EngineState &s, const std::string &accessor, const std::string &param)
{
    for (const state::ViolationRecord &v : s.violations) {
        if (v.kind != ViolationKind::UnregisteredAccess || v.accessor >= s.modules.size()) continue;
        for (const state::ParamRecord &p : s.params)
            if (p.id == v.param && p.name == param && s.modules[v.accessor].path == accessor)
                return &v;
    }
    return nullptr;
}

// Waits up to 10 s for the server to close fd; true if it did.
bool closedByServer(int fd)
{
    char buf[4096];
    for (int i = 0; i < 100; ++i) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return true;
    }
    return false;
}

// Reads frames from fd until an Error frame (returned) or the end of the stream (nullopt).
std::optional<wire::ErrorMessage> errorFromServer(int fd)
{
    wire::FrameDecoder decoder;
    char buf[65536];
    for (int i = 0; i < 200; ++i) {
        for (;;) {
            auto f = decoder.next();
            if (!f.ok() || !f.value()) break;
            if (f.value()->type == wire::MessageType::Error) {
                auto err = wire::decodeError(f.value()->payload);
                if (err.ok()) return *err;
                return std::nullopt;
            }
        }
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return std::nullopt;
        decoder.feed(buf, static_cast<std::size_t>(n));
    }
    return std::nullopt;
}

std::string helloFrame(const std::string &token)
{
    wire::Hello hello;
    hello.token = token;
    std::string frame;
    wire::appendFrame(frame, wire::MessageType::Hello, wire::encodeHello(hello));
    return frame;
}

} // namespace

class TestInspector : public QObject
{
    Q_OBJECT
  private slots:
    void initTestCase();
    void lateClientGetsStateHistoryAndLiveEvents();
    void severalClientsAtOnce();
    void eachClientGetsTheStateFormatItAskedFor();
    void newEventKindsOnlyToClientsThatAskedForThem();
    void collectiveKindsOnlyToClientsOfEvents3();
    void stalledClientNeverBlocksTrainingAndLearnsWhatItLost();
    void wrongTokenIsRefusedWithAClearMessage();
    void wrongProtocolVersionIsRefused();
    void foreignClientGetsAReadableError();
    void bytesAfterAValidHelloAreABadFrame();
    void helloWithAByteOrderMarkIsAProtocolError();
    void helloVersionOutsideU16IsAProtocolError();
    void clientRefusesAnEndpointThatIsNotShardScope();
    void nonLoopbackWithoutTokenIsRefused();
    void defaultUnixSocketIsPrivateAndDiscoverable();
    void snapshotOutIsWrittenAtFinish();
    void noListenStillWritesTheSnapshot();
    void telemetryOffStillServesTheChangingState();
    void badEndpointsAreInspectorErrors();
    void silentConnectionsDoNotLockClientsOut();
    void clientsBeyondThirtyTwoAreRefusedAfterTheirHello();
    void clientThatKeepsSendingIsClosed();
    void historyQueuedPerClientIsBounded();
    void waitForClientReturnsOnceOneIsLive();
    void costCountsTheServerThreadsWork();

  private:
    QTemporaryDir m_runtime;
};

void TestInspector::initTestCase()
{
    QVERIFY(m_runtime.isValid());
    ::setenv("XDG_RUNTIME_DIR", m_runtime.path().toLocal8Bit().constData(), 1);
}

void TestInspector::lateClientGetsStateHistoryAndLiveEvents()
{
    TiedRun run(2);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    QVERIFY(inspector.endpoint().starts_with("tcp:127.0.0.1:"));
    QVERIFY(!inspector.endpoint().ends_with(":0"));
    run.steps(3);

    auto client = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    const wire::Welcome &w = (*client)->welcome();
    QCOMPARE(w.model, std::string("tied"));
    QCOMPARE(w.worldSize, 2);
    QCOMPARE(w.backend, std::string("cpu"));
    QCOMPARE(w.pid, std::int64_t(::getpid()));

    client::ClientState state;
    std::string error;
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.historyDone(); }, &error),
             error.c_str());
    const state::EngineState &st = state.snapshot().state;
    QCOMPARE(st.step, std::uint32_t(3));
    QCOMPARE(st.params.size(), std::size_t(2));
    QCOMPARE(st.params[0].name, std::string("embed.weight"));
    QCOMPARE(st.params[0].partitionNumel, std::int64_t(15));
    const state::ViolationRecord *v = findUnregistered(st, "lm_head", "embed.weight");
    QVERIFY(v != nullptr);
    QCOMPARE(st.modules[v->owner].path, std::string("embed"));
    QCOMPARE(v->fix, std::string("register_external_parameter(lm_head, embed.weight)"));

    // The history holds what already happened: three step ends per rank, the accesses.
    QVERIFY(state.historyEvents() > 0);
    int stepEnds = 0, accesses = 0;
    for (const telemetry::Event &e : state.snapshot().events) {
        stepEnds += e.type == EventType::StepEnd;
        if (e.type == EventType::UnregisteredAccess) {
            ++accesses;
            QCOMPARE(telemetry::readAccess(e).accessor, run.lmHead);
            QCOMPARE(telemetry::readAccess(e).param, run.embedW);
            QCOMPARE(telemetry::readAccess(e).owner, run.embed);
        }
    }
    QCOMPARE(stepEnds, 3 * 2);
    QCOMPARE(accesses, 3 * 2);

    // Live: two more steps arrive as events, and a fresh state follows the step ends.
    run.steps(2);
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.latestCompletedStep() >= 5; }, &error),
             error.c_str());
    QVERIFY(state.liveEvents() > 0);
    std::thread finisher([&] { inspector.finish(); });
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.finished(); }, &error),
             error.c_str());
    finisher.join();
    QCOMPARE(state.snapshot().state.step, std::uint32_t(5));
    const wire::Goodbye &bye = state.goodbye();
    QCOMPARE(bye.eventsDropped, std::uint64_t(0));
    QCOMPARE(bye.eventsSent, state.liveEvents());
    QCOMPARE(bye.eventsOffered, bye.eventsSent);
    auto closed = (*client)->next(5000);
    QVERIFY(!closed.ok());
    QCOMPARE(closed.error(), std::string("the engine closed the connection"));
}

void TestInspector::severalClientsAtOnce()
{
    TiedRun run(2);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    auto a = InspectorClient::connect(inspector.endpoint(), {});
    auto b = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY(a.ok() && b.ok());
    run.steps(2);
    std::thread finisher([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        inspector.finish();
    });
    client::ClientState sa, sb;
    std::string error;
    QVERIFY2(readUntil(
                 **a, sa, [&] { return sa.finished(); }, &error),
             error.c_str());
    QVERIFY2(readUntil(
                 **b, sb, [&] { return sb.finished(); }, &error),
             error.c_str());
    finisher.join();
    QCOMPARE(sa.snapshot().state.step, std::uint32_t(2));
    QCOMPARE(sb.snapshot().state.step, std::uint32_t(2));
    QCOMPARE(sa.snapshot().events.size(), sb.snapshot().events.size());
    QVERIFY(sa.liveEvents() > 0);
    QCOMPARE(sa.goodbye().eventsOffered, sb.goodbye().eventsOffered);
}

// A client whose Hello lists "state_binary" (every C++ client's default) gets StateBinary
// frames; one that does not (older clients, the Python client of protocol.md) gets JSON
// State frames; both end with the same state.
void TestInspector::eachClientGetsTheStateFormatItAskedFor()
{
    TiedRun run(2);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    run.steps(1);
    InspectorClient::Options older;
    older.capabilities = {"state", "events", "history", "dropped"};
    // A client of the release before StateBinary layout 2: "state_binary" only.
    InspectorClient::Options layout1;
    layout1.capabilities = {"state", "events", "history", "dropped", "state_binary"};
    // ... and of the release before layout 3 (FSDP2's units and placements).
    InspectorClient::Options layout2 = layout1;
    layout2.capabilities.push_back("state_binary_2");
    auto binary = InspectorClient::connect(inspector.endpoint(), {});
    auto json = InspectorClient::connect(inspector.endpoint(), older);
    auto one = InspectorClient::connect(inspector.endpoint(), layout1);
    auto two = InspectorClient::connect(inspector.endpoint(), layout2);
    QVERIFY2(binary.ok(), binary.error().c_str());
    QVERIFY2(json.ok(), json.error().c_str());
    QVERIFY2(one.ok(), one.error().c_str());
    QVERIFY2(two.ok(), two.error().c_str());
    const auto &caps = (*json)->welcome().capabilities;
    QVERIFY(std::find(caps.begin(), caps.end(), "state_binary") != caps.end());
    run.steps(2);
    std::thread finisher([&] { inspector.finish(); });
    std::map<InspectorClient *, std::map<wire::MessageType, int>> seen;
    std::map<InspectorClient *, std::set<std::uint16_t>> layouts; // of its StateBinary frames
    client::ClientState sb, sj, s1, s2;
    for (auto [client, state] : {std::pair{binary->get(), &sb}, std::pair{json->get(), &sj},
                                 std::pair{one->get(), &s1}, std::pair{two->get(), &s2}}) {
        while (!state->finished()) {
            auto frame = client->next(30000);
            QVERIFY2(frame.ok() && frame->has_value(),
                     frame.ok() ? "no frame for 30 s" : frame.error().c_str());
            ++seen[client][(*frame)->type];
            if ((*frame)->type == wire::MessageType::StateBinary && (*frame)->payload.size() > 6) {
                std::uint16_t layout = 0;
                std::memcpy(&layout, (*frame)->payload.data() + 4, 2);
                layouts[client].insert(layout);
            }
            const auto applied = state->apply(**frame);
            QVERIFY2(applied.ok(), applied.error().c_str());
        }
    }
    finisher.join();
    QVERIFY(seen[binary->get()][wire::MessageType::StateBinary] >= 2); // on attach and at the end
    QCOMPARE(seen[binary->get()][wire::MessageType::State], 0);
    QVERIFY(seen[json->get()][wire::MessageType::State] >= 2);
    QCOMPARE(seen[json->get()][wire::MessageType::StateBinary], 0);
    const state::EngineState &a = sb.snapshot().state, &b = sj.snapshot().state;
    QCOMPARE(a.step, std::uint32_t(3));
    QCOMPARE(b.step, a.step);
    test::compareStates(a, b); // the last State, as either format carried it
    if (QTest::currentTestFailed()) return;
    QVERIFY(findUnregistered(a, "lm_head", "embed.weight") != nullptr);
    // Layout 5 to this release's clients; layout 2 to a client that listed "state_binary_2"
    // but not "state_binary_3" (the engine has no FSDP units and its violations the severity
    // their kind and action give: the same state); layout 1, the same state without
    // locations, to a client that listed only "state_binary".
    QCOMPARE(layouts[binary->get()], (std::set<std::uint16_t>{5}));
    QCOMPARE(findUnregistered(a, "lm_head", "embed.weight")->severity, Severity::Cost); // gathered
    QCOMPARE(layouts[two->get()], (std::set<std::uint16_t>{2}));
    QCOMPARE(layouts[one->get()], (std::set<std::uint16_t>{1}));
    test::compareStates(s2.snapshot().state, a);
    QVERIFY(findUnregistered(a, "lm_head", "embed.weight")->location.known());
    const state::ViolationRecord *old =
        findUnregistered(s1.snapshot().state, "lm_head", "embed.weight");
    QVERIFY(old != nullptr);
    QVERIFY(!old->location.known());
    QCOMPARE(old->fix, findUnregistered(a, "lm_head", "embed.weight")->fix);
    // The same events, but for the collectives (kinds 22, 23), which only a client listing
    // "events_3" gets: one begin and one end per gather.
    const auto collectives = [](const client::ClientState &st) {
        return std::size_t(std::count_if(
            st.snapshot().events.begin(), st.snapshot().events.end(), [](const auto &e) {
                return e.type == EventType::CollectiveBegin || e.type == EventType::CollectiveEnd;
            }));
    };
    QVERIFY(collectives(sb) > 0);
    QCOMPARE(collectives(sj), std::size_t(0));
    QCOMPARE(sb.snapshot().events.size(), sj.snapshot().events.size() + collectives(sb));
}

// Gradient reduce-scatters (kinds 19, 20) go to clients that list "events_2" (this release's);
// a client of an earlier release, which would refuse the whole batch, gets every other event.
void TestInspector::newEventKindsOnlyToClientsThatAskedForThem()
{
    TiedRun run(2);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    const std::vector<float> grad(30, 1.0f);
    auto reduceStep = [&] {
        run.engine->forEachLocalRank([&](int r) {
            run.engine->beginStep(r);
            run.engine->reduceScatterGrad(r, run.embedW, grad.data());
            run.engine->endStep(r, 0.5);
        });
    };
    reduceStep(); // in the history of both clients
    InspectorClient::Options older;
    older.capabilities = {"state",   "events",       "history",
                          "dropped", "state_binary", "state_binary_2"};
    auto current = InspectorClient::connect(inspector.endpoint(), {});
    auto earlier = InspectorClient::connect(inspector.endpoint(), older);
    QVERIFY2(current.ok(), current.error().c_str());
    QVERIFY2(earlier.ok(), earlier.error().c_str());
    reduceStep(); // live
    std::thread finisher([&] { inspector.finish(); });
    client::ClientState sc, se;
    for (auto [c, state] : {std::pair{current->get(), &sc}, std::pair{earlier->get(), &se}}) {
        std::string error;
        QVERIFY2(readUntil(
                     *c, *state, [&] { return state->finished(); }, &error),
                 error.c_str());
    }
    finisher.join();
    auto count = [](const client::ClientState &st, EventType t) {
        return int(std::count_if(st.snapshot().events.begin(), st.snapshot().events.end(),
                                 [&](const telemetry::Event &e) { return e.type == t; }));
    };
    // Two steps on two ranks, one parameter each.
    QCOMPARE(count(sc, EventType::ReduceScatterBegin), 4);
    QCOMPARE(count(sc, EventType::ReduceScatterEnd), 4);
    QCOMPARE(count(se, EventType::ReduceScatterBegin), 0);
    QCOMPARE(count(se, EventType::ReduceScatterEnd), 0);
    QCOMPARE(count(se, EventType::StepEnd), count(sc, EventType::StepEnd));
    // ... and each reduce-scatter's place in the rank's collective sequence (kinds 22, 23).
    QCOMPARE(count(sc, EventType::CollectiveBegin), 4);
    QCOMPARE(count(sc, EventType::CollectiveEnd), 4);
    QCOMPARE(se.snapshot().events.size() + 16, sc.snapshot().events.size());
}

// Collectives (kinds 22, 23) go to clients that list "events_3"; one of the release before
// (events_2) gets the reduce-scatters but not them, one of the release before that neither.
void TestInspector::collectiveKindsOnlyToClientsOfEvents3()
{
    agent::AgentConfig config;
    config.worldSize = 1;
    auto provider = std::make_unique<agent::AgentState>(config);
    agent::AgentState &state = *provider;
    server::Inspector inspector(std::move(provider), tcpOptions());
    auto step = [&] {
        state.stepBegin();
        const std::uint64_t seq =
            state.collectiveBegin(CollectiveKind::AllGather, 0, 0, FetchReason::Forward, 4096, 2);
        state.collectiveEnd(0, seq);
        state.reduceScatterBegin(0, kNoParam, 4096, 2);
        state.reduceScatterEnd(0, kNoParam, 4096, 2);
        state.stepEnd(0.5);
    };
    step(); // in the history of every client
    InspectorClient::Options events2, events1;
    events1.capabilities = {"state",   "events",       "history",
                            "dropped", "state_binary", "state_binary_2"};
    events2.capabilities = events1.capabilities;
    events2.capabilities.push_back(std::string(wire::kCapabilityEvents2));
    auto current = InspectorClient::connect(inspector.endpoint(), {});
    auto second = InspectorClient::connect(inspector.endpoint(), events2);
    auto first = InspectorClient::connect(inspector.endpoint(), events1);
    QVERIFY2(current.ok(), current.error().c_str());
    QVERIFY2(second.ok(), second.error().c_str());
    QVERIFY2(first.ok(), first.error().c_str());
    step(); // live
    std::thread finisher([&] { inspector.finish(); });
    client::ClientState s3, s2, s1;
    for (auto [c, st] : {std::pair{current->get(), &s3}, std::pair{second->get(), &s2},
                         std::pair{first->get(), &s1}}) {
        std::string error;
        QVERIFY2(readUntil(
                     *c, *st, [&] { return st->finished(); }, &error),
                 error.c_str());
    }
    finisher.join();
    auto count = [](const client::ClientState &st, EventType t) {
        return int(std::count_if(st.snapshot().events.begin(), st.snapshot().events.end(),
                                 [&](const telemetry::Event &e) { return e.type == t; }));
    };
    QCOMPARE(count(s3, EventType::CollectiveBegin), 2);
    QCOMPARE(count(s3, EventType::CollectiveEnd), 2);
    QCOMPARE(count(s3, EventType::ReduceScatterBegin), 2);
    QCOMPARE(count(s2, EventType::CollectiveBegin), 0);
    QCOMPARE(count(s2, EventType::CollectiveEnd), 0);
    QCOMPARE(count(s2, EventType::ReduceScatterBegin), 2);
    QCOMPARE(count(s1, EventType::CollectiveBegin), 0);
    QCOMPARE(count(s1, EventType::ReduceScatterBegin), 0);
    QCOMPARE(count(s1, EventType::StepEnd), 2);
    QCOMPARE(s2.snapshot().events.size() + 4, s3.snapshot().events.size());
    QCOMPARE(s1.snapshot().events.size() + 4, s2.snapshot().events.size());
    const auto seqs = [&] {
        std::vector<std::uint64_t> out;
        for (const telemetry::Event &e : s3.snapshot().events)
            if (e.type == EventType::CollectiveEnd) out.push_back(telemetry::readCollective(e).seq);
        return out;
    }();
    QCOMPARE(seqs, (std::vector<std::uint64_t>{1, 2}));
}

void TestInspector::stalledClientNeverBlocksTrainingAndLearnsWhatItLost()
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions(16));
    auto client = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    // The client now stops reading. Training goes on until the server had to drop
    // events for it (a few megabytes of queue), bounded by a step budget.
    // Between batches the training thread yields, so that on a loaded machine the server
    // thread drains the rings into the client's queue instead of the rings overflowing
    // first (which drops in the engine, not for the client, and is not what this tests).
    int batches = 0;
    while (inspector.clientDroppedEvents() == 0 && batches < 400) {
        run.steps(10, 200);
        ++batches;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    QVERIFY2(inspector.clientDroppedEvents() > 0, "the server never had to drop events");
    run.steps(10, 200); // training still completes steps while the client is stalled
    const int stepsRun = run.stepsDone;
    QCOMPARE(run.engine->step(0), std::uint32_t(stepsRun));

    // The client resumes: it is told how many events it lost, then gets the rest.
    client::ClientState state;
    std::string error;
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.droppedNotices() > 0; }, &error),
             error.c_str());
    QVERIFY(state.clientDropped() > 0);
    std::thread finisher([&] { inspector.finish(); });
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.finished(); }, &error),
             error.c_str());
    finisher.join();
    const wire::Goodbye &bye = state.goodbye();
    QCOMPARE(state.clientDropped(), bye.eventsDropped);
    QCOMPARE(state.clientDropped(), inspector.clientDroppedEvents());
    QCOMPARE(state.liveEvents(), bye.eventsSent);
    QCOMPARE(bye.eventsSent + bye.eventsDropped, bye.eventsOffered);
    QVERIFY(bye.eventsOffered <= inspector.publishedEvents());
    QCOMPARE(state.snapshot().state.step, std::uint32_t(stepsRun));
    QVERIFY(state.snapshot().droppedEvents >= state.clientDropped());
}

void TestInspector::wrongTokenIsRefusedWithAClearMessage()
{
    TiedRun run(1);
    server::InspectorOptions o = tcpOptions();
    o.token = "s3cret";
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o);
    auto none = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY(!none.ok());
    QCOMPARE(none.error(), std::string("the engine refused the connection: this engine requires a "
                                       "token; pass --token SECRET"));
    InspectorClient::Options wrong;
    wrong.token = "guess";
    auto bad = InspectorClient::connect(inspector.endpoint(), wrong);
    QVERIFY(!bad.ok());
    QVERIFY2(bad.error().find("wrong token") != std::string::npos, bad.error().c_str());
    InspectorClient::Options right;
    right.token = "s3cret";
    auto good = InspectorClient::connect(inspector.endpoint(), right);
    QVERIFY2(good.ok(), good.error().c_str());
}

void TestInspector::wrongProtocolVersionIsRefused()
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    InspectorClient::Options future;
    future.version = 2;
    auto r = InspectorClient::connect(inspector.endpoint(), future);
    QVERIFY(!r.ok());
    QVERIFY2(
        r.error().find("the engine refused the connection: protocol version 2 is not supported: "
                       "this engine speaks version 1") != std::string::npos,
        r.error().c_str());
}

void TestInspector::foreignClientGetsAReadableError()
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    auto fd = wire::connectTo(inspector.endpoint());
    QVERIFY(fd.ok());
    QVERIFY(client::sendAll(*fd, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"));
    wire::FrameDecoder decoder;
    std::optional<wire::Frame> frame;
    char buf[4096];
    while (!frame) {
        const ssize_t n = ::recv(*fd, buf, sizeof buf, 0);
        QVERIFY(n > 0);
        decoder.feed(buf, static_cast<std::size_t>(n));
        auto f = decoder.next();
        QVERIFY(f.ok());
        frame = std::move(f.value());
    }
    ::close(*fd);
    QCOMPARE(frame->type, wire::MessageType::Error);
    auto err = wire::decodeError(frame->payload);
    QVERIFY(err.ok());
    QCOMPARE(err->code, std::string("bad_magic"));
    QVERIFY2(err->message.find("not a ShardScope stream") != std::string::npos,
             err->message.c_str());
}

// Issue #13: bad_magic is for the first bytes of a connection only; bytes after a valid
// Hello that are not a frame break the stream: bad_frame, then the server closes.
void TestInspector::bytesAfterAValidHelloAreABadFrame()
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    auto fd = wire::connectTo(inspector.endpoint());
    QVERIFY(fd.ok());
    QVERIFY(client::sendAll(*fd, helloFrame("") + "GET / HTTP/1.1\r\n\r\n"));
    const auto err = errorFromServer(*fd);
    QVERIFY(err.has_value());
    QCOMPARE(err->code, std::string("bad_frame"));
    QVERIFY(closedByServer(*fd));
    ::close(*fd);
}

// The Error a fresh inspector answers a Hello frame carrying `payload` with.
std::optional<wire::ErrorMessage> refusalOfHello(const std::string &payload)
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    auto fd = wire::connectTo(inspector.endpoint());
    if (!fd.ok()) return std::nullopt;
    std::string frame;
    wire::appendFrame(frame, wire::MessageType::Hello, payload);
    std::optional<wire::ErrorMessage> err;
    if (client::sendAll(*fd, frame)) err = errorFromServer(*fd);
    ::close(*fd);
    return err;
}

// Issue #13: JSON payloads carry no byte order mark; a Hello with one is not a valid Hello.
void TestInspector::helloWithAByteOrderMarkIsAProtocolError()
{
    const auto err = refusalOfHello("\xEF\xBB\xBF" + wire::encodeHello(wire::Hello{}));
    QVERIFY(err.has_value());
    QCOMPARE(err->code, std::string("protocol"));
    QVERIFY2(err->message.find("byte order mark") != std::string::npos, err->message.c_str());
}

// Issue #13: a version that is not an integer in 0-65535 makes the Hello invalid
// (`protocol`); version_mismatch is for versions a later release could speak.
void TestInspector::helloVersionOutsideU16IsAProtocolError()
{
    const auto err = refusalOfHello(R"({"protocol":"shardscope","version":70000})");
    QVERIFY(err.has_value());
    QCOMPARE(err->code, std::string("protocol"));
    QVERIFY2(err->message.find("hello.version") != std::string::npos, err->message.c_str());
}

void TestInspector::clientRefusesAnEndpointThatIsNotShardScope()
{
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    QCOMPARE(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
    QCOMPARE(::listen(fd, 1), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
    std::thread fake([fd] {
        const int c = ::accept(fd, nullptr, nullptr);
        client::sendAll(c, "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n");
        char buf[256];
        (void)::recv(c, buf, sizeof buf, 0);
        ::close(c);
    });
    auto r = InspectorClient::connect("tcp:127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), {});
    fake.join();
    ::close(fd);
    QVERIFY(!r.ok());
    QVERIFY2(r.error().find("not a ShardScope stream") != std::string::npos, r.error().c_str());
    QVERIFY2(r.error().find("is the endpoint a ShardScope engine?") != std::string::npos,
             r.error().c_str());

    auto refused =
        InspectorClient::connect("tcp:127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), {});
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().find("Connection refused") != std::string::npos,
             refused.error().c_str());
}

void TestInspector::nonLoopbackWithoutTokenIsRefused()
{
    TiedRun run(1);
    server::InspectorOptions o = tcpOptions();
    o.endpoint = "tcp:0.0.0.0:0";
    try {
        server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o);
        QFAIL("a non-loopback bind without a token was accepted");
    } catch (const server::InspectorError &e) {
        const std::string msg = e.what();
        QVERIFY2(msg.find("refusing to listen on tcp:0.0.0.0:0 without a token") !=
                     std::string::npos,
                 e.what());
        QVERIFY2(msg.find("--token") != std::string::npos, e.what());
    }
    o.token = "s3cret";
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o);
    QVERIFY(inspector.endpoint().starts_with("tcp:0.0.0.0:"));
    const std::string port = inspector.endpoint().substr(std::string("tcp:0.0.0.0:").size());
    InspectorClient::Options opts;
    opts.token = "s3cret";
    auto c = InspectorClient::connect("tcp:127.0.0.1:" + port, opts);
    QVERIFY2(c.ok(), c.error().c_str());
}

void TestInspector::defaultUnixSocketIsPrivateAndDiscoverable()
{
    TiedRun run(2);
    const std::string dir = wire::defaultRuntimeDir();
    QCOMPARE(dir, m_runtime.path().toStdString() + "/shardscope");
    std::string socketPath;
    {
        server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                    server::InspectorOptions{});
        socketPath = wire::defaultSocketPath(::getpid());
        QCOMPARE(inspector.endpoint(), "unix:" + socketPath);
        struct stat st
        {
        };
        QCOMPARE(::stat(dir.c_str(), &st), 0);
        QCOMPARE(st.st_mode & 0777, mode_t(0700));
        QCOMPARE(::stat(socketPath.c_str(), &st), 0);
        QVERIFY(S_ISSOCK(st.st_mode));
        QCOMPARE(st.st_mode & 0777, mode_t(0600));

        const auto engines = wire::listLiveEngines();
        QCOMPARE(engines.size(), std::size_t(1));
        QCOMPARE(engines[0].pid, std::int64_t(::getpid()));
        QCOMPARE(engines[0].endpoint, inspector.endpoint());
        QCOMPARE(engines[0].model, std::string("tied"));
        QCOMPARE(engines[0].worldSize, 2);
        QCOMPARE(engines[0].backend, std::string("cpu"));
        QVERIFY(!engines[0].tokenRequired);

        auto c = InspectorClient::connect(engines[0].endpoint, {});
        QVERIFY2(c.ok(), c.error().c_str());
        run.steps(1);
    }
    QVERIFY(::access(socketPath.c_str(), F_OK) != 0);
    QVERIFY(wire::listLiveEngines().empty());
    QVERIFY(::access(wire::discoveryFilePath(dir, ::getpid()).c_str(), F_OK) != 0);
}

void TestInspector::snapshotOutIsWrittenAtFinish()
{
    QTemporaryDir tmp;
    TiedRun run(2);
    server::InspectorOptions o = tcpOptions(100);
    o.snapshotOut = tmp.filePath("final.json").toStdString();
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o);
    run.steps(4);
    inspector.finish();
    inspector.finish(); // idempotent
    auto snap = wire::readSnapshotFile(o.snapshotOut);
    QVERIFY2(snap.ok(), snap.error().c_str());
    QCOMPARE(snap->state.step, std::uint32_t(4));
    QCOMPARE(snap->state.worldSize, 2);
    QVERIFY(findUnregistered(snap->state, "lm_head", "embed.weight") != nullptr);
    QCOMPARE(snap->events.size(), std::size_t(100)); // the bounded history
    QCOMPARE(snap->events.back().type, EventType::StepEnd);
    QCOMPARE(snap->droppedEvents, std::uint64_t(0));
    QCOMPARE(snap->meta.pid, std::int64_t(::getpid()));
    QCOMPARE(snap->meta.endpoint, inspector.endpoint());
}

void TestInspector::noListenStillWritesTheSnapshot()
{
    QTemporaryDir tmp;
    TiedRun run(1);
    server::InspectorOptions o;
    o.listen = false;
    o.snapshotOut = tmp.filePath("s.json").toStdString();
    {
        server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o);
        QVERIFY(inspector.endpoint().empty());
        run.steps(2);
    }
    auto snap = wire::readSnapshotFile(o.snapshotOut);
    QVERIFY2(snap.ok(), snap.error().c_str());
    QCOMPARE(snap->state.step, std::uint32_t(2));
    QVERIFY(!snap->events.empty());
    QVERIFY(wire::listLiveEngines().empty());
}

void TestInspector::telemetryOffStillServesTheChangingState()
{
    TiedRun run(2);
    server::InspectorOptions o = tcpOptions();
    o.telemetry = false;
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o);
    QVERIFY(!run.engine->telemetryEnabled());
    auto client = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    client::ClientState state;
    std::string error;
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.historyDone(); }, &error),
             error.c_str());
    QCOMPARE(state.snapshot().state.step, std::uint32_t(0));
    run.steps(3);
    // No event announces the steps: the periodic check notices the state changed.
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.snapshot().state.step == 3; }, &error),
             error.c_str());
    QVERIFY(findUnregistered(state.snapshot().state, "lm_head", "embed.weight") != nullptr);
    std::thread finisher([&] { inspector.finish(); });
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.finished(); }, &error),
             error.c_str());
    finisher.join();
    QCOMPARE(state.historyEvents(), std::uint64_t(0));
    QCOMPARE(state.liveEvents(), std::uint64_t(0));
    QCOMPARE(state.goodbye().eventsOffered, std::uint64_t(0));
}

void TestInspector::badEndpointsAreInspectorErrors()
{
    TiedRun run(1);
    auto expectError = [&](const std::string &endpoint, const char *needle) {
        server::InspectorOptions o;
        o.endpoint = endpoint;
        try {
            server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                        o);
            QFAIL(("accepted " + endpoint).c_str());
        } catch (const server::InspectorError &e) {
            QVERIFY2(std::string(e.what()).find(needle) != std::string::npos, e.what());
        }
    };
    expectError("udp:1.2.3.4:5", "unknown endpoint");
    {
        server::InspectorOptions o = tcpOptions(std::size_t(1) << 40);
        QVERIFY_THROWS_EXCEPTION(
            server::InspectorError,
            server::Inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o));
    }
    expectError("tcp:127.0.0.1:notaport", "bad port");
    expectError("unix:" + std::string(200, 'x'), "longer than 107 bytes");
    expectError("unix:/nonexistent-dir/x.sock", "cannot listen on /nonexistent-dir/x.sock");
    server::Inspector first(std::make_unique<core::EngineStateProvider>(*run.engine), tcpOptions());
    expectError(first.endpoint(), "cannot listen on");
}

// Issue #14, defect 5: 32 connections that never said hello took every client slot, so
// real clients with the right token were refused. Handshakes have slots of their own and
// the longest-waiting silent connection makes room for a new one.
void TestInspector::silentConnectionsDoNotLockClientsOut()
{
    TiedRun run(1);
    server::InspectorOptions o = tcpOptions();
    o.token = "s3cret";
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine), o);
    std::vector<int> silent;
    for (int i = 0; i < 100; ++i) {
        auto fd = wire::connectTo(inspector.endpoint());
        QVERIFY2(fd.ok(), fd.ok() ? "" : fd.error().c_str());
        silent.push_back(*fd);
    }
    InspectorClient::Options right;
    right.token = "s3cret";
    std::vector<std::unique_ptr<InspectorClient>> clients;
    for (int i = 0; i < 20; ++i) {
        auto c = InspectorClient::connect(inspector.endpoint(), right);
        QVERIFY2(c.ok(), c.ok() ? "" : c.error().c_str());
        clients.push_back(std::move(c.value()));
        // more silent connections keep arriving between the real ones
        if (auto fd = wire::connectTo(inspector.endpoint()); fd.ok()) silent.push_back(*fd);
    }
    QVERIFY(closedByServer(silent.front())); // the oldest silent ones made room
    for (int fd : silent)
        ::close(fd);
}

void TestInspector::clientsBeyondThirtyTwoAreRefusedAfterTheirHello()
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    std::vector<std::unique_ptr<InspectorClient>> clients;
    for (int i = 0; i < 32; ++i) {
        auto c = InspectorClient::connect(inspector.endpoint(), {});
        QVERIFY2(c.ok(), c.ok() ? "" : c.error().c_str());
        clients.push_back(std::move(c.value()));
    }
    auto extra = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY(!extra.ok());
    QVERIFY2(extra.error().find("already serves 32 clients") != std::string::npos,
             extra.error().c_str());
    clients.pop_back(); // one leaves: a slot is free again
    bool admitted = false;
    for (int tries = 0; tries < 100 && !admitted; ++tries) {
        admitted = InspectorClient::connect(inspector.endpoint(), {}).ok();
        if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    QVERIFY(admitted);
}

// Issue #14, defect 9: after its Hello a client could send without limit (10.9 GB in
// 20 s). The server reads at most 64 KiB from a connection and closes one that sends more.
void TestInspector::clientThatKeepsSendingIsClosed()
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    auto fd = wire::connectTo(inspector.endpoint());
    QVERIFY(fd.ok());
    QVERIFY(client::sendAll(*fd, helloFrame("")));
    const std::string junk(1 << 16, 'x');
    std::size_t sent = 0;
    bool refused = false;
    // Far more than the socket buffers of both ends hold: a server that keeps reading
    // accepts all of it, one that closed the connection makes a send fail.
    while (sent < (std::size_t(256) << 20) && !refused) {
        pollfd p{*fd, POLLOUT, 0};
        if (::poll(&p, 1, 10000) <= 0) break; // the server stopped reading, without closing
        const ssize_t n = ::send(*fd, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0)
            refused = true;
        else
            sent += static_cast<std::size_t>(n);
    }
    ::close(*fd);
    QVERIFY2(refused, qPrintable(QStringLiteral("the server took %1 bytes").arg(sent)));
}

// Issue #14, defect 8: each client got the whole history queued, outside its 8 MiB cap
// (20 stalled clients with --history 1000000 added 890 MB). A late client is sent the
// newest events that fit in 8 MiB.
void TestInspector::historyQueuedPerClientIsBounded()
{
    TiedRun run(1);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions(1'000'000));
    while (inspector.publishedEvents() < 250'000)
        run.steps(10, 200);
    auto client = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client.ok(), client.ok() ? "" : client.error().c_str());
    client::ClientState state(2'000'000);
    std::string error;
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.historyDone(); }, &error),
             error.c_str());
    const std::uint64_t perClient = (std::uint64_t(8) << 20) / sizeof(telemetry::Event);
    QCOMPARE(state.historyEvents(), perClient); // the server held more than that
}

QTEST_APPLESS_MAIN(TestInspector)
// shardscope-train --wait-for-client and --linger: the trainer blocks until a client holds
// the state, and is released when the inspector finishes whatever happens.
// What bench_trainoverhead reports as the inspector's share of a training run.
void TestInspector::costCountsTheServerThreadsWork()
{
    TiedRun run(2);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    run.steps(2);
    auto client = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    client::ClientState state;
    std::string error;
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.historyDone(); }, &error),
             error.c_str());
    const server::Inspector::Cost serving = inspector.cost();
    QVERIFY(serving.states >= 1); // the attaching client's State was built for it
    QVERIFY(serving.wakeups >= 1);
    QVERIFY(serving.stateCpuSeconds <= serving.serverCpuSeconds);
    std::thread finisher([&] { inspector.finish(); });
    QVERIFY2(readUntil(
                 **client, state, [&] { return state.finished(); }, &error),
             error.c_str());
    finisher.join();
    // Once finished, the server thread's total stays as it left it.
    const server::Inspector::Cost done = inspector.cost();
    QVERIFY(done.serverCpuSeconds > 0.0);
    QVERIFY(done.serverCpuSeconds >= serving.serverCpuSeconds);
    QVERIFY(done.states > serving.states); // the final State of the goodbye
    QCOMPARE(inspector.cost().serverCpuSeconds, done.serverCpuSeconds);
}

void TestInspector::waitForClientReturnsOnceOneIsLive()
{
    TiedRun run(2);
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*run.engine),
                                tcpOptions());
    QCOMPARE(inspector.liveClients(), std::size_t(0));
    QVERIFY(!inspector.waitForClient(std::chrono::milliseconds(0)));

    bool attached = false;
    std::thread waiter(
        [&] { attached = inspector.waitForClient(std::chrono::milliseconds::max()); });
    auto client = InspectorClient::connect(inspector.endpoint(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    waiter.join();
    QVERIFY(attached);
    QCOMPARE(inspector.liveClients(), std::size_t(1));
    QVERIFY(inspector.waitForClient(std::chrono::milliseconds(0)));

    client.value().reset();
    for (int i = 0; i < 3000 && inspector.liveClients() > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    QCOMPARE(inspector.liveClients(), std::size_t(0));

    // Nobody attaches: finish() releases a waiter that would wait forever.
    bool released = true;
    std::thread waitsForever(
        [&] { released = inspector.waitForClient(std::chrono::milliseconds::max()); });
    inspector.finish();
    waitsForever.join();
    QVERIFY(!released);

    server::InspectorOptions off;
    off.listen = false;
    TiedRun quiet(1);
    server::Inspector notListening(std::make_unique<core::EngineStateProvider>(*quiet.engine), off);
    QVERIFY(!notListening.waitForClient(std::chrono::milliseconds::max()));
}

#include "tst_inspector.moc"

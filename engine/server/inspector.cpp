#include "server/inspector.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <malloc.h>
#include <mutex>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "server/sendqueue.h"
#include "server/sockets.h"
#include "state/stateprovider.h"
#include "telemetry/clock.h"
#include "telemetry/eventhistory.h"
#include "telemetry/telemetryhub.h"
#include "wire/atomicfile.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/snapshot.h"
#include "wire/statebinary.h"

namespace shardscope::server {

namespace {

using Clock = std::chrono::steady_clock;

// -1 when the clock is gone (its thread ended).
double cpuSeconds(clockid_t clock)
{
    timespec ts{};
    if (::clock_gettime(clock, &ts) != 0) return -1.0;
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double threadCpuSeconds()
{
    return cpuSeconds(CLOCK_THREAD_CPUTIME_ID);
}

// A client's send queue may hold this much; beyond it, live events are dropped for it.
constexpr std::size_t kMaxQueueBytes = 8u << 20;
constexpr std::size_t kEventsPerFrame = 2048;
// The server wakes to drain the rings at an interval that adapts to how full it finds
// them: on 2 cores every wakeup comes out of the training threads, and a client's views
// refresh at about 30 Hz, so it sleeps as long as the rings allow, and drains sooner
// when a burst fills them (a ring holds TelemetryHub::kDefaultRingCapacity events).
constexpr auto kMinPollInterval = std::chrono::milliseconds(1);
constexpr auto kMaxPollInterval = std::chrono::milliseconds(50);
// A live client that was sent nothing for this long gets an empty EventBatch, so a client
// can tell a process that is stopped or hung from one that has nothing to say.
constexpr auto kHeartbeat = std::chrono::seconds(1);
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
constexpr auto kStateMinInterval = std::chrono::milliseconds(200);
constexpr auto kStateRefresh = std::chrono::seconds(1);
constexpr auto kFinishFlushTimeout = std::chrono::seconds(2);
constexpr auto kRefusalLinger = std::chrono::seconds(1);
constexpr auto kTrimInterval = std::chrono::seconds(1);
// More simultaneous clients are refused (each may hold kMaxQueueBytes).
constexpr std::size_t kMaxClients = 32;
// Connections still in their handshake have slots of their own, so peers that connect and
// never say hello cannot take the clients' places; when these are full, the connection
// that has waited longest is closed for the new one. Refused connections that linger to
// deliver their Error are bounded the same way.
constexpr std::size_t kMaxHandshakes = 64;
constexpr std::size_t kMaxRefused = 32;
// A client sends one Hello; the server reads at most this much from a connection in all
// and closes one that sends more.
constexpr std::size_t kMaxBytesFromClient = wire::kFrameHeaderSize + wire::kMaxClientPayload;
// A late client gets at most this much history queued at once: the newest events that fit
// within the same bound as its live queue (174,762 events), however large --history is.
constexpr std::size_t kMaxHistoryEventsPerClient = kMaxQueueBytes / sizeof(telemetry::Event);

std::string processName()
{
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "shardscope";
    const std::string path(exe, static_cast<std::size_t>(n));
    return path.substr(path.rfind('/') + 1);
}

// Events after which the state a client holds is out of date.
bool changesState(EventType t)
{
    switch (t) {
    case EventType::StepEnd:
    case EventType::ExternalRegister:
    case EventType::ExternalUnregister:
    case EventType::UnregisteredAccess:
    case EventType::LateParameter:
    case EventType::ParameterAdopted:
    case EventType::TraceRecorded:
    case EventType::TraceInvalidated:
    case EventType::GatheredWriteError:
        return true;
    default:
        return false;
    }
}

struct Client
{
    enum class Phase
    {
        Handshake,
        Live,
        Closing
    };

    int fd = -1;
    Phase phase = Phase::Handshake;
    wire::FrameDecoder decoder{wire::kMaxClientPayload};
    server::SendQueue out;
    Clock::time_point since = Clock::now();
    std::uint64_t offered = 0;
    std::uint64_t sent = 0;
    std::uint64_t dropped = 0;
    std::uint64_t pendingDropped = 0;
    bool needState = false;
    // The StateBinary layout its Hello asked for (wire::binaryLayoutOf); 0: JSON State frames.
    std::uint16_t binaryLayout = 0;
    // The event kinds its Hello's capabilities read (wire::eventsLevelOf): 1 (kinds 1-18), 2
    // ("events_2": up to 21), 3 ("events_3": up to 23); it gets no kind above its level.
    int eventsLevel = wire::kEventsLevel;
    // engine.stateVersion() when the last State queued for this client was built.
    std::uint64_t stateVersion = ~std::uint64_t(0);
    bool readClosed = false;
    std::size_t bytesRead = 0;
    Clock::time_point lastQueued = Clock::now(); // for the heartbeat

    std::size_t queued() const { return out.size(); }
    void enqueue(wire::MessageType type, std::string_view payload)
    {
        out.append(type, payload);
        lastQueued = Clock::now();
    }
};

// A State ready to queue for any number of clients, in the formats they asked for, and the
// engine version it shows.
struct StateFrame
{
    std::shared_ptr<const std::string> json; // State payload, if a client needs it
    // StateBinary payloads by layout, those a client needs: clients of earlier releases ask
    // for older layouts.
    std::array<std::shared_ptr<const std::string>, wire::kBinaryStateLayout + 1> binary;
    std::uint64_t version = 0;
};

// Which encodings of a State are needed.
struct StateFormats
{
    bool json = false;
    std::array<bool, wire::kBinaryStateLayout + 1> binary{}; // by layout

    void add(const Client &c) { (c.binaryLayout ? binary[c.binaryLayout] : json) = true; }
    static StateFormats of(const Client &c)
    {
        StateFormats f;
        f.add(c);
        return f;
    }
};

} // namespace

struct Inspector::Impl
{
    Impl(state::StateProvider &p, InspectorOptions o)
        : engine(p), options(std::move(o)), history(options.historyEvents)
    {
    }

    std::unique_ptr<state::StateProvider> ownProvider; // when given to own
    state::StateProvider &engine;
    wire::JobIdentity job;
    InspectorOptions options;
    std::unique_ptr<telemetry::TelemetryHub> hub;
    telemetry::EventHistory history; // server thread while running, finish() afterwards
    server::Listener listener;
    std::string endpointText;
    std::string discoveryFile;
    wire::DiscoveryEntry discoveryEntry; // what discoveryFile says; under finishMutex
    std::uint64_t startUnixMs = wire::unixTimeMs();
    std::string producer = processName();
    int wake[2] = {-1, -1};
    std::thread thread;
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> published{0};
    std::atomic<std::uint64_t> clientDropped{0};
    std::mutex finishMutex;
    bool finished = false;
    // flushNow(): a request the server thread answers.
    std::mutex flushMutex;
    std::condition_variable flushDone;
    std::uint64_t flushRequested = 0; // guarded by flushMutex
    std::uint64_t flushAnswered = 0;  // guarded by flushMutex
    std::string flushError;           // guarded by flushMutex
    std::atomic<bool> flushPending{false};
    // Live clients, counted by the server thread after each round; waitForClient sleeps on
    // the condition variable, which the server thread signals when the count changes.
    std::atomic<std::size_t> liveCount{0};
    std::mutex liveMutex;
    std::condition_variable liveChanged;

    // Server thread only.
    std::vector<Client> clients;
    std::vector<telemetry::Event> batch;
    std::string frameBuffer; // fanOut's EventBatch frame, reused
    // The same without the kinds above level 1 and 2, for clients of earlier releases.
    std::array<std::string, wire::kEventsLevel> olderFrameBuffers;
    std::vector<telemetry::Event> olderEvents;
    bool stateDirty = false;
    Clock::time_point lastState = Clock::now();
    Clock::time_point lastTrim{};
    Clock::duration lastStateCost{}; // building + encoding the last state
    // The columns every State is built into, their memory reused from one State to the
    // next while a client is live and given back when none is.
    state::StateColumns columns;
    // The records of the last JSON State built, freed once every client has been sent its
    // bytes: at 100,000 parameters freeing them takes longer than encoding them, and an
    // attaching client should not wait for it before the first byte leaves.
    state::EngineState retiredState;
    bool stateRetired = false;
    std::chrono::milliseconds pollInterval = kMaxPollInterval;
    std::size_t lastDrained = 0; // events the last drain found, over all rings
    // Cost(), written by the server thread, read by any.
    clockid_t serverClock{};
    std::atomic<bool> serverClockValid{false};
    std::atomic<double> serverCpuAtExit{0.0};
    std::atomic<double> stateCpu{0.0};
    std::atomic<std::uint64_t> wakeups{0};
    std::atomic<std::uint64_t> statesBuilt{0};
    std::string lastFailure;

    void start();
    void run();
    void runLoop();
    void pump();
    void acceptClients();
    void makeRoom(Client::Phase phase, std::size_t limit);
    void readClient(Client &c);
    void onHello(Client &c, const wire::Frame &frame);
    void refuse(Client &c, const std::string &code, const std::string &message);
    void writeClient(Client &c);
    void fanOut(const std::vector<telemetry::Event> &events);
    void afterWrite(Client &c);
    wire::SnapshotMeta stateMeta() const;
    StateFrame currentState(StateFormats formats);
    StateFormats liveFormats() const;
    void sendState(Client &c, const StateFrame &state);
    // States are re-sent at most this often: a large model's state costs its build and
    // encoding, so the interval grows with that cost to keep the server's share bounded.
    Clock::duration stateInterval(Clock::duration base) const
    {
        return std::max(base, 10 * lastStateCost);
    }
    void broadcastState();
    void farewell();
    wire::Snapshot makeSnapshot();
    void closeClient(Client &c);
    void answerFlush();
    void countLiveClients(std::size_t live);
    void drainHub();
    void adaptPollInterval();
    void shiftState(state::EngineState &state) const;
    void shiftColumns(state::StateColumns &c) const;
    void answerClock(Client &c, const wire::Frame &frame);
    std::int64_t clockOffset = 0; // options.testClockOffsetNs or the environment's
    std::string goodbyeReason = "training finished"; // set by finish() before the thread ends
};

// The rings' new events into batch, with the test clock offset applied.
void Inspector::Impl::drainHub()
{
    batch.clear();
    lastDrained = hub->drain(batch);
    if (clockOffset != 0)
        for (telemetry::Event &e : batch)
            e.tsNs += static_cast<std::uint64_t>(clockOffset);
}

// Fuller than 1/8 of a ring: wake twice as often; emptier than 1/64: half as often.
void Inspector::Impl::adaptPollInterval()
{
    const std::size_t perRing = lastDrained / std::size_t(std::max(1, hub->localRingCount()));
    const std::size_t capacity = hub->ringCapacity();
    if (perRing > capacity / 8)
        pollInterval = std::max(kMinPollInterval, pollInterval / 2);
    else if (perRing < capacity / 64)
        pollInterval = std::min(kMaxPollInterval, pollInterval * 2);
}

void Inspector::Impl::shiftState(state::EngineState &state) const
{
    if (clockOffset == 0) return;
    for (state::ParamRecord &p : state.params)
        if (p.lastGatherTsNs != 0) p.lastGatherTsNs += static_cast<std::uint64_t>(clockOffset);
    for (state::ViolationRecord &v : state.violations)
        v.tsNs += static_cast<std::uint64_t>(clockOffset);
}

void Inspector::Impl::shiftColumns(state::StateColumns &c) const
{
    if (clockOffset == 0) return;
    for (std::uint64_t &ts : c.lastGatherTsNs)
        if (ts != 0) ts += static_cast<std::uint64_t>(clockOffset);
    for (state::ViolationRecord &v : c.violations)
        v.tsNs += static_cast<std::uint64_t>(clockOffset);
}

void Inspector::Impl::answerClock(Client &c, const wire::Frame &frame)
{
    auto echo = wire::decodeClockRequest(frame.payload);
    if (!echo) {
        refuse(c, "protocol", echo.error());
        return;
    }
    c.enqueue(wire::MessageType::ClockReply,
              wire::encodeClockReply(
                  {*echo, telemetry::nowNs() + static_cast<std::uint64_t>(clockOffset)}));
}

void Inspector::Impl::countLiveClients(std::size_t live)
{
    if (liveCount.load(std::memory_order_relaxed) == live) return;
    {
        std::lock_guard lock(liveMutex);
        liveCount.store(live, std::memory_order_release);
    }
    liveChanged.notify_all();
}

void Inspector::Impl::start()
{
    if (options.historyEvents > kMaxHistoryEvents)
        throw InspectorError("--history " + std::to_string(options.historyEvents) +
                             " is too large: keep at most " + std::to_string(kMaxHistoryEvents) +
                             " events (48 bytes each)");
    // Refused now rather than found at finish(), when the run's snapshot would be lost.
    if (!options.snapshotOut.empty())
        if (auto ok = wire::checkOutputFile(options.snapshotOut); !ok)
            throw InspectorError("bad snapshot output: " + ok.error());
    const std::vector<int> ranks = engine.localRanks();
    job = wire::jobFromEnvironment(options.job, ranks, engine.worldSize());
    clockOffset = options.testClockOffsetNs;
    if (const char *env = std::getenv("SHARDSCOPE_TEST_CLOCK_OFFSET_NS"); env && clockOffset == 0)
        clockOffset = std::strtoll(env, nullptr, 10);
    hub = std::make_unique<telemetry::TelemetryHub>(engine.worldSize(), ranks);
    engine.setTelemetryEnabled(options.telemetry);
    engine.setEventSink(hub.get());
    if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0)
        throw InspectorError(std::string("cannot create the inspector's wake-up pipe: ") +
                             std::strerror(errno));

    if (options.listen) {
        wire::Endpoint ep;
        if (options.endpoint.empty()) {
            const std::string dir = wire::defaultRuntimeDir();
            if (auto ok = server::ensurePrivateDir(dir); !ok)
                throw InspectorError("cannot create the default endpoint: " + ok.error() +
                                     "; or pass --listen unix:PATH / tcp:127.0.0.1:0");
            ep.kind = wire::Endpoint::Kind::Unix;
            ep.path = wire::defaultSocketPath(::getpid());
        } else {
            auto parsed = wire::parseEndpoint(options.endpoint);
            if (!parsed) throw InspectorError("bad --listen: " + parsed.error());
            ep = *parsed;
        }
        auto l = server::listenOn(ep, !options.token.empty());
        if (!l) throw InspectorError(l.error());
        listener = std::move(l.value());
        endpointText = wire::formatEndpoint(listener.bound);

        const std::string dir = wire::defaultRuntimeDir();
        if (server::ensurePrivateDir(dir)) {
            wire::DiscoveryEntry entry;
            entry.pid = ::getpid();
            entry.endpoint = endpointText;
            entry.model = engine.modelName();
            entry.worldSize = engine.worldSize();
            entry.backend = engine.backend();
            entry.job = job;
            entry.startUnixMs = startUnixMs;
            entry.tokenRequired = !options.token.empty();
            const std::string file = wire::discoveryFilePath(dir, entry.pid);
            if (wire::writeFileAtomically(file, wire::encodeDiscovery(entry))) discoveryFile = file;
            discoveryEntry = std::move(entry);
        }
    }
    thread = std::thread([this] { run(); });
}

void Inspector::Impl::closeClient(Client &c)
{
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
}

void Inspector::Impl::acceptClients()
{
    for (;;) {
        const int fd = ::accept4(listener.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        makeRoom(Client::Phase::Handshake, kMaxHandshakes);
        makeRoom(Client::Phase::Closing, kMaxRefused);
        Client c;
        c.fd = fd;
        clients.push_back(std::move(c));
    }
}

// Closes the longest-waiting connections in `phase` until fewer than `limit` remain. A
// handshaking one is read first: a Hello that has arrived completes its handshake instead.
void Inspector::Impl::makeRoom(Client::Phase phase, std::size_t limit)
{
    for (;;) {
        Client *oldest = nullptr;
        std::size_t count = 0;
        for (Client &c : clients) {
            if (c.fd < 0 || c.phase != phase) continue;
            ++count;
            if (!oldest || c.since < oldest->since) oldest = &c;
        }
        if (count < limit) return;
        if (phase == Client::Phase::Handshake) readClient(*oldest);
        if (oldest->phase == phase) closeClient(*oldest);
    }
}

void Inspector::Impl::refuse(Client &c, const std::string &code, const std::string &message)
{
    c.enqueue(wire::MessageType::Error, wire::encodeError({code, message}));
    c.phase = Client::Phase::Closing;
    c.since = Clock::now();
}

wire::SnapshotMeta Inspector::Impl::stateMeta() const
{
    wire::SnapshotMeta m;
    m.producer = producer;
    m.pid = ::getpid();
    m.createdUnixMs = wire::unixTimeMs();
    m.endpoint = endpointText;
    return m;
}

StateFormats Inspector::Impl::liveFormats() const
{
    StateFormats f;
    for (const Client &c : clients)
        if (c.phase == Client::Phase::Live) f.add(c);
    return f;
}

StateFrame Inspector::Impl::currentState(StateFormats formats)
{
    const auto t0 = Clock::now();
    const double cpu0 = threadCpuSeconds();
    StateFrame f;
    f.version = engine.stateVersion(); // before: a change during the build is not lost
    engine.stateColumns(columns);
    shiftColumns(columns);
    const wire::SnapshotMeta meta = stateMeta();
    const std::uint64_t dropped = hub->droppedEvents();
    for (std::uint16_t layout = wire::kBinaryStateOldestLayout; layout <= wire::kBinaryStateLayout;
         ++layout)
        if (formats.binary[layout])
            f.binary[layout] = std::make_shared<const std::string>(
                wire::encodeBinaryState(columns, meta, dropped, {}, layout));
    if (formats.json) {
        wire::Snapshot snapshot;
        snapshot.meta = meta;
        snapshot.state = state::stateOf(columns);
        snapshot.droppedEvents = dropped;
        f.json = std::make_shared<const std::string>(wire::encodeSnapshot(snapshot));
        retiredState = std::move(snapshot.state); // the one retired before is freed here
        stateRetired = true;
    }
    lastStateCost = Clock::now() - t0;
    stateCpu.store(stateCpu.load(std::memory_order_relaxed) + threadCpuSeconds() - cpu0,
                   std::memory_order_relaxed);
    statesBuilt.fetch_add(1, std::memory_order_relaxed);
    return f;
}

void Inspector::Impl::sendState(Client &c, const StateFrame &state)
{
    if (c.binaryLayout)
        c.out.append(wire::MessageType::StateBinary, state.binary[c.binaryLayout]);
    else
        c.out.append(wire::MessageType::State, state.json);
    c.lastQueued = Clock::now();
    c.stateVersion = state.version;
    c.needState = false;
}

void Inspector::Impl::onHello(Client &c, const wire::Frame &frame)
{
    if (frame.type != wire::MessageType::Hello) {
        refuse(c, "protocol",
               "expected a hello frame first, got " +
                   std::string(wire::messageTypeName(frame.type)));
        return;
    }
    auto hello = wire::decodeHello(frame.payload);
    if (!hello) {
        refuse(c, "protocol", hello.error());
        return;
    }
    if (auto refusal = wire::checkHello(*hello, options.token)) {
        refuse(c, refusal->code, refusal->message);
        return;
    }
    const auto live = std::count_if(clients.begin(), clients.end(), [](const Client &other) {
        return other.fd >= 0 && other.phase == Client::Phase::Live;
    });
    if (static_cast<std::size_t>(live) >= kMaxClients) {
        refuse(c, "too_many_clients",
               "this engine already serves " + std::to_string(kMaxClients) +
                   " clients; close one and retry");
        return;
    }
    wire::Welcome w;
    w.server = producer;
    w.pid = ::getpid();
    w.model = engine.modelName();
    w.worldSize = engine.worldSize();
    w.backend = engine.backend();
    w.job = job;
    w.historyCapacity = history.capacity();
    c.binaryLayout = wire::binaryLayoutOf(hello->capabilities);
    c.eventsLevel = wire::eventsLevelOf(hello->capabilities);
    c.enqueue(wire::MessageType::Welcome, wire::encodeWelcome(w));
    sendState(c, currentState(StateFormats::of(c)));
    std::vector<telemetry::Event> past = history.newest(kMaxHistoryEventsPerClient);
    if (c.eventsLevel < wire::kEventsLevel)
        std::erase_if(past, [&](const telemetry::Event &e) {
            return wire::eventsLevelOfType(e.type) > c.eventsLevel;
        });
    c.enqueue(wire::MessageType::HistoryBegin, wire::encodeHistoryBegin(past.size()));
    for (std::size_t i = 0; i < past.size(); i += kEventsPerFrame) {
        const std::size_t n = std::min(kEventsPerFrame, past.size() - i);
        c.enqueue(wire::MessageType::EventBatch,
                  wire::encodeEvents(std::span<const telemetry::Event>(past.data() + i, n)));
    }
    c.enqueue(wire::MessageType::HistoryEnd, {});
    c.phase = Client::Phase::Live;
}

void Inspector::Impl::readClient(Client &c)
{
    char buf[1 << 14];
    for (;;) {
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        if (n == 0) {
            c.readClosed = true;
            break;
        }
        c.bytesRead += static_cast<std::size_t>(n);
        if (c.bytesRead > kMaxBytesFromClient) {
            c.readClosed = true; // only a Hello is ever expected: close, read nothing more
            break;
        }
        if (c.phase == Client::Phase::Closing) continue;
        c.decoder.feed(buf, static_cast<std::size_t>(n));
        for (;;) {
            auto frame = c.decoder.next();
            if (!frame) {
                // bad_magic only for the first bytes (a stranger, e.g. HTTP); after a Hello a
                // wrong magic is a broken stream.
                const bool magic = c.phase == Client::Phase::Handshake &&
                                   frame.error().find("magic") != std::string::npos;
                refuse(c, magic ? "bad_magic" : "bad_frame",
                       frame.error() +
                           "; this endpoint speaks the ShardScope inspector protocol "
                           "version " +
                           std::to_string(wire::kProtocolVersion));
                break;
            }
            if (!frame->has_value()) break;
            if (c.phase == Client::Phase::Handshake) {
                if ((*frame)->type == wire::MessageType::ClockRequest)
                    answerClock(c, **frame);
                else
                    onHello(c, **frame);
            }
            // Frames after the handshake carry no requests in this protocol version.
        }
    }
}

void Inspector::Impl::writeClient(Client &c)
{
    if (c.out.sendTo(c.fd) == server::SendQueue::Sent::Closed) c.readClosed = true;
}

// Once a lagging client has room again: tell it what it lost, then the latest state.
void Inspector::Impl::afterWrite(Client &c)
{
    if (c.phase != Client::Phase::Live || c.queued() > kMaxQueueBytes / 2) return;
    if (c.pendingDropped > 0) {
        c.enqueue(wire::MessageType::Dropped, wire::encodeDropped({c.pendingDropped, c.dropped}));
        c.pendingDropped = 0;
    }
    if (c.needState) sendState(c, currentState(StateFormats::of(c)));
}

void Inspector::Impl::fanOut(const std::vector<telemetry::Event> &events)
{
    for (const telemetry::Event &e : events)
        if (changesState(e.type)) stateDirty = true;
    published.fetch_add(events.size(), std::memory_order_relaxed);
    for (std::size_t i = 0; i < events.size(); i += kEventsPerFrame) {
        const std::size_t n = std::min(kEventsPerFrame, events.size() - i);
        const std::span<const telemetry::Event> part(events.data() + i, n);
        // Framed once, in a buffer kept between wakeups, then copied into each queue.
        std::string &frame = frameBuffer;
        frame.clear();
        wire::appendFrameHeader(frame, wire::MessageType::EventBatch, part.size_bytes());
        wire::appendEvents(frame, part);
        // Clients of an earlier release get the batch without the kinds they cannot read:
        // one frame per level below this release's that a live client has, built only when
        // the batch holds a kind above it.
        int partLevel = 1;
        for (const telemetry::Event &e : part)
            partLevel = std::max(partLevel, wire::eventsLevelOfType(e.type));
        std::array<std::size_t, wire::kEventsLevel + 1> levelN{};
        levelN.fill(n);
        for (int level = 1; level < partLevel; ++level) {
            const bool wanted = std::any_of(clients.begin(), clients.end(), [&](const Client &c) {
                return c.phase == Client::Phase::Live && c.eventsLevel == level;
            });
            if (!wanted) continue;
            olderEvents.clear();
            for (const telemetry::Event &e : part)
                if (wire::eventsLevelOfType(e.type) <= level) olderEvents.push_back(e);
            levelN[level] = olderEvents.size();
            std::string &buffer = olderFrameBuffers[level - 1];
            buffer.clear();
            wire::appendFrameHeader(buffer, wire::MessageType::EventBatch,
                                    olderEvents.size() * sizeof(telemetry::Event));
            wire::appendEvents(buffer, olderEvents);
        }
        for (Client &c : clients) {
            if (c.phase != Client::Phase::Live) continue;
            const bool filtered = c.eventsLevel < partLevel;
            const std::size_t count = filtered ? levelN[c.eventsLevel] : n;
            if (filtered && count == 0) continue;
            const std::string &f = filtered ? olderFrameBuffers[c.eventsLevel - 1] : frame;
            c.offered += count;
            if (c.pendingDropped == 0 && c.queued() + f.size() <= kMaxQueueBytes) {
                c.out.appendFrames(f);
                c.lastQueued = Clock::now();
                c.sent += count;
            } else {
                c.pendingDropped += count;
                c.dropped += count;
                clientDropped.fetch_add(count, std::memory_order_relaxed);
            }
        }
    }
}

void Inspector::Impl::broadcastState()
{
    const StateFrame state = currentState(liveFormats());
    for (Client &c : clients) {
        if (c.phase != Client::Phase::Live || c.stateVersion == state.version) continue;
        if (c.queued() <= kMaxQueueBytes / 2 && c.pendingDropped == 0)
            sendState(c, state);
        else
            c.needState = true;
    }
    stateDirty = false;
    lastState = Clock::now();
}

void Inspector::Impl::pump()
{
    drainHub();
    history.append(batch);
    fanOut(batch);
    const auto now = Clock::now();
    const bool anyLive = std::any_of(clients.begin(), clients.end(), [](const Client &c) {
        return c.phase == Client::Phase::Live;
    });
    // A client that attached since the last broadcast already holds the state of its Hello;
    // one that waits for room gets the newest state then (afterWrite).
    const std::uint64_t version = engine.stateVersion();
    const bool anyBehind = std::any_of(clients.begin(), clients.end(), [&](const Client &c) {
        return c.phase == Client::Phase::Live && !c.needState && c.stateVersion != version;
    });
    if (!anyLive) {
        stateDirty = false;
        if (columns.paramId.capacity() != 0) columns.release();
    } else if (((stateDirty && now - lastState >= stateInterval(kStateMinInterval)) ||
                now - lastState >= stateInterval(kStateRefresh)) &&
               anyBehind) {
        // Event-driven changes are sent soon; others (telemetry off, modules added while
        // building) at the refresh interval, and only when the engine changed at all.
        broadcastState();
    }
    bool freedQueues = false;
    for (Client &c : clients) {
        if (c.fd < 0) continue;
        if (c.phase == Client::Phase::Live && now - c.lastQueued >= kHeartbeat)
            c.enqueue(wire::MessageType::EventBatch, {});
        writeClient(c);
        afterWrite(c);
        writeClient(c);
        const bool handshakeExpired =
            c.phase == Client::Phase::Handshake && now - c.since > kHandshakeTimeout;
        if (handshakeExpired) refuse(c, "handshake_timeout", "no hello within 5 seconds; closing");
        const bool refusalDone = c.phase == Client::Phase::Closing &&
                                 (c.queued() == 0 || now - c.since > kRefusalLinger);
        if (c.readClosed || refusalDone) {
            if (c.phase == Client::Phase::Closing && c.queued() == 0) ::shutdown(c.fd, SHUT_WR);
            freedQueues = freedQueues || c.queued() > 0 || c.sent > 0;
            closeClient(c);
        }
    }
    std::erase_if(clients, [](const Client &c) { return c.fd < 0; });
    if (stateRetired && std::all_of(clients.begin(), clients.end(),
                                    [](const Client &c) { return c.queued() == 0; })) {
        retiredState = state::EngineState{};
        stateRetired = false;
    }
    // Queues of departed clients (up to 8 MiB each) go back to the system rather than
    // staying in the allocator's free lists as the trainer's resident memory; at most
    // once a second, on this thread, never on the training threads.
    if (freedQueues && now - lastTrim >= kTrimInterval) {
        ::malloc_trim(0);
        lastTrim = now;
    }
}

void Inspector::Impl::run()
{
    if (::pthread_getcpuclockid(::pthread_self(), &serverClock) == 0)
        serverClockValid.store(true, std::memory_order_release);
    runLoop();
    serverCpuAtExit.store(threadCpuSeconds(), std::memory_order_release);
    serverClockValid.store(false, std::memory_order_release);
}

void Inspector::Impl::runLoop()
{
    std::vector<pollfd> fds;
    while (!stop.load(std::memory_order_acquire)) {
        fds.clear();
        fds.push_back({wake[0], POLLIN, 0});
        if (listener.fd >= 0) fds.push_back({listener.fd, POLLIN, 0});
        const std::size_t first = fds.size();
        for (const Client &c : clients)
            fds.push_back({c.fd, static_cast<short>(POLLIN | (c.queued() > 0 ? POLLOUT : 0)), 0});
        ::poll(fds.data(), fds.size(), static_cast<int>(pollInterval.count()));
        wakeups.fetch_add(1, std::memory_order_relaxed);
        if (fds[0].revents & POLLIN) {
            char drainBuf[64];
            while (::read(wake[0], drainBuf, sizeof drainBuf) > 0) {
            }
        }
        if (listener.fd >= 0 && (fds[1].revents & POLLIN)) acceptClients();
        const std::size_t polled = fds.size() - first;
        try {
            for (std::size_t i = 0; i < polled && i < clients.size(); ++i)
                if (fds[first + i].revents & (POLLIN | POLLHUP | POLLERR)) readClient(clients[i]);
            pump();
            adaptPollInterval();
            if (flushPending.load(std::memory_order_acquire)) answerFlush();
        } catch (const std::exception &e) {
            // Serving must never take the training down; report once per kind of failure.
            if (lastFailure != e.what()) {
                lastFailure = e.what();
                std::fprintf(stderr,
                             "shardscope: the inspector endpoint hit an error and continues: %s\n",
                             e.what());
            }
        }
        countLiveClients(static_cast<std::size_t>(
            std::count_if(clients.begin(), clients.end(),
                          [](const Client &c) { return c.phase == Client::Phase::Live; })));
    }
    countLiveClients(0);
    try {
        farewell();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "shardscope: the inspector could not say goodbye to its clients: %s\n",
                     e.what());
        for (Client &c : clients)
            closeClient(c);
        clients.clear();
    }
}

// Final drain, the final state and a goodbye to every live client, a bounded flush.
void Inspector::Impl::farewell()
{
    drainHub();
    history.append(batch);
    fanOut(batch);
    const bool anyLive = std::any_of(clients.begin(), clients.end(), [](const Client &c) {
        return c.phase == Client::Phase::Live;
    });
    const StateFrame state = anyLive ? currentState(liveFormats()) : StateFrame{};
    for (Client &c : clients) {
        if (c.phase != Client::Phase::Live) continue;
        if (c.pendingDropped > 0) {
            c.enqueue(wire::MessageType::Dropped,
                      wire::encodeDropped({c.pendingDropped, c.dropped}));
            c.pendingDropped = 0;
        }
        sendState(c, state);
        wire::Goodbye bye;
        bye.reason = goodbyeReason;
        bye.eventsOffered = c.offered;
        bye.eventsSent = c.sent;
        bye.eventsDropped = c.dropped;
        c.enqueue(wire::MessageType::Goodbye, wire::encodeGoodbye(bye));
        c.phase = Client::Phase::Closing;
    }
    const auto deadline = Clock::now() + kFinishFlushTimeout;
    std::vector<pollfd> fds;
    while (Clock::now() < deadline) {
        fds.clear();
        for (const Client &c : clients)
            if (c.fd >= 0 && !c.readClosed && c.queued() > 0) fds.push_back({c.fd, POLLOUT, 0});
        if (fds.empty()) break;
        ::poll(fds.data(), fds.size(), 20);
        for (Client &c : clients)
            if (c.fd >= 0 && !c.readClosed) writeClient(c);
    }
    for (Client &c : clients) {
        if (c.fd >= 0) ::shutdown(c.fd, SHUT_WR);
        closeClient(c);
    }
    clients.clear();
}

void Inspector::Impl::answerFlush()
{
    std::uint64_t request;
    {
        std::lock_guard lock(flushMutex);
        request = flushRequested;
        flushPending.store(false, std::memory_order_release);
    }
    std::string error;
    try {
        // Everything recorded before the request: events written since this loop's pump.
        batch.clear();
        hub->drain(batch);
        history.append(batch);
        fanOut(batch);
        if (std::any_of(clients.begin(), clients.end(),
                        [](const Client &c) { return c.phase == Client::Phase::Live; }))
            broadcastState();
        for (Client &c : clients)
            if (c.fd >= 0) writeClient(c);
        if (!options.snapshotOut.empty()) {
            auto written = wire::writeSnapshotFile(options.snapshotOut, makeSnapshot());
            if (!written) error = "cannot write the snapshot: " + written.error();
        }
    } catch (const std::exception &e) {
        error = e.what();
    }
    {
        std::lock_guard lock(flushMutex);
        flushAnswered = request;
        flushError = error;
    }
    flushDone.notify_all();
}

wire::Snapshot Inspector::Impl::makeSnapshot()
{
    wire::Snapshot s;
    s.meta = stateMeta();
    s.state = engine.state();
    shiftState(s.state);
    s.events = history.events();
    s.droppedEvents = hub->droppedEvents();
    return s;
}

Inspector::Inspector(std::unique_ptr<state::StateProvider> own, InspectorOptions options)
    : Inspector(*own, std::move(options))
{
    d->ownProvider = std::move(own);
}

Inspector::Inspector(state::StateProvider &provider, InspectorOptions options)
    : d(std::make_unique<Impl>(provider, std::move(options)))
{
    try {
        d->start();
    } catch (...) {
        provider.setEventSink(nullptr);
        if (d->wake[0] >= 0) {
            ::close(d->wake[0]);
            ::close(d->wake[1]);
        }
        throw;
    }
}

Inspector::~Inspector()
{
    try {
        finish();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "shardscope: %s\n", e.what());
    }
}

std::string Inspector::endpoint() const
{
    return d->endpointText;
}

std::uint64_t Inspector::droppedEvents() const
{
    return d->hub ? d->hub->droppedEvents() : 0;
}

std::uint64_t Inspector::publishedEvents() const
{
    return d->published.load(std::memory_order_relaxed);
}

std::uint64_t Inspector::clientDroppedEvents() const
{
    return d->clientDropped.load(std::memory_order_relaxed);
}

std::string Inspector::flushNow()
{
    std::uint64_t request;
    {
        std::lock_guard finishLock(d->finishMutex);
        if (d->finished) return "the inspector has finished";
        {
            std::lock_guard lock(d->flushMutex);
            request = ++d->flushRequested;
            d->flushPending.store(true, std::memory_order_release);
        }
        const char one = 1;
        [[maybe_unused]] const ssize_t w = ::write(d->wake[1], &one, 1);
    }
    std::unique_lock lock(d->flushMutex);
    if (!d->flushDone.wait_for(lock, std::chrono::seconds(10),
                               [&] { return d->flushAnswered >= request; }))
        return "the inspector's server thread did not answer within 10 s";
    return d->flushError;
}

Inspector::Cost Inspector::cost() const
{
    Cost c;
    // Read while the thread runs; once it ended it left its total.
    c.serverCpuSeconds =
        d->serverClockValid.load(std::memory_order_acquire) ? cpuSeconds(d->serverClock) : -1.0;
    if (c.serverCpuSeconds < 0)
        c.serverCpuSeconds = d->serverCpuAtExit.load(std::memory_order_acquire);
    c.stateCpuSeconds = d->stateCpu.load(std::memory_order_relaxed);
    c.wakeups = d->wakeups.load(std::memory_order_relaxed);
    c.states = d->statesBuilt.load(std::memory_order_relaxed);
    return c;
}

std::size_t Inspector::liveClients() const
{
    return d->liveCount.load(std::memory_order_acquire);
}

bool Inspector::waitForClient(std::chrono::milliseconds timeout)
{
    if (d->listener.fd < 0) return false;
    std::unique_lock lock(d->liveMutex);
    auto ready = [this] {
        return d->liveCount.load(std::memory_order_acquire) > 0 ||
               d->stop.load(std::memory_order_acquire);
    };
    if (timeout == std::chrono::milliseconds::max())
        d->liveChanged.wait(lock, ready);
    else
        d->liveChanged.wait_for(lock, timeout, ready);
    return d->liveCount.load(std::memory_order_acquire) > 0 &&
           !d->stop.load(std::memory_order_acquire);
}

void Inspector::refreshDiscovery()
{
    std::lock_guard lock(d->finishMutex);
    if (d->finished || d->discoveryFile.empty()) return; // gone, or never written
    const std::string model = d->engine.modelName();
    if (model == d->discoveryEntry.model) return;
    d->discoveryEntry.model = model;
    // A failed rewrite leaves the earlier file, which still finds the endpoint.
    if (wire::writeFileAtomically(d->discoveryFile, wire::encodeDiscovery(d->discoveryEntry)))
        return;
}

void Inspector::finish()
{
    finish("training finished");
}

void Inspector::finish(const std::string &reason)
{
    std::lock_guard lock(d->finishMutex);
    if (d->finished) return;
    d->goodbyeReason = reason;
    d->finished = true;
    d->engine.setEventSink(nullptr);
    {
        std::lock_guard liveLock(d->liveMutex);
        d->stop.store(true, std::memory_order_release);
    }
    d->liveChanged.notify_all();
    const char one = 1;
    [[maybe_unused]] const ssize_t w = ::write(d->wake[1], &one, 1);
    if (d->thread.joinable()) d->thread.join();
    {
        std::lock_guard flushLock(d->flushMutex); // a flushNow() that came too late: finish answers
        if (d->flushAnswered < d->flushRequested) {
            d->flushAnswered = d->flushRequested;
            d->flushError = "the inspector finished first";
        }
    }
    d->flushDone.notify_all();
    if (d->listener.fd >= 0) ::close(d->listener.fd);
    if (!d->listener.socketPath.empty()) ::unlink(d->listener.socketPath.c_str());
    if (!d->discoveryFile.empty()) ::unlink(d->discoveryFile.c_str());
    ::close(d->wake[0]);
    ::close(d->wake[1]);
    if (!d->options.snapshotOut.empty()) {
        auto written = wire::writeSnapshotFile(d->options.snapshotOut, d->makeSnapshot());
        if (!written) throw InspectorError("cannot write the snapshot: " + written.error());
    }
}

} // namespace shardscope::server

// Telemetry cost per event, side by side in one run: an instrumented loop whose events are
// stamped with the telemetry clock and written into a TelemetryHub ring while a consumer
// thread drains it (as the inspector does), the same loop with telemetry switched off, and
// the bare loop. Then the engine's own path (module enter/exit, three events per pair)
// with telemetry on, off (setTelemetryEnabled(false)) and with no sink. Prints Markdown.
//
// Usage: bench_telemetry [--reps N]

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "benchutil.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "telemetry/clock.h"
#include "telemetry/telemetryhub.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr std::uint64_t kLoopEvents = 10'000'000;
constexpr int kPairsPerStep = 1000;
constexpr int kEngineSteps = 1000;

// The shape of the engine's own emit: the sink pointer and the on/off flag are read per
// event, the record is stamped with the telemetry clock and handed to the sink.
class Emitter
{
public:
    void setSink(EventSink *sink) { m_sink.store(sink, std::memory_order_release); }
    void setEnabled(bool on) { m_on.store(on, std::memory_order_relaxed); }

    [[gnu::noinline]] void emit(EventType type, std::uint32_t a, std::uint64_t u0)
    {
        EventSink *s = m_sink.load(std::memory_order_acquire);
        if (!s || !m_on.load(std::memory_order_relaxed))
            return;
        Event ev;
        ev.tsNs = nowNs();
        ev.step = 1;
        ev.rank = 0;
        ev.type = type;
        ev.flags = 0;
        ev.a = a;
        ev.b = 0;
        ev.u0 = u0;
        ev.u1 = 0;
        ev.u2 = 0;
        s->write(ev);
    }

private:
    std::atomic<EventSink *> m_sink{nullptr};
    std::atomic<bool> m_on{true};
};

// Drains the hub until stopped, sleeping briefly when it finds nothing, like the
// inspector's server thread (which also encodes and sends; here the events are dropped).
class Consumer
{
public:
    explicit Consumer(TelemetryHub &hub)
        : m_hub(hub), m_thread([this] { run(); })
    {
    }
    ~Consumer()
    {
        m_stop.store(true, std::memory_order_release);
        m_thread.join();
    }
    std::uint64_t received() const { return m_received.load(std::memory_order_relaxed); }

private:
    void run()
    {
        std::vector<Event> batch;
        batch.reserve(1u << 16);
        while (!m_stop.load(std::memory_order_acquire)) {
            batch.clear();
            const std::size_t n = m_hub.drain(batch);
            m_received.fetch_add(n, std::memory_order_relaxed);
            if (n == 0)
                std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

    TelemetryHub &m_hub;
    std::atomic<bool> m_stop{false};
    std::atomic<std::uint64_t> m_received{0};
    std::thread m_thread;
};

enum Variant { On, Off, Bare, VariantCount };
const char *const kVariantNames[VariantCount] = {
    "telemetry on: clock + ring write, consumer draining",
    "telemetry off (same instrumented loop, one branch)",
    "bare loop (no instrumentation)",
};

// One pass of the loop; returns ns per iteration. The work per iteration is a few
// arithmetic operations, so what is measured is the instrumentation.
double runLoop(Variant v, Emitter &emitter)
{
    std::uint64_t acc = 0;
    const auto t0 = Clock::now();
    if (v == Bare) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
        }
    } else {
        emitter.setEnabled(v == On);
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
            emitter.emit(EventType::FetchBegin, static_cast<std::uint32_t>(i), acc);
        }
    }
    return secondsSince(t0) * 1e9 / static_cast<double>(kLoopEvents);
}

enum EngineVariant { EngineOn, EngineOff, EngineNoSink, EngineVariantCount };
const char *const kEngineVariantNames[EngineVariantCount] = {
    "telemetry on (hub sink, consumer draining)",
    "setTelemetryEnabled(false)",
    "no sink",
};

struct EngineRun
{
    double nsPerPair = 0.0;
    std::uint64_t events = 0;
};

// kEngineSteps steps of kPairsPerStep enter/exit pairs of a module without parameters:
// each pair emits ModuleEnter, ModuleExit and a MemorySample.
EngineRun runEngine(EngineVariant v, Engine &engine, TelemetryHub &hub, ModuleId layer)
{
    engine.setEventSink(v == EngineNoSink ? nullptr : &hub);
    engine.setTelemetryEnabled(v != EngineOff);
    const std::uint64_t before = hub.writtenEvents() + hub.droppedEvents();
    const auto t0 = Clock::now();
    for (int s = 0; s < kEngineSteps; ++s) {
        engine.beginStep(0);
        for (int i = 0; i < kPairsPerStep; ++i) {
            engine.enterModule(0, layer, Phase::Forward);
            engine.exitModule(0, layer, Phase::Forward);
        }
        engine.endStep(0, 0.0);
    }
    EngineRun r;
    r.nsPerPair = secondsSince(t0) * 1e9 / (double(kEngineSteps) * kPairsPerStep);
    r.events = hub.writtenEvents() + hub.droppedEvents() - before;
    return r;
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = parseReps(argc, argv, "bench_telemetry", 7);

    TelemetryHub hub(1);
    std::vector<double> loopNs[VariantCount];
    std::uint64_t dropped = 0;
    std::uint64_t written = 0;
    {
        Consumer consumer(hub);
        Emitter emitter;
        emitter.setSink(&hub);
        runLoop(On, emitter); // warm-up: page tables, caches, the consumer's buffer
        const std::uint64_t dropsBefore = hub.droppedEvents();
        const std::uint64_t writtenBefore = hub.writtenEvents();
        for (int rep = 0; rep < reps; ++rep) {
            for (int k = 0; k < VariantCount; ++k) {
                const auto v = static_cast<Variant>((rep + k) % VariantCount); // rotate the order
                loopNs[v].push_back(runLoop(v, emitter));
            }
        }
        dropped = hub.droppedEvents() - dropsBefore;
        written = hub.writtenEvents() - writtenBefore;
    }

    std::vector<double> emitCost;
    for (int rep = 0; rep < reps; ++rep)
        emitCost.push_back(loopNs[On][static_cast<std::size_t>(rep)] - loopNs[Bare][static_cast<std::size_t>(rep)]);
    const Stats cost = stats(emitCost);

    std::printf("### Telemetry: cost per event\n\n");
    std::printf("%s; %llu events per pass; median (min-max) of %d passes, variants rotated "
                "within each repetition\n\n",
                machine().c_str(), static_cast<unsigned long long>(kLoopEvents), reps);
    std::printf("| loop | ns per iteration |\n|---|---:|\n");
    for (int v = 0; v < VariantCount; ++v)
        std::printf("| %s | %s |\n", kVariantNames[v], format(stats(loopNs[v]), 2).c_str());
    std::printf("| **emit cost = on - bare (same repetition)** | **%s** |\n", format(cost, 2).c_str());
    std::printf("\nEvents accepted into the ring: %llu, dropped because the ring was full: %llu "
                "(%.3f%%). Target <= 10 ns/event: %s.\n\n",
                static_cast<unsigned long long>(written), static_cast<unsigned long long>(dropped),
                written + dropped ? 100.0 * double(dropped) / double(written + dropped) : 0.0,
                verdict(cost.median <= 10.0));
    std::fflush(stdout);

    // The engine's own instrumentation.
    EngineConfig config;
    config.worldSize = 1;
    config.modelName = "bench-telemetry";
    Engine engine(config, makeCpuWorld(1));
    const ModuleId layer = engine.addModule(engine.root(), "layer", "Identity");
    engine.partition();
    TelemetryHub engineHub(1);
    std::vector<double> pairNs[EngineVariantCount];
    std::vector<double> perEvent;
    std::uint64_t eventsPerRun = 0;
    std::uint64_t engineDropped = 0;
    {
        Consumer consumer(engineHub);
        runEngine(EngineOn, engine, engineHub, layer); // warm-up, records the trace
        const std::uint64_t dropsBefore = engineHub.droppedEvents();
        for (int rep = 0; rep < reps; ++rep) {
            EngineRun runs[EngineVariantCount];
            for (int k = 0; k < EngineVariantCount; ++k) {
                const auto v = static_cast<EngineVariant>((rep + k) % EngineVariantCount);
                runs[v] = runEngine(v, engine, engineHub, layer);
                pairNs[v].push_back(runs[v].nsPerPair);
            }
            eventsPerRun = runs[EngineOn].events;
            const double pairs = double(kEngineSteps) * kPairsPerStep;
            perEvent.push_back((runs[EngineOn].nsPerPair - runs[EngineOff].nsPerPair) * pairs /
                               static_cast<double>(runs[EngineOn].events));
        }
        engineDropped = engineHub.droppedEvents() - dropsBefore;
        engine.setEventSink(nullptr);
    }
    const Stats enginePerEvent = stats(perEvent);
    std::printf("### Telemetry in the engine: module enter + exit (3 events per pair)\n\n");
    std::printf("%d steps x %d enter/exit pairs of a module without parameters per pass "
                "(%llu events with telemetry on); median (min-max) of %d passes\n\n",
                kEngineSteps, kPairsPerStep, static_cast<unsigned long long>(eventsPerRun), reps);
    std::printf("| engine | ns per enter/exit pair |\n|---|---:|\n");
    for (int v = 0; v < EngineVariantCount; ++v)
        std::printf("| %s | %s |\n", kEngineVariantNames[v], format(stats(pairNs[v]), 1).c_str());
    std::printf("| **ns per event = (on - off) / events** | **%s** |\n",
                format(enginePerEvent, 2).c_str());
    std::printf("\nDropped in the engine runs: %llu. Target <= 10 ns/event: %s.\n",
                static_cast<unsigned long long>(engineDropped), verdict(enginePerEvent.median <= 10.0));
    return 0;
}

// Telemetry cost per event, side by side in one run: an instrumented loop whose events are
// stamped with the telemetry clock and written into a TelemetryHub ring while a consumer
// thread drains it (as the inspector does), the same loop with telemetry switched off, and
// the bare loop, with the clock read alone (the telemetry clock, the raw TSC read it is
// built on, and steady_clock for comparison). Then the engine's own path (module enter/exit, three events per pair)
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
#include "telemetry/eventfields.h"
#include "telemetry/telemetryhub.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr std::uint64_t kLoopEvents = 10'000'000;
constexpr int kPairsPerStep = 1000;
constexpr int kEngineSteps = 500;

// The shape of the engine's own emit: the sink pointer and the on/off flag are read per
// event, the record is stamped with the telemetry clock and handed to the sink.
class Emitter
{
public:
    void setSink(EventSink *sink) { m_sink.store(sink, std::memory_order_release); }
    void setEnabled(bool on) { m_on.store(on, std::memory_order_relaxed); }

    // stampedTs == 0: stamp with the telemetry clock (the engine's way); else use it as is.
    [[gnu::noinline]] void emit(const Event &fields, std::uint64_t stampedTs = 0)
    {
        EventSink *s = m_sink.load(std::memory_order_acquire);
        if (!s || !m_on.load(std::memory_order_relaxed)) return;
        s->write(stamped(fields, stampedTs ? stampedTs : nowNs(), 1, 0));
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

enum Variant { On, WriteOnly, ClockOnly, RawTsc, Steady, Off, Bare, VariantCount };
const char *const kVariantNames[VariantCount] = {
    "**telemetry on: clock + ring write, consumer draining**",
    "breakdown: ring write only (timestamp given, no clock read)",
    "breakdown: clock read only (telemetry clock nowNs(), no write)",
#if SHARDSCOPE_HAVE_TSC
    "breakdown: raw TSC read only (__rdtsc, unscaled)",
#else
    "breakdown: raw TSC read only (no TSC here: steady_clock)",
#endif
    "breakdown: steady_clock::now() only (for comparison)",
    "telemetry off (same instrumented loop, one branch)",
    "bare loop (no instrumentation)",
};

struct Ns
{
    double cpu = 0.0;  // thread CPU time per iteration
    double wall = 0.0; // wall time per iteration
};

// One pass of the loop; returns ns per iteration. The work per iteration is a few
// arithmetic operations, so what is measured is the instrumentation.
Ns runLoop(Variant v, Emitter &emitter)
{
    std::uint64_t acc = 0;
    const PassTimer timer;
    if (v == Bare) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
        }
    } else if (v == ClockOnly) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
            const std::uint64_t t = nowNs();
            keep(t);
        }
    } else if (v == RawTsc) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
#if SHARDSCOPE_HAVE_TSC
            const std::uint64_t t = __rdtsc();
#else
            const std::uint64_t t = steadyNs();
#endif
            keep(t);
        }
    } else if (v == Steady) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
            const std::uint64_t t = steadyNs();
            keep(t);
        }
    } else {
        emitter.setEnabled(v != Off);
        const std::uint64_t given = v == WriteOnly ? 1 : 0;
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
            emitter.emit(
                makeFetchBegin({.param = static_cast<std::uint32_t>(i), .cause = 0, .bytes = acc}),
                given + i * given);
        }
    }
    const double n = static_cast<double>(kLoopEvents);
    return Ns{timer.cpuSeconds() * 1e9 / n, timer.wallSeconds() * 1e9 / n};
}

enum EngineVariant { EngineOn, EngineOff, EngineNoSink, EngineVariantCount };
const char *const kEngineVariantNames[EngineVariantCount] = {
    "telemetry on (hub sink, consumer draining)",
    "setTelemetryEnabled(false)",
    "no sink",
};

struct EngineRun
{
    Ns perPair;
    std::uint64_t events = 0;
};

// One pass: kEngineSteps steps per variant of kPairsPerStep enter/exit pairs of a module
// without parameters (each pair emits ModuleEnter, ModuleExit and a MemorySample). The
// variant changes every step, so machine noise hits every variant alike.
void runEngine(Engine &engine, TelemetryHub &hub, ModuleId layer, EngineRun (&runs)[EngineVariantCount])
{
    double cpu[EngineVariantCount] = {};
    double wall[EngineVariantCount] = {};
    for (auto &r : runs)
        r = EngineRun{};
    for (int s = 0; s < kEngineSteps * EngineVariantCount; ++s) {
        const auto v = static_cast<EngineVariant>(s % EngineVariantCount);
        engine.setEventSink(v == EngineNoSink ? nullptr : &hub);
        engine.setTelemetryEnabled(v != EngineOff);
        const std::uint64_t before = hub.writtenEvents() + hub.droppedEvents();
        const PassTimer timer;
        engine.beginStep(0);
        for (int i = 0; i < kPairsPerStep; ++i) {
            engine.enterModule(0, layer, Phase::Forward);
            engine.exitModule(0, layer, Phase::Forward);
        }
        engine.endStep(0, 0.0);
        cpu[v] += timer.cpuSeconds();
        wall[v] += timer.wallSeconds();
        runs[v].events += hub.writtenEvents() + hub.droppedEvents() - before;
    }
    const double pairs = double(kEngineSteps) * kPairsPerStep;
    for (int v = 0; v < EngineVariantCount; ++v)
        runs[v].perPair = Ns{cpu[v] * 1e9 / pairs, wall[v] * 1e9 / pairs};
}

void printRow(const char *name, const std::vector<Ns> &v, int decimals)
{
    std::vector<double> cpu, wall;
    for (const Ns &n : v) {
        cpu.push_back(n.cpu);
        wall.push_back(n.wall);
    }
    std::printf("| %s | %s | %s |\n", name, format(stats(cpu), decimals).c_str(),
                format(stats(wall), decimals).c_str());
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = parseReps(argc, argv, "bench_telemetry", 7);

    TelemetryHub hub(1);
    std::vector<Ns> loopNs[VariantCount];
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

    std::vector<Ns> emitCost;
    for (std::size_t rep = 0; rep < static_cast<std::size_t>(reps); ++rep)
        emitCost.push_back(Ns{loopNs[On][rep].cpu - loopNs[Bare][rep].cpu,
                              loopNs[On][rep].wall - loopNs[Bare][rep].wall});
    std::vector<double> costCpu;
    for (const Ns &n : emitCost)
        costCpu.push_back(n.cpu);
    const Stats cost = stats(costCpu);

    std::printf("### Telemetry: cost per event\n\n");
    std::printf("%s; %llu events per pass; median (min-max) of %d passes, variants rotated "
                "within each repetition; CPU = the producer thread's CPU time, wall = elapsed "
                "time (includes time the shared machine gave to other processes)\n\n",
                machine().c_str(), static_cast<unsigned long long>(kLoopEvents), reps);
#if SHARDSCOPE_HAVE_TSC
    const bool tsc = detail::g_tscScale.usable;
#else
    const bool tsc = false;
#endif
    std::printf("Telemetry clock in use: %s\n\n",
                tsc ? "rdtsc scaled to steady_clock nanoseconds (invariant TSC, clocksource tsc)"
                    : "steady_clock (no usable invariant TSC)");
    std::printf("| loop | CPU ns per iteration | wall ns per iteration |\n|---|---:|---:|\n");
    for (int v = 0; v < VariantCount; ++v)
        printRow(kVariantNames[v], loopNs[v], 2);
    printRow("**emit cost = on - bare (same repetition)**", emitCost, 2);
    std::printf("\nEvents accepted into the ring: %llu, dropped because the ring was full: %llu "
                "(%.3f%%). Target <= 10 ns/event (CPU): %s.\n\n",
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
    std::vector<Ns> pairNs[EngineVariantCount];
    std::vector<Ns> perEvent;
    std::uint64_t eventsPerRun = 0;
    std::uint64_t engineDropped = 0;
    {
        Consumer consumer(engineHub);
        EngineRun runs[EngineVariantCount];
        runEngine(engine, engineHub, layer, runs); // warm-up, records the trace
        const std::uint64_t dropsBefore = engineHub.droppedEvents();
        for (int rep = 0; rep < reps; ++rep) {
            runEngine(engine, engineHub, layer, runs);
            for (int v = 0; v < EngineVariantCount; ++v)
                pairNs[v].push_back(runs[v].perPair);
            eventsPerRun = runs[EngineOn].events;
            const double perPairEvents =
                static_cast<double>(runs[EngineOn].events) / (double(kEngineSteps) * kPairsPerStep);
            perEvent.push_back(Ns{(runs[EngineOn].perPair.cpu - runs[EngineOff].perPair.cpu) / perPairEvents,
                                  (runs[EngineOn].perPair.wall - runs[EngineOff].perPair.wall) / perPairEvents});
        }
        engineDropped = engineHub.droppedEvents() - dropsBefore;
        engine.setEventSink(nullptr);
    }
    std::vector<double> engineCpu;
    for (const Ns &n : perEvent)
        engineCpu.push_back(n.cpu);
    const Stats enginePerEvent = stats(engineCpu);
    std::printf("### Telemetry in the engine: module enter + exit (3 events per pair)\n\n");
    std::printf("%d steps x %d enter/exit pairs of a module without parameters per pass "
                "and variant (%llu events with telemetry on), the variant changing every step; median "
                "(min-max) of %d passes\n\n",
                kEngineSteps, kPairsPerStep, static_cast<unsigned long long>(eventsPerRun), reps);
    std::printf("| engine | CPU ns per enter/exit pair | wall ns per enter/exit pair |\n|---|---:|---:|\n");
    for (int v = 0; v < EngineVariantCount; ++v)
        printRow(kEngineVariantNames[v], pairNs[v], 1);
    printRow("**ns per event = (on - off) / events per pair**", perEvent, 2);
    std::printf("\nDropped in the engine runs: %llu. Target <= 10 ns/event (CPU): %s.\n",
                static_cast<unsigned long long>(engineDropped), verdict(enginePerEvent.median <= 10.0));
    return 0;
}

// Telemetry cost per event, side by side in one run, with the TSC clock and with the
// steady_clock fallback (clock.h's useClock(), as SHARDSCOPE_CLOCK=steady forces it):
// an instrumented loop whose events are stamped with the telemetry clock and written into a
// TelemetryHub ring while a consumer thread drains it (as the inspector does), the same
// loop with telemetry switched off, and the bare loop, with the clock reads alone (the
// telemetry clock, the raw TSC read it is built on, steady_clock). Then the engine's own
// path (module enter/exit without and with parameters) with telemetry on under each clock,
// off (setTelemetryEnabled(false)) and with no sink; there the hub is drained between
// steps, not by a thread running beside it (see runEngine). Prints what it ran on, then
// Markdown.
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
constexpr std::size_t kLoopRing = std::size_t(1) << 20; // tight loops outrun 65536 in 1-2 ms
constexpr auto kConsumerInterval = std::chrono::microseconds(200);

// The shape of the engine's own emit: the sink pointer and the on/off flag are read per
// event, the record is stamped with the telemetry clock and handed to the sink.
class Emitter
{
  public:
    void setSink(telemetry::EventSink *sink) { m_sink.store(sink, std::memory_order_release); }
    void setEnabled(bool on) { m_on.store(on, std::memory_order_relaxed); }

    // stampedTs == 0: stamp with the telemetry clock (the engine's way); else use it as is.
    [[gnu::noinline]] void emit(const telemetry::Event &fields, std::uint64_t stampedTs = 0)
    {
        telemetry::EventSink *s = m_sink.load(std::memory_order_acquire);
        if (!s || !m_on.load(std::memory_order_relaxed)) return;
        s->write(telemetry::stamped(fields, stampedTs ? stampedTs : telemetry::nowNs(), 1, 0));
    }

  private:
    std::atomic<telemetry::EventSink *> m_sink{nullptr};
    std::atomic<bool> m_on{true};
};

// Drains the hub until stopped, every kConsumerInterval: like the inspector's server thread,
// but more often than its shortest poll interval (1 ms), so that these tight loops, far
// denser in events than training, rarely fill a ring; here the events are dropped.
class Consumer
{
  public:
    // ring: also drained (the loop's bare-ring variant), when given.
    explicit Consumer(telemetry::TelemetryHub &hub, telemetry::EventRing *ring = nullptr)
        : m_hub(hub), m_ring(ring), m_thread([this] { run(); })
    {
    }
    ~Consumer()
    {
        m_stop.store(true, std::memory_order_release);
        m_thread.join();
    }

  private:
    void run()
    {
        std::vector<telemetry::Event> batch;
        batch.reserve(kLoopRing);
        while (!m_stop.load(std::memory_order_acquire)) {
            batch.clear();
            m_hub.drain(batch);
            if (m_ring) {
                batch.resize(kLoopRing);
                while (m_ring->pop(batch.data(), batch.size()) == batch.size()) {
                }
            }
            std::this_thread::sleep_for(kConsumerInterval);
        }
    }

    telemetry::TelemetryHub &m_hub;
    telemetry::EventRing *m_ring;
    std::atomic<bool> m_stop{false};
    std::thread m_thread;
};

enum Variant
{
    OnTsc,
    OnSteady,
    WriteOnly,
    RingOnly,
    ClockTsc,
    ClockSteady,
    RawTsc,
    Off,
    Bare,
    VariantCount
};
const char *const kVariantNames[VariantCount] = {
    "**telemetry on, TSC clock: clock + ring write, consumer draining**",
    "**telemetry on, steady_clock fallback: clock + ring write, consumer draining**",
    "breakdown: write only (timestamp given, no clock read; the emit call, the sink's virtual "
    "write, the ring)",
    "breakdown: the ring alone (EventRing::push of a record, no call, no sink)",
    "breakdown: clock read only, TSC clock (nowNs())",
    "breakdown: clock read only, steady_clock fallback (nowNs())",
#if SHARDSCOPE_HAVE_TSC
    "breakdown: raw TSC read only (__rdtsc, unscaled)",
#else
    "breakdown: raw TSC read only (no TSC here: steady_clock)",
#endif
    "telemetry off (same instrumented loop, one branch)",
    "bare loop (no instrumentation)",
};

struct Ns
{
    double cpu = 0.0;  // thread CPU time per iteration
    double wall = 0.0; // wall time per iteration
};

bool variantUsesTsc(Variant v)
{
    return v == OnTsc || v == ClockTsc || v == WriteOnly;
}

// One pass of the loop; returns ns per iteration. The work per iteration is a few
// arithmetic operations, so what is measured is the instrumentation.
Ns runLoop(Variant v, Emitter &emitter, telemetry::EventRing &ring)
{
    telemetry::useClock(variantUsesTsc(v) ? telemetry::ClockSource::Tsc
                                          : telemetry::ClockSource::Steady);
    std::uint64_t acc = 0;
    const PassTimer timer;
    if (v == Bare) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
        }
    } else if (v == ClockTsc || v == ClockSteady) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
            const std::uint64_t t = telemetry::nowNs();
            keep(t);
        }
    } else if (v == RingOnly) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
            ring.push(telemetry::stamped(
                telemetry::makeFetchBegin(
                    {.param = static_cast<std::uint32_t>(i), .cause = 0, .bytes = acc}),
                i + 1, 0, 0));
        }
    } else if (v == RawTsc) {
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
#if SHARDSCOPE_HAVE_TSC
            const std::uint64_t t = __rdtsc();
#else
            const std::uint64_t t = telemetry::steadyNs();
#endif
            keep(t);
        }
    } else {
        emitter.setEnabled(v != Off);
        const std::uint64_t given = v == WriteOnly ? 1 : 0;
        for (std::uint64_t i = 0; i < kLoopEvents; ++i) {
            acc = acc * 31 + i;
            keep(acc);
            emitter.emit(telemetry::makeFetchBegin(
                             {.param = static_cast<std::uint32_t>(i), .cause = 0, .bytes = acc}),
                         given + i * given);
        }
    }
    const double n = static_cast<double>(kLoopEvents);
    const Ns out{timer.cpuSeconds() * 1e9 / n, timer.wallSeconds() * 1e9 / n};
    telemetry::useClock(telemetry::ClockSource::Tsc);
    return out;
}

enum EngineVariant
{
    EngineOnTsc,
    EngineOffTsc,
    EngineOnSteady,
    EngineOffSteady,
    EngineNoSink,
    EngineVariantCount
};
const char *const kEngineVariantNames[EngineVariantCount] = {
    "telemetry on, TSC clock (hub sink, drained between steps)",
    "setTelemetryEnabled(false), TSC clock",
    "telemetry on, steady_clock fallback (hub sink, drained between steps)",
    "setTelemetryEnabled(false), steady_clock fallback",
    "no sink, TSC clock",
};

// A module the engine enters and exits: without parameters (ModuleEnter, ModuleExit and a
// MemorySample per pair) or owning two partitioned parameters, gathered on entry and
// released on exit (also 2 FetchBegin, 2 FetchEnd, 2 Release).
// clockReads: the clock reads telemetry adds to a pair (engine.cpp). Without parameters, the
// batches of the entry and of the exit read the clock once each, and the pair's three events
// share those two reads. With parameters, none: the engine reads the clock to time each
// gather (its issue and its completion) whether telemetry is on or off, and telemetry uses
// those reads as the batches' times.
struct EngineShape
{
    const char *name;
    int params;
    int steps;
    int pairsPerStep;
    int clockReads;
};
constexpr EngineShape kShapes[] = {
    {"a module without parameters", 0, 300, 1000, 2},
    {"a module owning 2 partitioned parameters (256 floats each)", 2, 100, 1000, 0},
};

// This run's clock reads (the loop's "clock read only" rows, median CPU ns): what an event
// that needs a time of its own cannot cost less than.
struct ClockCosts
{
    double tsc = 0.0;    // the telemetry clock on the TSC (lfence; rdtsc; mapped)
    double steady = 0.0; // steady_clock
    double rawTsc = 0.0; // a bare rdtsc, unordered and unscaled
};

struct EngineRun
{
    Ns perPair[EngineVariantCount];
    std::uint64_t events[EngineVariantCount] = {};
};

// One pass: shape.steps steps per variant of shape.pairsPerStep enter/exit pairs; the
// variant changes every step, so machine noise hits every variant alike.
EngineRun runEngine(const EngineShape &shape, core::Engine &engine, telemetry::TelemetryHub &hub,
                    ModuleId layer)
{
    double cpu[EngineVariantCount] = {};
    double wall[EngineVariantCount] = {};
    EngineRun run;
    std::vector<telemetry::Event> drained;
    drained.reserve(hub.ringCapacity());
    for (int s = 0; s < shape.steps * EngineVariantCount; ++s) {
        const auto v = static_cast<EngineVariant>(s % EngineVariantCount);
        engine.setEventSink(v == EngineNoSink ? nullptr : &hub);
        engine.setTelemetryEnabled(v != EngineOffTsc && v != EngineOffSteady);
        // The engine reads the clock itself to time gathers, telemetry or not: "off" is
        // measured on the same clock as the "on" it is compared with.
        telemetry::useClock(v == EngineOnSteady || v == EngineOffSteady
                                ? telemetry::ClockSource::Steady
                                : telemetry::ClockSource::Tsc);
        const std::uint64_t before = hub.writtenEvents() + hub.droppedEvents();
        const PassTimer timer;
        engine.beginStep(0);
        for (int i = 0; i < shape.pairsPerStep; ++i) {
            engine.enterModule(0, layer, Phase::Forward);
            engine.exitModule(0, layer, Phase::Forward);
        }
        engine.endStep(0, 0.0);
        cpu[v] += timer.cpuSeconds();
        wall[v] += timer.wallSeconds();
        run.events[v] += hub.writtenEvents() + hub.droppedEvents() - before;
        // Drained here, untimed, not by a consumer thread beside the loop: these steps emit
        // 30-45 M events/s, a thousand times a training rank's rate, and a consumer copying
        // them (~2 GB/s) on the other vCPU slowed this thread's events by 1-3 ns (with
        // parameters) and up to 8 ns (without), in some runs and not others (2-core AMD EPYC
        // VM; docs/performance.md section 1). The inspector's server drains every 1-50 ms at
        // the training rate, which that cost does not reach. The loop above keeps its consumer.
        drained.clear();
        hub.drain(drained);
    }
    telemetry::useClock(telemetry::ClockSource::Tsc);
    const double pairs = double(shape.steps) * shape.pairsPerStep;
    for (int v = 0; v < EngineVariantCount; ++v)
        run.perPair[v] = Ns{cpu[v] * 1e9 / pairs, wall[v] * 1e9 / pairs};
    return run;
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

double medianCpu(const std::vector<Ns> &v)
{
    std::vector<double> cpu;
    for (const Ns &n : v)
        cpu.push_back(n.cpu);
    return stats(cpu).median;
}

// Per event = (on - off) / events per pair, per pass.
bool engineShape(const EngineShape &shape, int reps, const ClockCosts &clocks)
{
    core::EngineConfig config;
    config.worldSize = 1;
    config.modelName = "bench-telemetry";
    config.persistenceThreshold = 0; // every parameter partitioned, gathered on entry
    core::Engine engine(config, comm::makeCpuWorld(1));
    const ModuleId layer = engine.addModule(engine.root(), "layer", "Linear");
    std::vector<float> init(256, 0.5f);
    for (int p = 0; p < shape.params; ++p)
        engine.addParameter(layer, p == 0 ? "weight" : "bias", {16, 16}, DType::F32, init.data());
    engine.partition();
    telemetry::TelemetryHub hub(1); // the rings' size in a training process
    std::vector<Ns> pairNs[EngineVariantCount];
    std::vector<Ns> perEvent[2];
    double eventsPerPair = 0.0;
    std::uint64_t dropped = 0;
    {
        runEngine(shape, engine, hub, layer); // warm-up, records the trace
        const std::uint64_t dropsBefore = hub.droppedEvents();
        for (int rep = 0; rep < reps; ++rep) {
            const EngineRun run = runEngine(shape, engine, hub, layer);
            for (int v = 0; v < EngineVariantCount; ++v)
                pairNs[v].push_back(run.perPair[v]);
            eventsPerPair =
                double(run.events[EngineOnTsc]) / (double(shape.steps) * shape.pairsPerStep);
            for (int c = 0; c < 2; ++c) {
                const Ns &on = run.perPair[c == 0 ? EngineOnTsc : EngineOnSteady];
                const Ns &off = run.perPair[c == 0 ? EngineOffTsc : EngineOffSteady];
                perEvent[c].push_back(
                    Ns{(on.cpu - off.cpu) / eventsPerPair, (on.wall - off.wall) / eventsPerPair});
            }
        }
        dropped = hub.droppedEvents() - dropsBefore;
        engine.setEventSink(nullptr);
    }
    std::printf("#### Engine: enter + exit of %s (%.2f events per pair)\n\n", shape.name,
                eventsPerPair);
    std::printf("%d steps x %d enter/exit pairs per pass and variant, the variant changing every "
                "step, the hub drained between steps (untimed); median (min-max) of %d passes\n\n",
                shape.steps, shape.pairsPerStep, reps);
    std::printf(
        "| engine | CPU ns per enter/exit pair | wall ns per enter/exit pair |\n|---|---:|---:|\n");
    for (int v = 0; v < EngineVariantCount; ++v)
        printRow(kEngineVariantNames[v], pairNs[v], 1);
    printRow("**ns per event, TSC clock = (on - off) / events per pair**", perEvent[0], 2);
    printRow("**ns per event, steady_clock fallback = (on - off) / events per pair**", perEvent[1],
             2);
    const double tsc = medianCpu(perEvent[0]);
    const double steady = medianCpu(perEvent[1]);
    std::printf("\nDropped: %llu. Target <= 10 ns/event (CPU): TSC %s, steady_clock %s.\n",
                static_cast<unsigned long long>(dropped), verdict(tsc <= 10.0),
                verdict(steady <= 10.0));
    if (shape.clockReads > 0) {
        // What the clock alone costs per event, from this run's clock rows: no ring, sink or
        // engine code can bring an event below it while each entry and exit has a time of its own.
        const double readsPerEvent = shape.clockReads / eventsPerPair;
        std::printf("Telemetry adds %d clock reads per pair, %.2f per event: the clock alone costs "
                    "%.2f ns per event on the TSC clock (%.2f ns a read), %.2f ns on steady_clock "
                    "(%.2f ns), and even a bare, unordered rdtsc would cost %.2f ns (%.2f ns).\n",
                    shape.clockReads, readsPerEvent, readsPerEvent * clocks.tsc, clocks.tsc,
                    readsPerEvent * clocks.steady, clocks.steady, readsPerEvent * clocks.rawTsc,
                    clocks.rawTsc);
    } else {
        std::printf("Telemetry adds no clock read here: its batches take the times the engine "
                    "reads anyway to time the gathers.\n");
    }
    std::printf("\n");
    std::fflush(stdout);
    return tsc <= 10.0 && steady <= 10.0;
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = parseReps(argc, argv, "bench_telemetry", 7);

    std::printf("### Telemetry: cost per event\n\n");
    std::printf("%s\n\n", machine().c_str());
    std::printf("- kernel clocksource: %s; TSC flags in /proc/cpuinfo: %s\n", clocksource().c_str(),
                tscFlags().c_str());
    std::printf("- telemetry clock at start-up: %s\n", telemetry::clockDescription().c_str());
    if (!telemetry::tscUsable()) {
        std::printf("- no usable TSC here: the \"TSC clock\" rows below also read steady_clock\n");
    }
    std::printf("\n");

    telemetry::TelemetryHub hub(1, kLoopRing);
    std::vector<Ns> loopNs[VariantCount];
    std::uint64_t dropped = 0;
    std::uint64_t written = 0;
    {
        telemetry::EventRing ring(kLoopRing);
        Consumer consumer(hub, &ring);
        Emitter emitter;
        emitter.setSink(&hub);
        runLoop(OnTsc, emitter, ring); // warm-up: page tables, caches, the consumer's buffer
        const std::uint64_t dropsBefore = hub.droppedEvents();
        const std::uint64_t writtenBefore = hub.writtenEvents();
        for (int rep = 0; rep < reps; ++rep) {
            for (int k = 0; k < VariantCount; ++k) {
                const auto v = static_cast<Variant>((rep + k) % VariantCount); // rotate the order
                loopNs[v].push_back(runLoop(v, emitter, ring));
            }
        }
        dropped = hub.droppedEvents() - dropsBefore;
        written = hub.writtenEvents() - writtenBefore;
    }

    std::vector<Ns> emitCost[2];
    for (std::size_t rep = 0; rep < static_cast<std::size_t>(reps); ++rep)
        for (int c = 0; c < 2; ++c) {
            const Ns &on = loopNs[c == 0 ? OnTsc : OnSteady][rep];
            emitCost[c].push_back(
                Ns{on.cpu - loopNs[Bare][rep].cpu, on.wall - loopNs[Bare][rep].wall});
        }

    std::printf("#### A loop emitting one event per iteration\n\n");
    std::printf("%llu events per pass; ring of %zu events drained every %lld us; median (min-max) "
                "of %d passes, variants rotated within each repetition; CPU = the producer "
                "thread's CPU time, wall = elapsed time (includes time the shared machine gave "
                "to other processes)\n\n",
                static_cast<unsigned long long>(kLoopEvents), kLoopRing,
                static_cast<long long>(kConsumerInterval.count()), reps);
    std::printf("| loop | CPU ns per iteration | wall ns per iteration |\n|---|---:|---:|\n");
    for (int v = 0; v < VariantCount; ++v)
        printRow(kVariantNames[v], loopNs[v], 2);
    printRow("**emit cost, TSC clock = on - bare (same repetition)**", emitCost[0], 2);
    printRow("**emit cost, steady_clock fallback = on - bare (same repetition)**", emitCost[1], 2);
    std::printf("\nEvents accepted into the ring: %llu, dropped because the ring was full: %llu "
                "(%.3f%%). Target <= 10 ns/event (CPU): TSC %s, steady_clock %s.\n\n",
                static_cast<unsigned long long>(written), static_cast<unsigned long long>(dropped),
                written + dropped ? 100.0 * double(dropped) / double(written + dropped) : 0.0,
                verdict(medianCpu(emitCost[0]) <= 10.0), verdict(medianCpu(emitCost[1]) <= 10.0));
    std::fflush(stdout);

    std::printf("### Telemetry in the engine\n\n");
    const ClockCosts clocks{medianCpu(loopNs[ClockTsc]), medianCpu(loopNs[ClockSteady]),
                            medianCpu(loopNs[RawTsc])};
    for (const EngineShape &shape : kShapes)
        engineShape(shape, reps, clocks);
    return 0;
}

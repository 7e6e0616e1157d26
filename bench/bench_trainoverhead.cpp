// What the inspector costs a training run: the trainer's step time (the default model,
// 4 CPU ranks) with a real socket client attached (a child process, like the GUI) that
// decodes every frame with the wire codec, against the same run with the endpoint off,
// and against telemetry off. The three variants are interleaved (A B C, B C A, C A B, ...)
// so machine noise hits all alike. Prints a Markdown table.
//
// Then, more sensitive: one attached run per repetition whose telemetry is switched on
// and off from step to step, comparing neighbouring steps.
//
// Usage: bench_trainoverhead [--reps N] [--steps N] [--toggled-steps N] [--control]
//        bench_trainoverhead --client ENDPOINT   (the attached client; started by the above)
// --control: the toggled runs label their steps the same way but never switch telemetry off
// (an A/A test: the step-by-step method's own bias on this machine, to read beside it).

#include <unistd.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "benchutil.h"
#include "client/inspectorclient.h"
#include "core/engineprovider.h"
#include "nn/trainer.h"
#include "server/inspector.h"
#include "wire/messages.h"
#include "wire/snapshot.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

enum Variant
{
    Attached,
    EndpointOff,
    TelemetryOff,
    VariantCount
};
const char *const kNames[VariantCount] = {
    "A: endpoint on, client attached decoding every event",
    "B: endpoint off (--no-listen), telemetry on",
    "C: telemetry off (--no-listen --no-telemetry)",
};

constexpr int kWarmupSteps = 20; // not counted: the first step records the trace, caches warm up

struct ClientTotals
{
    std::uint64_t events = 0;
    std::uint64_t states = 0;
    std::uint64_t frames = 0;
    double stateCpu = 0.0; // CPU seconds spent decoding States
    std::string error;
};

// A client like shardscope-capture: reads every frame and decodes it (events and states).
void runClient(client::InspectorClient &client, ClientTotals &totals)
{
    for (;;) {
        auto frame = client.next(1000);
        if (!frame) {
            if (frame.error() != "the engine closed the connection") totals.error = frame.error();
            return;
        }
        if (!frame.value()) continue;
        const wire::Frame &f = *frame.value();
        ++totals.frames;
        switch (f.type) {
        case wire::MessageType::EventBatch: {
            auto events = wire::decodeEvents(f.payload);
            if (!events) {
                totals.error = events.error();
                return;
            }
            totals.events += events->size();
            break;
        }
        case wire::MessageType::State: {
            const double cpu0 = threadCpuSeconds();
            auto snap = wire::decodeSnapshot(f.payload);
            totals.stateCpu += threadCpuSeconds() - cpu0;
            if (!snap) {
                totals.error = snap.error();
                return;
            }
            ++totals.states;
            break;
        }
        case wire::MessageType::Goodbye:
            return;
        default:
            break;
        }
    }
}

// The client process: attaches, says so on stdout, decodes until the engine says goodbye.
int clientMain(const std::string &endpoint)
{
    client::InspectorClient::Options co;
    co.name = "bench_trainoverhead";
    auto connected = client::InspectorClient::connect(endpoint, co);
    if (!connected) {
        std::fprintf(stderr, "bench_trainoverhead --client: cannot attach to %s: %s\n",
                     endpoint.c_str(), connected.error().c_str());
        return 1;
    }
    std::printf("attached\n");
    std::fflush(stdout);
    const double cpuAtAttach = processCpuSeconds(); // what follows is the cost to training
    ClientTotals totals;
    runClient(*connected.value(), totals);
    if (!totals.error.empty()) {
        std::fprintf(stderr, "bench_trainoverhead --client: %s\n", totals.error.c_str());
        return 1;
    }
    const double cpu = processCpuSeconds() - cpuAtAttach;
    std::printf("events %llu states %llu cpu %.6f statecpu %.6f\n",
                static_cast<unsigned long long>(totals.events),
                static_cast<unsigned long long>(totals.states), cpu, totals.stateCpu);
    return 0;
}

// The client's last line, "events N states M cpu S statecpu T": its CPU seconds after
// attaching, and of those, decoding States.
struct ClientCpu
{
    double total = 0.0;
    double states = 0.0;
};

ClientCpu readClientTotals(FILE *client, std::uint64_t &events)
{
    char line[256];
    unsigned long long n = 0, states = 0;
    ClientCpu cpu;
    const bool read = std::fgets(line, sizeof line, client) &&
                      std::sscanf(line, "events %llu states %llu cpu %lf statecpu %lf", &n, &states,
                                  &cpu.total, &cpu.states) == 4;
    const int status = ::pclose(client);
    if (!read || status != 0)
        throw std::runtime_error("the client process failed (see its message above)");
    events = n;
    return cpu;
}

struct RunResult
{
    double medianStepMs = 0.0;
    double cpuMsPerStep = 0.0; // the training process's CPU time (ranks + inspector) per step
    double totalSeconds = 0.0;
    // CPU seconds over the training, by whom: the rank threads (the process less the
    // inspector's server thread), the server thread (drains the rings, encodes, sends),
    // of which States, and the attached client process (its whole life).
    double trainingCpu = 0.0;
    double serverCpu = 0.0;
    double stateCpu = 0.0;
    double clientCpu = 0.0;
    double clientStateCpu = 0.0;
    double wakeupsPerSecond = 0.0;
    std::uint64_t states = 0;
    std::uint64_t clientEvents = 0;
    std::uint64_t clientDropped = 0;
    std::uint64_t ringDropped = 0;
};

RunResult runOnce(Variant v, const nn::TrainConfig &base)
{
    nn::TrainConfig config = base;
    config.listen = v == Attached;
    config.telemetry = v != TelemetryOff;
    config.endpoint = config.listen ? "tcp:127.0.0.1:0" : "";

    std::unique_ptr<core::Engine> engine = nn::makeCpuEngine(config);
    server::InspectorOptions options;
    options.listen = config.listen;
    options.endpoint = config.endpoint;
    options.telemetry = config.telemetry;
    options.historyEvents = config.historyEvents;
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*engine), options);

    FILE *client = nullptr;
    char line[256];
    if (v == Attached) {
        const std::string command = selfPath() + " --client " + inspector.endpoint();
        client = ::popen(command.c_str(), "r");
        if (!client || !std::fgets(line, sizeof line, client) || std::string(line) != "attached\n")
            throw std::runtime_error("the client process did not attach to " +
                                     inspector.endpoint());
    }

    std::vector<double> stepSeconds;
    stepSeconds.reserve(static_cast<std::size_t>(config.steps));
    const double cpu0 = processCpuSeconds();
    const server::Inspector::Cost cost0 = inspector.cost();
    const nn::TrainResult result =
        nn::runCpuTraining(config, *engine, [&](const nn::StepReport &r) {
            if (r.step > kWarmupSteps) stepSeconds.push_back(r.seconds);
        });
    const double cpuSeconds = processCpuSeconds() - cpu0;
    const server::Inspector::Cost cost1 = inspector.cost();
    inspector.finish();

    RunResult out;
    out.serverCpu = cost1.serverCpuSeconds - cost0.serverCpuSeconds;
    out.stateCpu = cost1.stateCpuSeconds - cost0.stateCpuSeconds;
    out.trainingCpu = cpuSeconds - out.serverCpu;
    out.states = cost1.states - cost0.states;
    out.wakeupsPerSecond = double(cost1.wakeups - cost0.wakeups) / result.seconds;
    if (client) {
        const ClientCpu c = readClientTotals(client, out.clientEvents);
        out.clientCpu = c.total;
        out.clientStateCpu = c.states;
    }
    out.medianStepMs = stats(stepSeconds).median * 1e3;
    out.cpuMsPerStep = cpuSeconds * 1e3 / config.steps;
    out.totalSeconds = result.seconds;
    out.clientDropped = inspector.clientDroppedEvents();
    out.ringDropped = inspector.droppedEvents();
    return out;
}

// Whether the first step of pair `pair` is the one with telemetry on: drawn for each pair (a
// splitmix64 of its number), so that nothing periodic in the steps lines up with the labels.
// A fixed order (on off, off on, ...) read about 1 % by itself in the DeepSpeed agent's bench
// (docs/performance.md, section 10).
bool onFirst(int pair)
{
    std::uint64_t z = std::uint64_t(pair) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return ((z ^ (z >> 31)) >> 63) != 0;
}

// One attached run whose telemetry alternates per step, in pairs whose order is drawn per
// pair (onFirst), so neighbouring steps share the machine's state. Returns
// t(on) / t(off) of every pair after the warm-up. The switch is made by the reporting rank
// after a step's last barrier, so the other ranks may begin the next step a little before
// it: a small part of each step runs in the previous step's mode, which if anything hides
// some of the difference.
struct ToggledRun
{
    std::vector<double> ratios;
    std::vector<double> cpuRatios; // the same pairs in the process's CPU time per step
    double serverShare = 0.0;      // server thread CPU / training threads' CPU, whole run
    double clientShare = 0.0;      // client process CPU / training threads' CPU
};

ToggledRun runToggled(const nn::TrainConfig &base, int steps, bool control)
{
    nn::TrainConfig config = base;
    config.steps = steps;
    config.listen = true;
    config.telemetry = true;
    config.endpoint = "tcp:127.0.0.1:0";
    std::unique_ptr<core::Engine> engine = nn::makeCpuEngine(config);
    server::InspectorOptions options;
    options.endpoint = config.endpoint;
    options.historyEvents = config.historyEvents;
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*engine), options);
    const std::string command = selfPath() + " --client " + inspector.endpoint();
    FILE *client = ::popen(command.c_str(), "r");
    char line[256];
    if (!client || !std::fgets(line, sizeof line, client) || std::string(line) != "attached\n")
        throw std::runtime_error("the client process did not attach to " + inspector.endpoint());

    auto telemetryOn = [](int step) { // 1-based step
        const int pair = (step - 1) / 2;
        const int pos = (step - 1) % 2;
        return (pos == 0) == onFirst(pair);
    };
    std::vector<double> seconds(static_cast<std::size_t>(steps) + 1, 0.0);
    std::vector<double> cpu(static_cast<std::size_t>(steps) + 1, 0.0);
    engine->setTelemetryEnabled(true);
    const double cpu0 = processCpuSeconds();
    double lastCpu = cpu0;
    const double server0 = inspector.cost().serverCpuSeconds;
    nn::runCpuTraining(config, *engine, [&](const nn::StepReport &r) {
        seconds[static_cast<std::size_t>(r.step)] = r.seconds;
        const double now = processCpuSeconds();
        cpu[static_cast<std::size_t>(r.step)] = now - lastCpu;
        lastCpu = now;
        engine->setTelemetryEnabled(control || telemetryOn(r.step + 1));
    });
    const double server = inspector.cost().serverCpuSeconds - server0;
    const double training = processCpuSeconds() - cpu0 - server;
    engine->setTelemetryEnabled(true);
    inspector.finish();
    std::uint64_t events = 0;
    const double clientCpu = readClientTotals(client, events).total;

    ToggledRun out;
    out.serverShare = server / training;
    out.clientShare = clientCpu / training;
    std::vector<double> &ratios = out.ratios;
    for (int s = kWarmupSteps + 1; s + 1 <= steps; s += 2) {
        if ((s - 1) % 2 != 0) continue;
        const int on = telemetryOn(s) ? s : s + 1;
        const int off = telemetryOn(s) ? s + 1 : s;
        ratios.push_back(seconds[static_cast<std::size_t>(on)] /
                         seconds[static_cast<std::size_t>(off)]);
        out.cpuRatios.push_back(cpu[static_cast<std::size_t>(on)] /
                                cpu[static_cast<std::size_t>(off)]);
    }
    return out;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc == 3 && std::string(argv[1]) == "--client") return clientMain(argv[2]);
    int reps = 5;
    nn::TrainConfig config; // the default model and run, 4 ranks
    config.worldSize = 4;
    config.steps = 400;
    // 1200 steps a run, 2950 pairs over 5 runs: on this 2-core VM the wall-time interval of
    // 700 pairs (300 steps) was ±0.75 %, as wide as the target, and landed on either side of
    // 1.01 from one quiet run to the next; 2950 pairs halve it (±0.45 %).
    int toggledSteps = 1200;
    bool control = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc) {
            reps = std::atoi(argv[++i]);
        } else if (a == "--steps" && i + 1 < argc) {
            config.steps = std::atoi(argv[++i]);
        } else if (a == "--toggled-steps" && i + 1 < argc) {
            toggledSteps = std::atoi(argv[++i]);
        } else if (a == "--control") {
            control = true;
        } else {
            std::fprintf(stderr,
                         "bench_trainoverhead: unknown argument '%s'\n"
                         "usage: bench_trainoverhead [--reps N] [--steps N] [--toggled-steps N] "
                         "[--control]\n",
                         a.c_str());
            return 2;
        }
    }
    if (reps < 5 || config.steps <= kWarmupSteps + 10 || toggledSteps <= kWarmupSteps + 10) {
        std::fprintf(stderr,
                     "bench_trainoverhead: needs --reps >= 5, --steps and --toggled-steps > %d\n",
                     kWarmupSteps + 10);
        return 2;
    }

    std::vector<double> stepMs[VariantCount];
    std::vector<double> cpuMs[VariantCount];
    std::vector<double> ratioAC, ratioBC, ratioAB, cpuRatioAC;
    std::vector<double> events;
    std::vector<double> toggledMean, allPairs, allCpuPairs;
    // Shares of the training threads' CPU, per run: the server thread (A, B), its States
    // (A), the client process (A); and the toggled runs' server and client shares.
    std::vector<double> serverShare[VariantCount], stateShare, clientShare, clientStateShare,
        wakeups[VariantCount], statesPerRun;
    std::vector<double> toggledServerShare, toggledClientShare;
    std::uint64_t clientDropped = 0;
    std::uint64_t ringDropped = 0;
    try {
        runOnce(EndpointOff, config); // warm-up: page cache, allocator, CPU frequency
        for (int rep = 0; rep < reps; ++rep) {
            RunResult r[VariantCount];
            for (int k = 0; k < VariantCount; ++k) {
                const auto v = static_cast<Variant>((rep + k) % VariantCount);
                r[v] = runOnce(v, config);
                stepMs[v].push_back(r[v].medianStepMs);
                cpuMs[v].push_back(r[v].cpuMsPerStep);
                serverShare[v].push_back(r[v].serverCpu / r[v].trainingCpu);
                wakeups[v].push_back(r[v].wakeupsPerSecond);
            }
            cpuRatioAC.push_back(r[Attached].cpuMsPerStep / r[TelemetryOff].cpuMsPerStep);
            ratioAC.push_back(r[Attached].medianStepMs / r[TelemetryOff].medianStepMs);
            ratioBC.push_back(r[EndpointOff].medianStepMs / r[TelemetryOff].medianStepMs);
            ratioAB.push_back(r[Attached].medianStepMs / r[EndpointOff].medianStepMs);
            events.push_back(double(r[Attached].clientEvents));
            stateShare.push_back(r[Attached].stateCpu / r[Attached].trainingCpu);
            clientShare.push_back(r[Attached].clientCpu / r[Attached].trainingCpu);
            clientStateShare.push_back(r[Attached].clientStateCpu / r[Attached].trainingCpu);
            statesPerRun.push_back(double(r[Attached].states));
            clientDropped += r[Attached].clientDropped;
            ringDropped += r[Attached].ringDropped + r[EndpointOff].ringDropped;
        }
        for (int rep = 0; rep < reps; ++rep) {
            // Logs of the ratios: their mean is unbiased when on and off steps are equally
            // noisy (a plain mean of ratios drifts above 1 with the noise alone).
            const ToggledRun run = runToggled(config, toggledSteps, control);
            const std::vector<double> &ratios = run.ratios;
            toggledServerShare.push_back(run.serverShare);
            toggledClientShare.push_back(run.clientShare);
            double sum = 0.0;
            for (double x : ratios) {
                sum += std::log(x);
                allPairs.push_back(std::log(x));
            }
            toggledMean.push_back(std::exp(sum / double(ratios.size())));
            for (double x : run.cpuRatios)
                allCpuPairs.push_back(std::log(x));
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_trainoverhead: %s\n", e.what());
        return 1;
    }

    const Stats ac = stats(ratioAC);
    std::printf("### Training overhead of the inspector\n\n");
    std::printf("%s; shardscope-train's default model (%d blocks, hidden %d, vocab %d, seq %d, "
                "batch %d), %d CPU ranks, %d steps per run (the first %d not counted); each "
                "figure is the median step time of one run; median (min-max) over %d runs per "
                "variant, variants interleaved\n\n",
                machine().c_str(), config.layers, config.hidden, config.vocab, config.seq,
                config.batch, config.worldSize, config.steps, kWarmupSteps, reps);
    std::printf("| variant | median step, wall (ms) | training process CPU per step (ms) "
                "|\n|---|---:|---:|\n");
    for (int v = 0; v < VariantCount; ++v)
        std::printf("| %s | %s | %s |\n", kNames[v], format(stats(stepMs[v]), 3).c_str(),
                    format(stats(cpuMs[v]), 3).c_str());
    std::printf("\n| ratio (same repetition) | median (min-max) |\n|---|---:|\n");
    std::printf("| A / C: attached client vs telemetry off | %s |\n", format(ac, 4).c_str());
    std::printf("| B / C: endpoint off vs telemetry off | %s |\n",
                format(stats(ratioBC), 4).c_str());
    std::printf("| A / B: attached client vs endpoint off | %s |\n",
                format(stats(ratioAB), 4).c_str());
    std::printf("| A / C in training-process CPU time (ranks + inspector thread) | %s |\n",
                format(stats(cpuRatioAC), 4).c_str());
    // Whole runs compared with whole runs: on a 2-core VM their step times differ by several
    // per cent from run to run whatever the variant (A / C medians 0.92 to 1.04 in four quiet
    // scripts/bench runs of the same code), so no verdict on a 1 % target is drawn from them.
    std::printf("\nThe client decoded %s events per run (median); events dropped for the client: "
                "%llu, dropped from the rings: %llu (all runs). Whole runs against whole runs "
                "(A / C spread %.4f-%.4f) cannot resolve 1 %%; the 1 %% target is judged step by "
                "step, below.\n",
                format(stats(events), 0).c_str(), static_cast<unsigned long long>(clientDropped),
                static_cast<unsigned long long>(ringDropped), ac.min, ac.max);

    auto percent = [](const std::vector<double> &v) {
        std::vector<double> p;
        for (double x : v)
            p.push_back(100.0 * x);
        return format(stats(p), 3) + " %";
    };
    std::printf(
        "\n#### CPU time of the inspector, as a share of the training threads' CPU time\n\n");
    std::printf("The inspector runs one thread in the training process, the server: it drains the "
                "rings (the rings' consumer), encodes events and States (the encoder) and sends "
                "them; training threads = the process's CPU time less the server thread's, over "
                "the training. The client is the attached process (its whole life). Median "
                "(min-max) over the %d runs per variant.\n\n",
                reps);
    std::printf("| thread | share of the training threads' CPU | server wakeups per second "
                "|\n|---|---:|---:|\n");
    std::printf("| server thread, A (client attached) | %s | %s |\n",
                percent(serverShare[Attached]).c_str(),
                format(stats(wakeups[Attached]), 0).c_str());
    std::printf("| of which building and encoding States, A (%s States per run) | %s | |\n",
                format(stats(statesPerRun), 0).c_str(), percent(stateShare).c_str());
    std::printf("| server thread, B (endpoint off: draining only) | %s | %s |\n",
                percent(serverShare[EndpointOff]).c_str(),
                format(stats(wakeups[EndpointOff]), 0).c_str());
    std::printf("| client process (decodes every frame), A, after attaching | %s | |\n",
                percent(clientShare).c_str());
    std::printf("| of which decoding States, A | %s | |\n", percent(clientStateShare).c_str());
    std::printf("| server thread, step-by-step runs (below) | %s | |\n",
                percent(toggledServerShare).c_str());
    std::printf("| client process, step-by-step runs (below) | %s | |\n",
                percent(toggledClientShare).c_str());

    // Geometric mean of pair ratios (given as logs) and its 95 % interval.
    struct Interval
    {
        double mean, lo, hi;
    };
    auto interval = [](const std::vector<double> &logs) {
        double mean = 0.0, var = 0.0;
        for (double x : logs)
            mean += x;
        mean /= double(logs.size());
        for (double x : logs)
            var += (x - mean) * (x - mean);
        var /= double(logs.size() - 1);
        const double half = 1.96 * std::sqrt(var / double(logs.size()));
        return Interval{std::exp(mean), std::exp(mean - half), std::exp(mean + half)};
    };
    auto verdictOn = [](const Interval &i) {
        return i.hi <= 1.01  ? "met (the interval lies below 1.01)"
               : i.lo > 1.01 ? "**missed** (the interval lies above 1.01)"
                             : "**not resolved** (the interval contains 1.01)";
    };
    const Interval wall = interval(allPairs);
    const Interval cpu = interval(allCpuPairs);
    std::printf("\n#### Step by step: telemetry switched on and off within one attached run\n\n");
    std::printf("%d runs of %d steps with the client attached; telemetry on and off in alternate "
                "steps, in pairs whose order is drawn per pair, the first %d steps not counted; "
                "ratio = step time with telemetry on / the neighbouring step with it off, "
                "averaged as logarithms (geometric mean); in wall time, and in the training "
                "process's CPU time (all its threads, the server's included) between the step "
                "reports%s\n\n",
                reps, toggledSteps, kWarmupSteps,
                control ? ". CONTROL (--control): the steps labelled the same way, telemetry "
                          "never switched off, so every ratio is the method's own bias and noise"
                        : "");
    std::printf("| figure | value |\n|---|---:|\n");
    std::printf(
        "| geometric mean of the pair ratios per run, median (min-max) over %d runs | %s |\n", reps,
        format(stats(toggledMean), 4).c_str());
    std::printf("| **geometric mean over all %zu pairs, wall time, 95%% confidence interval** | "
                "**%.4f (%.4f-%.4f)** |\n",
                allPairs.size(), wall.mean, wall.lo, wall.hi);
    std::printf("| median pair ratio over all pairs, wall time | %.4f |\n",
                std::exp(stats(allPairs).median));
    std::printf("| **geometric mean over all %zu pairs, process CPU time, 95%% confidence "
                "interval** | **%.4f (%.4f-%.4f)** |\n",
                allCpuPairs.size(), cpu.mean, cpu.lo, cpu.hi);
    std::printf("\nTarget <= 1%% overhead on this measure: wall time %s; CPU time %s.\n",
                verdictOn(wall), verdictOn(cpu));
    return 0;
}

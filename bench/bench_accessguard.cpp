// Cost of a guarded parameter read (Engine::access on its fast path) against a raw pointer
// read of the same float, side by side in one run: inside the module that owns the
// (gathered, partitioned) parameter, a persistent parameter, and a parameter registered
// on the running module as external. Prints a Markdown table.
//
// Usage: bench_accessguard [--reps N]

#include <cstdint>
#include <cstdio>
#include <vector>

#include "benchutil.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr std::uint64_t kReads = 50'000'000;
constexpr std::int64_t kNumel = 4096; // a power of two: the index is i & (kNumel - 1)

enum Variant
{
    Raw,
    Owned,
    Persistent,
    External,
    VariantCount
};
const char *const kNames[VariantCount] = {
    "raw pointer read (baseline)",
    "Engine::access, owned partitioned parameter (gathered on entry)",
    "Engine::access, persistent parameter",
    "Engine::access, parameter registered on the module as external",
};

struct Ns
{
    double cpu = 0.0;  // thread CPU time per read
    double wall = 0.0; // wall time per read
};

Ns perRead(const PassTimer &timer)
{
    return Ns{timer.cpuSeconds() * 1e9 / double(kReads),
              timer.wallSeconds() * 1e9 / double(kReads)};
}

// ns per read: each iteration reads one float of the parameter's full tensor.
Ns runRaw(const float *data)
{
    float acc = 0.0f;
    const PassTimer timer;
    for (std::uint64_t i = 0; i < kReads; ++i) {
        keep(data);
        acc += data[i & (kNumel - 1)];
    }
    keep(acc);
    return perRead(timer);
}

Ns runGuarded(core::Engine &engine, ParamId p)
{
    float acc = 0.0f;
    const PassTimer timer;
    for (std::uint64_t i = 0; i < kReads; ++i) {
        const core::TensorView v = engine.access(0, p);
        acc += v.f32()[i & (kNumel - 1)];
    }
    keep(acc);
    return perRead(timer);
}

void printRow(const char *name, const std::vector<Ns> &v)
{
    std::vector<double> cpu, wall;
    for (const Ns &n : v) {
        cpu.push_back(n.cpu);
        wall.push_back(n.wall);
    }
    std::printf("| %s | %s | %s |\n", name, format(stats(cpu), 2).c_str(),
                format(stats(wall), 2).c_str());
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = parseReps(argc, argv, "bench_accessguard", 7);

    core::EngineConfig config;
    config.worldSize = 1;
    config.persistenceThreshold = 1000;
    config.guard =
        GuardPolicy::Error; // any slow-path read would throw: only the fast path is timed
    config.modelName = "bench-accessguard";
    core::Engine engine(config, comm::makeCpuWorld(1));
    const ModuleId other = engine.addModule(engine.root(), "embed", "Embedding");
    const ModuleId layer = engine.addModule(engine.root(), "layer", "Linear");
    std::vector<float> init(kNumel);
    for (std::int64_t i = 0; i < kNumel; ++i)
        init[static_cast<std::size_t>(i)] = float(i % 7);
    const ParamId owned = engine.addParameter(layer, "weight", {64, 64}, DType::F32, init.data());
    const ParamId persistent = engine.addParameter(layer, "bias", {64}, DType::F32, init.data());
    const ParamId tied = engine.addParameter(other, "weight", {64, 64}, DType::F32, init.data());
    engine.registerExternalParameter(layer, tied);
    engine.partition();

    engine.beginStep(0);
    engine.enterModule(0, layer, Phase::Forward);
    // The raw baseline reads the very tensor access() hands out.
    const float *raw = engine.access(0, owned).f32();

    std::vector<Ns> ns[VariantCount];
    for (int v = Owned; v < VariantCount; ++v) // warm-up
        runGuarded(engine, v == Owned ? owned : v == Persistent ? persistent : tied);
    runRaw(raw);
    for (int rep = 0; rep < reps; ++rep) {
        for (int k = 0; k < VariantCount; ++k) {
            const auto v = static_cast<Variant>((rep + k) % VariantCount);
            switch (v) {
            case Raw:
                ns[v].push_back(runRaw(raw));
                break;
            case Owned:
                ns[v].push_back(runGuarded(engine, owned));
                break;
            case Persistent:
                ns[v].push_back(runGuarded(engine, persistent));
                break;
            case External:
                ns[v].push_back(runGuarded(engine, tied));
                break;
            case VariantCount:
                break;
            }
        }
    }
    engine.exitModule(0, layer, Phase::Forward);
    engine.endStep(0, 0.0);
    if (engine.unregisteredAccessCount() != 0) {
        std::fprintf(stderr,
                     "bench_accessguard: a read left the fast path; the figures are void\n");
        return 1;
    }

    std::vector<Ns> overhead;
    std::vector<double> guardCpu;
    for (std::size_t rep = 0; rep < static_cast<std::size_t>(reps); ++rep) {
        overhead.push_back(
            Ns{ns[Owned][rep].cpu - ns[Raw][rep].cpu, ns[Owned][rep].wall - ns[Raw][rep].wall});
        guardCpu.push_back(ns[Owned][rep].cpu);
    }
    const Stats guard = stats(guardCpu);
    std::printf("### Access guard: ns per parameter read\n\n");
    std::printf("%s; %llu reads of one float per pass, inside the module `layer`; median "
                "(min-max) of %d passes, variants rotated; CPU = the thread's CPU time, wall = "
                "elapsed time (includes time the shared machine gave to other processes)\n\n",
                machine().c_str(), static_cast<unsigned long long>(kReads), reps);
    std::printf("| read | CPU ns per read | wall ns per read |\n|---|---:|---:|\n");
    for (int v = 0; v < VariantCount; ++v)
        printRow(kNames[v], ns[v]);
    printRow("guard overhead over raw (owned, same repetition)", overhead);
    std::printf("\nTarget <= 5 ns per guarded read (owned parameter, CPU): %s.\n",
                verdict(guard.median <= 5.0));
    return 0;
}

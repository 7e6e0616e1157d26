// What overlap_comm buys on the CPU backend: the default model (4 CPU ranks) trained
// with each rank's collectives on a progress thread (--overlap-comm) against the same
// run with synchronous collectives. Runs alternate (sync, overlap, overlap, sync, ...)
// so machine noise hits both alike; the figure is the ratio of their step times, per
// repetition. Also counts how often a rank entered a module while a prefetch gather was
// still in flight: the overlap itself, as the inspector shows it. Prints a Markdown table.
//
// Usage: bench_overlap [--reps N]

#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "benchutil.h"
#include "nn/trainer.h"
#include "telemetry/eventfields.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kSteps = 60;
constexpr int kWarmupSteps = 10;

class OverlapCounter : public telemetry::EventSink
{
  public:
    void write(const telemetry::Event &ev) noexcept override
    {
        std::lock_guard lock(m_mutex);
        auto &open = m_open[ev.rank];
        if (ev.type == EventType::FetchBegin &&
            telemetry::readFetch(ev).reason == FetchReason::Prefetch) {
            open.push_back(telemetry::readFetch(ev).param);
        } else if (ev.type == EventType::FetchEnd) {
            std::erase(open, telemetry::readFetch(ev).param);
        } else if (ev.type == EventType::ModuleEnter) {
            ++entries;
            if (!open.empty()) ++overlapped;
        }
    }
    std::uint64_t entries = 0;
    std::uint64_t overlapped = 0;

  private:
    std::mutex m_mutex;
    std::map<int, std::vector<std::uint32_t>> m_open;
};

struct Pass
{
    double stepSeconds = 0.0; // median step time after warm-up
    double overlapShare = 0.0;
    double finalLoss = 0.0;
};

Pass run(bool overlap)
{
    nn::TrainConfig c;
    c.steps = kSteps;
    c.listen = false;
    c.overlapComm = overlap;
    auto engine = nn::makeCpuEngine(c);
    OverlapCounter counter;
    engine->setEventSink(&counter);
    std::vector<double> steps;
    const nn::TrainResult r = nn::runCpuTraining(c, *engine, [&](const nn::StepReport &s) {
        if (s.step > kWarmupSteps) steps.push_back(s.seconds);
    });
    Pass p;
    p.stepSeconds = stats(steps).median;
    p.overlapShare = counter.entries ? double(counter.overlapped) / double(counter.entries) : 0.0;
    p.finalLoss = r.lastLoss;
    return p;
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = parseReps(argc, argv, "bench_overlap", 5);
    std::vector<double> syncMs, overlapMs, ratio, share;
    bool sameLoss = true;
    for (int i = 0; i < reps; ++i) {
        // ABBA order: neither variant always runs first.
        const bool overlapFirst = i % 2 == 1;
        const Pass a = run(overlapFirst);
        const Pass b = run(!overlapFirst);
        const Pass &sync = overlapFirst ? b : a;
        const Pass &over = overlapFirst ? a : b;
        syncMs.push_back(sync.stepSeconds * 1e3);
        overlapMs.push_back(over.stepSeconds * 1e3);
        ratio.push_back(over.stepSeconds / sync.stepSeconds);
        share.push_back(100.0 * over.overlapShare);
        sameLoss = sameLoss && sync.finalLoss == over.finalLoss;
    }
    std::printf("Machine: %s. Default model, 4 CPU ranks, %d steps per run (first %d not "
                "counted), median step time per run; median (min-max) over %d repetitions.\n\n",
                machine().c_str(), kSteps, kWarmupSteps, reps);
    std::printf("| figure | value |\n|---|---|\n");
    std::printf("| step time, synchronous collectives (ms) | %s |\n",
                format(stats(syncMs), 2).c_str());
    std::printf("| step time, --overlap-comm (ms) | %s |\n", format(stats(overlapMs), 2).c_str());
    std::printf("| overlap / synchronous step time | %s |\n", format(stats(ratio), 3).c_str());
    std::printf("| module entries with a prefetch still in flight (%%) | %s |\n",
                format(stats(share), 1).c_str());
    std::printf("| final loss identical | %s |\n", sameLoss ? "yes" : "**no**");
    return sameLoss ? 0 : 1;
}

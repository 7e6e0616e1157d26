// The job's aligner of collectives (issue 51, sessioncore/collectivealigner.h) fed a synthetic
// 64-rank job: events aligned per second, against the GUI's ingest target (>= 2 M events/s,
// docs/performance.md section 5), which it must keep up with; and the seqs its windows hold.
//
//   build/bin/bench_aligner --reps 5

#include <cstdio>
#include <vector>

#include "benchutil.h"
#include "sessioncore/collectivealigner.h"
#include "telemetry/eventfields.h"

using namespace shardscope;

namespace {

constexpr int kRanks = 64;
constexpr std::uint64_t kCollectives = 8000; // per rank: 1,024,000 events in all

// As a live job's events arrive: for each collective every rank's begin (ranks a few
// microseconds apart, rank 63 last), then every rank's end; a 12-collective step of forward
// and backward gathers and reduce-scatters over 4 modules.
std::vector<telemetry::Event> job()
{
    std::vector<telemetry::Event> out;
    out.reserve(kCollectives * kRanks * 2);
    for (std::uint64_t seq = 1; seq <= kCollectives; ++seq) {
        const std::uint64_t k = seq % 12;
        const telemetry::CollectiveFields f{k < 8 ? CollectiveKind::AllGather
                                                  : CollectiveKind::ReduceScatter,
                                            ModuleId(1 + k % 4),
                                            0,
                                            seq,
                                            4096ull << (k % 4),
                                            k < 4   ? FetchReason::Forward
                                            : k < 8 ? FetchReason::Backward
                                                    : FetchReason::Backward,
                                            2};
        const std::uint64_t t = seq * 1'000'000;
        for (int r = 0; r < kRanks; ++r)
            out.push_back(telemetry::stamped(telemetry::makeCollectiveBegin(f),
                                             t + std::uint64_t(r) * 3'000, 1, std::uint16_t(r)));
        for (int r = 0; r < kRanks; ++r)
            out.push_back(telemetry::stamped(telemetry::makeCollectiveEnd(f), t + 500'000, 1,
                                             std::uint16_t(r)));
    }
    return out;
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = bench::parseReps(argc, argv, "bench_aligner", 5);
    const std::vector<telemetry::Event> events = job();
    std::vector<state::ModuleRecord> modules;
    for (ModuleId m = 0; m < 5; ++m)
        modules.push_back({m, m ? "layers." + std::to_string(m) : "", "Linear", m ? 0 : kNoModule});
    std::vector<double> wall, cpu;
    std::size_t most = 0, records = 0;
    for (int rep = 0; rep < reps; ++rep) {
        sessioncore::CollectiveAligner a(kRanks);
        a.setModulePaths(modules);
        const bench::PassTimer timer;
        for (const telemetry::Event &e : events) {
            a.add(e);
            if ((e.tsNs & 0xFFFF) == 0) most = std::max(most, a.windowedSeqs());
        }
        a.tick(events.back().tsNs + 1);
        a.finish(0);
        wall.push_back(double(events.size()) / timer.wallSeconds() / 1e6);
        cpu.push_back(double(events.size()) / timer.cpuSeconds() / 1e6);
        records += a.records().size();
        most = std::max(most, a.windowedSeqs());
        bench::keep(a.stragglers().collectives);
    }
    std::printf("# bench_aligner: %d ranks, %llu collectives each, %zu events a pass, %d reps\n\n",
                kRanks, static_cast<unsigned long long>(kCollectives), events.size(), reps);
    std::printf("Machine: %s\n\n", bench::machine().c_str());
    std::printf("| figure | median (min-max) | target |\n|---|---|---|\n");
    std::printf("| events aligned, M events/s (wall) | %s | >= 2: %s |\n",
                bench::format(bench::stats(wall), 2).c_str(),
                bench::verdict(bench::stats(wall).median >= 2.0));
    std::printf("| events aligned, M events/s (thread CPU) | %s | >= 2: %s |\n",
                bench::format(bench::stats(cpu), 2).c_str(),
                bench::verdict(bench::stats(cpu).median >= 2.0));
    std::printf("| most seqs held in the windows | %zu | bounded |\n", most);
    std::printf("| records on this healthy job | %zu | 0 |\n", records);
    return records == 0 ? 0 : 1;
}

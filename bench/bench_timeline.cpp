// The gather timeline at a million events on 8 ranks (issue #52): milliseconds a frame drawn
// offscreen (QCustomPlot::replot into the widget's backing store, then grabbed, as a frame on
// screen costs) at whole-run, one-step and single-gather zoom, and the Selection panel's sums
// (GatherTimeline::rangeSummary) over the whole run. The run: 8 ranks x 62,500 fetches
// (begin and end: 1,000,000 events), 400 steps, one fetch every 10 us a rank, each 4 us, over
// 1,000 parameters and 100 modules, a violation every 1,000th fetch; also the whole run with
// the ranks folded into one summary lane. Prints a Markdown table.
//
// Usage: bench_timeline [--reps N]   (QT_QPA_PLATFORM=offscreen by default)

#include <QApplication>
#include <QPixmap>

#include <cstdio>
#include <vector>

#include <qcustomplot.h>

#include "benchutil.h"
#include "telemetry/eventfields.h"
#include "views/gathertimeline.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kRanks = 8;
constexpr int kFetches = 62500; // a rank
constexpr int kSteps = 400;
constexpr std::uint64_t kUs = 1000;

telemetry::Event at(std::uint64_t ts, int rank, std::uint32_t step, telemetry::Event e)
{
    e.tsNs = ts;
    e.rank = std::uint16_t(rank);
    e.step = step;
    return e;
}

std::vector<telemetry::Event> run()
{
    std::vector<telemetry::Event> events;
    events.reserve(std::size_t(kRanks) * kFetches * 2 + kRanks * kSteps + kRanks * 100);
    const int perStep = kFetches / kSteps;
    for (int r = 0; r < kRanks; ++r)
        for (int i = 0; i < kFetches; ++i) {
            const std::uint32_t step = std::uint32_t(i / perStep + 1);
            const std::uint64_t t = std::uint64_t(i) * 10 * kUs + std::uint64_t(r) * kUs;
            if (i % perStep == 0) events.push_back(at(t, r, step, telemetry::makeStepBegin()));
            const auto param = ParamId(i % 1000);
            const auto cause = ModuleId(i % 100);
            const auto reason = FetchReason(i % 3);
            events.push_back(
                at(t + 1, r, step,
                   telemetry::makeFetchBegin({.param = param, .cause = cause, .reason = reason})));
            events.push_back(
                at(t + 4 * kUs, r, step,
                   telemetry::makeFetchEnd(
                       {.param = param, .cause = cause, .bytes = 4096, .reason = reason})));
            if (i % 1000 == 999)
                events.push_back(
                    at(t + 5 * kUs, r, step,
                       telemetry::makeUnregisteredAccess({.accessor = cause, .param = param})));
        }
    return events;
}

} // namespace

int main(int argc, char **argv)
{
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    const int reps = parseReps(argc, argv, "bench_timeline", 20);
    const std::vector<telemetry::Event> events = run();

    views::GatherTimeline timeline;
    timeline.resize(1600, 700);
    timeline.show();
    timeline.setWorldSize(kRanks);
    timeline.setTimeOrigin(0);
    const PassTimer ingest;
    for (std::size_t i = 0; i < events.size(); i += 65536)
        timeline.appendEvents(std::span<const telemetry::Event>(events).subspan(
            i, std::min<std::size_t>(65536, events.size() - i)));
    timeline.refresh();
    const double ingestMs = ingest.wallSeconds() * 1e3;

    struct Zoom
    {
        const char *name;
        double t0, t1;
    };
    const double end = double(kFetches) * 10e-6;
    const double stepLen = end / kSteps;
    const Zoom zooms[] = {{"whole run (0.625 s, 400 steps)", -0.01 * end, 1.01 * end},
                          {"one step (1.56 ms)", 200 * stepLen, 201 * stepLen},
                          {"one gather (10 us)", 0.3125, 0.31251}};
    std::printf("bench_timeline: %zu events, %d ranks, %d reps a zoom; %s; ingest %.0f ms\n\n",
                events.size(), kRanks, reps, machine().c_str(), ingestMs);
    std::printf("| zoom | blocks drawn | ms a frame, median (min-max) |\n|---|---|---|\n");
    for (const Zoom &z : zooms) {
        timeline.setVisibleRange(z.t0, z.t1);
        timeline.plot()->replot();
        std::vector<double> ms;
        for (int i = 0; i < reps; ++i) {
            const PassTimer t;
            timeline.plot()->replot(QCustomPlot::rpImmediateRefresh);
            keep(timeline.plot()->toPixmap(1600, 600));
            ms.push_back(t.wallSeconds() * 1e3);
        }
        std::printf("| %s | %zu | %s |\n", z.name, timeline.visibleBlocks().size(),
                    format(stats(ms), 2).c_str());
    }
    {
        timeline.setFolded(true); // all ranks in one summary lane, at whole-run zoom
        timeline.setVisibleRange(zooms[0].t0, zooms[0].t1);
        timeline.plot()->replot();
        std::vector<double> ms;
        for (int i = 0; i < reps; ++i) {
            const PassTimer t;
            timeline.plot()->replot(QCustomPlot::rpImmediateRefresh);
            keep(timeline.plot()->toPixmap(1600, 600));
            ms.push_back(t.wallSeconds() * 1e3);
        }
        std::printf("| whole run, ranks folded into one lane | - | %s |\n",
                    format(stats(ms), 2).c_str());
        timeline.setFolded(false);
    }
    std::vector<double> ms;
    std::size_t rows = 0;
    for (int i = 0; i < reps; ++i) {
        const PassTimer t;
        const auto summary = timeline.rangeSummary(-1, end + 1);
        ms.push_back(t.wallSeconds() * 1e3);
        rows = summary.size();
    }
    std::printf("\n| selection over the whole run | rows | ms, median (min-max) |\n|---|---|---|\n"
                "| 500,000 gathers | %zu | %s |\n",
                rows, format(stats(ms), 2).c_str());
    return 0;
}

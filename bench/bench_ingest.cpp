// How much the inspector can swallow: events per second decoded from wire bytes (the
// frame decoder and the event codec, in 64 KiB reads, 2048 events per frame as the server
// sends them) and applied live to the GUI's SessionStore, and bytes of memory per stored
// event, from the store's own accounting (its event lanes) and from the heap in use.
// The stream imitates training: per rank and step, module enter/exit, fetch begin/end,
// release, memory samples, one unregistered access. Prints a Markdown table.
//
// Usage: bench_ingest [--reps N]   (run with QT_QPA_PLATFORM=offscreen)

#include <QCoreApplication>

#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "benchutil.h"
#include "session/sessionstore.h"
#include "telemetry/eventfields.h"
#include "wire/frame.h"
#include "wire/messages.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kWorld = 8;
constexpr int kModules = 100;
constexpr int kParamsPerModule = 10;
constexpr int kSteps = 150;
constexpr std::size_t kEventsPerFrame = 2048; // as the inspector's server batches them
constexpr std::size_t kReadSize = 64 << 10;

state::EngineState makeState()
{
    state::EngineState st;
    st.modelName = "bench-ingest";
    st.worldSize = kWorld;
    st.backend = "cpu";
    for (int r = 0; r < kWorld; ++r)
        st.localRanks.push_back(r);
    st.modules.push_back(state::ModuleRecord{0, "", "Model", kNoModule});
    for (int m = 0; m < kModules; ++m) {
        const auto id = static_cast<ModuleId>(st.modules.size());
        st.modules.push_back(state::ModuleRecord{id, "layers." + std::to_string(m), "Linear", 0});
        for (int k = 0; k < kParamsPerModule; ++k) {
            state::ParamRecord p;
            p.id = static_cast<ParamId>(st.params.size());
            p.name = st.modules.back().path + ".w" + std::to_string(k);
            p.owner = id;
            p.shape = {256, 64};
            p.numel = 256 * 64;
            p.paddedNumel = p.numel;
            p.partitionNumel = p.numel / kWorld;
            p.partitioned = true;
            p.status.assign(kWorld, ParamStatus::NotAvailable);
            st.params.push_back(std::move(p));
        }
    }
    return st;
}

telemetry::Event ev(std::uint64_t &ts, int rank, std::uint32_t step, const telemetry::Event &fields)
{
    ts += 97;
    return telemetry::stamped(fields, ts, step, static_cast<std::uint16_t>(rank));
}

// One rank's events of one step, as the engine emits them.
void stepEvents(std::vector<telemetry::Event> &out, std::uint64_t &ts, int rank, std::uint32_t step)
{
    const std::uint64_t bytes = 256 * 64 * 4;
    out.push_back(ev(ts, rank, step, telemetry::makeStepBegin()));
    for (int m = 0; m < kModules; ++m) {
        const auto module = static_cast<ModuleId>(m + 1);
        const auto first = static_cast<ParamId>(m * kParamsPerModule);
        out.push_back(ev(ts, rank, step, telemetry::makeModuleEnter({.module = module})));
        for (int k = 0; k < kParamsPerModule; ++k) {
            const telemetry::FetchFields f{.param = first + k, .cause = module, .bytes = bytes};
            out.push_back(ev(ts, rank, step, telemetry::makeFetchBegin(f)));
            out.push_back(ev(ts, rank, step, telemetry::makeFetchEnd(f)));
        }
        if (m == kModules - 1)
            out.push_back(ev(ts, rank, step,
                             telemetry::makeUnregisteredAccess({.accessor = module,
                                                                .param = 0,
                                                                .owner = 1,
                                                                .status = ParamStatus::NotAvailable,
                                                                .action = GuardAction::Gathered})));
        out.push_back(ev(ts, rank, step, telemetry::makeModuleExit({.module = module})));
        for (int k = 0; k < kParamsPerModule; ++k)
            out.push_back(
                ev(ts, rank, step,
                   telemetry::makeRelease({.param = first + k, .cause = module, .bytes = bytes})));
        out.push_back(ev(ts, rank, step,
                         telemetry::makeMemorySample({.partitionedBytes = bytes * 100 / kWorld,
                                                      .gatheredBytes = bytes * kParamsPerModule,
                                                      .peakGatheredBytes = bytes * kParamsPerModule,
                                                      .liveElements = 2560})));
    }
    out.push_back(ev(ts, rank, step, telemetry::makeStepEnd(1.0)));
}

// The bytes a client receives: per step, each rank's events in frames of 2048.
std::string makeStream(std::uint64_t &events)
{
    std::string bytes;
    std::vector<std::uint64_t> ts(kWorld, 1'000'000);
    std::vector<telemetry::Event> batch;
    events = 0;
    for (std::uint32_t step = 1; step <= kSteps; ++step) {
        batch.clear();
        for (int r = 0; r < kWorld; ++r)
            stepEvents(batch, ts[static_cast<std::size_t>(r)], r, step);
        for (std::size_t i = 0; i < batch.size(); i += kEventsPerFrame) {
            const std::size_t n = std::min(kEventsPerFrame, batch.size() - i);
            wire::appendFrame(
                bytes, wire::MessageType::EventBatch,
                wire::encodeEvents(std::span<const telemetry::Event>(batch.data() + i, n)));
        }
        events += batch.size();
    }
    return bytes;
}

std::size_t heapInUse()
{
    const struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

struct Rep
{
    double decodeSeconds = 0.0; // frame decoder + event codec
    double applySeconds = 0.0;  // SessionStore::appendEvents
    double totalSeconds = 0.0;
    std::uint64_t stored = 0;
    double laneBytesPerEvent = 0.0;
    double heapBytesPerEvent = 0.0;
};

Rep runOnce(const std::string &stream, const state::EngineState &state)
{
    Rep rep;
    session::SessionStore store;
    store.applyState(state);
    store.flush();
    const std::size_t heapBefore = heapInUse();
    {
        wire::FrameDecoder decoder;
        const auto t0 = Clock::now();
        for (std::size_t off = 0; off < stream.size(); off += kReadSize) {
            const std::size_t n = std::min(kReadSize, stream.size() - off);
            const auto d0 = Clock::now();
            decoder.feed(stream.data() + off, n);
            for (;;) {
                auto frame = decoder.next();
                if (!frame || !frame.value()) break;
                auto events = wire::decodeEvents(frame.value()->payload);
                if (!events) throw std::runtime_error(events.error());
                const auto a0 = Clock::now();
                rep.decodeSeconds += std::chrono::duration<double>(a0 - d0).count();
                store.appendEvents(*events, false);
                rep.applySeconds += secondsSince(a0);
            }
        }
        rep.totalSeconds = secondsSince(t0);
        if (decoder.failed()) throw std::runtime_error(decoder.error());
    }
    store.flush();
    rep.stored = store.totalEvents();
    std::size_t laneBytes = 0;
    for (int r = 0; r < store.laneCount(); ++r)
        laneBytes += store.lane(r).bytesUsed();
    rep.laneBytesPerEvent = double(laneBytes) / double(rep.stored);
    rep.heapBytesPerEvent = (double(heapInUse()) - double(heapBefore)) / double(rep.stored);
    return rep;
}

} // namespace

int main(int argc, char **argv)
{
    QCoreApplication app(argc, argv);
    const int reps = parseReps(argc, argv, "bench_ingest", 5);
    const state::EngineState state = makeState();
    std::uint64_t events = 0;
    const std::string stream = makeStream(events);

    std::vector<double> total, decode, apply, laneB, heapB;
    try {
        runOnce(stream, state); // warm-up
        for (int r = 0; r < reps; ++r) {
            const Rep rep = runOnce(stream, state);
            if (rep.stored != events)
                throw std::runtime_error("the store kept " + std::to_string(rep.stored) + " of " +
                                         std::to_string(events) + " events");
            total.push_back(double(events) / rep.totalSeconds / 1e6);
            decode.push_back(double(events) / rep.decodeSeconds / 1e6);
            apply.push_back(double(events) / rep.applySeconds / 1e6);
            laneB.push_back(rep.laneBytesPerEvent);
            heapB.push_back(rep.heapBytesPerEvent);
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_ingest: %s\n", e.what());
        return 1;
    }

    const Stats rate = stats(total);
    const Stats lane = stats(laneB);
    std::printf("### GUI session ingest\n\n");
    std::printf("%s; %llu events (%d ranks, %d steps, %d modules x %d parameters; %.1f MB of "
                "frames) fed in %zu KiB reads to the wire decoder and applied live to a "
                "SessionStore, serially on one thread; median (min-max) of %d runs\n\n",
                machine().c_str(), static_cast<unsigned long long>(events), kWorld, kSteps,
                kModules, kParamsPerModule, double(stream.size()) / 1e6, kReadSize >> 10, reps);
    std::printf("| figure | value |\n|---|---:|\n");
    std::printf("| **decoded and applied, M events/s** | **%s** |\n", format(rate, 2).c_str());
    std::printf("| decode only (frames + event codec), M events/s | %s |\n",
                format(stats(decode), 2).c_str());
    std::printf("| apply only (SessionStore::appendEvents), M events/s | %s |\n",
                format(stats(apply), 2).c_str());
    std::printf(
        "| **bytes per stored event, store's accounting (EventLane::bytesUsed)** | **%s** |\n",
        format(lane, 2).c_str());
    std::printf("| bytes per stored event, heap in use (mallinfo2 delta, whole store) | %s |\n",
                format(stats(heapB), 2).c_str());
    std::printf("\nTargets: >= 2 M events/s: %s; <= 24 B/event (store's accounting): %s.\n",
                verdict(rate.median >= 2.0), verdict(lane.median <= 24.0));
    return 0;
}

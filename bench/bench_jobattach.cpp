// Attach to a whole job: 64 rank "processes" (64 Inspectors in this process, each serving a
// synthetic state of its own on loopback TCP, as a gloo rank process would: the job's
// module tree, the 1/64 of its 100,000 parameters it observes, its one global rank, and
// 32,768 recent events in its history), attached by the GUI's JobSession (64 Connections,
// one SessionStore, states merged by wire::mergeJobStates) with a ModuleTreeModel.
// Measured: attach -> tree populated with every module and all 100,000 parameters; attach
// -> all 2,097,152 events stored, and the ingest rate that makes; bytes per stored event
// (the store's own accounting, as bench_ingest reports it) and the resident memory the
// whole attach grew by per event. Prints Markdown.
//
// Usage: bench_jobattach [--reps N]   (run with QT_QPA_PLATFORM=offscreen)

#include <QEventLoop>
#include <QGuiApplication>
#include <QTimer>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchutil.h"
#include "models/moduletreemodel.h"
#include "server/inspector.h"
#include "session/jobsession.h"
#include "session/sessionstore.h"
#include "state/stateprovider.h"
#include "telemetry/eventfields.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kWorld = 64;
constexpr int kParams = 100000;
constexpr int kBlocks = 250;
constexpr int kLayersPerBlock = 24;
constexpr std::size_t kEventsPerRank = 32768; // half a ring: nothing is dropped

// One rank process of the job: its part of the model's state and its rank's events.
class RankProvider final : public state::StateProvider
{
  public:
    RankProvider(int rank, const state::EngineState &whole) : m_rank(rank)
    {
        m_state.modelName = whole.modelName;
        m_state.worldSize = kWorld;
        m_state.backend = "gloo";
        m_state.step = 10;
        m_state.localRanks = {rank};
        m_state.modules = whole.modules;
        for (const state::ParamRecord &p : whole.params)
            if (static_cast<int>(p.id % kWorld) == rank) m_state.params.push_back(p);
    }
    state::EngineState state() const override { return m_state; }
    std::uint64_t stateVersion() const override { return 1; }
    std::string modelName() const override { return m_state.modelName; }
    int worldSize() const override { return kWorld; }
    std::string backend() const override { return "gloo"; }
    std::vector<int> localRanks() const override { return {m_rank}; }
    void setEventSink(telemetry::EventSink *sink) override { m_sink = sink; }
    void setTelemetryEnabled(bool) override {}

    // A gather's worth of events, again and again: fetch, use, release.
    void writeEvents() const
    {
        const auto rank = static_cast<std::uint16_t>(m_rank);
        std::uint64_t ts = 1'000'000'000;
        for (std::size_t i = 0; i < kEventsPerRank; ++i) {
            const auto id = static_cast<std::uint32_t>((i / 4 * kWorld + m_rank) % kParams);
            const telemetry::FetchFields fetch{.param = id, .cause = 0, .bytes = 16384};
            const auto kind = i % 4;
            const telemetry::Event fields =
                kind == 0   ? telemetry::makeFetchBegin(fetch)
                : kind == 1 ? telemetry::makeFetchEnd(fetch)
                : kind == 2 ? telemetry::makeModuleEnter({.module = id})
                            : telemetry::makeRelease({.param = id, .cause = 0, .bytes = 16384});
            m_sink->write(telemetry::stamped(fields, ts += 997,
                                             static_cast<std::uint32_t>(1 + i / 4096), rank));
        }
    }

  private:
    int m_rank;
    state::EngineState m_state;
    telemetry::EventSink *m_sink = nullptr;
};

state::EngineState wholeModel()
{
    state::EngineState st;
    st.modelName = "synthetic job, 100k parameters";
    st.worldSize = kWorld;
    st.modules.push_back({0, "", "Model", kNoModule});
    std::vector<ModuleId> owners;
    for (int b = 0; b < kBlocks; ++b) {
        const ModuleId block = static_cast<ModuleId>(st.modules.size());
        st.modules.push_back({block, "blocks." + std::to_string(b), "Block", 0});
        owners.push_back(block);
        for (int l = 0; l < kLayersPerBlock; ++l) {
            const ModuleId id = static_cast<ModuleId>(st.modules.size());
            st.modules.push_back({id, "blocks." + std::to_string(b) + ".layer" + std::to_string(l),
                                  "Linear", block});
            owners.push_back(id);
        }
    }
    const std::size_t perOwner = (kParams + owners.size() - 1) / owners.size();
    for (int i = 0; i < kParams; ++i) {
        state::ParamRecord p;
        p.id = static_cast<ParamId>(i);
        const ModuleId owner = owners[static_cast<std::size_t>(i) / perOwner];
        p.owner = owner;
        p.name = st.modules[owner].path + ".w" + std::to_string(i % perOwner);
        p.shape = {64, 64};
        p.numel = 4096;
        p.paddedNumel = 4096;
        p.partitionNumel = 4096 / kWorld;
        p.partitioned = true;
        p.status.assign(kWorld, ParamStatus::NotAvailable);
        st.params.push_back(std::move(p));
    }
    return st;
}

std::size_t residentBytes()
{
    std::ifstream f("/proc/self/statm");
    std::size_t pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

struct Rep
{
    double populatedMs = 0;
    double ingestedMs = 0;
    double eventsPerSecond = 0;
    double bytesPerEvent = 0;    // the store's accounting (EventLane::bytesUsed), as figure 5
    double residentPerEvent = 0; // resident memory grown during the attach, per event
};

Rep attachOnce(const std::vector<session::JobTarget> &targets, int expectedNodes)
{
    const std::size_t rss0 = residentBytes();
    auto store = std::make_unique<session::SessionStore>();
    models::ModuleTreeModel tree(store.get());
    session::JobSession session(store.get());
    QEventLoop loop;
    Rep out;
    const std::uint64_t expectedEvents = kEventsPerRank * kWorld;
    const auto t0 = Clock::now();
    QObject::connect(store.get(), &session::SessionStore::updated, &loop, [&] {
        if (out.populatedMs == 0 && tree.matchingNodeCount() >= expectedNodes)
            out.populatedMs = secondsSince(t0) * 1e3;
        if (out.ingestedMs == 0 && store->totalEvents() >= expectedEvents)
            out.ingestedMs = secondsSince(t0) * 1e3;
        if (out.populatedMs > 0 && out.ingestedMs > 0) loop.quit();
    });
    QTimer::singleShot(120000, &loop, [&] { loop.quit(); });
    session.attach(targets, {}, QStringLiteral("bench"));
    loop.exec();
    if (out.populatedMs == 0 || out.ingestedMs == 0)
        throw std::runtime_error("not populated within 120 s: " + session.summary().toStdString() +
                                 ", " + std::to_string(store->totalEvents()) + " events");
    out.eventsPerSecond = static_cast<double>(store->totalEvents()) / (out.ingestedMs / 1e3);
    std::size_t laneBytes = 0;
    for (int r = 0; r < store->laneCount(); ++r)
        laneBytes += store->lane(r).bytesUsed();
    out.bytesPerEvent = static_cast<double>(laneBytes) / static_cast<double>(store->totalEvents());
    out.residentPerEvent =
        static_cast<double>(residentBytes() - rss0) / static_cast<double>(store->totalEvents());
    session.detach();
    return out;
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = parseReps(argc, argv, "bench_jobattach", 5);
    QGuiApplication app(argc, argv);
    const state::EngineState whole = wholeModel();
    std::vector<std::unique_ptr<RankProvider>> providers;
    std::vector<std::unique_ptr<server::Inspector>> servers;
    std::vector<session::JobTarget> targets;
    for (int r = 0; r < kWorld; ++r) {
        providers.push_back(std::make_unique<RankProvider>(r, whole));
        server::InspectorOptions o;
        o.endpoint = "tcp:127.0.0.1:0";
        o.job = "bench";
        o.historyEvents = kEventsPerRank;
        servers.push_back(std::make_unique<server::Inspector>(*providers.back(), o));
        targets.push_back({QString::fromStdString(servers.back()->endpoint()), {r}, {}});
        providers.back()->writeEvents();
    }
    // The servers drain their rings into their histories every 5 ms.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const int expectedNodes = static_cast<int>(whole.modules.size() + whole.params.size());

    std::vector<double> populated, ingested, rate, perEvent, resident;
    for (int i = 0; i < reps; ++i) {
        const Rep r = attachOnce(targets, expectedNodes);
        populated.push_back(r.populatedMs);
        ingested.push_back(r.ingestedMs);
        rate.push_back(r.eventsPerSecond / 1e6);
        perEvent.push_back(r.bytesPerEvent);
        resident.push_back(r.residentPerEvent);
    }
    const Stats p = stats(populated), in = stats(ingested), rt = stats(rate), pe = stats(perEvent),
                rs = stats(resident);
    std::printf("#### Attach to a job: %d rank processes, %d parameters\n\n", kWorld, kParams);
    std::printf("%s; %d Inspectors in this process on loopback TCP, each serving the job's "
                "%zu modules, its 1/%d of the parameters, one rank and %zu history events "
                "(%zu in all); median (min-max) of %d attaches\n\n",
                machine().c_str(), kWorld, whole.modules.size(), kWorld, kEventsPerRank,
                kEventsPerRank * kWorld, reps);
    std::printf("| figure | value | target |\n|---|---|---|\n");
    std::printf(
        "| **attach -> tree populated (all modules and parameters), ms** | **%s** | <= 2000 "
        "(%s) |\n",
        format(p, 0).c_str(), verdict(p.median <= 2000));
    std::printf("| attach -> every event stored, ms | %s | |\n", format(in, 0).c_str());
    std::printf(
        "| **events ingested, M events/s (events / attach -> stored)** | **%s** | >= 2 (%s) "
        "|\n",
        format(rt, 2).c_str(), verdict(rt.median >= 2.0));
    std::printf(
        "| **bytes per stored event, store's accounting (EventLane::bytesUsed)** | **%s** | "
        "unchanged (figure 5) |\n",
        format(pe, 2).c_str());
    std::printf("| resident memory grown per stored event (whole attach: states, queues, store) | "
                "%s | |\n",
                format(rs, 1).c_str());
    return 0;
}

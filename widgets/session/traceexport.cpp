#include "session/traceexport.h"

#include <QJsonObject>

#include <optional>
#include <queue>
#include <unordered_map>
#include <vector>

#include "session/labels.h"
#include "session/tracebuilder.h"
#include "telemetry/eventfields.h"

namespace shardscope::session {

namespace {

// Gathers of one rank overlap each other and module compute: prefetches are issued
// ahead and complete while later modules run. "X" spans on one thread must nest, so
// each gather goes onto the lowest free of its rank's "gathers k" threads (tid
// FirstGatherTid + k) rather than becoming an async "b"/"e" pair: X spans on threads
// are drawn alike by Chrome (DevTools' Performance panel) and Perfetto (each groups async slices into tracks
// its own way), keep the integer ts/dur of every other span, and the number of gather
// threads is the rank's peak number of gathers in flight, as the timeline's sub-rows show.
enum Lane
{
    ModulesTid = 0,
    ViolationsTid = 2,
    StepsTid = 3,
    FirstGatherTid = 4
};

// Threads are listed modules, gathers 0..n, violations, steps.
constexpr int kViolationsSortIndex = 1 << 20;

struct OpenFetch
{
    std::uint64_t ts = 0;
    std::uint32_t module = kNoModule;
    FetchReason reason = FetchReason::Forward;
};

struct Gather
{
    qint64 ts = 0; // microseconds, as written
    qint64 end = 0;
    ParamId param = kNoParam;
    ModuleId module = kNoModule;
    FetchReason reason = FetchReason::Forward;
    std::uint64_t bytes = 0;
    std::uint32_t step = 0;
};

// Lowest free lane per gather, in start order: a lane is free again once its last gather
// has ended (touching spans do not overlap). Returns each gather's lane and the lane count.
std::pair<std::vector<int>, int> assignLanes(std::vector<Gather> &gathers)
{
    std::stable_sort(gathers.begin(), gathers.end(),
                     [](const Gather &a, const Gather &b) { return a.ts < b.ts; });
    using Busy = std::pair<qint64, int>; // end, lane
    std::priority_queue<Busy, std::vector<Busy>, std::greater<>> busy;
    std::priority_queue<int, std::vector<int>, std::greater<>> freeLanes;
    std::vector<int> lanes;
    lanes.reserve(gathers.size());
    int count = 0;
    for (const Gather &g : gathers) {
        while (!busy.empty() && busy.top().first <= g.ts) {
            freeLanes.push(busy.top().second);
            busy.pop();
        }
        int lane = count;
        if (freeLanes.empty()) {
            ++count;
        } else {
            lane = freeLanes.top();
            freeLanes.pop();
        }
        busy.emplace(g.end, lane);
        lanes.push_back(lane);
    }
    return {std::move(lanes), std::max(count, 1)};
}

// Metadata naming rank r's process and its fixed threads.
void rankThreads(TraceBuilder &t, int r)
{
    t.meta("process_name", r, 0, {{QStringLiteral("name"), QStringLiteral("rank %1").arg(r)}});
    t.meta("process_sort_index", r, 0, {{QStringLiteral("sort_index"), r}});
    t.meta("thread_name", r, ModulesTid, {{QStringLiteral("name"), QStringLiteral("modules")}});
    t.meta("thread_sort_index", r, ModulesTid, {{QStringLiteral("sort_index"), 0}});
    t.meta("thread_name", r, ViolationsTid,
           {{QStringLiteral("name"), QStringLiteral("violations")}});
    t.meta("thread_sort_index", r, ViolationsTid,
           {{QStringLiteral("sort_index"), kViolationsSortIndex}});
    t.meta("thread_name", r, StepsTid, {{QStringLiteral("name"), QStringLiteral("steps")}});
    t.meta("thread_sort_index", r, StepsTid,
           {{QStringLiteral("sort_index"), kViolationsSortIndex + 1}});
}

void gatherThreads(TraceBuilder &t, int r, int lanes)
{
    for (int k = 0; k < lanes; ++k) {
        t.meta("thread_name", r, FirstGatherTid + k,
               {{QStringLiteral("name"), QStringLiteral("gathers %1").arg(k)}});
        t.meta("thread_sort_index", r, FirstGatherTid + k, {{QStringLiteral("sort_index"), 1 + k}});
    }
}

QJsonObject violationArgs(const SessionStore &store, ModuleId accessor, ParamId param,
                          ModuleId owner)
{
    return {{QStringLiteral("accessor"), store.modulePath(accessor)},
            {QStringLiteral("param"), param == kNoParam ? QString() : store.paramName(param)},
            {QStringLiteral("owner"), store.modulePath(owner)}};
}

// One rank's events: module spans, step spans, broadcasts and violations as they come, then
// its gathers on the fewest "gathers k" threads. Marks the groups its violations belong to.
void mapLane(TraceBuilder &t, const SessionStore &store, int r, std::vector<bool> &groupHasEvent)
{
    const EventLane &lane = store.lane(r);
    std::vector<std::pair<std::uint32_t, telemetry::Event>> moduleStack;
    std::unordered_map<std::uint32_t, OpenFetch> fetches;
    std::vector<Gather> gathers;
    telemetry::Event stepBegin{}; // valid while inStep (a plain value: GCC's -Wmaybe-uninitialized
    bool inStep = false; // misfires on std::optional<Event> here)
    for (std::size_t i = 0; i < lane.size(); ++i) {
        const telemetry::Event ev = lane.at(i);
        switch (ev.type) {
        case EventType::ModuleEnter:
            moduleStack.emplace_back(telemetry::readModule(ev).module, ev);
            break;
        case EventType::ModuleExit: {
            const ModuleId m = telemetry::readModule(ev).module;
            for (std::size_t k = moduleStack.size(); k-- > 0;) {
                if (moduleStack[k].first != m) continue;
                const telemetry::Event b = moduleStack[k].second;
                const QString phase = labels::phase(telemetry::readModule(b).phase);
                t.span(
                    store.modulePath(m), QStringLiteral("module,") + phase, r, ModulesTid, b.tsNs,
                    ev.tsNs,
                    {{QStringLiteral("step"), qint64(b.step)}, {QStringLiteral("phase"), phase}});
                moduleStack.resize(k);
                break;
            }
            break;
        }
        case EventType::FetchBegin: {
            const telemetry::FetchFields f = telemetry::readFetch(ev);
            fetches[f.param] = OpenFetch{ev.tsNs, f.cause, f.reason};
            break;
        }
        case EventType::FetchEnd: {
            const telemetry::FetchFields e = telemetry::readFetch(ev);
            auto it = fetches.find(e.param);
            const OpenFetch f =
                it != fetches.end() ? it->second : OpenFetch{ev.tsNs, e.cause, e.reason};
            if (it != fetches.end()) fetches.erase(it);
            const std::uint64_t begin = std::min(f.ts, ev.tsNs);
            gathers.push_back(Gather{t.us(begin), t.us(begin) + t.dur(begin, ev.tsNs), e.param,
                                     f.module, f.reason, e.bytes, ev.step});
            break;
        }
        case EventType::Broadcast: {
            const telemetry::BroadcastFields f = telemetry::readBroadcast(ev);
            t.instant(QStringLiteral("broadcast %1").arg(store.paramName(f.param)),
                      QStringLiteral("gather,broadcast"), r, FirstGatherTid, ev.tsNs,
                      {{QStringLiteral("root"), qint64(f.root)},
                       {QStringLiteral("bytes"), qint64(f.bytes)}});
            break;
        }
        case EventType::StepBegin:
            stepBegin = ev;
            inStep = true;
            break;
        case EventType::StepEnd:
            if (inStep) {
                t.span(QStringLiteral("step %1").arg(stepBegin.step), QStringLiteral("step"), r,
                       StepsTid, stepBegin.tsNs, ev.tsNs,
                       {{QStringLiteral("loss"), telemetry::readStepEnd(ev)},
                        {QStringLiteral("step"), qint64(stepBegin.step)}});
                inStep = false;
            }
            break;
        case EventType::UnregisteredAccess:
        case EventType::LateParameter:
        case EventType::TraceInvalidated:
        case EventType::GatheredWriteError: {
            const std::optional<ViolationEvent> v = store.violationOf(ev);
            if (!v) break;
            QString fix;
            if (const ViolationGroup *g = store.violationGroup(*v)) {
                groupHasEvent[static_cast<std::size_t>(g - store.violationGroups().data())] = true;
                fix = QString::fromStdString(g->fix);
            }
            QJsonObject args = violationArgs(store, v->accessor, v->param, v->owner);
            args.insert(QStringLiteral("step"), qint64(ev.step));
            args.insert(QStringLiteral("fix"), fix);
            t.instant(labels::kind(v->kind), QStringLiteral("violation"), r, ViolationsTid, ev.tsNs,
                      args);
            break;
        }
        default:
            break;
        }
    }
    const auto [lanes, laneTotal] = assignLanes(gathers);
    gatherThreads(t, r, laneTotal);
    for (std::size_t g = 0; g < gathers.size(); ++g) {
        const Gather &x = gathers[g];
        const QString reason = labels::reason(x.reason);
        t.spanUs(store.paramName(x.param), QStringLiteral("gather,") + reason, r,
                 FirstGatherTid + lanes[g], x.ts, x.end - x.ts,
                 {{QStringLiteral("param"), store.paramName(x.param)},
                  {QStringLiteral("module"), store.modulePath(x.module)},
                  {QStringLiteral("reason"), reason},
                  {QStringLiteral("bytes"), qint64(x.bytes)},
                  {QStringLiteral("step"), qint64(x.step)}});
    }
}

// Violations known only from the state (their events are older than the history).
void mapStateViolations(TraceBuilder &t, const SessionStore &store,
                        const std::vector<bool> &groupHasEvent)
{
    const auto &groups = store.violationGroups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
        if (groupHasEvent[g]) continue;
        const ViolationGroup &v = groups[g];
        QJsonObject args = violationArgs(store, v.accessor, v.param, v.owner);
        args.insert(QStringLiteral("step"), qint64(v.firstStep));
        args.insert(QStringLiteral("count"), qint64(v.count));
        args.insert(QStringLiteral("fix"), QString::fromStdString(v.fix));
        t.instant(labels::kind(v.kind), QStringLiteral("violation"), v.firstRank, ViolationsTid,
                  std::max(v.firstTsNs, store.timeOrigin()), args);
    }
}

} // namespace

QByteArray chromeTrace(const SessionStore &store)
{
    TraceBuilder t(store.timeOrigin());
    const int ranks = std::max(store.laneCount(), store.worldSize());
    for (int r = 0; r < ranks; ++r)
        rankThreads(t, r);
    for (int r = store.laneCount(); r < ranks; ++r)
        gatherThreads(t, r, 1);
    std::vector<bool> groupHasEvent(store.violationGroups().size(), false);
    for (int r = 0; r < store.laneCount(); ++r)
        mapLane(t, store, r, groupHasEvent);
    mapStateViolations(t, store, groupHasEvent);

    const core::EngineState &st = store.state();
    return t.document(
        {{QStringLiteral("distributedInfo"),
          QJsonObject{{QStringLiteral("backend"), QString::fromStdString(st.backend)},
                      {QStringLiteral("world_size"), st.worldSize},
                      {QStringLiteral("rank"), st.localRanks.empty() ? 0 : st.localRanks.front()},
                      {QStringLiteral("local_ranks"), qint64(st.localRanks.size())},
                      {QStringLiteral("model"), QString::fromStdString(st.modelName)}}},
         {QStringLiteral("otherData"),
          QJsonObject{{QStringLiteral("producer"), QStringLiteral("shardscope")},
                      {QStringLiteral("step"), qint64(store.step())},
                      {QStringLiteral("dropped_events"), qint64(store.droppedEvents())}}}});
}

} // namespace shardscope::session

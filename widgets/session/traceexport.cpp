#include "session/traceexport.h"

#include <QJsonObject>

#include <algorithm>
#include <optional>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "session/labels.h"
#include "session/tracebuilder.h"
#include "telemetry/eventfields.h"

namespace shardscope::session {

namespace {

// Gathers of one rank overlap each other and module compute: prefetches are issued
// ahead and complete while later modules run. "X" spans on one thread must nest, so
// each gather goes onto the lowest free of its rank's "gathers k" threads rather than
// becoming an async "b"/"e" pair: X spans on threads are drawn alike by Chrome (DevTools'
// Performance panel) and Perfetto (each groups async slices into tracks its own way), keep
// the integer ts/dur of every other span, and the number of gather threads is the rank's
// peak number of gathers in flight, as the timeline's sub-rows show.
//
// A rank's threads, as offsets from its pid (TraceIds): the modules thread is the pid.
enum ThreadOffset
{
    ModulesThread = 0,
    ViolationsThread = 1,
    StepsThread = 2,
    FirstGatherThread = 3
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

// A module's span, in microseconds as written.
struct ModuleSpan
{
    qint64 ts = 0;
    qint64 dur = 0;
    ModuleId module = kNoModule;
    telemetry::Event begin{};
    std::size_t order = 0; // its enter's place in the lane: a parent's comes first
};

// One rank's gathers in start order, each with its "gathers k" thread, and how many such
// threads the rank needs (at least 1: broadcasts go onto "gathers 0").
struct RankGathers
{
    std::vector<Gather> gathers;
    std::vector<int> lanes;
    int laneCount = 1;
};

RankGathers gathersOf(const TraceBuilder &t, const EventLane &lane)
{
    RankGathers out;
    std::unordered_map<std::uint32_t, OpenFetch> fetches;
    for (std::size_t i = 0; i < lane.size(); ++i) {
        const telemetry::Event ev = lane.at(i);
        if (ev.type == EventType::FetchBegin) {
            const telemetry::FetchFields f = telemetry::readFetch(ev);
            fetches[f.param] = OpenFetch{ev.tsNs, f.cause, f.reason};
        } else if (ev.type == EventType::FetchEnd) {
            const telemetry::FetchFields e = telemetry::readFetch(ev);
            auto it = fetches.find(e.param);
            const OpenFetch f =
                it != fetches.end() ? it->second : OpenFetch{ev.tsNs, e.cause, e.reason};
            if (it != fetches.end()) fetches.erase(it);
            const std::uint64_t begin = std::min(f.ts, ev.tsNs);
            out.gathers.push_back(Gather{t.us(begin), t.us(begin) + t.dur(begin, ev.tsNs), e.param,
                                         f.module, f.reason, e.bytes, ev.step});
        }
    }
    std::tie(out.lanes, out.laneCount) = assignLanes(out.gathers);
    return out;
}

// Metadata naming rank r's process and its threads.
void rankThreads(TraceBuilder &t, const TraceIds &ids, int r, int gatherLanes)
{
    const int pid = ids.pid(r);
    const auto thread = [&](int offset, const QString &name, int sortIndex) {
        t.meta("thread_name", pid, ids.tid(r, offset), {{QStringLiteral("name"), name}});
        t.meta("thread_sort_index", pid, ids.tid(r, offset),
               {{QStringLiteral("sort_index"), sortIndex}});
    };
    t.meta("process_name", pid, pid, {{QStringLiteral("name"), QStringLiteral("rank %1").arg(r)}});
    t.meta("process_sort_index", pid, pid, {{QStringLiteral("sort_index"), r}});
    thread(ModulesThread, QStringLiteral("modules"), 0);
    for (int k = 0; k < gatherLanes; ++k)
        thread(FirstGatherThread + k, QStringLiteral("gathers %1").arg(k), 1 + k);
    thread(ViolationsThread, QStringLiteral("violations"), kViolationsSortIndex);
    thread(StepsThread, QStringLiteral("steps"), kViolationsSortIndex + 1);
}

QJsonObject violationArgs(const SessionStore &store, ModuleId accessor, ParamId param,
                          ModuleId owner)
{
    return {{QStringLiteral("accessor"), store.modulePath(accessor)},
            {QStringLiteral("param"), param == kNoParam ? QString() : store.paramName(param)},
            {QStringLiteral("owner"), store.modulePath(owner)}};
}

// One rank's events: step spans, broadcasts and violations as they come, then its module
// spans in start order and its gathers on their "gathers k" threads. Marks the groups its
// violations belong to.
void mapLane(TraceBuilder &t, const TraceIds &ids, const SessionStore &store, int r,
             const RankGathers &g, std::vector<bool> &groupHasEvent)
{
    const EventLane &lane = store.lane(r);
    const int pid = ids.pid(r);
    struct Open
    {
        std::uint32_t module;
        telemetry::Event enter;
        std::size_t order; // the enter's place in the lane
    };
    std::vector<Open> moduleStack;
    std::vector<ModuleSpan> modules; // in exit order: children before their parents
    telemetry::Event stepBegin{}; // valid while inStep (a plain value: GCC's -Wmaybe-uninitialized
    bool inStep = false;          // misfires on std::optional<Event> here)
    for (std::size_t i = 0; i < lane.size(); ++i) {
        const telemetry::Event ev = lane.at(i);
        switch (ev.type) {
        case EventType::ModuleEnter:
            moduleStack.push_back(Open{telemetry::readModule(ev).module, ev, i});
            break;
        case EventType::ModuleExit: {
            const ModuleId m = telemetry::readModule(ev).module;
            for (std::size_t k = moduleStack.size(); k-- > 0;) {
                if (moduleStack[k].module != m) continue;
                const Open &b = moduleStack[k];
                modules.push_back(ModuleSpan{t.us(b.enter.tsNs), t.dur(b.enter.tsNs, ev.tsNs), m,
                                             b.enter, b.order});
                moduleStack.resize(k);
                break;
            }
            break;
        }
        case EventType::Broadcast: {
            const telemetry::BroadcastFields f = telemetry::readBroadcast(ev);
            t.instant(QStringLiteral("broadcast %1").arg(store.paramName(f.param)),
                      QStringLiteral("gather,broadcast"), pid, ids.tid(r, FirstGatherThread),
                      ev.tsNs,
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
                t.span(QStringLiteral("step %1").arg(stepBegin.step), QStringLiteral("step"), pid,
                       ids.tid(r, StepsThread), stepBegin.tsNs, ev.tsNs,
                       {{QStringLiteral("loss"), telemetry::readStepEnd(ev)},
                        {QStringLiteral("step"), qint64(stepBegin.step)}});
                inStep = false;
            }
            break;
        case EventType::UnregisteredAccess:
        case EventType::LateParameter:
        case EventType::TraceInvalidated:
        case EventType::GatheredWriteError: {
            const std::optional<state::ViolationRecord> v = store.violationOf(ev);
            if (!v) break;
            QString fix, location;
            if (const state::ViolationRow *vg = store.violationGroup(*v)) {
                groupHasEvent[static_cast<std::size_t>(vg - store.violationGroups().data())] = true;
                fix = QString::fromStdString(vg->fix);
                location = QString::fromStdString(vg->location.fileLine());
            }
            QJsonObject args = violationArgs(store, v->accessor, v->param, v->owner);
            args.insert(QStringLiteral("step"), qint64(ev.step));
            args.insert(QStringLiteral("fix"), fix);
            if (!location.isEmpty()) args.insert(QStringLiteral("location"), location);
            t.instant(labels::kind(v->kind), QStringLiteral("violation"), pid,
                      ids.tid(r, ViolationsThread), ev.tsNs, args);
            break;
        }
        default:
            break;
        }
    }
    // Parents before the children that start in the same microsecond (rounding makes that
    // common: a container and its first child are entered nanoseconds apart), the longer
    // first and, as long, the one entered first. Perfetto versions whose sorter breaks
    // timestamp ties by file order drop a span that starts inside an open one and ends
    // after it (slice_tracker.cc, "slice_drop_overlapping_complete_event"), so exit order
    // would lose those parents there, and nest spans of one length child over parent.
    std::sort(modules.begin(), modules.end(), [](const ModuleSpan &a, const ModuleSpan &b) {
        if (a.ts != b.ts) return a.ts < b.ts;
        if (a.dur != b.dur) return a.dur > b.dur;
        return a.order < b.order;
    });
    for (const ModuleSpan &x : modules) {
        const QString phase = labels::phase(telemetry::readModule(x.begin).phase);
        t.spanUs(
            store.modulePath(x.module), QStringLiteral("module,") + phase, pid,
            ids.tid(r, ModulesThread), x.ts, x.dur,
            {{QStringLiteral("step"), qint64(x.begin.step)}, {QStringLiteral("phase"), phase}});
    }
    for (std::size_t k = 0; k < g.gathers.size(); ++k) {
        const Gather &x = g.gathers[k];
        const QString reason = labels::reason(x.reason);
        t.spanUs(store.paramName(x.param), QStringLiteral("gather,") + reason, pid,
                 ids.tid(r, FirstGatherThread + g.lanes[k]), x.ts, x.end - x.ts,
                 {{QStringLiteral("param"), store.paramName(x.param)},
                  {QStringLiteral("module"), store.modulePath(x.module)},
                  {QStringLiteral("reason"), reason},
                  {QStringLiteral("bytes"), qint64(x.bytes)},
                  {QStringLiteral("step"), qint64(x.step)}});
    }
}

// Violations known only from the state (their events are older than the history).
void mapStateViolations(TraceBuilder &t, const TraceIds &ids, const SessionStore &store, int ranks,
                        const std::vector<bool> &groupHasEvent)
{
    const auto &groups = store.violationGroups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
        if (groupHasEvent[g]) continue;
        const state::ViolationRow &v = groups[g];
        const int r = std::clamp(v.firstRank, 0, ranks - 1);
        QJsonObject args = violationArgs(store, v.accessor, v.param, v.owner);
        args.insert(QStringLiteral("step"), qint64(v.firstStep));
        args.insert(QStringLiteral("count"), qint64(v.count));
        args.insert(QStringLiteral("fix"), QString::fromStdString(v.fix));
        if (v.location.known())
            args.insert(QStringLiteral("location"), QString::fromStdString(v.location.fileLine()));
        t.instant(labels::kind(v.kind), QStringLiteral("violation"), ids.pid(r),
                  ids.tid(r, ViolationsThread), std::max(v.firstTsNs, store.timeOrigin()), args);
    }
}

} // namespace

QByteArray chromeTrace(const SessionStore &store)
{
    TraceBuilder t(store.timeOrigin());
    const int ranks = std::max({store.laneCount(), store.worldSize(), 1});
    std::vector<RankGathers> gathers(static_cast<std::size_t>(store.laneCount()));
    std::vector<int> threads(static_cast<std::size_t>(ranks), FirstGatherThread + 1);
    for (int r = 0; r < store.laneCount(); ++r) {
        gathers[static_cast<std::size_t>(r)] = gathersOf(t, store.lane(r));
        threads[static_cast<std::size_t>(r)] =
            FirstGatherThread + gathers[static_cast<std::size_t>(r)].laneCount;
    }
    const TraceIds ids(threads);
    for (int r = 0; r < ranks; ++r)
        rankThreads(t, ids, r, threads[static_cast<std::size_t>(r)] - FirstGatherThread);
    std::vector<bool> groupHasEvent(store.violationGroups().size(), false);
    for (int r = 0; r < store.laneCount(); ++r)
        mapLane(t, ids, store, r, gathers[static_cast<std::size_t>(r)], groupHasEvent);
    mapStateViolations(t, ids, store, ranks, groupHasEvent);

    const state::EngineState &st = store.state();
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

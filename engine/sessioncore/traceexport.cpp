#include "sessioncore/traceexport.h"

#include <algorithm>
#include <map>
#include <optional>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/names.h"
#include "sessioncore/tracebuilder.h"
#include "telemetry/eventfields.h"
#include "wire/atomicfile.h"
#include "wire/compress.h"

namespace shardscope::sessioncore {

using nlohmann::json;

namespace {

// Gathers of one rank overlap each other and module compute: prefetches are issued
// ahead and complete while later modules run. "X" spans on one thread must nest, so
// each gather goes onto the lowest free of its rank's "gathers k" threads rather than
// becoming an async "b"/"e" pair: X spans on threads are drawn alike by Chrome (DevTools'
// Performance panel) and Perfetto (each groups async slices into tracks its own way), keep
// the integer ts/dur of every other span, and the number of gather threads is the rank's
// peak number of gathers in flight, as the timeline's sub-rows show.
//
// Gradient reduce-scatters go the same way onto "reduce-scatters k" threads after the
// gathers, so all-gathers and reduce-scatters never share a thread.
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
    std::int64_t ts = 0; // microseconds, as written
    std::int64_t end = 0;
    ParamId param = kNoParam;
    ModuleId module = kNoModule;
    FetchReason reason = FetchReason::Forward;
    std::uint64_t bytes = 0;
    std::uint32_t step = 0;
};

// Lowest free lane per gather, in start order: a lane is free again once its last gather
// has ended (touching spans do not overlap). Returns each gather's lane and the lane count.
// (Gathers and reduce-scatters alike: anything with ts and end.)
template <typename Span> std::pair<std::vector<int>, int> assignLanes(std::vector<Span> &gathers)
{
    std::stable_sort(gathers.begin(), gathers.end(),
                     [](const Span &a, const Span &b) { return a.ts < b.ts; });
    using Busy = std::pair<std::int64_t, int>; // end, lane
    std::priority_queue<Busy, std::vector<Busy>, std::greater<>> busy;
    std::priority_queue<int, std::vector<int>, std::greater<>> freeLanes;
    std::vector<int> lanes;
    lanes.reserve(gathers.size());
    int count = 0;
    for (const Span &g : gathers) {
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
    std::int64_t ts = 0;
    std::int64_t dur = 0;
    ModuleId module = kNoModule;
    telemetry::Event begin{};
    std::size_t order = 0; // its enter's place in the lane: a parent's comes first
};

// A gradient reduce-scatter, in microseconds as written (Gather's fields: param may be none).
struct Reduce
{
    std::int64_t ts = 0;
    std::int64_t end = 0;
    ModuleId module = kNoModule;
    ParamId param = kNoParam;
    std::uint64_t bytes = 0;
    std::uint32_t params = 0;
    std::uint32_t step = 0;
};

// One rank's gathers in start order, each with its "gathers k" thread, and how many such
// threads the rank needs (at least 1: broadcasts go onto "gathers 0"); its reduce-scatters
// likewise on "reduce-scatters k" (none when it has none).
struct RankGathers
{
    std::vector<Gather> gathers;
    std::vector<int> lanes;
    int laneCount = 1;
    std::vector<Reduce> reduces;
    std::vector<int> reduceLanes;
    int reduceLaneCount = 0;
};

RankGathers gathersOf(const TraceBuilder &t, const EventLane &lane)
{
    RankGathers out;
    std::unordered_map<std::uint32_t, OpenFetch> fetches;
    std::map<std::pair<ModuleId, ParamId>, std::uint64_t> reduces; // begun: (module, param)
    for (std::size_t i = 0; i < lane.size(); ++i) {
        const telemetry::Event ev = lane.at(i);
        if (ev.type == EventType::ReduceScatterBegin) {
            const telemetry::ReduceScatterFields f = telemetry::readReduceScatter(ev);
            reduces[{f.module, f.param}] = ev.tsNs;
        } else if (ev.type == EventType::ReduceScatterEnd) {
            const telemetry::ReduceScatterFields f = telemetry::readReduceScatter(ev);
            std::uint64_t begin = ev.tsNs;
            if (auto it = reduces.find({f.module, f.param}); it != reduces.end()) {
                begin = std::min(it->second, ev.tsNs);
                reduces.erase(it);
            }
            out.reduces.push_back(Reduce{t.us(begin), t.us(begin) + t.dur(begin, ev.tsNs), f.module,
                                         f.param, f.bytes, f.params, ev.step});
        } else if (ev.type == EventType::FetchBegin) {
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
    if (!out.reduces.empty())
        std::tie(out.reduceLanes, out.reduceLaneCount) = assignLanes(out.reduces);
    return out;
}

// Metadata naming rank r's process and its threads.
void rankThreads(TraceBuilder &t, const TraceIds &ids, int r, int gatherLanes, int reduceLanes)
{
    const int pid = ids.pid(r);
    const auto thread = [&](int offset, const std::string &name, int sortIndex) {
        t.meta("thread_name", pid, ids.tid(r, offset), {{"name", name}});
        t.meta("thread_sort_index", pid, ids.tid(r, offset), {{"sort_index", sortIndex}});
    };
    t.meta("process_name", pid, pid, {{"name", "rank " + std::to_string(r)}});
    t.meta("process_sort_index", pid, pid, {{"sort_index", r}});
    thread(ModulesThread, "modules", 0);
    for (int k = 0; k < gatherLanes; ++k)
        thread(FirstGatherThread + k, "gathers " + std::to_string(k), 1 + k);
    for (int k = 0; k < reduceLanes; ++k)
        thread(FirstGatherThread + gatherLanes + k, "reduce-scatters " + std::to_string(k),
               1 + gatherLanes + k);
    thread(ViolationsThread, "violations", kViolationsSortIndex);
    thread(StepsThread, "steps", kViolationsSortIndex + 1);
}

json violationArgs(const Store &store, ModuleId accessor, ParamId param, ModuleId owner)
{
    return {{"accessor", store.modulePath(accessor)},
            {"param", param == kNoParam ? std::string() : store.paramName(param)},
            {"owner", store.modulePath(owner)}};
}

std::string name(std::string_view n)
{
    return std::string(n);
}

// One rank's events: step spans, broadcasts and violations as they come, then its module
// spans in start order and its gathers on their "gathers k" threads. Marks the groups its
// violations belong to.
void mapLane(TraceBuilder &t, const TraceIds &ids, const Store &store, int r, const RankGathers &g,
             std::vector<bool> &groupHasEvent)
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
            t.instant("broadcast " + store.paramName(f.param), "gather,broadcast", pid,
                      ids.tid(r, FirstGatherThread), ev.tsNs,
                      {{"root", std::int64_t(f.root)}, {"bytes", std::int64_t(f.bytes)}});
            break;
        }
        case EventType::AllocatorSample: {
            const telemetry::AllocatorFields f = telemetry::readAllocator(ev);
            t.counter("CUDA allocator", pid, ev.tsNs,
                      {{"allocated", std::int64_t(f.allocatedBytes)},
                       {"reserved", std::int64_t(f.reservedBytes)},
                       {"peak allocated", std::int64_t(f.peakAllocatedBytes)}});
            break;
        }
        case EventType::StepBegin:
            stepBegin = ev;
            inStep = true;
            break;
        case EventType::StepEnd:
            if (inStep) {
                t.span("step " + std::to_string(stepBegin.step), "step", pid,
                       ids.tid(r, StepsThread), stepBegin.tsNs, ev.tsNs,
                       {{"loss", TraceBuilder::number(telemetry::readStepEnd(ev))},
                        {"step", std::int64_t(stepBegin.step)}});
                inStep = false;
            }
            break;
        case EventType::UnregisteredAccess:
        case EventType::LateParameter:
        case EventType::TraceInvalidated:
        case EventType::GatheredWriteError: {
            const std::optional<state::ViolationRecord> v = store.violationOf(ev);
            if (!v) break;
            std::string fix, location;
            if (const state::ViolationRow *vg = store.violationGroup(*v)) {
                groupHasEvent[static_cast<std::size_t>(vg - store.violationGroups().data())] = true;
                fix = vg->fix;
                location = vg->location.fileLine();
            }
            json args = violationArgs(store, v->accessor, v->param, v->owner);
            args["step"] = std::int64_t(ev.step);
            args["fix"] = fix;
            if (!location.empty()) args["location"] = location;
            t.instant(name(violationKindName(v->kind)), "violation", pid,
                      ids.tid(r, ViolationsThread), ev.tsNs, std::move(args));
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
        const std::string phase = name(phaseName(telemetry::readModule(x.begin).phase));
        t.spanUs(store.modulePath(x.module), "module," + phase, pid, ids.tid(r, ModulesThread),
                 x.ts, x.dur, {{"step", std::int64_t(x.begin.step)}, {"phase", phase}});
    }
    for (std::size_t k = 0; k < g.gathers.size(); ++k) {
        const Gather &x = g.gathers[k];
        const std::string reason = name(fetchReasonName(x.reason));
        const std::string param = store.paramName(x.param);
        t.spanUs(param, "gather," + reason, pid, ids.tid(r, FirstGatherThread + g.lanes[k]), x.ts,
                 x.end - x.ts,
                 {{"param", param},
                  {"module", store.modulePath(x.module)},
                  {"reason", reason},
                  {"bytes", std::int64_t(x.bytes)},
                  {"step", std::int64_t(x.step)}});
    }
    for (std::size_t k = 0; k < g.reduces.size(); ++k) {
        const Reduce &x = g.reduces[k];
        const std::string module = store.modulePath(x.module);
        json args = {{"module", module},
                     {"bytes", std::int64_t(x.bytes)},
                     {"params", std::int64_t(x.params)},
                     {"step", std::int64_t(x.step)}};
        std::string spanName =
            "reduce-scatter " + (module.empty() ? std::string("(root)") : module);
        if (x.param != kNoParam) {
            args["param"] = store.paramName(x.param);
            spanName = "reduce-scatter " + store.paramName(x.param);
        }
        t.spanUs(spanName, "reduce_scatter", pid,
                 ids.tid(r, FirstGatherThread + g.laneCount + g.reduceLanes[k]), x.ts, x.end - x.ts,
                 std::move(args));
    }
}

// Violations known only from the state (their events are older than the history).
void mapStateViolations(TraceBuilder &t, const TraceIds &ids, const Store &store, int ranks,
                        const std::vector<bool> &groupHasEvent)
{
    const auto &groups = store.violationGroups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
        if (groupHasEvent[g]) continue;
        const state::ViolationRow &v = groups[g];
        const int r = std::clamp(v.firstRank, 0, ranks - 1);
        json args = violationArgs(store, v.accessor, v.param, v.owner);
        args["step"] = std::int64_t(v.firstStep);
        args["count"] = std::int64_t(v.count);
        args["fix"] = v.fix;
        if (v.location.known()) args["location"] = v.location.fileLine();
        t.instant(name(violationKindName(v.kind)), "violation", ids.pid(r),
                  ids.tid(r, ViolationsThread), std::max(v.firstTsNs, store.timeOrigin()),
                  std::move(args));
    }
}

} // namespace

std::string chromeTrace(const Store &store)
{
    TraceBuilder t(store.timeOrigin());
    const int ranks = std::max({store.laneCount(), store.worldSize(), 1});
    std::vector<RankGathers> gathers(static_cast<std::size_t>(store.laneCount()));
    std::vector<int> threads(static_cast<std::size_t>(ranks), FirstGatherThread + 1);
    for (int r = 0; r < store.laneCount(); ++r) {
        gathers[static_cast<std::size_t>(r)] = gathersOf(t, store.lane(r));
        threads[static_cast<std::size_t>(r)] = FirstGatherThread +
                                               gathers[static_cast<std::size_t>(r)].laneCount +
                                               gathers[static_cast<std::size_t>(r)].reduceLaneCount;
    }
    const TraceIds ids(threads);
    for (int r = 0; r < ranks; ++r) {
        const bool has = r < store.laneCount();
        const RankGathers *g = has ? &gathers[static_cast<std::size_t>(r)] : nullptr;
        rankThreads(t, ids, r, g ? g->laneCount : 1, g ? g->reduceLaneCount : 0);
    }
    std::vector<bool> groupHasEvent(store.violationGroups().size(), false);
    for (int r = 0; r < store.laneCount(); ++r)
        mapLane(t, ids, store, r, gathers[static_cast<std::size_t>(r)], groupHasEvent);
    mapStateViolations(t, ids, store, ranks, groupHasEvent);

    const state::EngineState &st = store.state();
    json distributed = {{"backend", st.backend},
                        {"world_size", st.worldSize},
                        {"rank", st.localRanks.empty() ? 0 : st.localRanks.front()},
                        {"local_ranks", std::int64_t(st.localRanks.size())},
                        {"model", st.modelName}};
    json other = {{"producer", "shardscope"},
                  {"step", std::int64_t(store.step())},
                  {"dropped_events", std::int64_t(store.droppedEvents())}};
    return t.document(
        {{"distributedInfo", std::move(distributed)}, {"otherData", std::move(other)}});
}

wire::Status writeTraceFile(const std::string &path, const Store &store)
{
    const std::string trace = chromeTrace(store);
    return wire::writeFileAtomically(path,
                                     wire::wantsGzip(path) ? wire::gzipCompress(trace) : trace);
}

} // namespace shardscope::sessioncore

#pragma once
// Private state of the Engine, shared by engine.cpp and gatheredparameters.cpp.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <source_location>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "core/engine.h"
#include "state/violationledger.h"
#include "telemetry/eventfields.h"

namespace shardscope::core {

struct ExternalEntry
{
    ParamId param = kNoParam;
    bool automatic = false;
};

// One parameter as held by one rank. Tensors live in the rank's MemorySpace; the status
// is RankState::status[param].
struct RankParam
{
    bool alwaysAvailable = false; // persistent, or late and not adopted: the full tensor stays
    bool inScope = false;         // inside a GatheredParameters scope on this rank
    bool prefetched = false;      // gathered ahead of use by the prefetcher
    comm::Buffer shard;           // partitionNumel elements (empty if not partitioned)
    comm::Buffer
        full; // paddedNumel elements while gathered or in flight / always if alwaysAvailable
    comm::Buffer grad; // fp32 gradient of the shard (of the whole tensor if not partitioned)
    std::vector<ModuleId> active; // modules using the gathered tensor (guarded by RankState::mu)
    // The all-gather in flight (status INFLIGHT): what issued it and when.
    comm::CommHandle gather;
    std::uint64_t gatherIssuedNs = 0;
    ModuleId gatherCause = kNoModule;
    FetchReason gatherReason = FetchReason::Forward;
    std::uint64_t gatherSeq = 0; // its place in the rank's collective sequence (CollectiveBegin)
};

// All-gathers of one parameter, summed over the local ranks (what state() reports).
struct GatherTotals
{
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::uint64_t> ns{0};
    std::atomic<std::uint64_t> lastTs{0};
};

// What one module scope fetched, so exit releases exactly that.
struct Frame
{
    ModuleId module = kNoModule;
    Phase phase = Phase::Forward;
    std::vector<std::pair<ParamId, bool>> params; // (param, counted in FastEntry::readable)
};

struct TraceEntry
{
    ModuleId module;
    Phase phase;
    bool operator==(const TraceEntry &) const = default;
};

struct RankState
{
    int rank = 0;
    comm::Communicator *comm = nullptr;
    comm::MemorySpace *mem = nullptr; // comm->memory()
    mutable std::mutex mu; // guards `active` vectors, externals and counters read by state()
    std::deque<RankParam> params;
    // ZeroParamStatus by parameter id, dense so that state() reads it in order.
    std::deque<std::atomic<ParamStatus>> status;
    std::vector<ParamId> activeParams;   // parameters whose `active` is not empty (guarded by mu)
    std::vector<Engine::FastEntry> fast; // the guard's view of params, same index
    std::vector<std::vector<ExternalEntry>> externals; // by module id
    // The modules whose externals are not empty, ascending (guarded by mu): state() reads
    // these instead of scanning every module's list on every rank (4.4 million lists at
    // 68,752 modules x 64 ranks, all under the rank locks).
    std::vector<ModuleId> externalModules;
    std::vector<Frame> frames; // the module stack; capacity is reused
    // Telemetry: the time the events of one module entry or exit share (the entry and the
    // fetches it issues; the releases of an exit and the exit itself), so a batch costs one
    // clock read; it moves forward with any clock read in the batch (a gather completing),
    // keeping a rank's timestamps in order. 0 outside a batch or with telemetry off.
    std::uint64_t batchTs = 0;
    std::size_t depth = 0;
    // The rank's collective sequence (issue 51, CollectiveBegin/End): the last seq issued on
    // the world group, the engine's only one. Every rank of a healthy job issues the same
    // collective at the same seq; the job's aligner (sessioncore) compares them.
    std::uint64_t collectiveSeq = 0;
    // Where the rank's own code is: the call site of its latest enterModule, guarded access,
    // reduceScatterGrad or GatheredParameters (the rank's thread only). A wait carries it.
    std::source_location site;
    // The collective the rank's thread is blocked in now, for the stall watchdog (Impl::watch):
    // written under waitMu when a blocking wait begins and ends, read by the watchdog every
    // quarter of the threshold (at most every 0.5 s).
    struct Waiting
    {
        bool active = false;
        std::uint64_t sinceNs = 0; // when the wait began (a synchronous collective: its issue)
        telemetry::CollectiveFields what;
        std::source_location site;
    };
    std::mutex waitMu;
    Waiting waiting;
    std::uint64_t stalledSeq = 0; // the last seq recorded as stalled (the watchdog's only)
    std::atomic<std::uint32_t> step{0};
    bool inStep = false;

    std::vector<TraceEntry> trace; // recorded module order of a whole step
    bool traceValid = false;
    bool traceBroken = false; // the current step departed from the trace
    std::size_t tracePos = 0;
    std::size_t prefetchCursor = 0;   // trace entries up to here have been prefetched
    std::int64_t prefetchedNumel = 0; // gathered ahead and not yet used by a module
    std::vector<TraceEntry> order;    // this step's order so far

    // (accessor, param, call site): the first sighting of each this step is recorded
    std::set<std::tuple<ModuleId, ParamId, const char *, std::uint32_t>> violationsThisStep;

    std::uint64_t partitionedBytes = 0;
    std::uint64_t gatheredBytesNow = 0;
    std::uint64_t peakGatheredBytes = 0;
    std::int64_t liveElements = 0;
    std::atomic<std::uint64_t> totalGatheredBytes{0};

    std::vector<ParamId> inflight; // parameters whose all-gather is in flight, in issue order

    comm::Buffer scratch;      // reduce-scatter input (padded), grown as needed
    comm::Buffer scratchShard; // reduce-scatter output
};

// Marks rs's thread as blocked in collective `what` for the stall watchdog (Impl::watch) until
// the scope ends, however the wait ends (returned, or threw on a failed collective).
class WaitingScope
{
  public:
    WaitingScope(RankState &rs, const telemetry::CollectiveFields &what, std::uint64_t sinceNs)
        : m_rs(rs)
    {
        std::lock_guard lock(rs.waitMu);
        rs.waiting = {.active = true, .sinceNs = sinceNs, .what = what, .site = rs.site};
    }
    ~WaitingScope()
    {
        std::lock_guard lock(m_rs.waitMu);
        m_rs.waiting.active = false;
    }
    WaitingScope(const WaitingScope &) = delete;
    WaitingScope &operator=(const WaitingScope &) = delete;

  private:
    RankState &m_rs;
};

struct Engine::Impl
{
    Engine *q = nullptr;
    std::vector<std::unique_ptr<comm::Communicator>> comms;
    std::vector<std::unique_ptr<RankState>> ranks; // by local index
    std::vector<int> localIndex;                   // world rank -> local index, -1 if remote
    std::atomic<telemetry::EventSink *> sink{nullptr};

    mutable std::shared_mutex structure; // modules/params added or removed
    std::deque<ModuleInfo> modules;
    std::deque<ParamInfo> params;
    std::vector<std::vector<std::byte>> pending; // full tensors before partition()
    std::vector<ParamId> lateParams;
    std::map<ParamId, std::source_location> lateSites; // where each late parameter was added
    std::deque<GatherTotals> gatherTotals;             // by parameter id
    std::vector<bool> lateReported;

    mutable std::mutex violationMutex;
    state::ViolationLedger violations;
    std::atomic<std::uint64_t> version{0};
    void touch() { version.fetch_add(1, std::memory_order_relaxed); }
    std::atomic<std::uint64_t> unregisteredCount{0};
    std::atomic<std::uint64_t> lateCount{0};

    // The stall watchdog (issue 51): a thread that wakes every quarter of the threshold (at
    // most 0.5 s) and reads each local rank's Waiting; a rank blocked in one collective for
    // longer than stallNs gets one rank_stalled record with its C++ call site, as the agents'
    // watchdogs give their Python lines. While collectives complete it reads and records nothing.
    std::uint64_t stallNs = 0;
    std::mutex watchMu;
    std::condition_variable watchCv;
    bool watchStop = false;
    std::thread watchdog;
    void watch();
    void recordStall(RankState &rs, const RankState::Waiting &w, std::uint64_t nowNs);

    RankState &rankState(int rank);
    const RankState &rankState(int rank) const;

    // Writes one event made by telemetry/eventfields.h, stamped with rs's step and rank and
    // the batch's time (RankState::batchTs), else the telemetry clock now.
    void emit(const RankState &rs, const telemetry::Event &fields);
    // The same, stamped with tsNs: an instant the engine also records elsewhere (a gather's).
    void emitAt(const RankState &rs, const telemetry::Event &fields, std::uint64_t tsNs);
    void emitMemory(RankState &rs);
    bool telemetryLive() const;

    // The full tensor of p on rs changes: keep the guard's fast view in step.
    void setFull(RankState &rs, ParamId p, comm::Buffer full)
    {
        touch();
        rs.fast[p].data = full.data();
        rs.params[p].full = std::move(full);
    }
    static void setAlwaysAvailable(RankState &rs, ParamId p, bool on)
    {
        RankParam &rp = rs.params[p];
        if (rp.alwaysAvailable != on) rs.fast[p].readable += on ? 1 : -1;
        rp.alwaysAvailable = on;
    }

    std::size_t elemSize(ParamId p) const { return dtypeSize(params[p].dtype); }
    std::uint64_t fullBytes(ParamId p) const
    {
        return static_cast<std::uint64_t>(params[p].layout.paddedNumel) * elemSize(p);
    }
    // The all-gather of p in flight or just completed, as its CollectiveBegin/End say it.
    static telemetry::CollectiveFields gatherCollective(const RankParam &rp, std::uint64_t bytes)
    {
        return {.kind = CollectiveKind::AllGather,
                .module = rp.gatherCause,
                .seq = rp.gatherSeq,
                .bytes = bytes,
                .reason = rp.gatherReason,
                .params = 1};
    }

    // Issues p's all-gather (NOT_AVAILABLE -> INFLIGHT); nothing if it is already in flight
    // or available.
    void fetch(RankState &rs, ParamId p, ModuleId cause, FetchReason reason);
    // Waits for p's gather (INFLIGHT -> AVAILABLE); nothing unless it is in flight.
    void complete(RankState &rs, ParamId p);
    // Completes every gather in flight whose collective has finished, without waiting.
    void poll(RankState &rs);
    // fetch + complete: p is AVAILABLE on return.
    void gather(RankState &rs, ParamId p, ModuleId cause, FetchReason reason)
    {
        fetch(rs, p, cause, reason);
        complete(rs, p);
    }
    // A fresh zeroed buffer in rs's memory.
    static comm::Buffer zeroed(RankState &rs, std::size_t bytes)
    {
        comm::Buffer b(*rs.mem, bytes);
        rs.mem->zero(b.data(), bytes);
        return b;
    }
    // The shard of rank rs.rank cut from p's full tensor (padded, zero tail) on rs.
    void shardFromFull(RankState &rs, ParamId p);
    // Hash of p's full tensor on rs (copied to the host first when it lives elsewhere).
    std::uint64_t hashFull(RankState &rs, ParamId p);
    void release(RankState &rs, ParamId p, ModuleId cause);
    void releaseIdle(RankState &rs);
    void prefetch(RankState &rs);
    void clearPrefetched(RankState &rs, ParamId p); // caller holds rs.mu
    void useParam(RankState &rs, ParamId p, ModuleId m, bool counted, FetchReason reason);
    TensorView view(RankState &rs, ParamId p);
    TensorView slowAccess(RankState &rs, ParamId p, std::source_location where);
    bool registeredOnStack(const RankState &rs, ParamId p) const;
    void addExternal(RankState &rs, ModuleId m, ParamId p, bool automatic);

    // Counts one sighting of a violation into the ledger, stamped now.
    void recordViolation(state::ViolationRecord v);
    std::string replacedBy(ParamId late) const;

    // GatheredParameters on one rank.
    // where: the scope's line in the caller's code (its collectives' site).
    std::vector<std::uint64_t> openScope(RankState &rs, const std::vector<ParamId> &ps,
                                         std::source_location where);
    // Returns the names modified without a modifier rank (the caller raises).
    std::vector<std::string> closeScope(RankState &rs, const std::vector<ParamId> &ps,
                                        std::optional<int> modifier,
                                        const std::vector<std::uint64_t> &hashes,
                                        std::source_location where);
};

std::uint64_t hashBytes(const std::byte *data, std::size_t n);

} // namespace shardscope::core

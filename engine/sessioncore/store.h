#pragma once
// Everything a client knows about one training run, without Qt: the decoded engine state,
// live per-rank status, violations in the one ledger, and every received event in per-rank
// sorted lanes. Ingest is cheap and silent and collects what changed (StoreChanges) until a
// consumer takes it: the inspector's SessionStore (widgets/session, its QObject adapter)
// does on a timer and emits updated(); shardscope-capture fills one from a snapshot to
// write its trace (sessioncore/traceexport.h).

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "sessioncore/collectivealigner.h"
#include "sessioncore/eventlane.h"
#include "state/state.h"
#include "state/violationledger.h"
#include "telemetry/event.h"
#include "wire/result.h"
#include "wire/snapshot.h"

namespace shardscope::sessioncore {

struct RankMemory
{
    std::uint64_t tsNs = 0;
    std::uint64_t partitionedBytes = 0;
    std::uint64_t gatheredBytes = 0;
    std::uint64_t peakGatheredBytes = 0;
    std::uint64_t liveElements = 0;
};

// What changed since the previous updated(): consumers refresh only that.
struct StoreChanges
{
    bool reset = false;          // a different run (or a cleared store): rebuild everything
    bool structure = false;      // modules, parameters or external registrations added/removed
    bool violations = false;     // groups added or counts changed
    bool summary = false;        // step, loss, dropped events, memory, source
    bool events = false;         // new events in the lanes
    std::vector<ParamId> params; // status or gather figures changed (unique)
    bool any() const
    {
        return reset || structure || violations || summary || events || !params.empty();
    }
};

class Store
{
  public:
    Store();
    Store(const Store &) = delete;
    Store &operator=(const Store &) = delete;

    // ---- ingest (UI thread)
    void clear();
    // A full state. If it describes the run already shown (same model, world size and
    // modules; a provisional model name, wire::provisionalModelName, may give way to the
    // model's once the run built it), it replaces the state and keeps the collected history;
    // otherwise the store starts over with it. Pass an rvalue: copying a 100k-parameter state
    // costs the UI thread 10-40 ms. Returns the state it replaced, so that a caller can free a
    // large one (about 10 ms) on another thread.
    state::EngineState applyState(state::EngineState state);
    // history: events that the state already reflects (the recent history a server sends
    // after the state, or a snapshot's events): stored, and used for loss and memory,
    // but not counted again. Live events also update status, gathers and violations.
    // Duplicates of stored events (a reconnect replaying history) are skipped.
    void appendEvents(std::span<const telemetry::Event> events, bool history);
    void setDroppedEvents(std::uint64_t dropped); // the engine's own total, when it reports one
    void setReadOnly(bool readOnly, const std::string &source);

    // ---- a job: one store fed by several rank processes ("sources", numbered from 0)
    // The latest state of one process of a job. The store shows the merge of every source's
    // latest state (wire::mergeJobStates: the structure of source 0's, each global rank's
    // status from the process that runs it, gathers summed, violations kept with their rank),
    // so states of different processes never replace each other, and a process that is gone
    // keeps its part. Merges are coalesced: at most one every max(100 ms, 3 x the last
    // merge's cost), on the refresh timer (mergeSources() forces one). A state that cannot
    // belong to the job (wire::checkOneJob: another world size; never the model's name) changes
    // nothing; the reason is returned.
    std::string applySourceState(int source, state::EngineState state,
                                 const std::string &name = {});
    void setSourceDropped(int source, std::uint64_t dropped); // that process's total
    void mergeSources();
    // Forgets the sources' states (a new attach); the shown state stays until replaced.
    void clearSources();
    int sourceCount() const { return static_cast<int>(m_sources.size()); }
    bool hasSourceState(int source) const;

    // ---- the job's collectives (issue 51; sessioncore/collectivealigner.h)
    // Every event the store takes is also aligned (history and live alike); the aligner's
    // collective_mismatch and rank_stalled records join violationGroups() as they are made.
    // A live store decides stalls on takeChanges() at telemetry::nowNs(), each wait measured
    // from when the store received the collective's begin on that clock, so hosts' clocks
    // never make a false stall (setCollectiveClock replaces it, nullptr: never); a snapshot
    // (loadSnapshot) is diagnosed as ended at its last event. Threshold: the environment's
    // SHARDSCOPE_STALL_SECONDS (default 5 s, 60 s for a job on NCCL), or setCollectiveOptions.
    const CollectiveAligner &collectives() const { return m_collectives; }
    // What the GUI shows: each rank's current collective, and the stragglers.
    std::vector<RankProgress> collectiveProgress() const { return m_collectives.progress(); }
    StragglerSummary stragglers() const { return m_collectives.stragglers(); }
    void setCollectiveOptions(const AlignerOptions &options);
    void setCollectiveClock(std::uint64_t (*now)());
    // Decides stalls at nowNs (takeChanges calls it with the clock when the store is live).
    void tickCollectives(std::uint64_t nowNs);
    // The rank's run ended (its process said Goodbye, or its connection was lost).
    void rankFinished(int rank, const std::string &how = {});
    // The recording ended (a snapshot's): every rank not waiting has finished.
    void finishCollectives();

    // ---- reading
    bool hasState() const { return m_hasState; }
    const state::EngineState &state() const { return m_state; }
    bool readOnly() const { return m_readOnly; }
    const std::string &source() const { return m_source; }
    int worldSize() const { return m_state.worldSize; }

    const state::ModuleRecord *module(ModuleId id) const;
    const state::ParamRecord *param(ParamId id) const;
    // Where the parameter sits in state().params, or -1: tables indexed by parameter keep
    // to the number of parameters whatever their ids are (a file may say 4294967294).
    std::int32_t paramSlot(ParamId id) const;
    std::string modulePath(ModuleId id) const; // "<none>" / "<root>" as the engine names them
    std::string paramName(ParamId id) const;
    std::span<const ModuleId> childModules(ModuleId id) const;
    std::span<const ParamId> ownedParams(ModuleId id) const;
    const std::vector<state::ExternalRecord> &
    externalsOn(ModuleId module) const; // .module holds the param id
    std::uint64_t paramViolations(ParamId id) const;
    std::uint64_t moduleViolations(ModuleId id) const; // as accessor or as owner
    // The worst severity among a parameter's violations, and a module's (as accessor or as
    // owner); nullopt: none.
    std::optional<Severity> paramSeverity(ParamId id) const;
    std::optional<Severity> moduleSeverity(ModuleId id) const;

    // The violations, a row each as the one ledger groups them (state/violationledger.h).
    const std::vector<state::ViolationRow> &violationGroups() const { return m_violations.rows(); }
    const state::ViolationLedger &violationLedger() const { return m_violations; }
    // The violation an event reports (one sighting on the event's rank and step, without
    // words), or nullopt for an event that reports none: the one decoding of violation
    // events, for live events and for the trace export. A late_parameter event announces its
    // violation (as the producer's row of that parameter records it, when the store has one)
    // but is not counted live: the producer records the violation when a step begins with
    // the parameter unadopted, and its State brings it, so the inspector and
    // shardscope-capture hold the same rows.
    std::optional<state::ViolationRecord> violationOf(const telemetry::Event &ev) const;
    // The row a violation belongs to, or null when the store has none.
    const state::ViolationRow *violationGroup(const state::ViolationRecord &v) const;
    std::vector<const state::ViolationRow *> violationsOf(ParamId id) const;

    int laneCount() const { return static_cast<int>(m_lanes.size()); }
    const EventLane &lane(int rank) const { return m_lanes[static_cast<std::size_t>(rank)]; }
    std::uint64_t totalEvents() const { return m_totalEvents; }
    std::uint64_t duplicateEvents() const { return m_duplicates; }
    std::uint64_t droppedEvents() const { return m_droppedReported + m_droppedFromEvents; }
    std::uint32_t step() const { return m_state.step; }
    // The newest step a StepEnd event reported (0 before any).
    std::uint32_t completedStep() const { return m_completedStep; }
    bool hasLoss() const { return m_hasLoss; }
    double loss() const { return m_loss; }
    const std::vector<RankMemory> &memory() const { return m_memory; }
    std::uint64_t firstTs() const;
    std::uint64_t lastTs() const;
    // Time zero of every view (telemetry clock): the earliest moment the session knows of,
    // the first stored event or the first violation of the state, whichever is earlier.
    // Fixed once known (until the store is cleared), so times do not move as old events are
    // evicted, and a late attach, whose history starts long after the violations, still
    // shows when each violation happened. 0 while nothing is known.
    std::uint64_t timeOrigin() const;

    // What changed since the previous call (merging the sources first when a coalesced
    // merge is due), and forgets it: the adapter's timer emits it as updated().
    StoreChanges takeChanges();
    // Memory bound of the event history: at most this many events over all ranks (the
    // oldest are evicted per rank, in 16384-event chunks). 0: unbounded.
    void setMaxEvents(std::size_t events);
    std::size_t maxEvents() const { return m_maxEvents; }
    std::uint64_t evictedEvents() const;

  private:
    struct Source
    {
        bool hasState = false;
        state::EngineState state;
        std::string name;
        std::uint64_t dropped = 0;
    };
    void rebuildIndex();
    void rebuildViolationCounts();
    void markParam(ParamId id);
    void applyLive(const telemetry::Event &ev);
    // A live event's violation into the ledger, with the words core's describeViolation
    // writes from the names the store knows (a State's records bring the producer's).
    void addViolation(state::ViolationRecord v);
    state::ParamRecord *mutParam(ParamId id);
    EventLane &laneFor(int rank);

    state::EngineState m_state;
    bool m_hasState = false;
    bool m_readOnly = false;
    std::string m_source;

    // param id -> index in m_state.params (-1 if absent): a table while ids are dense,
    // a hash map when they are sparse, so memory follows the number of parameters.
    std::vector<std::int32_t> m_paramIndex;
    std::unordered_map<ParamId, std::int32_t> m_sparseParamIndex;
    // Module -> its child modules, and -> the parameters it owns, as offsets into one array
    // each (module m's are [at[m], at[m + 1])): two arrays instead of a vector per module.
    std::vector<std::uint32_t> m_childModulesAt, m_ownedParamsAt;
    std::vector<ModuleId> m_childModules;
    std::vector<ParamId> m_ownedParams;
    std::vector<std::vector<state::ExternalRecord>> m_externalsOn;
    std::vector<std::uint64_t> m_paramViolations; // by paramSlot
    std::vector<std::uint64_t> m_moduleViolations;
    // The worst Severity of each, as its number; kNoSeverity: none.
    static constexpr std::uint8_t kNoSeverity = 0xFF;
    std::vector<std::uint8_t> m_paramSeverity; // by paramSlot
    std::vector<std::uint8_t> m_moduleSeverity;
    void countSeverity(const state::ViolationRow &row);

    state::ViolationLedger m_violations;
    // The names of parameters an earlier state listed and the current one does not, by id:
    // events and violations may name them (weight_norm removes `weight`).
    std::unordered_map<ParamId, std::string> m_knownParamNames;

    std::vector<EventLane> m_lanes;
    std::vector<std::vector<telemetry::Event>>
        m_late; // per lane: appendEvents' out-of-order events
    std::unordered_map<std::uint64_t, std::uint64_t> m_fetchBegin; // (rank, param) -> ts
    std::vector<RankMemory> m_memory;
    std::uint64_t m_totalEvents = 0;
    std::uint64_t m_duplicates = 0;
    std::uint64_t m_droppedFromEvents = 0;
    std::uint64_t m_droppedReported = 0;
    std::uint32_t m_completedStep = 0;
    bool m_hasLoss = false;
    double m_loss = 0.0;
    bool m_dedupe = false;
    std::size_t m_maxEvents = 8u << 20; // 8 Mi events: 384 MiB // after a state of the same run:
                                        // history may repeat stored events

    mutable std::uint64_t m_timeOrigin = 0; // latched by timeOrigin()

    StoreChanges m_pending;
    // The job's aligner, its records' revision already in the ledger, and its clock.
    CollectiveAligner m_collectives;
    AlignerOptions m_collectiveOptions;
    bool m_collectiveOptionsSet = false; // else the environment's or the backend's default
    std::uint64_t m_collectiveRevision = 0;
    std::uint64_t (*m_collectiveClock)() = nullptr;
    void syncCollectives();
    std::vector<std::uint8_t> m_paramMarked; // by paramSlot

    std::vector<Source> m_sources;
    bool m_mergePending = false;
    bool mergeDue() const;
    std::optional<std::chrono::steady_clock::time_point> m_lastMerge;
    std::int64_t m_mergeCostMs = 0;
};

// A snapshot into a store, read-only, as the inspector opens a file and as
// shardscope-capture reads what it captured: cleared, the state, the events as history,
// the dropped count. source: where it came from (the file's path).
void loadSnapshot(Store &store, wire::Snapshot snapshot, const std::string &source);
// The store's state (live statuses and counts), its violations (one record per violation
// and rank, ViolationLedger::records), all its events in time order; meta names this
// process as "shardscope" (the caller may rename it).
wire::Snapshot snapshotOf(const Store &store);

} // namespace shardscope::sessioncore

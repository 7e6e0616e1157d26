#pragma once
// The state provider of a process that does not run our Engine: a Python agent
// (python/shardscope: the DeepSpeed agent, and the FSDP2 agent with its units and groups)
// tells it the model, each status change and each violation as it observes them, and it
// keeps EngineState and emits the events the Engine would. The words of violations come
// from state/violationtext in the agent's dialect (`dialect`: DeepSpeed's or FSDP2's), as
// the Engine's come from it in its own. Thread-safe: the training thread calls the
// recording methods, the server thread reads state().

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "state/state.h"
#include "state/stateprovider.h"
#include "state/violationledger.h"
#include "state/violationtext.h"
#include "telemetry/eventfields.h"

namespace shardscope::agent {

struct AgentConfig
{
    std::string modelName = "model";
    int rank = 0;
    int worldSize = 1;
    std::string backend = "gloo";
    state::FixDialect dialect = state::FixDialect::DeepSpeed;
    state::EngineConfigRecord config;
};

// A parameter as the agent knows it: the snapshot's record (its per-rank status, gathers,
// registrations and active modules are filled by state()) and its status on this rank.
struct AgentParam
{
    state::ParamRecord record; // record.id is DeepSpeed's ds_id, or a provisional id for a late one
    ParamStatus status = ParamStatus::NotAvailable;
    // The tensor's element size: DeepSpeed's dtypes are more than record.dtype names (fp16).
    std::uint32_t elementBytes = 4;
    // ZeRO++ hpZ: the bytes of the secondary partition this rank holds of it now (0: none).
    std::uint64_t secondaryBytes = 0;
};

class AgentState final : public state::StateProvider
{
  public:
    explicit AgentState(AgentConfig config);

    // ---- structure (any time; ids are stable once given)
    // The module with this dotted path, created (with its missing ancestors) if new.
    ModuleId ensureModule(const std::string &path, const std::string &type);
    void setModuleType(ModuleId id, const std::string &type);
    // Marks module id an FSDP2 unit of the group headed by module `group` (itself, or the first
    // module of fully_shard([a, b])), with fully_shard's reshard_after_forward and the mesh's
    // dimensions ("dp=2"): ModuleRecord's unit fields.
    void setUnit(ModuleId id, ModuleId group, const std::string &reshardAfterForward,
                 const std::string &mesh);
    void setModelName(const std::string &name);
    void setConfig(const state::EngineConfigRecord &config);
    void setParam(const AgentParam &p); // adds or updates by id
    void removeParam(ParamId id);       // the name stays known to violations
    bool hasParam(ParamId id) const;
    void setActive(ParamId id, std::vector<ModuleId> modules);
    void setActive(std::vector<std::pair<ParamId, std::vector<ModuleId>>> changes); // one lock
    // Statuses as they are now, without events: what changed while observation was paused.
    void setStatuses(const std::vector<std::pair<ParamId, ParamStatus>> &statuses);
    // ZeRO++ hpZ: parameter p's secondary partition on this rank is now `bytes` (0: dropped).
    // Counted in the memory samples' held bytes, beside its primary partition; setParam keeps it.
    void setSecondary(ParamId p, std::uint64_t bytes);

    // ---- events (the training thread)
    void moduleEnter(ModuleId m, Phase phase);
    void moduleExit(ModuleId m, Phase phase);
    void fetchBegin(ParamId p, ModuleId cause, std::uint64_t bytes, FetchReason reason);
    void fetchEnd(ParamId p, ModuleId cause, std::uint64_t bytes, FetchReason reason);
    void release(ParamId p, ModuleId cause, std::uint64_t bytes);
    // A ds_status assignment seen by the agent, as events: →NOT_AVAILABLE is a release,
    // NOT_AVAILABLE→INFLIGHT a fetch_begin, →AVAILABLE from NOT_AVAILABLE both fetch events
    // (a synchronous gather), from INFLIGHT a fetch_end; anything else changes nothing.
    void statusChanged(ParamId p, ParamStatus from, ParamStatus to, ModuleId cause,
                       std::uint64_t bytes, FetchReason reason);
    void broadcast(ParamId p, int root, std::uint64_t bytes);
    void registerExternal(ModuleId m, ParamId p, bool automatic);
    void unregisterExternal(ModuleId m, ParamId p);
    // Records an unregistered access (accessor kNoModule: outside any module) once per step,
    // and returns its words; use: what a read outside modules does with it (its fix), or
    // Attribute for a read of attributes only (the record's read, its severity info).
    // where: the user's source location (one row per distinct location); building: the
    // modules under construction when it happened during the model's build, with paramCode
    // the parameter as the constructor's code names it ("self.conv.weight"). statusAtRead:
    // the parameter's status when it was read, for a read recorded after DeepSpeed gathered
    // it (the DeepSpeed agent classifies a read in forward once it knows what it touched);
    // none: its status now.
    state::ViolationText unregisteredAccess(ModuleId accessor, ParamId p, GuardAction action,
                                            state::AccessUse use = state::AccessUse::Read,
                                            const state::SourceLocation &where = {},
                                            const std::string &building = {},
                                            const std::string &paramCode = {},
                                            std::optional<ParamStatus> statusAtRead = {});
    // The model exists: modules first named while it was built (moved: old id -> id in the
    // model) are known by their final paths; the violations that named them are completed
    // with the final names, and their words (fix lines) written again from them.
    void completeBuildNames(const std::map<ModuleId, ModuleId> &moved);
    // p was created after the model was partitioned (zero.Init, fully_shard); where: the
    // user's line that registered it (the late_parameter violation's location, one row per
    // distinct location), empty when not known.
    void lateParameter(ParamId p, const state::SourceLocation &where = {});
    void parameterAdopted(ParamId p);
    state::ViolationText traceInvalidated(std::optional<ModuleId> expected, ModuleId got,
                                          Phase phase);
    // FSDP2 (shardscope.fsdp): parameter p is tied into the fully_shard groups of units `first`
    // (which holds it) and `second`, and of each unit in `more` (one record, one fix naming
    // them all). Recorded in the state (no event kind carries it).
    state::ViolationText tiedAcrossGroups(ParamId p, ModuleId first, ModuleId second,
                                          bool refusedByTorch = true,
                                          const std::vector<ModuleId> &more = {});
    // A backward that did not finish, on the root module `root`. FSDP2 (shardscope.fsdp): it
    // ended with the root unit's state still in its pre-backward (FSDP2's end-of-backward
    // callback never ran); DeepSpeed (the DeepSpeed dialect): it raised with `bucketed`
    // parameters' gradients left in ZeRO-3's reduce bucket. raised: what the backward raised
    // ("ValueError: ..."), empty if nothing; compiledAutograd: it began under compiled
    // autograd; where: the user's line. Recorded in the state (no event kind carries it).
    state::ViolationText backwardUnfinished(ModuleId root, const std::string &raised,
                                            bool compiledAutograd,
                                            const state::SourceLocation &where = {},
                                            std::size_t bucketed = 0);
    // FSDP2 (shardscope.fsdp): fully_shard was called on `child` (at `where`) after it was
    // called on `parent` (at `parentCall`), which contains it; `param`: the name of one of
    // child's parameters parent's group already shards (a name only: FSDP2 fails before any
    // parameter is published). Recorded in the state (no event kind carries it).
    state::ViolationText shardOrder(ModuleId parent, ModuleId child, const std::string &param,
                                    const state::SourceLocation &parentCall,
                                    const state::SourceLocation &where);
    // Checkpoints (partitioned_save, partitioned_load, resume_world_size; docs/deepspeed.md,
    // docs/fsdp.md): what the agent saw at the user's call; recorded in the state (no event
    // kind carries it), its words from state::describeViolation.
    struct Checkpoint
    {
        ViolationKind kind = ViolationKind::PartitionedSave;
        ModuleId root = kNoModule; // the model the call was made on
        std::string call;          // as the user wrote it: "model.state_dict()", "torch.save"
        std::string param;         // the first parameter lost or left unchanged ("" none)
        ParamId paramId = kNoParam;
        std::size_t params = 0;  // how many
        std::uint64_t bytes = 0; // their bytes
        std::string checkpoint;  // resume_world_size: the directory and tag
        int savedWorld = 0;      // resume_world_size: the checkpoint's data-parallel world
        int world = 0;           // and the run's
        // partitioned_load (DeepSpeed): the parameters were gathered, but only by
        // GatheredParameters without modifier_rank, which discards the load at its exit
        bool withoutModifier = false;
        state::SourceLocation where;
    };
    state::ViolationText checkpoint(const Checkpoint &c);
    // step: the step that begins (1-based; DeepSpeed's global_steps + 1), so that steps run
    // while observation was paused keep the numbering; 0: the previous step + 1.
    void stepBegin(std::uint32_t step = 0);
    void stepEnd(double loss);
    std::uint32_t step() const;
    // A gradient reduce-scatter of module's gradients (param: kNoParam for a whole group or
    // bucket) issued and completed: telemetry only, as the engine's reduceScatterGrad emits.
    void reduceScatterBegin(ModuleId module, ParamId param, std::uint64_t bytes,
                            std::uint32_t params);
    void reduceScatterEnd(ModuleId module, ParamId param, std::uint64_t bytes,
                          std::uint32_t params);
    // The rank's CUDA allocator figures (torch.cuda.memory_allocated, memory_reserved,
    // max_memory_allocated); the agents send them after a step's memory sample.
    void allocatorSample(std::uint64_t allocated, std::uint64_t reserved,
                         std::uint64_t peakAllocated);

    // ---- collectives (issue 51; docs/protocol.md collective_begin/end)
    // One collective this rank is issuing or waits in.
    struct InFlight
    {
        std::uint32_t group = 0;
        std::uint64_t seq = 0;
        CollectiveKind kind = CollectiveKind::AllGather;
        ModuleId module = kNoModule;
        FetchReason reason = FetchReason::Forward;
        std::uint64_t bytes = 0;
        std::uint32_t params = 0;
        std::uint64_t sinceNs = 0; // telemetry::nowNs() at its begin
    };
    // Called just before the collective is issued: the group's next seq (1, 2, ...), emitted as
    // CollectiveBegin and marked in flight. No allocation after a group's first use.
    std::uint64_t collectiveBegin(CollectiveKind kind, std::uint32_t group, ModuleId module,
                                  FetchReason reason, std::uint64_t bytes, std::uint32_t params);
    // It completed: CollectiveEnd with its begin's fields. A seq not in flight is ignored.
    void collectiveEnd(std::uint32_t group, std::uint64_t seq);
    // The collective in flight longest (a watchdog reads it twice a second; a short lock of
    // its own, not the state's), or none.
    std::optional<InFlight> oldestInFlight() const;
    // The collective (group, seq) if it is still in flight.
    std::optional<InFlight> inFlight(std::uint32_t group, std::uint64_t seq) const;
    // This rank has waited waitedSeconds in c: records its rank_stalled violation (where: the
    // user's innermost frame; stack: the frames above it, innermost first, written into the
    // location's chain when where has none) and makes it visible at once (the caller then
    // flushes the snapshot). Once per (group, seq); nothing if c is no longer in flight.
    void collectiveStalled(const InFlight &c, double waitedSeconds, state::SourceLocation where,
                           std::vector<state::SourceLocation> stack);

    // ---- StateProvider
    state::EngineState state() const override;
    std::uint64_t stateVersion() const override
    {
        return m_version.load(std::memory_order_acquire);
    }
    std::string modelName() const override;
    int worldSize() const override { return m_config.worldSize; }
    std::string backend() const override { return m_config.backend; }
    std::vector<int> localRanks() const override { return {m_config.rank}; }
    void setEventSink(telemetry::EventSink *sink) override
    {
        m_sink.store(sink, std::memory_order_release);
    }
    void setTelemetryEnabled(bool on) override { m_telemetry.store(on, std::memory_order_relaxed); }

  private:
    // Writes one event made by telemetry/eventfields.h, stamped with tsNs (0: now), the step
    // and rank. Gathers pass the instants gather_ns and last_gather_ts_ns are measured by.
    void post(const telemetry::Event &fields, std::uint64_t tsNs = 0);
    void touch() { m_version.fetch_add(1, std::memory_order_acq_rel); }
    AgentParam *findLocked(ParamId id);
    // Every change of a parameter's status or record goes through these, so that the memory
    // figures (MemorySample: held, gathered now, peak, live elements) follow it.
    void setStatusLocked(AgentParam &p, ParamStatus status);
    void countLocked(const AgentParam &p, bool add);
    telemetry::MemoryFields memoryLocked() const;
    void postMemory(); // after a module exit or a step, as the engine does, when it changed
    // A violation of this rank and step, counted once, now, in text's words; the caller fills
    // what is its kind's own (accessor, parameter, owner, status, action, location).
    state::ViolationRecord violationLocked(ViolationKind kind,
                                           const state::ViolationText &text) const;
    void recordLocked(const state::ViolationRecord &v);
    std::string paramNameLocked(ParamId id) const;

    AgentConfig m_config;
    mutable std::mutex m_mutex;
    std::vector<state::ModuleRecord> m_modules; // index == id
    std::unordered_map<std::string, ModuleId> m_moduleByPath;
    std::map<ParamId, AgentParam> m_params;
    std::unordered_map<ParamId, std::string> m_removedNames;
    std::map<ParamId, std::vector<state::ExternalRecord>> m_externals;
    std::map<ParamId, std::vector<ModuleId>> m_active;
    struct Gathers
    {
        std::uint64_t count = 0, bytes = 0, ns = 0, lastTs = 0, beganTs = 0;
    };
    std::map<ParamId, Gathers> m_gathers;
    // The status path's lookups without a tree walk: ds_ids are dense from 0 (a late
    // parameter's provisional id is 1 << 20 and up, found in the maps). Pointers into the
    // maps' nodes, which stay put.
    static constexpr ParamId kIndexed = 1u << 16;
    std::vector<AgentParam *> m_paramIndex; // null: no such parameter
    std::vector<Gathers *> m_gatherIndex;   // null: none yet
    Gathers &gathersLocked(ParamId id);
    state::ViolationLedger m_violations;
    std::set<std::tuple<int, ModuleId, ParamId, std::string, std::uint32_t>> m_thisStep;
    std::set<ParamId> m_lateUnadopted;
    std::map<ParamId, state::SourceLocation>
        m_lateSites; // where each late parameter was registered
    struct Memory
    {
        std::uint64_t held = 0, gathered = 0, peak = 0, liveElements = 0;
    };
    Memory m_memory;
    telemetry::MemoryFields m_lastMemory; // the last sample sent, and whether one was
    bool m_memoryPosted = false;
    // Set by every change of the memory figures (countLocked), taken by postMemory: a module
    // exit with nothing changed since the last sample takes no lock.
    std::atomic<bool> m_memoryChanged{true};
    std::uint32_t m_step = 0;
    bool m_inStep = false;
    // Collectives: their own lock (the watchdog's reads never wait for the state's).
    struct CollectiveGroup
    {
        std::uint64_t lastSeq = 0;
        std::vector<InFlight> inFlight; // ascending seq; its capacity is kept
    };
    mutable std::mutex m_collectiveMutex;
    std::vector<CollectiveGroup> m_collectiveGroups;             // index == group
    std::set<std::pair<std::uint32_t, std::uint64_t>> m_stalled; // said once each

    std::atomic<std::uint64_t> m_version{1};
    std::atomic<telemetry::EventSink *> m_sink{nullptr};
    std::atomic<bool> m_telemetry{true};
};

// The collective in flight of AgentState (oldestInFlight, collectiveStalled), by either name.
using InFlight = AgentState::InFlight;

} // namespace shardscope::agent

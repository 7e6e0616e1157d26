#pragma once
// The ZeRO-3 engine: owns the module tree, every parameter's partitions on the local
// ranks, the coordinator (fetch on module entry, release on exit, prefetch from the
// recorded trace), external registrations, the access guard and late parameters.
//
// Memory: each local rank's shards, gathered tensors and shard gradients live in its
// communicator's MemorySpace (host memory for the CPU backend, GPU memory for NCCL), so
// TensorView::data, shardData() and shardGrad() point into that space; toHost() copies out.
//
// Gathers are asynchronous when the communicator is (NCCL; the CPU backend behind
// makeAsyncCommunicators): a fetch issues the all-gather and the parameter is INFLIGHT;
// it becomes AVAILABLE when the engine sees the collective complete, which it checks on
// every module entry and exit, and waits for when a module uses the parameter. So the
// prefetcher's gathers for the next modules overlap the current module's compute.
//
// Threading: the model is built (addModule/addParameter/partition/register...) while
// no rank is inside a step. During training each local rank's thread calls the rank
// API with its own rank; ranks issue the same collectives in the same order, as in
// DeepSpeed, because they run the same module order. state() may be called from any
// thread at any time.

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "state/partition.h"
#include "state/shape.h"
#include "state/state.h"
#include "telemetry/event.h"

namespace shardscope::state {
struct StateColumns;
}

namespace shardscope::core {

struct EngineConfig
{
    int worldSize = 1;
    // Parameters with fewer elements are never partitioned (stage3_param_persistence_threshold).
    std::int64_t persistenceThreshold = 100000;
    // Elements prefetched ahead of the current module (stage3_prefetch_bucket_size).
    std::int64_t prefetchBucketSize = 50000000;
    // Gathered elements beyond which prefetch stops (stage3_max_live_parameters).
    std::int64_t maxLiveParameters = 1000000000;
    GuardPolicy guard = GuardPolicy::Warn;
    std::string modelName = "model";
    // How long a rank may wait in one collective before its stall watchdog records a
    // rank_stalled with its call site (issue 51). 0: SHARDSCOPE_STALL_SECONDS, else the
    // backend's default (state/stallthreshold.h); a bad variable is an EngineError naming it.
    std::uint64_t stallNs = 0;
};

// A user-visible misuse of the engine: an illegal status transition, a nested
// GatheredParameters, unregistering what is not registered... The message says what
// happened and what to do.
class EngineError : public std::logic_error
{
  public:
    using std::logic_error::logic_error;
};

// Thrown by the access guard under the `error` policy. what() names both modules and
// contains the exact fix, e.g. "register_external_parameter(lm_head, embed.weight)".
class UnregisteredAccessError : public EngineError
{
  public:
    UnregisteredAccessError(const std::string &msg, std::string fix)
        : EngineError(msg), m_fix(std::move(fix))
    {
    }
    const std::string &fix() const { return m_fix; }

  private:
    std::string m_fix;
};

struct ModuleInfo
{
    ModuleId id = 0;
    ModuleId parent = kNoModule;
    std::string name; // local name ("fc1")
    std::string path; // dotted path ("blocks.0.fc1"); "" for the root
    std::string type; // "Linear"
    std::vector<ModuleId> children;
    std::vector<ParamId> params; // owned parameters (not externals)
};

struct ParamInfo
{
    ParamId id = 0;
    ModuleId owner = kNoModule;
    std::string localName; // "weight"
    std::string name;      // "blocks.0.fc1.weight"
    Shape shape;
    DType dtype = DType::F32;
    std::int64_t numel = 0;
    state::PartitionLayout layout;
    bool persistent = false;
    bool late = false;
    bool partitioned = false;
    bool removed = false;
};

// A parameter's full tensor as seen by one rank, in that rank's MemorySpace.
struct TensorView
{
    std::byte *data = nullptr;
    std::int64_t numel = 0;
    DType dtype = DType::F32;
    float *f32() const { return reinterpret_cast<float *>(data); }
};

class Engine
{
  public:
    // comms: one communicator per local rank (all of the world for the CPU backend).
    Engine(EngineConfig config, std::vector<std::unique_ptr<comm::Communicator>> comms);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    const EngineConfig &config() const { return m_config; }
    int worldSize() const { return m_config.worldSize; }
    comm::Backend backend() const;
    const std::vector<int> &localRanks() const { return m_localRanks; }
    comm::Communicator &comm(int rank);
    // Where rank's tensors live (its communicator's memory).
    comm::MemorySpace &memory(int rank);
    // A host copy of v's numel elements (v from access() or GatheredParameters on rank).
    std::vector<std::byte> toHost(int rank, TensorView v);
    // Runs fn(rank) on one thread per local rank (bound with Communicator::bindThread) and
    // joins them; rethrows the first exception. When one rank throws, every local
    // communicator is aborted (Communicator::abort) so that ranks waiting in a collective
    // the failed rank will never join are released. This is how model-building code
    // issues collectives in a threads world, and how the trainers run their ranks.
    void forEachLocalRank(const std::function<void(int rank)> &fn);

    // Telemetry: events go to sink (nullptr: none). Switching off costs one branch.
    void setEventSink(telemetry::EventSink *sink);
    telemetry::EventSink *eventSink() const; // the sink set last (nullptr: none)
    void setTelemetryEnabled(bool on) { m_telemetryOn.store(on, std::memory_order_relaxed); }
    bool telemetryEnabled() const { return m_telemetryOn.load(std::memory_order_relaxed); }

    // ---- model structure
    ModuleId root() const { return 0; }
    ModuleId addModule(ModuleId parent, std::string_view name, std::string_view type);
    // init: numel * dtypeSize bytes of the full tensor (identical on every rank), or nullptr for
    // zeros. After partition() the parameter is late: recorded, kept whole on every rank, until
    // adopted; its late_parameter violations carry the caller's source location.
    ParamId addParameter(ModuleId owner, std::string_view name, Shape shape, DType dtype,
                         const void *init,
                         std::source_location where = std::source_location::current());
    // Removes a parameter from its module (weight_norm removing `weight`).
    void removeParameter(ParamId param);
    // zero.Init: partitions every parameter; parameters added afterwards are late.
    void partition();
    bool isPartitioned() const { return m_partitioned; }
    // Partitions a late parameter (the stories' workaround), so it is gathered like any other.
    void adoptParameter(ParamId param);
    // A read from model-building code, outside any rank's module scope (e.g. a weight_norm
    // applied after partitioning). A partitioned parameter read this way is an unregistered
    // access with accessor none on every local rank: under `warn`/`auto` it is gathered on
    // every local rank and a copy of the full tensor is returned; under `error` it throws.
    std::vector<std::byte> hostRead(ParamId param);

    std::size_t moduleCount() const;
    std::size_t paramCount() const; // including removed ids
    const ModuleInfo &module(ModuleId id) const;
    const ParamInfo &param(ParamId id) const;
    ModuleId findModule(std::string_view path) const; // kNoModule if absent
    ParamId findParam(std::string_view name) const;   // kNoParam if absent
    std::string modulePath(ModuleId id) const; // "<none>" for kNoModule, "<root>" for the root

    // ---- external parameters (deepspeed.zero.register_external_parameter)
    // Manual registration applies to every local rank. Call while building the model.
    void registerExternalParameter(ModuleId module, ParamId param);
    void unregisterExternalParameter(ModuleId module, ParamId param);
    bool isExternal(int rank, ModuleId module, ParamId param) const;

    // ---- rank API: called by the rank's own thread
    void beginStep(int rank);            // steps count from 1
    void endStep(int rank, double loss); // releases what is still gathered, samples memory
    std::uint32_t step(int rank) const;
    // where: the caller's line; a collective the entry waits in carries it (rank_stalled).
    void enterModule(int rank, ModuleId module, Phase phase,
                     std::source_location where = std::source_location::current());
    void exitModule(int rank, ModuleId module, Phase phase);
    // Guarded read of a parameter's full tensor (docs/architecture.md, access guard). The fast
    // path (the module on the stack owns or registered it, or it is persistent) is inline.
    // where: the caller's line, recorded with a violation (one row per distinct call site).
    TensorView access(int rank, ParamId param,
                      std::source_location where = std::source_location::current())
    {
        if (static_cast<unsigned>(rank) < m_fast.size()) [[likely]] {
            const std::vector<FastEntry> *table = m_fast[static_cast<unsigned>(rank)];
            if (table && param < table->size()) [[likely]] {
                const FastEntry &e = (*table)[param];
                if (e.readable > 0) [[likely]]
                    return TensorView{e.data, e.numel, e.dtype};
            }
        }
        return accessSlow(rank, param, where);
    }
    ParamStatus status(int rank, ParamId param) const;
    std::vector<ModuleId> activeModules(int rank, ParamId param) const;

    // Gradients and optimizer state live on the shard (fp32 parameters only), in the rank's
    // MemorySpace. fullGrad: numel floats of this rank's gradient, in that space; summed over ranks
    // into each rank's shard gradient (reduce-scatter; an all-reduce for parameters that are not
    // partitioned).
    void reduceScatterGrad(int rank, ParamId param, const float *fullGrad,
                           std::source_location where = std::source_location::current());
    // The rank's fp32 shard (whole tensor if not partitioned); a gather of it still in
    // flight is completed first, so the caller may change it.
    std::span<float> shardData(int rank, ParamId param);
    std::span<float> shardGrad(int rank, ParamId param);
    void zeroGrads(int rank);
    // After the optimizer changed the shards: refresh the full copies of persistent
    // parameters (an all-gather each), as DeepSpeed does after its step.
    void refreshPersistent(int rank);

    // ---- inspection (any thread)
    state::EngineState state() const;
    // The same state as columns, written into `out` (its memory reused): what the server
    // encodes the binary State from without building an EngineState (state/statecolumns.h).
    void stateColumns(state::StateColumns &out) const;
    // Changes whenever something state() reports may have changed (structure, registrations,
    // statuses, violations): a server compares it instead of rebuilding state() to find out.
    std::uint64_t stateVersion() const;
    std::vector<state::ViolationRecord> violations() const;
    std::uint64_t
    unregisteredAccessCount() const; // records so far: one per (accessor, param, rank, step)
    // Late parameters that a step started with while they were still not adopted (each
    // counted once); a late parameter adopted before training is not counted.
    std::uint64_t lateParameterCount() const;
    std::uint64_t
    gatheredBytes(int rank) const; // bytes received by all-gathers on this rank so far

    struct Impl;

    // What the guard's fast path needs of one parameter on one rank. readable counts the
    // reasons it may be read without the guard: module scopes that fetched it, a
    // GatheredParameters scope, and +1 while it is always whole (persistent or late).
    struct FastEntry
    {
        std::byte *data = nullptr;
        std::int64_t numel = 0;
        std::int32_t readable = 0;
        DType dtype = DType::F32;
    };

  private:
    friend class GatheredParameters;
    TensorView accessSlow(int rank, ParamId param, std::source_location where);

    std::vector<const std::vector<FastEntry> *> m_fast; // by world rank; null if not local
    EngineConfig m_config;
    std::vector<int> m_localRanks;
    bool m_partitioned = false;
    std::atomic<bool> m_telemetryOn{true};
    std::unique_ptr<Impl> d;
};

// RAII module scope: enterModule on construction, exitModule on destruction. When the
// scope ends because an exception is unwinding through it (a failed gather, a CUDA error,
// the guard's UnregisteredAccessError), an error from exitModule is dropped so that the
// original one reaches the caller instead of std::terminate.
class ModuleScope
{
  public:
    ModuleScope(Engine &engine, int rank, ModuleId module, Phase phase,
                std::source_location where = std::source_location::current())
        : m_engine(engine), m_rank(rank), m_module(module), m_phase(phase),
          m_uncaught(std::uncaught_exceptions())
    {
        m_engine.enterModule(rank, module, phase, where);
    }
    ~ModuleScope() noexcept(false)
    {
        if (std::uncaught_exceptions() > m_uncaught) {
            try {
                m_engine.exitModule(m_rank, m_module, m_phase);
            } catch (...) {
            }
            return;
        }
        m_engine.exitModule(m_rank, m_module, m_phase);
    }
    ModuleScope(const ModuleScope &) = delete;
    ModuleScope &operator=(const ModuleScope &) = delete;

  private:
    Engine &m_engine;
    int m_rank;
    ModuleId m_module;
    Phase m_phase;
    int m_uncaught;
};

// deepspeed.zero.GatheredParameters for one rank: gathers on construction. close()
// (or the destructor) ends the scope: with a modifier rank, that rank's full tensors
// are broadcast and every rank's shard rewritten; without one, an in-place change is
// an EngineError naming the parameter, and no shard changes. Every rank must open and
// close the same scopes. Nesting a scope over a parameter already in one is an error.
class GatheredParameters
{
  public:
    // where: the caller's line; the gathers and broadcasts of the scope carry it.
    GatheredParameters(Engine &engine, int rank, std::vector<ParamId> params,
                       std::optional<int> modifierRank = std::nullopt,
                       std::source_location where = std::source_location::current());
    // The same scope for every local rank at once, from model-building code (not a rank
    // thread): operator[] shows the modifier rank's tensor (or the first local rank's).
    GatheredParameters(Engine &engine, std::vector<ParamId> params,
                       std::optional<int> modifierRank = std::nullopt,
                       std::source_location where = std::source_location::current());
    ~GatheredParameters() noexcept(false);
    GatheredParameters(const GatheredParameters &) = delete;
    GatheredParameters &operator=(const GatheredParameters &) = delete;

    void close();
    // Full tensor of params[i], in the memory of the rank it is shown from (viewRank()).
    TensorView operator[](std::size_t i) const;
    // A host copy of params[i]'s full tensor (model-building code on GPU ranks reads this way).
    std::vector<std::byte> toHost(std::size_t i) const;
    // The rank whose tensors operator[] shows: this scope's rank, or for a process-wide scope
    // the modifier rank when it is local, else the first local rank.
    int viewRank() const;

  private:
    Engine &m_engine;
    int m_rank; // -1: every local rank
    std::vector<ParamId> m_params;
    std::optional<int> m_modifier;
    std::vector<std::vector<std::uint64_t>> m_hashes; // [local rank index][param]
    std::source_location m_where;
    bool m_open = true;
};

} // namespace shardscope::core

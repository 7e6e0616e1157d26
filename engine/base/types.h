#pragma once
// The engine's vocabulary: ids and the small enums every layer speaks (named as in
// DeepSpeed ZeRO-3). A leaf: comm, core, telemetry and wire all build on it; their
// names live once in base/names.h.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardscope {

using ModuleId = std::uint32_t;
using ParamId = std::uint32_t;
inline constexpr ModuleId kNoModule = 0xFFFFFFFFu;
inline constexpr ParamId kNoParam = 0xFFFFFFFFu;

using Shape = std::vector<std::int64_t>;

enum class DType : std::uint8_t
{
    F32 = 0,
    BF16 = 1
};
inline constexpr std::size_t dtypeSize(DType t)
{
    return t == DType::BF16 ? 2 : 4;
}

// ZeRO-3 per-rank partition state of a parameter (DeepSpeed's ZeroParamStatus).
enum class ParamStatus : std::uint8_t
{
    NotAvailable = 0,
    Inflight = 1,
    Available = 2
};

enum class Phase : std::uint8_t
{
    Forward = 0,
    Backward = 1
};

// What the access guard does about an unregistered access.
enum class GuardPolicy : std::uint8_t
{
    Error = 0,
    Warn = 1,
    Auto = 2
};

// The action the guard took for one unregistered access.
enum class GuardAction : std::uint8_t
{
    Raised = 0,
    Gathered = 1,
    AutoRegistered = 2,
    Recorded = 3
};

enum class FetchReason : std::uint8_t
{
    Forward = 0,
    Backward = 1,
    Prefetch = 2,
    GatheredParameters = 3,
    Guard = 4,
};

enum class ViolationKind : std::uint8_t
{
    UnregisteredAccess = 0,
    LateParameter = 1,
    TraceInvalidated = 2,
    GatheredWriteWithoutModifier = 3,
    TiedAcrossGroups = 4,   // FSDP2: one tied parameter in two fully_shard groups
    BackwardUnfinished = 5, // FSDP2: a backward whose end-of-backward callback never ran
    ShardOrder = 6, // FSDP2: fully_shard on a module inside one already sharded (parent first)
    // Checkpoints (state/violationtext.cpp words them; docs/snapshot.md):
    PartitionedSave = 7, // a state dict of placeholders (ZeRO-3) or shards (FSDP2) saved as whole
    PartitionedLoad = 8, // full tensors loaded into a partitioned or sharded model
    ResumeWorldSize = 9, // DeepSpeed: load_checkpoint at another data-parallel world size
    // Collectives of a job (issue 51; state/violationtext.cpp words them; docs/snapshot.md):
    CollectiveMismatch = 10, // the job's aligner: at one (group, seq) the ranks issued different
    RankStalled = 11,        // a rank waited in a collective past the threshold (the rank's
                             // watchdog, or the job's aligner naming the waiting and missing)
};

// How bad one violation is for the run (state/severity.h decides it, from its kind, the
// guard's action and what the read touched).
enum class Severity : std::uint8_t
{
    Error = 0, // it crashes, or silently computes on a placeholder, a shard or a lost copy
    Cost = 1,  // the run is right, but it costs memory or time (a gather nothing prefetched)
    Info = 2   // information: nothing to fix
};

// What an unregistered access read of the parameter.
enum class ViolationRead : std::uint8_t
{
    Values = 0,   // its data: an op, a copy, its values (every other kind is this)
    Attribute = 1 // only attributes that need no data: .dtype, .shape, .device, .requires_grad
};

// The kind of a telemetry record (telemetry/event.h); what each kind carries is
// telemetry/eventfields.h.
enum class EventType : std::uint8_t
{
    ModuleEnter = 1,
    ModuleExit = 2,
    FetchBegin = 3,
    FetchEnd = 4,
    Release = 5,
    Broadcast = 6,
    ExternalRegister = 7,
    ExternalUnregister = 8,
    UnregisteredAccess = 9,
    LateParameter = 10,
    ParameterAdopted = 11,
    TraceRecorded = 12,
    TraceInvalidated = 13,
    StepBegin = 14,
    StepEnd = 15,
    MemorySample = 16,
    DroppedEvents = 17,
    GatheredWriteError = 18,
    ReduceScatterBegin = 19, // a gradient reduce-scatter is issued (backward)
    ReduceScatterEnd = 20,   // ... and has completed
    AllocatorSample = 21,    // the rank's device allocator figures (CUDA only)
    CollectiveBegin = 22,    // a collective is about to be issued (its group's next seq)
    CollectiveEnd = 23,      // ... and has completed
};

// What a collective of a rank's sequence is (CollectiveBegin/End, telemetry/eventfields.h).
enum class CollectiveKind : std::uint8_t
{
    AllGather = 0,     // ZeRO-3's parameter all-gather, FSDP2's unshard
    ReduceScatter = 1, // gradients reduced in backward
    Broadcast = 2      // GatheredParameters' modifier_rank broadcast
};

// Where a set of ranks stands at one (group, seq) of a collective_mismatch or rank_stalled
// record (state/state.h CollectiveSide).
enum class CollectivePosition : std::uint8_t
{
    Issued = 0,   // it issued the collective at seq (and went on, or it completed)
    Waiting = 1,  // it issued it and waits in it
    Behind = 2,   // it has not reached seq (its last seq is lower) and still runs
    Finished = 3, // its run ended (or it died) before reaching seq
};

} // namespace shardscope

#pragma once
// A plain copy of the engine's state at one moment: what a snapshot file and the
// wire's state message carry (see docs/snapshot.md). No behaviour but the one rule both state
// decoders check (unitGroupError), no Qt.

#include <cstdint>
#include <string>
#include <vector>

#include "state/shape.h"

namespace shardscope::state {

struct EngineConfigRecord
{
    std::int64_t persistenceThreshold = 0;
    std::int64_t prefetchBucketSize = 0;
    std::int64_t maxLiveParameters = 0;
    GuardPolicy guard = GuardPolicy::Warn;
};

struct ModuleRecord
{
    ModuleId id = 0;
    std::string path; // "" for the root
    std::string type;
    ModuleId parent = kNoModule;
    // An FSDP2 unit (docs/fsdp.md): a module torch.distributed.fsdp.fully_shard was called on.
    // unitGroup is the first module of that call (the module itself, or the first of
    // fully_shard([a, b])); kNoModule for every other module and every producer without units
    // (the engine, DeepSpeed), whose two strings are then empty.
    ModuleId unitGroup = kNoModule;
    std::string reshardAfterForward = {}; // as fully_shard took it: "True", "False" or a mesh size
    std::string mesh =
        {}; // the unit's mesh, dimension by dimension: "dp=2", "replicate=2, shard=2"

    bool fsdpUnit() const { return unitGroup != kNoModule; }
};

struct ExternalRecord
{
    ModuleId module = kNoModule;
    bool automatic = false; // registered by the guard's `auto` policy
};

struct ParamRecord
{
    ParamId id = 0;
    std::string name; // full dotted name, e.g. "embed.weight"
    ModuleId owner = kNoModule;
    Shape shape;
    DType dtype = DType::F32;
    std::int64_t numel = 0;
    std::int64_t paddedNumel = 0;
    std::int64_t partitionNumel = 0;
    bool persistent = false;
    bool late = false;        // created after the model was partitioned
    bool partitioned = false; // false for persistent and for late, not yet adopted, parameters
    std::string replaces;     // late: the parameter it replaced (weight_norm's `weight`), if known
    // FSDP2: the DTensor's placements over the unit's mesh, "Shard(0)" or "(Replicate(),
    // Shard(0))"; empty for a parameter that is not a DTensor (the engine's and DeepSpeed's flat
    // partitions).
    std::string placements;
    std::vector<ParamStatus> status;       // one entry per rank (world size)
    std::vector<ExternalRecord> externals; // modules it is registered on as external
    std::vector<ModuleId> activeModules;   // union over ranks
    std::uint64_t gatherCount = 0;         // all-gathers, summed over local ranks
    std::uint64_t gatherBytes = 0;
    std::uint64_t gatherNs = 0;
    std::uint64_t lastGatherTsNs = 0;
};

// Where a violation happened in the user's code (docs/snapshot.md, a violation's `location`).
// A Python agent's: the innermost frame outside torch, DeepSpeed, Transformers, Accelerate
// and ShardScope, and the frames above it; the engine's: the C++ call site of
// Engine::access. An empty file means not known (snapshots written before locations).
struct SourceLocation
{
    std::string file;
    std::uint32_t line = 0;
    std::string function;
    std::vector<std::string> chain; // the frames above it, innermost first, "file:line in function"

    bool known() const { return !file.empty(); }
    // "file:line", what a user pastes into an editor; "" when not known.
    std::string fileLine() const
    {
        return known() ? file + ":" + std::to_string(line) : std::string();
    }
    bool operator==(const SourceLocation &) const = default;
};

// One distinct violation (kind, rank, accessor, param, location), with how often it happened.
// collective_mismatch, rank_stalled (issue 51): what one set of ranks did at the record's
// (group, seq). A side that issued names its collective's signature: kind, the module's path
// it serves (hasModule false: none), why, bytes, parameters.
struct CollectiveSide
{
    std::vector<int> ranks; // global ranks, ascending
    CollectivePosition position = CollectivePosition::Issued;
    CollectiveKind kind = CollectiveKind::AllGather;
    bool hasModule = false;
    std::string module; // "" is the root module
    FetchReason reason = FetchReason::Forward;
    std::uint64_t bytes = 0;
    std::uint32_t params = 0;
    // Behind, Finished: the last seq they issued in the group (0: none); Issued, Waiting: seq.
    std::uint64_t lastSeq = 0;
    bool operator==(const CollectiveSide &) const = default;
};

// Where one rank of such a record is: its collective's seq and its user's line, from its
// own rank_stalled record (its watchdog's) when there is one.
struct CollectiveSite
{
    int rank = 0;
    std::uint64_t seq = 0;
    std::uint64_t waitedMs = 0; // how long it had waited in seq when the line was taken
    SourceLocation where;
    bool operator==(const CollectiveSite &) const = default;
};

struct CollectiveDetail
{
    std::uint32_t group = 0;    // the process group's number (0: the job's default group)
    std::uint64_t seq = 0;      // 0: no detail (every other kind)
    std::uint64_t waitedMs = 0; // rank_stalled: the longest wait of the waiting ranks
    std::vector<CollectiveSide> sides;
    std::vector<CollectiveSite> sites; // ascending rank
    bool empty() const { return seq == 0 && sides.empty() && sites.empty(); }
    bool operator==(const CollectiveDetail &) const = default;
};

struct ViolationRecord
{
    ViolationKind kind = ViolationKind::UnregisteredAccess;
    std::uint32_t step = 0;     // first step it happened in
    std::uint32_t lastStep = 0; // last step it happened in
    int rank = 0;
    ModuleId accessor = kNoModule; // module that read; for trace_invalidated: the module entered
    ParamId param = kNoParam;
    std::string paramName;      // the parameter's name, kept after it is removed (weight_norm)
    ModuleId owner = kNoModule; // for trace_invalidated: the module expected
    ParamStatus status = ParamStatus::NotAvailable; // the parameter's status when it happened
    GuardAction action = GuardAction::Recorded;
    // unregistered_access: whether the read touched the values or only attributes (.dtype);
    // Values for every other kind.
    ViolationRead read = ViolationRead::Values;
    // How bad it is: state::severityOf(kind, action, read), written by the ledger that counts
    // it (records()) and by the snapshot readers; a producer never sets it.
    Severity severity = Severity::Error;
    std::uint64_t count = 0;
    std::uint64_t tsNs = 0;  // first occurrence
    std::string fix;         // the line that fixes it, where one exists
    std::string message;     // a sentence in the user's terms
    SourceLocation location; // where in the user's code; file empty when not known
    // Read while the model was being built: the modules under construction, outermost first
    // ("Wav2Vec2Model .encoder > Wav2Vec2Encoder .pos_conv_embed > ..."); "" otherwise.
    std::string building;
    // collective_mismatch, rank_stalled: the collective, its sides and where each rank is;
    // empty for every other kind.
    CollectiveDetail collective;
};

struct EngineState
{
    std::string modelName;
    std::string fixDialect = "shardscope"; // how fix lines are written: "shardscope" | "deepspeed"

    int worldSize = 1;
    std::string backend; // "cpu" or "nccl"
    std::uint32_t step = 0;
    EngineConfigRecord config;
    std::vector<int> localRanks;
    std::vector<ModuleRecord> modules; // index == id
    std::vector<ParamRecord> params;   // sorted by id; removed parameters are absent
    std::vector<ViolationRecord> violations;
};

// Why module m's FSDP unit group cannot be: a group that is not a listed module, or not
// itself a unit heading its own group (docs/snapshot.md, `fsdp_unit`); "" when it can.
inline std::string unitGroupError(const std::vector<ModuleRecord> &modules, const ModuleRecord &m)
{
    if (!m.fsdpUnit()) return {};
    if (m.unitGroup >= modules.size())
        return "module id " + std::to_string(m.unitGroup) + " does not exist (" +
               std::to_string(modules.size()) + " modules)";
    const ModuleRecord &g = modules[m.unitGroup];
    if (g.unitGroup != g.id)
        return "module " + std::to_string(g.id) + " does not head an FSDP unit group of its own";
    return {};
}

} // namespace shardscope::state

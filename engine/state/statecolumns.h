#pragma once
// The engine's state as columns: the same content as EngineState, one array per field and
// every module path, type and parameter name in one string table, in the order the binary
// State carries them (docs/protocol.md, "StateBinary"). The inspector's server refills one
// in place and encodes it with memcpy, where an EngineState is a 248-byte record plus a
// name, a shape and a status vector on the heap for each parameter: at 100,000 parameters x
// 64 ranks about 16 MB of columns (estimated from their sizes) instead of about 48 MB of
// records, written in a few dozen allocations that the next State reuses. EngineState stays what a
// snapshot file, the JSON State and a client hold; columnsOf and stateOf convert between the two
// without loss.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "state/state.h"

namespace shardscope::state {

// A string-table index meaning "none" (a parameter that replaces nothing).
inline constexpr std::uint32_t kNoString = 0xFFFFFFFFu;

// A parameter's flags, as the binary State writes them.
inline constexpr std::uint8_t kParamPersistent = 1, kParamPartitioned = 2, kParamLate = 4;

// Shapes longer than this are cut to it (the binary State counts dimensions in a byte).
inline constexpr std::size_t kMaxColumnDims = 255;

// Strings back to back and their lengths. The bytes are kept as given; the binary State's
// encoder makes them valid UTF-8.
class StringColumn
{
  public:
    std::uint32_t add(std::string_view s);
    // Reuses an equal string that intern() added before clear(): for the few values many
    // rows share (module types, what late parameters replace).
    std::uint32_t intern(std::string_view s);
    void reserve(std::size_t strings, std::size_t bytes);
    void clear(); // keeps the capacity
    std::size_t size() const { return m_lengths.size(); }
    const std::string &bytes() const { return m_bytes; }
    const std::vector<std::uint32_t> &lengths() const { return m_lengths; }
    // Every string in order (views into bytes()).
    std::vector<std::string_view> views() const;

  private:
    std::string m_bytes;
    std::vector<std::uint32_t> m_lengths;
    // Looked up by string_view, so a lookup of a value already interned allocates nothing.
    struct Hash
    {
        using is_transparent = void;
        std::size_t operator()(std::string_view s) const
        {
            return std::hash<std::string_view>{}(s);
        }
    };
    std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> m_interned;
};

// The bytes of one parameter's status row: 2 bits a rank.
inline std::size_t statusRowBytes(int worldSize)
{
    return (static_cast<std::size_t>(worldSize < 1 ? 1 : worldSize) + 3) / 4;
}

struct StateColumns
{
    // One per state.
    std::string modelName;
    std::string fixDialect = "shardscope";
    std::string backend;
    int worldSize = 1;
    std::uint32_t step = 0;
    EngineConfigRecord config;
    std::vector<int> localRanks;

    // Module paths and types, parameter names, what they replace, FSDP units' settings and
    // parameters' placements.
    StringColumn strings;

    // Modules; index == id.
    std::vector<std::uint32_t> modulePath, moduleType; // into strings
    std::vector<ModuleId> moduleParent;
    // FSDP2 units (ModuleRecord::unitGroup): kNoModule, and kNoString for both strings, where
    // a module is not one.
    std::vector<ModuleId> moduleUnitGroup;
    std::vector<std::uint32_t> moduleReshard, moduleMesh; // into strings; kNoString for none

    // Parameters, sorted by id; removed ones are absent. Each column has one entry a
    // parameter, except dims, statusRows and the two module lists.
    std::vector<ParamId> paramId;
    std::vector<std::uint32_t> paramName; // into strings
    std::vector<ModuleId> paramOwner;
    std::vector<std::uint8_t> paramDtype;
    std::vector<std::uint8_t> paramFlags; // kParamPersistent | kParamPartitioned | kParamLate
    std::vector<std::uint8_t> paramDims;  // how many of dims are this parameter's
    std::vector<std::int64_t> numel, paddedNumel, partitionNumel;
    std::vector<std::int64_t> dims; // every parameter's shape in turn
    // statusRowBytes(worldSize) bytes a parameter: rank r's ParamStatus in bits 2(r%4) of
    // byte r/4; the bits after the last rank are 0.
    std::vector<std::uint8_t> statusRows;
    // The modules a parameter is registered on as external (with whether the guard's `auto`
    // policy did it), and the modules using it now (union over ranks): externalCount[i]
    // and activeCount[i] entries of the flat lists, parameter after parameter.
    std::vector<std::uint32_t> externalCount;
    std::vector<ModuleId> externalModule;
    std::vector<std::uint8_t> externalAutomatic; // 0 or 1
    std::vector<std::uint32_t> activeCount;
    std::vector<ModuleId> activeModule;
    std::vector<std::uint64_t> gatherCount, gatherBytes, gatherNs, lastGatherTsNs;
    std::vector<std::uint32_t> paramReplaces;   // into strings; kNoString for none
    std::vector<std::uint32_t> paramPlacements; // into strings; kNoString for none (not a DTensor)

    std::vector<ViolationRecord> violations;

    std::size_t paramCount() const { return paramId.size(); }
    // A parameter's fixed fields onto the end of their columns, its name added to the
    // table; its statuses, module lists, gather figures, what it replaces and its placements
    // are the caller's. Both fillers (Engine::stateColumns, columnsOf) add through this, so the
    // same state makes the same columns.
    void addParam(ParamId id, std::string_view name, ModuleId owner, DType dtype, bool persistent,
                  bool partitioned, bool late, const Shape &shape, std::int64_t numel,
                  std::int64_t padded, std::int64_t partition);
    // Empties every column and keeps the memory, for the next state to be written into.
    void clear();
    // Gives the memory back.
    void release();
    // Whether every per-parameter column has one entry a parameter and the flat lists add
    // up; an error names the first column that does not. Empty when consistent.
    std::string checkConsistent() const;
};

// Every column with one entry a parameter (not dims, statusRows or the module lists), for
// what is done to all of them alike (reserving).
template <class C, class F> void forEachParamColumn(C &c, F f)
{
    f(c.paramId), f(c.paramName), f(c.paramOwner), f(c.paramDtype), f(c.paramFlags), f(c.paramDims);
    f(c.numel), f(c.paddedNumel), f(c.partitionNumel);
    f(c.externalCount), f(c.activeCount);
    f(c.gatherCount), f(c.gatherBytes), f(c.gatherNs), f(c.lastGatherTsNs), f(c.paramReplaces);
    f(c.paramPlacements);
}

// Every column with one entry a module, likewise.
template <class C, class F> void forEachModuleColumn(C &c, F f)
{
    f(c.modulePath), f(c.moduleType), f(c.moduleParent);
    f(c.moduleUnitGroup), f(c.moduleReshard), f(c.moduleMesh);
}

// The columns of a state, and back; stateOf(columnsOf(s)) == s, names byte for byte.
void columnsOf(const EngineState &state, StateColumns &out);
EngineState stateOf(const StateColumns &columns);

} // namespace shardscope::state

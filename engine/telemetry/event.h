#pragma once
// The fixed-size telemetry record every engine event is written as. Names never
// travel here: records refer to modules and parameters by id, resolved against
// the snapshot. The layout is the wire layout (little-endian), pinned below.

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace shardscope {

enum class EventType : std::uint8_t {
    ModuleEnter = 1,     // a = module, flags = Phase
    ModuleExit = 2,      // a = module, flags = Phase
    FetchBegin = 3,      // a = param, b = module that caused it (or kNoModule), u0 = bytes, flags = FetchReason
    FetchEnd = 4,        // same fields as FetchBegin
    Release = 5,         // a = param, b = module whose exit released it (or kNoModule), u0 = bytes
    Broadcast = 6,       // a = param, b = root rank, u0 = bytes (GatheredParameters exit)
    ExternalRegister = 7,   // a = module, b = param, flags = 0 manual / 1 automatic
    ExternalUnregister = 8, // a = module, b = param
    UnregisteredAccess = 9, // a = accessor module (or kNoModule), b = param, u0 = owner module,
                            // flags = (ParamStatus) | (GuardAction << 4)
    LateParameter = 10,     // a = module, b = param
    ParameterAdopted = 11,  // a = module, b = param
    TraceRecorded = 12,     // u0 = number of module entries in the trace
    TraceInvalidated = 13,  // a = expected module (or kNoModule), b = module actually entered, flags = Phase got
    StepBegin = 14,         // step = the new step
    StepEnd = 15,           // u0 = loss as IEEE-754 double bits
    MemorySample = 16,      // u0 = partitioned bytes, u1 = gathered bytes, u2 = peak gathered bytes,
                            // a = live parameter elements (low 32 bits), b = (high 32 bits)
    DroppedEvents = 17,     // u0 = events dropped on this rank since the previous DroppedEvents
    GatheredWriteError = 18, // a = param: modified in GatheredParameters without modifier_rank
};

// 48 bytes, naturally aligned, no padding: written as-is into rings and frames.
struct Event
{
    std::uint64_t tsNs;  // monotonic nanoseconds (telemetry clock), comparable across ranks
    std::uint32_t step;  // training step the rank was in
    std::uint16_t rank;
    EventType type;
    std::uint8_t flags;  // type-specific small field (reason, phase, status/action)
    std::uint32_t a;
    std::uint32_t b;
    std::uint64_t u0;
    std::uint64_t u1;
    std::uint64_t u2;
};

static_assert(sizeof(Event) == 48, "Event is a 48-byte wire record");
static_assert(std::is_trivially_copyable_v<Event>);
static_assert(offsetof(Event, tsNs) == 0);
static_assert(offsetof(Event, step) == 8);
static_assert(offsetof(Event, rank) == 12);
static_assert(offsetof(Event, type) == 14);
static_assert(offsetof(Event, flags) == 15);
static_assert(offsetof(Event, a) == 16);
static_assert(offsetof(Event, b) == 20);
static_assert(offsetof(Event, u0) == 24);
static_assert(offsetof(Event, u1) == 32);
static_assert(offsetof(Event, u2) == 40);

// Where the engine writes its events. Implementations must not block or allocate
// in write(): it is called from training threads, concurrently from every rank thread
// (each with its own ev.rank). (Not named emit: Qt defines `emit` as a macro.)
class EventSink
{
public:
    virtual ~EventSink() = default;
    virtual void write(const Event &ev) noexcept = 0;
};

} // namespace shardscope

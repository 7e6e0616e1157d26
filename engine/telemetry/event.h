#pragma once
// The fixed-size telemetry record every engine event is written as. Names never
// travel here: records refer to modules and parameters by id, resolved against
// the snapshot. The layout is the wire layout (little-endian), pinned below. Which of
// flags, a, b, u0..u2 a kind uses, and what for, is said once: telemetry/eventfields.h.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/types.h"

namespace shardscope::telemetry {

// 48 bytes, naturally aligned, no padding: written as-is into rings and frames.
struct Event
{
    std::uint64_t tsNs; // monotonic nanoseconds (telemetry clock), comparable across ranks
    std::uint32_t step; // training step the rank was in
    std::uint16_t rank;
    EventType type;
    std::uint8_t flags; // type-specific small field (reason, phase, status/action)
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

} // namespace shardscope::telemetry

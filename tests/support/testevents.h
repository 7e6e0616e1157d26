#pragma once
// Events for the tests, Qt-free and engine-free: typed events (telemetry/eventfields.h)
// stamped with a time, rank and step, and raw records for what the typed makers cannot say.

#include <cstdint>

#include "telemetry/eventfields.h"

namespace shardscope::test {

// A raw record, for what the typed makers cannot say: unknown kinds, bad fields, and the
// lane's storage of every field.
inline telemetry::Event makeEvent(std::uint64_t ts, int rank, EventType type, std::uint32_t a = 0,
                                  std::uint32_t b = 0, std::uint64_t u0 = 0, std::uint8_t flags = 0,
                                  std::uint32_t step = 1)
{
    telemetry::Event e{};
    e.tsNs = ts;
    e.step = step;
    e.rank = static_cast<std::uint16_t>(rank);
    e.type = type;
    e.flags = flags;
    e.a = a;
    e.b = b;
    e.u0 = u0;
    return e;
}

// An event made by telemetry/eventfields.h, at ts on rank, in step.
inline telemetry::Event eventAt(std::uint64_t ts, int rank, const telemetry::Event &fields,
                                std::uint32_t step = 1)
{
    return telemetry::stamped(fields, ts, step, static_cast<std::uint16_t>(rank));
}

} // namespace shardscope::test

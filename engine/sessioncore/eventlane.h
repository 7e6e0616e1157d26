#pragma once
// One rank's events, sorted by time, in fixed-size chunks of 20-byte records (no
// reallocation spikes), binary-searchable like Qt Creator's timeline models. With a
// capacity, the oldest chunk is evicted as a whole when the lane is full.

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "telemetry/event.h"

namespace shardscope::sessioncore {

class EventLane
{
  public:
    static constexpr std::size_t kChunkEvents = 16384;

    // An Event as the lane keeps it (20 bytes instead of 48): the rank is the lane's; the
    // time's high 32 bits and the step change rarely and are kept per chunk as runs
    // (index of the first event, value); u0 when it does not fit 32 bits, u1 and u2 (used
    // by MemorySample, AllocatorSample and group reduce-scatters) live in the chunk's side table.
    struct Stored
    {
        std::uint32_t tsLo; // low 32 bits of tsNs
        std::uint32_t a;
        std::uint32_t b;
        std::uint32_t u0; // u0 when extra == 0
        EventType type;
        std::uint8_t flags;
        std::uint16_t extra; // 0: u0 fits, u1 = u2 = 0; else 1 + index in the side table
    };
    static_assert(sizeof(Stored) == 20);

    EventLane() = default;
    EventLane(const EventLane &) = delete;
    EventLane &operator=(const EventLane &) = delete;
    EventLane(EventLane &&) = default;
    EventLane &operator=(EventLane &&) = default;

    std::size_t size() const { return m_size; }
    bool empty() const { return m_size == 0; }
    // The full event (its rank is the rank of the events inserted into this lane).
    telemetry::Event at(std::size_t i) const
    {
        const Chunk &c = m_chunks[i / kChunkEvents];
        const std::size_t j = i % kChunkEvents;
        const Stored &s = c.events[j];
        telemetry::Event ev{};
        ev.tsNs = std::uint64_t(runValue(c.tsHigh, j)) << 32 | s.tsLo;
        ev.step = runValue(c.steps, j);
        ev.rank = m_rank;
        ev.type = s.type;
        ev.flags = s.flags;
        ev.a = s.a;
        ev.b = s.b;
        ev.u0 = s.u0;
        if (s.extra) {
            const Extra &x = c.extras[s.extra - 1u];
            ev.u0 = x.u0;
            ev.u1 = x.u1;
            ev.u2 = x.u2;
        }
        return ev;
    }
    std::uint64_t tsAt(std::size_t i) const
    {
        const Chunk &c = m_chunks[i / kChunkEvents];
        const std::size_t j = i % kChunkEvents;
        return std::uint64_t(runValue(c.tsHigh, j)) << 32 | c.events[j].tsLo;
    }
    std::uint64_t firstTs() const { return m_size ? tsAt(0) : 0; }
    std::uint64_t lastTs() const { return m_size ? tsAt(m_size - 1) : 0; }
    // Events evicted from the front so far: absolute index = evicted() + index.
    std::uint64_t evicted() const { return m_evicted; }
    // At most this many events are kept (rounded up to whole chunks, at least two); 0: no limit.
    void setCapacity(std::size_t events);

    // Index of the first event with tsNs >= ts (size() if none).
    std::size_t firstIndex(std::uint64_t ts) const;
    // Index one past the last event with tsNs <= ts.
    std::size_t lastIndex(std::uint64_t ts) const;

    // Keeps time order: appends, or inserts an out-of-order event at its place (storing
    // every later event again: use insertMany for more than a few late events).
    void insert(const telemetry::Event &ev);
    // Inserts events of this lane's rank in any order, as insert() one by one would (equal
    // times keep arrival order, after the stored ones), in O(n log n + k) for n events and
    // k stored events later than the oldest of them: sorts `events` in place.
    void insertMany(std::span<telemetry::Event> events);
    // True if an event identical to ev (all 48 bytes) is stored with the same time.
    bool contains(const telemetry::Event &ev) const;

    void clear();
    std::size_t bytesUsed() const;

  private:
    struct Extra
    {
        std::uint64_t u0, u1, u2;
        std::uint32_t at; // the event's index in the chunk
    };
    // (index of the first event in the chunk with this value, value), by index; a chunk's
    // events are only ever appended or cut off at the end, so runs stay sorted.
    using Runs = std::vector<std::pair<std::uint32_t, std::uint32_t>>;
    struct Chunk
    {
        std::unique_ptr<Stored[]> events;
        Runs tsHigh;
        Runs steps;
        std::vector<Extra> extras;
    };

    static std::uint32_t runValue(const Runs &runs, std::size_t j)
    {
        if (runs.size() == 1 || runs[1].first > j) return runs[0].second;
        std::size_t lo = 1, hi = runs.size(); // the last run starting at or before j
        while (hi - lo > 1) {
            const std::size_t mid = lo + (hi - lo) / 2;
            if (runs[mid].first <= j)
                lo = mid;
            else
                hi = mid;
        }
        return runs[lo].second;
    }
    void pushBack(const telemetry::Event &ev);
    void truncate(std::size_t size);
    void evictIfFull();

    std::deque<Chunk> m_chunks;
    std::size_t m_size = 0;
    std::size_t m_capacityChunks = 0;
    std::uint64_t m_evicted = 0;
    std::uint16_t m_rank = 0;
};

} // namespace shardscope::sessioncore

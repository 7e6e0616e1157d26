#pragma once
// One rank's events, sorted by time, in fixed-size chunks of 32-byte records (no
// reallocation spikes), binary-searchable like Qt Creator's timeline models. With a
// capacity, the oldest chunk is evicted as a whole when the lane is full.

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "telemetry/event.h"

namespace shardscope {

class EventLane
{
  public:
    static constexpr std::size_t kChunkEvents = 16384;

    // An Event as the lane keeps it: the rank is the lane's, and u1/u2 (used only by
    // MemorySample) live in the chunk's side table when either is non-zero.
    struct Stored
    {
        std::uint64_t tsNs;
        std::uint32_t step;
        EventType type;
        std::uint8_t flags;
        std::uint16_t extra; // 0: u1 = u2 = 0; else 1 + index in the chunk's side table
        std::uint32_t a;
        std::uint32_t b;
        std::uint64_t u0;
    };
    static_assert(sizeof(Stored) == 32);

    EventLane() = default;
    EventLane(const EventLane &) = delete;
    EventLane &operator=(const EventLane &) = delete;
    EventLane(EventLane &&) = default;
    EventLane &operator=(EventLane &&) = default;

    std::size_t size() const { return m_size; }
    bool empty() const { return m_size == 0; }
    // The full event (its rank is the rank of the events inserted into this lane).
    Event at(std::size_t i) const
    {
        const Chunk &c = m_chunks[i / kChunkEvents];
        const Stored &s = c.events[i % kChunkEvents];
        Event ev{};
        ev.tsNs = s.tsNs;
        ev.step = s.step;
        ev.rank = m_rank;
        ev.type = s.type;
        ev.flags = s.flags;
        ev.a = s.a;
        ev.b = s.b;
        ev.u0 = s.u0;
        if (s.extra) {
            ev.u1 = c.extras[s.extra - 1u][0];
            ev.u2 = c.extras[s.extra - 1u][1];
        }
        return ev;
    }
    std::uint64_t tsAt(std::size_t i) const { return rec(i).tsNs; }
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

    // Keeps time order: appends, or inserts an out-of-order event at its place (moving
    // every later event: use insertMany for more than a few late events).
    void insert(const Event &ev);
    // Inserts events of this lane's rank in any order, as insert() one by one would (equal
    // times keep arrival order, after the stored ones), in O(n log n + k) for n events and
    // k stored events later than the oldest of them: sorts `events` in place.
    void insertMany(std::span<Event> events);
    // True if an event identical to ev (all 48 bytes) is stored with the same time.
    bool contains(const Event &ev) const;

    void clear();
    std::size_t bytesUsed() const;

  private:
    struct Chunk
    {
        std::unique_ptr<Stored[]> events;
        std::vector<std::array<std::uint64_t, 2>> extras; // u1, u2
    };

    const Stored &rec(std::size_t i) const
    {
        return m_chunks[i / kChunkEvents].events[i % kChunkEvents];
    }
    Stored &mut(std::size_t i) { return m_chunks[i / kChunkEvents].events[i % kChunkEvents]; }
    std::uint16_t addExtra(Chunk &c, std::uint64_t u1, std::uint64_t u2);
    void put(std::size_t i, const Event &ev);
    void move(std::size_t from, std::size_t to);
    void pushBack(const Event &ev);
    void truncate(std::size_t size);
    void evictIfFull();

    std::deque<Chunk> m_chunks;
    std::size_t m_size = 0;
    std::size_t m_capacityChunks = 0;
    std::uint64_t m_evicted = 0;
    std::uint16_t m_rank = 0;
};

} // namespace shardscope

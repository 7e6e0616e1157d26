#pragma once
// One rank's events, sorted by time, in fixed-size chunks (48 bytes per event, no
// reallocation spikes), binary-searchable like Qt Creator's timeline models. With a
// capacity, the oldest chunk is evicted as a whole when the lane is full.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>

#include "telemetry/event.h"

namespace shardscope {

class EventLane
{
  public:
    static constexpr std::size_t kChunkEvents = 16384;

    EventLane() = default;
    EventLane(const EventLane &) = delete;
    EventLane &operator=(const EventLane &) = delete;
    EventLane(EventLane &&) = default;
    EventLane &operator=(EventLane &&) = default;

    std::size_t size() const { return m_size; }
    bool empty() const { return m_size == 0; }
    const Event &at(std::size_t i) const { return m_chunks[i / kChunkEvents][i % kChunkEvents]; }
    std::uint64_t firstTs() const { return m_size ? at(0).tsNs : 0; }
    std::uint64_t lastTs() const { return m_size ? at(m_size - 1).tsNs : 0; }
    // Events evicted from the front so far: absolute index = evicted() + index.
    std::uint64_t evicted() const { return m_evicted; }
    // At most this many events are kept (rounded up to whole chunks, at least two); 0: no limit.
    void setCapacity(std::size_t events);

    // Index of the first event with tsNs >= ts (size() if none).
    std::size_t firstIndex(std::uint64_t ts) const;
    // Index one past the last event with tsNs <= ts.
    std::size_t lastIndex(std::uint64_t ts) const;

    // Keeps time order: appends, or inserts an out-of-order event at its place.
    void insert(const Event &ev);
    // True if an event identical to ev (all 48 bytes) is stored with the same time.
    bool contains(const Event &ev) const;

    void clear();
    std::size_t bytesUsed() const { return m_chunks.size() * kChunkEvents * sizeof(Event); }

  private:
    Event &mut(std::size_t i) { return m_chunks[i / kChunkEvents][i % kChunkEvents]; }
    void pushBack(const Event &ev);
    void evictIfFull();

    std::deque<std::unique_ptr<Event[]>> m_chunks;
    std::size_t m_size = 0;
    std::size_t m_capacityChunks = 0;
    std::uint64_t m_evicted = 0;
};

} // namespace shardscope

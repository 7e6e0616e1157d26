#pragma once
// The bounded recent history a late client receives: the last N events, oldest first.
// Used by one thread (the inspector's consumer).
//
// Stored in fixed blocks allocated as the history first reaches them: it grows with use up
// to capacity (a generous capacity costs nothing until used), and growing never moves the
// events already kept, which a vector's doubling did on the server thread (perf: about a
// fifth of its CPU in a 120-step run, with the page faults of each new copy).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "telemetry/event.h"

namespace shardscope::telemetry {

class EventHistory
{
  public:
    static constexpr std::size_t kBlockEvents = 4096; // 192 KiB a block

    explicit EventHistory(std::size_t capacity) : m_capacity(capacity) {}

    void append(std::span<const Event> events)
    {
        if (m_capacity == 0) return;
        if (events.size() >= m_capacity) {
            events = events.last(m_capacity);
            m_start = 0;
            m_size = 0;
        }
        while (!events.empty()) {
            const std::size_t at = (m_start + m_size) % m_capacity;
            const std::size_t run =
                std::min({events.size(), m_capacity - at, kBlockEvents - at % kBlockEvents});
            std::memcpy(static_cast<void *>(slot(at)), events.data(), run * sizeof(Event));
            if (m_size + run <= m_capacity) {
                m_size += run;
            } else {
                m_start = (m_start + (m_size + run - m_capacity)) % m_capacity;
                m_size = m_capacity;
            }
            events = events.subspan(run);
        }
    }

    std::vector<Event> events() const { return newest(m_size); }

    // The newest `count` events (all if fewer), oldest first.
    std::vector<Event> newest(std::size_t count) const
    {
        const std::size_t n = std::min(count, m_size);
        std::vector<Event> out(n);
        std::size_t done = 0;
        std::size_t at = (m_start + (m_size - n)) % std::max<std::size_t>(m_capacity, 1);
        while (done < n) {
            const std::size_t run =
                std::min({n - done, m_capacity - at, kBlockEvents - at % kBlockEvents});
            std::memcpy(static_cast<void *>(out.data() + done),
                        m_blocks[at / kBlockEvents].get() + at % kBlockEvents, run * sizeof(Event));
            done += run;
            at = (at + run) % m_capacity;
        }
        return out;
    }

    std::size_t size() const { return m_size; }
    std::size_t capacity() const { return m_capacity; }

  private:
    // The slot at ring position `at`, allocating its block on first use.
    Event *slot(std::size_t at)
    {
        const std::size_t b = at / kBlockEvents;
        if (b >= m_blocks.size()) m_blocks.resize(b + 1);
        if (!m_blocks[b])
            m_blocks[b] = std::make_unique_for_overwrite<Event[]>(
                std::min(kBlockEvents, m_capacity - b * kBlockEvents));
        return m_blocks[b].get() + at % kBlockEvents;
    }

    std::size_t m_capacity;
    std::vector<std::unique_ptr<Event[]>> m_blocks;
    std::size_t m_start = 0; // ring position of the oldest event
    std::size_t m_size = 0;
};

} // namespace shardscope::telemetry

#pragma once
// The bounded recent history a late client receives: the last N events, oldest first.
// Used by one thread (the inspector's consumer).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "telemetry/event.h"

namespace shardscope::telemetry {

class EventHistory
{
  public:
    // Memory grows with use up to capacity events, so a generous capacity costs nothing until used.
    explicit EventHistory(std::size_t capacity) : m_capacity(capacity) {}

    void append(std::span<const Event> events)
    {
        if (m_capacity == 0) return;
        if (events.size() >= m_capacity) {
            m_buf.assign(events.end() - static_cast<std::ptrdiff_t>(m_capacity), events.end());
            m_start = 0;
            return;
        }
        // Fill up to capacity, then overwrite the oldest in at most two runs (no modulo per event).
        const std::size_t fill = std::min(events.size(), m_capacity - m_buf.size());
        m_buf.insert(m_buf.end(), events.begin(),
                     events.begin() + static_cast<std::ptrdiff_t>(fill));
        auto rest = events.subspan(fill);
        while (!rest.empty()) {
            const std::size_t run = std::min(rest.size(), m_capacity - m_start);
            std::copy(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(run),
                      m_buf.begin() + static_cast<std::ptrdiff_t>(m_start));
            m_start = (m_start + run) % m_capacity;
            rest = rest.subspan(run);
        }
    }

    std::vector<Event> events() const
    {
        std::vector<Event> out;
        out.reserve(m_buf.size());
        out.insert(out.end(), m_buf.begin() + static_cast<std::ptrdiff_t>(m_start), m_buf.end());
        out.insert(out.end(), m_buf.begin(), m_buf.begin() + static_cast<std::ptrdiff_t>(m_start));
        return out;
    }

    // The newest `count` events (all if fewer), oldest first.
    std::vector<Event> newest(std::size_t count) const
    {
        const std::size_t n = std::min(count, m_buf.size());
        std::vector<Event> out;
        out.reserve(n);
        for (std::size_t i = m_buf.size() - n; i < m_buf.size(); ++i)
            out.push_back(m_buf[(m_start + i) % m_buf.size()]);
        return out;
    }

    std::size_t size() const { return m_buf.size(); }
    std::size_t capacity() const { return m_capacity; }

  private:
    std::size_t m_capacity;
    std::vector<Event> m_buf;
    std::size_t m_start = 0;
};

} // namespace shardscope::telemetry

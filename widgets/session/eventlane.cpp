#include "session/eventlane.h"

#include <algorithm>
#include <cstring>

namespace shardscope {

std::size_t EventLane::firstIndex(std::uint64_t ts) const
{
    std::size_t lo = 0, hi = m_size;
    while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (at(mid).tsNs < ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

std::size_t EventLane::lastIndex(std::uint64_t ts) const
{
    std::size_t lo = 0, hi = m_size;
    while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (at(mid).tsNs <= ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void EventLane::setCapacity(std::size_t events)
{
    m_capacityChunks =
        events == 0 ? 0 : std::max<std::size_t>(2, (events + kChunkEvents - 1) / kChunkEvents);
}

void EventLane::evictIfFull()
{
    if (m_capacityChunks == 0 || m_chunks.size() < m_capacityChunks || m_size < kChunkEvents)
        return;
    m_chunks.pop_front();
    m_size -= kChunkEvents;
    m_evicted += kChunkEvents;
}

void EventLane::pushBack(const Event &ev)
{
    if (m_size == m_chunks.size() * kChunkEvents) {
        evictIfFull();
        m_chunks.emplace_back(new Event[kChunkEvents]);
    }
    mut(m_size) = ev;
    ++m_size;
}

void EventLane::insert(const Event &ev)
{
    if (m_size == 0 || at(m_size - 1).tsNs <= ev.tsNs) {
        pushBack(ev);
        return;
    }
    const Event last = at(m_size - 1);
    pushBack(last); // may evict the front chunk: positions are computed afterwards
    const std::size_t pos = lastIndex(ev.tsNs);
    for (std::size_t i = m_size - 2; i > pos; --i)
        mut(i) = at(i - 1);
    mut(pos) = ev;
}

bool EventLane::contains(const Event &ev) const
{
    for (std::size_t i = firstIndex(ev.tsNs); i < m_size && at(i).tsNs == ev.tsNs; ++i) {
        if (std::memcmp(&at(i), &ev, sizeof(Event)) == 0) return true;
    }
    return false;
}

void EventLane::clear()
{
    m_chunks.clear();
    m_size = 0;
    m_evicted = 0;
}

} // namespace shardscope

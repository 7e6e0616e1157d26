#include "session/eventlane.h"

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

void EventLane::pushBack(const Event &ev)
{
    if (m_size == m_chunks.size() * kChunkEvents)
        m_chunks.emplace_back(new Event[kChunkEvents]);
    mut(m_size) = ev;
    ++m_size;
}

void EventLane::insert(const Event &ev)
{
    if (m_size == 0 || at(m_size - 1).tsNs <= ev.tsNs) {
        pushBack(ev);
        return;
    }
    const std::size_t pos = lastIndex(ev.tsNs);
    pushBack(at(m_size - 1));
    for (std::size_t i = m_size - 2; i > pos; --i)
        mut(i) = at(i - 1);
    mut(pos) = ev;
}

bool EventLane::contains(const Event &ev) const
{
    for (std::size_t i = firstIndex(ev.tsNs); i < m_size && at(i).tsNs == ev.tsNs; ++i) {
        if (std::memcmp(&at(i), &ev, sizeof(Event)) == 0)
            return true;
    }
    return false;
}

void EventLane::clear()
{
    m_chunks.clear();
    m_size = 0;
}

} // namespace shardscope

#include "session/eventlane.h"

#include <algorithm>
#include <cstring>

namespace shardscope {

std::size_t EventLane::firstIndex(std::uint64_t ts) const
{
    std::size_t lo = 0, hi = m_size;
    while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (tsAt(mid) < ts)
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
        if (tsAt(mid) <= ts)
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

std::uint16_t EventLane::addExtra(Chunk &c, std::uint64_t u1, std::uint64_t u2)
{
    // Out-of-order inserts leave unreferenced entries behind; once they could outgrow
    // the 16-bit index, the side table is rebuilt from the chunk's records.
    if (c.extras.size() >= 2 * kChunkEvents) {
        std::vector<std::array<std::uint64_t, 2>> kept;
        for (std::size_t k = 0; k < kChunkEvents; ++k) {
            Stored &s = c.events[k];
            if (!s.extra) continue;
            kept.push_back(c.extras[s.extra - 1u]);
            s.extra = static_cast<std::uint16_t>(kept.size());
        }
        c.extras = std::move(kept);
    }
    c.extras.push_back({u1, u2});
    return static_cast<std::uint16_t>(c.extras.size());
}

void EventLane::put(std::size_t i, const Event &ev)
{
    Chunk &c = m_chunks[i / kChunkEvents];
    Stored &s = c.events[i % kChunkEvents];
    s.tsNs = ev.tsNs;
    s.step = ev.step;
    s.type = ev.type;
    s.flags = ev.flags;
    s.a = ev.a;
    s.b = ev.b;
    s.u0 = ev.u0;
    s.extra = (ev.u1 | ev.u2) ? addExtra(c, ev.u1, ev.u2) : 0;
}

void EventLane::move(std::size_t from, std::size_t to)
{
    Stored s = rec(from);
    const std::size_t fromChunk = from / kChunkEvents, toChunk = to / kChunkEvents;
    if (s.extra && fromChunk != toChunk) {
        const auto x = m_chunks[fromChunk].extras[s.extra - 1u];
        s.extra = addExtra(m_chunks[toChunk], x[0], x[1]);
    }
    mut(to) = s;
}

void EventLane::pushBack(const Event &ev)
{
    if (m_size == m_chunks.size() * kChunkEvents) {
        evictIfFull();
        m_chunks.push_back(Chunk{std::make_unique<Stored[]>(kChunkEvents), {}});
    }
    put(m_size, ev);
    ++m_size;
}

void EventLane::insert(const Event &ev)
{
    m_rank = ev.rank;
    if (m_size == 0 || tsAt(m_size - 1) <= ev.tsNs) {
        pushBack(ev);
        return;
    }
    pushBack(at(m_size - 1)); // may evict the front chunk: positions are computed afterwards
    const std::size_t pos = lastIndex(ev.tsNs);
    for (std::size_t i = m_size - 2; i > pos; --i)
        move(i - 1, i);
    put(pos, ev);
}

void EventLane::truncate(std::size_t size)
{
    m_size = size;
    m_chunks.resize((size + kChunkEvents - 1) / kChunkEvents);
}

void EventLane::insertMany(std::span<Event> events)
{
    if (events.empty()) return;
    std::stable_sort(events.begin(), events.end(),
                     [](const Event &x, const Event &y) { return x.tsNs < y.tsNs; });
    m_rank = events.front().rank;
    const std::size_t pos = lastIndex(events.front().tsNs);
    // The stored events after the oldest new one are merged with the new ones and
    // appended again; stored ones come first among equal times, as insert() places them.
    std::vector<Event> tail;
    tail.reserve(m_size - pos);
    for (std::size_t i = pos; i < m_size; ++i)
        tail.push_back(at(i));
    truncate(pos);
    std::size_t t = 0, n = 0;
    while (t < tail.size() || n < events.size()) {
        if (n == events.size() || (t < tail.size() && tail[t].tsNs <= events[n].tsNs))
            pushBack(tail[t++]);
        else
            pushBack(events[n++]);
    }
}

bool EventLane::contains(const Event &ev) const
{
    for (std::size_t i = firstIndex(ev.tsNs); i < m_size && tsAt(i) == ev.tsNs; ++i) {
        const Event stored = at(i);
        if (std::memcmp(&stored, &ev, sizeof(Event)) == 0) return true;
    }
    return false;
}

void EventLane::clear()
{
    m_chunks.clear();
    m_size = 0;
    m_evicted = 0;
}

std::size_t EventLane::bytesUsed() const
{
    std::size_t bytes = m_chunks.size() * kChunkEvents * sizeof(Stored);
    for (const Chunk &c : m_chunks)
        bytes += c.extras.capacity() * sizeof(c.extras[0]);
    return bytes;
}

} // namespace shardscope

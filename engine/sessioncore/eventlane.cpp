#include "sessioncore/eventlane.h"

#include <algorithm>
#include <cstring>

namespace shardscope::sessioncore {

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

void EventLane::pushBack(const telemetry::Event &ev)
{
    if (m_size == m_chunks.size() * kChunkEvents) {
        evictIfFull();
        m_chunks.push_back(Chunk{std::make_unique<Stored[]>(kChunkEvents), {}, {}, {}});
    }
    Chunk &c = m_chunks.back();
    const auto j = static_cast<std::uint32_t>(m_size % kChunkEvents);
    const auto high = static_cast<std::uint32_t>(ev.tsNs >> 32);
    if (c.tsHigh.empty() || c.tsHigh.back().second != high) c.tsHigh.emplace_back(j, high);
    if (c.steps.empty() || c.steps.back().second != ev.step) c.steps.emplace_back(j, ev.step);
    Stored &s = c.events[j];
    s.tsLo = static_cast<std::uint32_t>(ev.tsNs);
    s.a = ev.a;
    s.b = ev.b;
    s.type = ev.type;
    s.flags = ev.flags;
    if (ev.u0 > 0xFFFFFFFFu || ev.u1 || ev.u2) {
        c.extras.push_back(Extra{ev.u0, ev.u1, ev.u2, j});
        s.u0 = 0;
        s.extra = static_cast<std::uint16_t>(c.extras.size()); // at most kChunkEvents
    } else {
        s.u0 = static_cast<std::uint32_t>(ev.u0);
        s.extra = 0;
    }
    ++m_size;
}

void EventLane::insert(const telemetry::Event &ev)
{
    m_rank = ev.rank;
    if (m_size == 0 || tsAt(m_size - 1) <= ev.tsNs) {
        pushBack(ev);
        return;
    }
    telemetry::Event one = ev;
    insertMany(std::span<telemetry::Event>(&one, 1));
}

void EventLane::truncate(std::size_t size)
{
    m_size = size;
    m_chunks.resize((size + kChunkEvents - 1) / kChunkEvents);
    const auto kept = static_cast<std::uint32_t>(size % kChunkEvents);
    if (kept == 0 || m_chunks.empty()) return;
    Chunk &c = m_chunks.back();
    while (!c.extras.empty() && c.extras.back().at >= kept)
        c.extras.pop_back();
    while (!c.tsHigh.empty() && c.tsHigh.back().first >= kept)
        c.tsHigh.pop_back();
    while (!c.steps.empty() && c.steps.back().first >= kept)
        c.steps.pop_back();
}

void EventLane::insertMany(std::span<telemetry::Event> events)
{
    if (events.empty()) return;
    std::stable_sort(
        events.begin(), events.end(),
        [](const telemetry::Event &x, const telemetry::Event &y) { return x.tsNs < y.tsNs; });
    m_rank = events.front().rank;
    const std::size_t pos = lastIndex(events.front().tsNs);
    // The stored events after the oldest new one are merged with the new ones and
    // appended again; stored ones come first among equal times, as insert() places them.
    std::vector<telemetry::Event> tail;
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

bool EventLane::contains(const telemetry::Event &ev) const
{
    for (std::size_t i = firstIndex(ev.tsNs); i < m_size && tsAt(i) == ev.tsNs; ++i) {
        const telemetry::Event stored = at(i);
        if (std::memcmp(&stored, &ev, sizeof(telemetry::Event)) == 0) return true;
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
    std::size_t bytes = m_chunks.size() * (kChunkEvents * sizeof(Stored) + sizeof(Chunk));
    for (const Chunk &c : m_chunks)
        bytes += c.extras.capacity() * sizeof(Extra) +
                 (c.tsHigh.capacity() + c.steps.capacity()) * sizeof(Runs::value_type);
    return bytes;
}

} // namespace shardscope::sessioncore

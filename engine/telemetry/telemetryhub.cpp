#include "telemetry/telemetryhub.h"

#include <iterator>

#include "telemetry/clock.h"
#include "telemetry/eventfields.h"

namespace shardscope::telemetry {

namespace {

std::vector<int> allRanks(int worldSize)
{
    std::vector<int> ranks(static_cast<std::size_t>(worldSize < 1 ? 1 : worldSize));
    for (std::size_t r = 0; r < ranks.size(); ++r)
        ranks[r] = static_cast<int>(r);
    return ranks;
}

// Out of line, so the common path (a stamped event) saves no registers.
[[gnu::noinline, gnu::cold]] void pushStamped(EventRing &ring, const Event &ev) noexcept
{
    Event stamped = ev;
    stamped.tsNs = nowNs();
    ring.push(stamped);
}

} // namespace

TelemetryHub::TelemetryHub(int worldSize, std::size_t ringCapacity)
    : TelemetryHub(worldSize, allRanks(worldSize), ringCapacity)
{
}

TelemetryHub::TelemetryHub(int worldSize, const std::vector<int> &localRanks,
                           std::size_t ringCapacity)
{
    const int ranks = worldSize < 1 ? 1 : worldSize;
    m_rings.resize(static_cast<std::size_t>(ranks));
    for (int r : localRanks)
        if (r >= 0 && r < ranks && !m_rings[static_cast<std::size_t>(r)]) {
            m_rings[static_cast<std::size_t>(r)] = std::make_unique<EventRing>(ringCapacity);
            ++m_localRings;
        }
    m_capacity = ringCapacity;
    for (const auto &ring : m_rings)
        if (ring) {
            m_capacity = ring->capacity(); // as the ring rounded it
            break;
        }
    m_reportedDrops.assign(static_cast<std::size_t>(ranks), 0);
}

void TelemetryHub::write(const Event &ev) noexcept
{
    if (ev.rank >= m_rings.size() || !m_rings[ev.rank]) [[unlikely]] {
        m_badRank.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    if (ev.tsNs == 0) [[unlikely]] {
        pushStamped(*m_rings[ev.rank], ev);
        return;
    }
    m_rings[ev.rank]->push(ev);
}

std::size_t TelemetryHub::drain(std::vector<Event> &out)
{
    const std::size_t before = out.size();
    for (std::size_t r = 0; r < m_rings.size(); ++r) {
        if (!m_rings[r]) continue;
        EventRing &ring = *m_rings[r];
        const std::uint64_t dropped = ring.dropped();
        if (dropped != m_reportedDrops[r]) {
            out.push_back(stamped(makeDroppedEvents(dropped - m_reportedDrops[r]), nowNs(), 0,
                                  static_cast<std::uint16_t>(r)));
            m_reportedDrops[r] = dropped;
        }
        Event chunk[256];
        for (;;) {
            const std::size_t n = ring.pop(chunk, std::size(chunk));
            out.insert(out.end(), chunk, chunk + n);
            if (n < std::size(chunk)) break;
        }
    }
    return out.size() - before;
}

std::uint64_t TelemetryHub::droppedEvents() const
{
    std::uint64_t total = m_badRank.load(std::memory_order_relaxed);
    for (const auto &ring : m_rings)
        if (ring) total += ring->dropped();
    return total;
}

std::uint64_t TelemetryHub::droppedEvents(int rank) const
{
    if (rank < 0 || static_cast<std::size_t>(rank) >= m_rings.size() ||
        !m_rings[static_cast<std::size_t>(rank)])
        return 0;
    return m_rings[static_cast<std::size_t>(rank)]->dropped();
}

std::uint64_t TelemetryHub::writtenEvents() const
{
    std::uint64_t total = 0;
    for (const auto &ring : m_rings)
        if (ring) total += ring->pushed();
    return total;
}

} // namespace shardscope::telemetry

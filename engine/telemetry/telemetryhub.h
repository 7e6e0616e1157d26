#pragma once
// The engine's event sink for live inspection: one EventRing per rank, written by that
// rank's thread (one clock read at most, one 48-byte copy, one release store) and drained
// by one consumer thread that also turns ring overflows into DroppedEvents records.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "telemetry/event.h"
#include "telemetry/eventring.h"

namespace shardscope::telemetry {

class TelemetryHub final : public EventSink
{
  public:
    static constexpr std::size_t kDefaultRingCapacity = 1u << 16;

    explicit TelemetryHub(int worldSize, std::size_t ringCapacity = kDefaultRingCapacity);
    // Rings only for the ranks this process runs (one per process under torchrun): events of
    // other ranks are counted as dropped, and no memory is spent on rings nobody writes.
    TelemetryHub(int worldSize, const std::vector<int> &localRanks,
                 std::size_t ringCapacity = kDefaultRingCapacity);

    // Training threads. Events of one rank must come from one thread at a time (the rank's
    // thread, or model-building code while no rank runs). A zero timestamp is stamped here.
    void write(const Event &ev) noexcept override;

    // Consumer thread: appends every waiting event to out (each rank's in order), preceded
    // per rank by a DroppedEvents record when that ring overflowed since the last drain.
    // Returns how many records were appended.
    std::size_t drain(std::vector<Event> &out);

    int rankCount() const { return static_cast<int>(m_rings.size()); }
    int localRingCount() const { return m_localRings; } // rings of this process's ranks
    std::size_t ringCapacity() const { return m_capacity; }
    // Any thread.
    std::uint64_t droppedEvents() const; // all ranks, including events of unknown ranks
    std::uint64_t droppedEvents(int rank) const;
    std::uint64_t writtenEvents() const; // accepted into a ring

  private:
    std::vector<std::unique_ptr<EventRing>> m_rings; // by rank; null for ranks of other processes
    std::size_t m_capacity = 0;
    int m_localRings = 0;
    std::vector<std::uint64_t> m_reportedDrops; // consumer-owned
    std::atomic<std::uint64_t> m_badRank{0};
};

} // namespace shardscope::telemetry

#pragma once
// Folds the frames a client receives after the handshake into one Snapshot: the latest
// state, the events received (history, then live) and every loss it was told about.
// shardscope-capture writes this snapshot; a GUI store can mirror it.

#include <cstddef>
#include <cstdint>

#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/snapshot.h"

namespace shardscope::wire {

class ClientState
{
  public:
    // Keeps at most maxEvents events (the oldest are evicted and counted as dropped).
    explicit ClientState(std::size_t maxEvents = 1000000);

    // Applies one frame received after the Welcome. An undecodable payload, an Error
    // frame (its message) or a frame out of order is an error; the state is unchanged.
    Status apply(const Frame &frame);

    // state: the latest State; events: oldest first; droppedEvents: the engine's own
    // count from the latest State + drops reported to this client + evicted events.
    const Snapshot &snapshot() const { return m_snapshot; }
    bool hasState() const { return m_stateCount > 0; }
    std::uint64_t stateCount() const { return m_stateCount; }
    bool historyDone() const { return m_historyDone; }
    bool finished() const { return m_finished; }
    const Goodbye &goodbye() const { return m_goodbye; }
    std::uint64_t historyEvents() const { return m_historyEvents; }
    std::uint64_t liveEvents() const { return m_liveEvents; }
    std::uint64_t clientDropped() const { return m_clientDropped; }
    std::uint64_t droppedNotices() const { return m_droppedNotices; }
    // The newest step seen in a State or a StepEnd event.
    std::uint32_t latestCompletedStep() const { return m_completedStep; }

  private:
    void addEvents(std::vector<telemetry::Event> &&events);
    void updateDropped();

    std::size_t m_maxEvents;
    Snapshot m_snapshot;
    std::uint64_t m_engineDropped = 0;
    std::uint64_t m_stateCount = 0;
    bool m_inHistory = false;
    bool m_historyDone = false;
    bool m_finished = false;
    Goodbye m_goodbye;
    std::uint64_t m_historyEvents = 0;
    std::uint64_t m_liveEvents = 0;
    std::uint64_t m_clientDropped = 0;
    std::uint64_t m_droppedNotices = 0;
    std::uint64_t m_evicted = 0;
    std::uint32_t m_completedStep = 0;
};

} // namespace shardscope::wire

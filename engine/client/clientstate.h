#pragma once
// The capture's fold of a connection: the frames after the handshake, reduced by the one
// FrameReducer, kept as one Snapshot: the latest state, the events received (history, then
// live) and every loss it was told about. shardscope-capture writes this snapshot; the
// inspector's ConnectionWorker is the reducer's other sink.

#include <cstddef>
#include <cstdint>

#include "client/framereducer.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/snapshot.h"

namespace shardscope::client {

class ClientState : private FrameSink
{
  public:
    // Keeps at most maxEvents events (the oldest are evicted and counted as dropped).
    explicit ClientState(std::size_t maxEvents = 1000000);

    // Applies one frame received after the Welcome (FrameReducer::apply). An undecodable
    // payload, an Error frame (its message) or a frame out of order is an error; the state
    // is unchanged.
    wire::Status apply(const wire::Frame &frame);

    // state: the latest State; events: oldest first; droppedEvents: the engine's own
    // count from the latest State + drops reported to this client + evicted events.
    const wire::Snapshot &snapshot() const { return m_snapshot; }
    bool hasState() const { return m_stateCount > 0; }
    std::uint64_t stateCount() const { return m_stateCount; }
    bool historyDone() const { return m_reducer.historyDone(); }
    bool finished() const { return m_reducer.finished(); }
    const wire::Goodbye &goodbye() const { return m_goodbye; }
    std::uint64_t historyEvents() const { return m_historyEvents; }
    std::uint64_t liveEvents() const { return m_liveEvents; }
    std::uint64_t clientDropped() const { return m_clientDropped; }
    std::uint64_t droppedNotices() const { return m_droppedNotices; }
    // The newest step seen in a State or a StepEnd event.
    std::uint32_t latestCompletedStep() const { return m_completedStep; }

  private:
    void onState(wire::Snapshot &&snapshot) override;
    void onEvents(std::vector<telemetry::Event> &&events, bool history) override;
    void onDropped(const wire::DroppedNotice &notice) override;
    void onGoodbye(wire::Goodbye &&goodbye) override;
    void updateDropped();

    FrameReducer m_reducer;
    std::size_t m_maxEvents;
    wire::Snapshot m_snapshot;
    std::uint64_t m_engineDropped = 0;
    std::uint64_t m_stateCount = 0;
    wire::Goodbye m_goodbye;
    std::uint64_t m_historyEvents = 0;
    std::uint64_t m_liveEvents = 0;
    std::uint64_t m_clientDropped = 0;
    std::uint64_t m_droppedNotices = 0;
    std::uint64_t m_evicted = 0;
    std::uint32_t m_completedStep = 0;
};

} // namespace shardscope::client

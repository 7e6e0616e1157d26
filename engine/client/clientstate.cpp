#include "client/clientstate.h"

#include <algorithm>

namespace shardscope::client {

ClientState::ClientState(std::size_t maxEvents) : m_maxEvents(std::max<std::size_t>(maxEvents, 1))
{
}

wire::Status ClientState::apply(const wire::Frame &frame)
{
    return m_reducer.apply(frame, *this);
}

void ClientState::updateDropped()
{
    m_snapshot.droppedEvents = m_engineDropped + m_clientDropped + m_evicted;
}

void ClientState::onState(wire::Snapshot &&snap)
{
    m_snapshot.meta = std::move(snap.meta);
    m_snapshot.state = std::move(snap.state);
    m_engineDropped = snap.droppedEvents;
    ++m_stateCount;
    updateDropped();
}

void ClientState::onEvents(std::vector<telemetry::Event> &&events, bool history)
{
    (history ? m_historyEvents : m_liveEvents) += events.size();
    for (const telemetry::Event &e : events)
        if (e.type == EventType::StepEnd) m_completedStep = std::max(m_completedStep, e.step);
    auto &all = m_snapshot.events;
    all.insert(all.end(), events.begin(), events.end());
    // Evict in chunks so a long capture stays linear.
    if (all.size() > m_maxEvents + m_maxEvents / 4) {
        const std::size_t excess = all.size() - m_maxEvents;
        all.erase(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(excess));
        m_evicted += excess;
        updateDropped();
    }
}

void ClientState::onDropped(const wire::DroppedNotice &notice)
{
    m_clientDropped += notice.dropped;
    ++m_droppedNotices;
    updateDropped();
}

void ClientState::onGoodbye(wire::Goodbye &&bye)
{
    m_goodbye = std::move(bye);
    m_completedStep = std::max(m_completedStep, m_snapshot.state.step);
}

} // namespace shardscope::client

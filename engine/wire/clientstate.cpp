#include "wire/clientstate.h"

#include <algorithm>

#include "wire/statebinary.h"

namespace shardscope::wire {

ClientState::ClientState(std::size_t maxEvents) : m_maxEvents(std::max<std::size_t>(maxEvents, 1))
{
}

void ClientState::updateDropped()
{
    m_snapshot.droppedEvents = m_engineDropped + m_clientDropped + m_evicted;
}

void ClientState::addEvents(std::vector<telemetry::Event> &&events)
{
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

Status ClientState::apply(const Frame &frame)
{
    switch (frame.type) {
    case MessageType::State:
    case MessageType::StateBinary: {
        auto snap = decodeStateFrame(frame);
        if (!snap) return fail("bad state from the engine: " + snap.error());
        m_snapshot.meta = std::move(snap->meta);
        m_snapshot.state = std::move(snap->state);
        m_engineDropped = snap->droppedEvents;
        ++m_stateCount;
        updateDropped();
        return success();
    }
    case MessageType::HistoryBegin: {
        auto count = decodeHistoryBegin(frame.payload);
        if (!count) return fail(count.error());
        if (m_inHistory || m_historyDone) return fail("the engine sent a second history");
        m_inHistory = true;
        return success();
    }
    case MessageType::EventBatch: {
        auto events = decodeEvents(frame.payload);
        if (!events) return fail(events.error());
        (m_inHistory ? m_historyEvents : m_liveEvents) += events->size();
        addEvents(std::move(events.value()));
        return success();
    }
    case MessageType::HistoryEnd:
        if (!m_inHistory) return fail("the engine ended a history it never began");
        m_inHistory = false;
        m_historyDone = true;
        return success();
    case MessageType::Dropped: {
        auto notice = decodeDropped(frame.payload);
        if (!notice) return fail(notice.error());
        m_clientDropped += notice->dropped;
        ++m_droppedNotices;
        updateDropped();
        return success();
    }
    case MessageType::Goodbye: {
        auto bye = decodeGoodbye(frame.payload);
        if (!bye) return fail(bye.error());
        m_goodbye = std::move(bye.value());
        m_finished = true;
        m_completedStep = std::max(m_completedStep, m_snapshot.state.step);
        return success();
    }
    case MessageType::Error: {
        auto err = decodeError(frame.payload);
        if (!err) return fail("the engine reported an error (" + err.error() + ")");
        return fail("the engine reported an error: " + err->message);
    }
    case MessageType::Hello:
    case MessageType::Welcome:
    case MessageType::ClockRequest:
    case MessageType::ClockReply:
        break;
    }
    return fail("unexpected " + std::string(messageTypeName(frame.type)) +
                " frame after the handshake");
}

} // namespace shardscope::wire

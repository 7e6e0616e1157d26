#include "client/framereducer.h"

#include <utility>

#include "wire/statebinary.h"

namespace shardscope::client {

wire::Status FrameReducer::fail(std::string message, bool refused)
{
    m_error = {message, refused};
    return wire::fail(std::move(message));
}

wire::Status FrameReducer::apply(const wire::Frame &frame, FrameSink &sink)
{
    using wire::MessageType;
    if (m_finished)
        return fail("the engine sent a " + std::string(wire::messageTypeName(frame.type)) +
                        " frame after its Goodbye",
                    true);
    switch (frame.type) {
    case MessageType::State:
    case MessageType::StateBinary: {
        auto snap = wire::decodeStateFrame(frame);
        if (!snap)
            return fail("bad state from the engine: " + snap.error() +
                            "; check that the engine and this client are the same ShardScope "
                            "version",
                        true);
        sink.onState(std::move(snap).value());
        return wire::success();
    }
    case MessageType::HistoryBegin: {
        auto count = wire::decodeHistoryBegin(frame.payload);
        if (!count) return fail("bad history from the engine: " + count.error(), true);
        if (m_inHistory || m_historyDone) return fail("the engine sent a second history", true);
        m_inHistory = true;
        sink.onHistoryBegin();
        return wire::success();
    }
    case MessageType::EventBatch: {
        auto events = wire::decodeEvents(frame.payload);
        if (!events)
            return fail("the engine sent events that could not be decoded: " + events.error(),
                        true);
        sink.onEvents(std::move(events).value(), m_inHistory);
        return wire::success();
    }
    case MessageType::HistoryEnd:
        if (!m_inHistory) return fail("the engine ended a history it never began", true);
        m_inHistory = false;
        m_historyDone = true;
        sink.onHistoryEnd();
        return wire::success();
    case MessageType::Dropped: {
        auto notice = wire::decodeDropped(frame.payload);
        if (!notice) return fail("bad drop notice from the engine: " + notice.error(), true);
        sink.onDropped(*notice);
        return wire::success();
    }
    case MessageType::Goodbye: {
        auto bye = wire::decodeGoodbye(frame.payload);
        if (!bye) return fail("bad goodbye from the engine: " + bye.error(), true);
        m_finished = true;
        m_inHistory = false;
        sink.onGoodbye(std::move(bye).value());
        return wire::success();
    }
    case MessageType::Error: {
        // The engine refuses a client for good with these codes; anything else (too many
        // clients, a server shutting down) may pass.
        auto err = wire::decodeError(frame.payload);
        if (!err) return fail("the engine reported an error (" + err.error() + ")", false);
        return fail("the engine reported an error: " + err->message,
                    err->code == "bad_token" || err->code == "version_mismatch");
    }
    case MessageType::Hello:
    case MessageType::Welcome:
    case MessageType::ClockRequest:
    case MessageType::ClockReply:
        break;
    }
    return fail("unexpected " + std::string(wire::messageTypeName(frame.type)) +
                    " frame after the handshake",
                true);
}

} // namespace shardscope::client

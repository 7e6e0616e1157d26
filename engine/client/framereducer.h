#pragma once
// The one reducer of the frames a client receives after the Welcome: it decodes each frame,
// keeps the protocol's order (one history, begun before it ends; nothing after Goodbye) and
// hands what it means to a FrameSink: a State, a batch of events (history or live), the end
// of the history, a drop notice, the Goodbye. An Error frame, an undecodable payload or a
// frame out of order is an error, with whether retrying could help. shardscope-capture's
// ClientState and the inspector's ConnectionWorker are its two sinks; neither decodes a
// frame itself.

#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/event.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/result.h"
#include "wire/snapshot.h"

namespace shardscope::client {

class FrameSink
{
  public:
    virtual ~FrameSink() = default;
    // A State (JSON or binary, decoded alike); the sink may take it apart.
    virtual void onState(wire::Snapshot &&snapshot) = 0;
    // Events as they arrived, oldest first; history: between HistoryBegin and HistoryEnd.
    virtual void onEvents(std::vector<telemetry::Event> &&events, bool history) = 0;
    virtual void onHistoryBegin() {}
    virtual void onHistoryEnd() {}
    virtual void onDropped(const wire::DroppedNotice &notice) = 0;
    virtual void onGoodbye(wire::Goodbye &&goodbye) = 0;
};

// Why a frame could not be applied. refused: the engine refused this client (a wrong token,
// another protocol version) or sent what this client cannot read; reconnecting as it is
// will not help.
struct FrameError
{
    std::string message;
    bool refused = false;
};

class FrameReducer
{
  public:
    // Applies one frame received after the Welcome; on an error nothing reached the sink.
    // After Goodbye every frame is an error.
    wire::Status apply(const wire::Frame &frame, FrameSink &sink);
    // The error of the last apply that failed (message and refused).
    const FrameError &lastError() const { return m_error; }

    bool inHistory() const { return m_inHistory; }
    bool historyDone() const { return m_historyDone; }
    bool finished() const { return m_finished; }

  private:
    wire::Status fail(std::string message, bool refused);

    bool m_inHistory = false;
    bool m_historyDone = false;
    bool m_finished = false;
    FrameError m_error;
};

} // namespace shardscope::client

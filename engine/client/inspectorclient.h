#pragma once
// A blocking client of the inspector endpoint (POSIX sockets): connects, does the
// handshake and hands out decoded frames. shardscope-capture and the tests use it; the
// Qt GUI speaks the same protocol through QLocalSocket/QTcpSocket with the same Hello
// (helloFrame), and both reduce the frames after the Welcome with client::FrameReducer.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wire/clocksync.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/result.h"

namespace shardscope::client {

class InspectorClient;
wire::Result<wire::ClockEstimate> probeClock(std::string_view endpoint, int samples, int timeoutMs);

class InspectorClient
{
  public:
    struct Options
    {
        std::string token;
        std::string name = "shardscope-client";
        std::uint16_t version = wire::kProtocolVersion; // tests send others
        // What the Hello lists; without "state_binary" the engine sends JSON States.
        std::vector<std::string> capabilities = wire::Hello{}.capabilities;
        int handshakeTimeoutMs = 10000;
    };

    // Connects and completes the handshake; a refusal carries the engine's reason.
    static wire::Result<std::unique_ptr<InspectorClient>> connect(std::string_view endpoint,
                                                                  const Options &options);
    ~InspectorClient();
    InspectorClient(const InspectorClient &) = delete;
    InspectorClient &operator=(const InspectorClient &) = delete;

    // The Hello frame these options send (the inspector's ConnectionWorker sends it too).
    static std::string helloFrame(const Options &options);

    const wire::Welcome &welcome() const { return m_welcome; }

    // The next frame; std::nullopt when none arrived within timeoutMs; an error when the
    // engine closed the connection ("the engine closed the connection") or sent bad bytes.
    wire::Result<std::optional<wire::Frame>> next(int timeoutMs);

    int fd() const { return m_fd; }

  private:
    friend wire::Result<wire::ClockEstimate> probeClock(std::string_view, int, int);
    explicit InspectorClient(int fd);

    int m_fd;
    wire::FrameDecoder m_decoder;
    wire::Welcome m_welcome;
};

// Probes the server's telemetry clock on a connection of its own (docs/protocol.md, "Clock
// probes"): `samples` round trips, the best one estimates the offset of the server's clock
// from ours (telemetry/clock.h). An engine of an older release answers with an Error: that
// error is returned, as are an unreachable endpoint and silence for timeoutMs.
wire::Result<wire::ClockEstimate> probeClock(std::string_view endpoint, int samples = 8,
                                             int timeoutMs = 1000);

// Sends bytes on a blocking socket; false on error.
bool sendAll(int fd, std::string_view bytes);

} // namespace shardscope::client

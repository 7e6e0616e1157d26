#include "client/inspectorclient.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "telemetry/clock.h"
#include "wire/endpoint.h"

#include <vector>

namespace shardscope::client {

bool sendAll(int fd, std::string_view bytes)
{
    while (!bytes.empty()) {
        const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
}

InspectorClient::InspectorClient(int fd) : m_fd(fd) {}

std::string InspectorClient::helloFrame(const Options &options)
{
    wire::Hello hello;
    hello.version = options.version;
    hello.capabilities = options.capabilities;
    hello.token = options.token;
    hello.client = options.name;
    return wire::encodeFrame(wire::MessageType::Hello, wire::encodeHello(hello));
}

InspectorClient::~InspectorClient()
{
    if (m_fd >= 0) ::close(m_fd);
}

wire::Result<std::unique_ptr<InspectorClient>> InspectorClient::connect(std::string_view endpoint,
                                                                        const Options &options)
{
    auto fd = wire::connectTo(endpoint);
    if (!fd) return wire::fail(fd.error());
    std::unique_ptr<InspectorClient> client(new InspectorClient(*fd));
    if (!sendAll(client->m_fd, helloFrame(options)))
        return wire::fail("cannot send the handshake to " + std::string(endpoint) + ": " +
                          std::strerror(errno));
    auto first = client->next(options.handshakeTimeoutMs);
    if (!first)
        return wire::fail("handshake with " + std::string(endpoint) + " failed: " + first.error());
    if (!first->has_value())
        return wire::fail("handshake with " + std::string(endpoint) +
                          " timed out: the endpoint "
                          "accepted the connection but sent no answer; is it a ShardScope engine?");
    auto welcome = wire::acceptWelcome(**first);
    if (!welcome) return wire::fail(welcome.error());
    client->m_welcome = std::move(welcome.value());
    return client;
}

wire::Result<std::optional<wire::Frame>> InspectorClient::next(int timeoutMs)
{
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    for (;;) {
        auto frame = m_decoder.next();
        if (!frame) return wire::fail(frame.error());
        if (frame->has_value()) return frame;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) return std::optional<wire::Frame>{};
        pollfd p{m_fd, POLLIN, 0};
        const int rc = ::poll(&p, 1, static_cast<int>(left));
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return wire::fail(std::string("poll failed: ") + std::strerror(errno));
        if (rc == 0) return std::optional<wire::Frame>{};
        char buf[1 << 16];
        const ssize_t n = ::recv(m_fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0)
            return wire::fail(std::string("connection to the engine failed: ") +
                              std::strerror(errno));
        if (n == 0) return wire::fail("the engine closed the connection");
        m_decoder.feed(buf, static_cast<std::size_t>(n));
    }
}

wire::Result<wire::ClockEstimate> probeClock(std::string_view endpoint, int samples, int timeoutMs)
{
    auto fd = wire::connectTo(endpoint);
    if (!fd) return wire::fail(fd.error());
    InspectorClient conn(*fd); // only for its frame reader; no handshake on a probe
    std::vector<wire::ClockSample> taken;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    for (int i = 0; i < samples; ++i) {
        const std::uint64_t sent = telemetry::nowNs();
        if (!sendAll(conn.fd(), wire::encodeFrame(wire::MessageType::ClockRequest,
                                                  wire::encodeClockRequest(sent))))
            return wire::fail("cannot send a clock probe to " + std::string(endpoint) + ": " +
                              std::strerror(errno));
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  deadline - std::chrono::steady_clock::now())
                                  .count();
            auto frame = conn.next(static_cast<int>(std::max<long long>(left, 0)));
            const std::uint64_t received = telemetry::nowNs();
            if (!frame) return wire::fail(frame.error());
            if (!frame->has_value())
                return wire::fail("no answer to a clock probe from " + std::string(endpoint) +
                                  " within " + std::to_string(timeoutMs) + " ms");
            const wire::Frame &f = **frame;
            if (f.type == wire::MessageType::Error) {
                auto err = wire::decodeError(f.payload);
                return wire::fail("the engine does not answer clock probes (" +
                                  (err ? err->code + ": " + err->message : f.payload) + ")");
            }
            if (f.type != wire::MessageType::ClockReply)
                return wire::fail("unexpected " + std::string(wire::messageTypeName(f.type)) +
                                  " frame in answer to a clock probe");
            auto reply = wire::decodeClockReply(f.payload);
            if (!reply) return wire::fail(reply.error());
            if (reply->echo != sent) continue; // an answer to an earlier probe
            taken.push_back({sent, reply->serverNs, received});
            break;
        }
    }
    return wire::estimateClockOffset(taken);
}

} // namespace shardscope::client

#include "server/inspectorclient.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/sockets.h"

namespace shardscope::server {

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

InspectorClient::~InspectorClient()
{
    if (m_fd >= 0) ::close(m_fd);
}

wire::Result<std::unique_ptr<InspectorClient>> InspectorClient::connect(std::string_view endpoint,
                                                                        const Options &options)
{
    auto fd = connectTo(endpoint);
    if (!fd) return wire::fail(fd.error());
    std::unique_ptr<InspectorClient> client(new InspectorClient(*fd));
    wire::Hello hello;
    hello.version = options.version;
    hello.token = options.token;
    hello.client = options.name;
    if (!sendAll(client->m_fd,
                 wire::encodeFrame(wire::MessageType::Hello, wire::encodeHello(hello))))
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

} // namespace shardscope::server

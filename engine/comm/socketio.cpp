#include "comm/socketio.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace shardscope::comm::detail {

int connectWithRetries(const std::string &host, int port, SocketClock::time_point deadline,
                       const std::atomic<bool> *stop, std::string &lastError,
                       const std::function<bool(int fd, std::string &error)> &handshake)
{
    lastError = "no attempt";
    while (!(stop && stop->load())) {
        addrinfo hints{};
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo *res = nullptr;
        const std::string service = std::to_string(port);
        const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
        if (gai != 0) {
            lastError = std::string("cannot resolve MASTER_ADDR: ") + ::gai_strerror(gai);
        } else {
            const int fd =
                ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
            const bool connected = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
            lastError = connected ? "" : std::strerror(errno);
            ::freeaddrinfo(res);
            if (connected) {
                const int one = 1;
                ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                bool done = false;
                try {
                    done = handshake(fd, lastError);
                } catch (...) {
                    ::close(fd);
                    throw;
                }
                if (done) return fd;
            }
            if (fd >= 0) ::close(fd);
        }
        if (SocketClock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, msLeft(deadline) + 1)));
    }
    return -1;
}

int msLeft(SocketClock::time_point deadline)
{
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SocketClock::now());
    return left.count() > 0 ? static_cast<int>(std::min<long long>(left.count(), 1 << 30)) : 0;
}

Io ioAll(int fd, void *buf, std::size_t n, SocketClock::time_point deadline, bool write,
         const std::atomic<bool> *stop)
{
    constexpr int kSliceMs = 100;
    auto *p = static_cast<char *>(buf);
    while (n > 0) {
        if (stop && stop->load()) return Io::Stopped;
        const int wait = stop ? std::min(msLeft(deadline), kSliceMs) : msLeft(deadline);
        pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
        const int r = ::poll(&pfd, 1, wait);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return Io::Closed;
        if (r == 0) {
            if (SocketClock::now() >= deadline) return Io::Timeout;
            continue;
        }
        const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) return Io::Closed;
        p += k;
        n -= static_cast<std::size_t>(k);
    }
    return Io::Done;
}

void putU32(unsigned char *p, std::uint32_t v)
{
    for (int i = 0; i < 4; ++i)
        p[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::uint32_t getU32(const unsigned char *p)
{
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
        v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
    return v;
}

std::string secondsText(std::chrono::milliseconds t)
{
    const long long ms = t.count();
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
    return std::to_string(ms) + " ms";
}

} // namespace shardscope::comm::detail

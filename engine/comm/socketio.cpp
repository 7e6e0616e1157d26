#include "comm/socketio.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace shardscope::detail {

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

} // namespace shardscope::detail

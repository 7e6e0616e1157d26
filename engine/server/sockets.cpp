#include "server/sockets.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace shardscope::server {

namespace {

std::string errnoText()
{
    return std::strerror(errno);
}

bool isLoopbackAddress(const sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const auto *in = reinterpret_cast<const sockaddr_in *>(sa);
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(sa);
        if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
    }
    return false;
}

struct AddrInfo
{
    addrinfo *list = nullptr;
    ~AddrInfo()
    {
        if (list) ::freeaddrinfo(list);
    }
};

} // namespace

bool setNonBlocking(int fd)
{
    const int flags = ::fcntl(fd, F_GETFL, 0);
    return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

wire::Status ensurePrivateDir(const std::string &dir)
{
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
        return wire::fail("cannot create " + dir + ": " + errnoText());
    struct stat st
    {
    };
    if (::lstat(dir.c_str(), &st) != 0)
        return wire::fail("cannot inspect " + dir + ": " + errnoText());
    if (!S_ISDIR(st.st_mode))
        return wire::fail(
            dir + " is not a directory; remove it so ShardScope can create its private directory");
    if (st.st_uid != ::getuid())
        return wire::fail(dir + " belongs to another user; remove it or set XDG_RUNTIME_DIR");
    if ((st.st_mode & 077) != 0 && ::chmod(dir.c_str(), 0700) != 0)
        return wire::fail(
            dir + " is accessible by other users and cannot be made private: " + errnoText());
    return wire::success();
}

wire::Result<Listener> listenOn(const wire::Endpoint &endpoint, bool haveToken)
{
    Listener l;
    l.bound = endpoint;
    if (endpoint.kind == wire::Endpoint::Kind::Unix) {
        auto addr = wire::unixSocketAddress(endpoint.path);
        if (!addr) return wire::fail(addr.error());
        struct stat st
        {
        };
        if (::lstat(endpoint.path.c_str(), &st) == 0) {
            if (!S_ISSOCK(st.st_mode))
                return wire::fail(endpoint.path +
                                  " exists and is not a socket; choose another path");
            const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            const bool live =
                probe >= 0 && ::connect(probe, reinterpret_cast<const sockaddr *>(&*addr),
                                        sizeof(sockaddr_un)) == 0;
            if (probe >= 0) ::close(probe);
            if (live)
                return wire::fail("another engine is already listening on " + endpoint.path +
                                  "; choose another --listen path");
            ::unlink(endpoint.path.c_str());
        }
        l.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (l.fd < 0) return wire::fail("cannot create a Unix socket: " + errnoText());
        if (::bind(l.fd, reinterpret_cast<const sockaddr *>(&*addr), sizeof(sockaddr_un)) != 0) {
            const std::string why = errnoText();
            ::close(l.fd);
            return wire::fail("cannot listen on " + endpoint.path + ": " + why);
        }
        l.socketPath = endpoint.path;
        if (::chmod(endpoint.path.c_str(), 0600) != 0 || ::listen(l.fd, 16) != 0 ||
            !setNonBlocking(l.fd)) {
            const std::string why = errnoText();
            ::close(l.fd);
            ::unlink(endpoint.path.c_str());
            return wire::fail("cannot listen on " + endpoint.path + ": " + why);
        }
        return l;
    }

    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    AddrInfo res;
    const std::string port = std::to_string(endpoint.port);
    if (const int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &res.list);
        rc != 0)
        return wire::fail("cannot resolve host \"" + endpoint.host + "\": " + ::gai_strerror(rc));
    for (const addrinfo *ai = res.list; ai; ai = ai->ai_next)
        if (!isLoopbackAddress(ai->ai_addr) && !haveToken)
            return wire::fail("refusing to listen on " + wire::formatEndpoint(endpoint) +
                              " without a token: " + endpoint.host +
                              " is reachable from other machines and the endpoint exposes the "
                              "model's state; pass --token SECRET, or listen on 127.0.0.1");
    std::string lastError = "no address";
    for (const addrinfo *ai = res.list; ai; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            lastError = errnoText();
            continue;
        }
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 16) != 0 ||
            !setNonBlocking(fd)) {
            lastError = errnoText();
            ::close(fd);
            continue;
        }
        sockaddr_storage bound{};
        socklen_t len = sizeof bound;
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&bound), &len);
        char host[NI_MAXHOST];
        char serv[NI_MAXSERV];
        if (::getnameinfo(reinterpret_cast<sockaddr *>(&bound), len, host, sizeof host, serv,
                          sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
            l.bound.host = host;
            l.bound.port = static_cast<std::uint16_t>(std::atoi(serv));
        }
        l.fd = fd;
        return l;
    }
    return wire::fail("cannot listen on " + wire::formatEndpoint(endpoint) + ": " + lastError);
}

} // namespace shardscope::server

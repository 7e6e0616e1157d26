#include "wire/endpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

namespace shardscope::wire {

namespace {

std::string errnoText()
{
    return std::strerror(errno);
}

struct AddrInfo
{
    addrinfo *list = nullptr;
    ~AddrInfo()
    {
        if (list) ::freeaddrinfo(list);
    }
};

bool parsePort(std::string_view s, std::uint16_t &out)
{
    if (s.empty() || s.size() > 5) return false;
    unsigned v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<unsigned>(c - '0');
    }
    if (v > 65535) return false;
    out = static_cast<std::uint16_t>(v);
    return true;
}

const char *kEndpointHelp = "; use unix:PATH or tcp:HOST:PORT (e.g. tcp:127.0.0.1:0)";

} // namespace

Result<Endpoint> parseEndpoint(std::string_view text)
{
    Endpoint e;
    if (text.starts_with("unix:")) {
        e.kind = Endpoint::Kind::Unix;
        e.path = std::string(text.substr(5));
        if (e.path.empty())
            return fail("endpoint \"" + std::string(text) + "\" has no socket path" +
                        kEndpointHelp);
        if (e.path.find('\0') != std::string::npos)
            return fail("endpoint socket path contains a NUL byte");
        return e;
    }
    if (text.starts_with("tcp:")) {
        e.kind = Endpoint::Kind::Tcp;
        std::string_view rest = text.substr(4);
        std::string_view host;
        std::string_view port;
        if (rest.starts_with("[")) {
            const auto close = rest.find(']');
            if (close == std::string_view::npos || close + 1 >= rest.size() ||
                rest[close + 1] != ':')
                return fail("endpoint \"" + std::string(text) + "\" has a malformed [IPv6] host" +
                            kEndpointHelp);
            host = rest.substr(1, close - 1);
            port = rest.substr(close + 2);
        } else {
            const auto colon = rest.rfind(':');
            if (colon == std::string_view::npos)
                return fail("endpoint \"" + std::string(text) + "\" has no port" + kEndpointHelp);
            host = rest.substr(0, colon);
            port = rest.substr(colon + 1);
            if (host.find(':') != std::string_view::npos)
                return fail("endpoint \"" + std::string(text) +
                            "\": write an IPv6 host in brackets, e.g. tcp:[::1]:7000");
        }
        if (host.empty())
            return fail("endpoint \"" + std::string(text) + "\" has no host" + kEndpointHelp);
        if (!parsePort(port, e.port))
            return fail("endpoint \"" + std::string(text) + "\" has a bad port \"" +
                        std::string(port) + "\" (0-65535)" + kEndpointHelp);
        e.host = std::string(host);
        return e;
    }
    return fail("unknown endpoint \"" + std::string(text) + "\"" + kEndpointHelp);
}

namespace {

std::string_view trimmed(std::string_view s)
{
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
        s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
        s.remove_suffix(1);
    return s;
}

} // namespace

Result<AttachTarget> parseAttachTarget(std::string_view text)
{
    const std::string_view s = trimmed(text);
    AttachTarget target;
    if (s.starts_with("job:")) {
        target.job = std::string(trimmed(s.substr(4)));
        if (target.job.empty())
            return fail("job:NAME needs the job's name (shardscope-capture --list shows each "
                        "live job with the job: argument that attaches it)");
        return target;
    }
    // A comma ends a tcp: endpoint (no host or port holds one); in a unix: path it ends the
    // endpoint only where another endpoint follows it.
    std::size_t begin = 0;
    const auto add = [&](std::size_t end) -> Status {
        const std::string_view part = trimmed(s.substr(begin, end - begin));
        begin = end + 1;
        if (part.empty()) return success();
        auto endpoint = parseEndpoint(part);
        if (!endpoint) return fail(endpoint.error());
        std::string written = formatEndpoint(*endpoint);
        if (std::find(target.endpoints.begin(), target.endpoints.end(), written) ==
            target.endpoints.end())
            target.endpoints.push_back(std::move(written));
        return success();
    };
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] != ',') continue;
        const std::string_view part = trimmed(s.substr(begin, i - begin));
        const std::string_view next = trimmed(s.substr(i + 1));
        if (part.starts_with("unix:") && !next.empty() && !next.starts_with("unix:") &&
            !next.starts_with("tcp:") && !next.starts_with(","))
            continue;
        if (auto ok = add(i); !ok) return fail(ok.error());
    }
    if (auto ok = add(s.size()); !ok) return fail(ok.error());
    if (target.endpoints.empty())
        return fail("no endpoint given; use unix:PATH, tcp:HOST:PORT (several separated by "
                    "commas: the processes of one job) or job:NAME");
    return target;
}

Status checkReachable(std::string_view endpoint)
{
    auto fd = connectTo(endpoint);
    if (!fd) return fail(fd.error());
    ::close(*fd);
    return success();
}

std::string formatEndpoint(const Endpoint &endpoint)
{
    if (endpoint.kind == Endpoint::Kind::Unix) return "unix:" + endpoint.path;
    const bool v6 = endpoint.host.find(':') != std::string::npos;
    return "tcp:" + (v6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" +
           std::to_string(endpoint.port);
}

bool isLoopbackHost(std::string_view host)
{
    if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1") return true;
    if (!host.starts_with("127.")) return false;
    int dots = 0;
    for (char c : host) {
        if (c == '.')
            ++dots;
        else if (c < '0' || c > '9')
            return false;
    }
    return dots == 3;
}

std::string defaultRuntimeDir()
{
    const char *xdg = std::getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg) return std::string(xdg) + "/shardscope";
    return "/tmp/shardscope-" + std::to_string(::getuid());
}

std::string defaultSocketPath(std::int64_t pid)
{
    return defaultRuntimeDir() + "/" + std::to_string(pid) + ".sock";
}

Result<std::string> endpointOfRank(const std::string &endpoint, int rank)
{
    if (endpoint.empty() || rank == 0) return endpoint;
    auto parsed = parseEndpoint(endpoint);
    if (!parsed) return endpoint;
    Endpoint ep = *parsed;
    if (ep.kind == Endpoint::Kind::Unix) {
        ep.path += ".rank" + std::to_string(rank);
    } else if (ep.port != 0) {
        if (ep.port + rank > 65535)
            return fail(endpoint + ": rank " + std::to_string(rank) + " would listen on port " +
                        std::to_string(ep.port + rank) + "; pick a port at most " +
                        std::to_string(65535 - rank) + " (rank N listens on PORT+N), or port 0");
        ep.port = static_cast<std::uint16_t>(ep.port + rank);
    }
    return formatEndpoint(ep);
}

Result<sockaddr_un> unixSocketAddress(const std::string &path)
{
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path))
        return fail("socket path " + path + " is longer than " +
                    std::to_string(sizeof(addr.sun_path) - 1) +
                    " bytes, the limit of Unix sockets; choose a shorter path");
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return addr;
}

Result<int> connectTo(std::string_view endpointText)
{
    auto endpoint = parseEndpoint(endpointText);
    if (!endpoint) return fail(endpoint.error());
    const std::string hint =
        "; is the engine running? (shardscope-capture --list shows live engines)";
    if (endpoint->kind == Endpoint::Kind::Unix) {
        auto addr = unixSocketAddress(endpoint->path);
        if (!addr) return fail(addr.error());
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return fail("cannot create a socket: " + errnoText());
        if (::connect(fd, reinterpret_cast<const sockaddr *>(&*addr), sizeof(sockaddr_un)) != 0) {
            const std::string why = errnoText();
            ::close(fd);
            return fail("cannot connect to " + std::string(endpointText) + ": " + why + hint);
        }
        return fd;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    AddrInfo res;
    const std::string port = std::to_string(endpoint->port);
    if (const int rc = ::getaddrinfo(endpoint->host.c_str(), port.c_str(), &hints, &res.list);
        rc != 0)
        return fail("cannot resolve host \"" + endpoint->host + "\": " + ::gai_strerror(rc));
    std::string lastError = "no address";
    for (const addrinfo *ai = res.list; ai; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            lastError = errnoText();
            continue;
        }
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        lastError = errnoText();
        ::close(fd);
    }
    return fail("cannot connect to " + std::string(endpointText) + ": " + lastError + hint);
}

} // namespace shardscope::wire

#include "wire/endpoint.h"

#include <cstdlib>
#include <unistd.h>

namespace shardscope::wire {

namespace {

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

} // namespace shardscope::wire

#pragma once
// Endpoint strings ("unix:PATH", "tcp:HOST:PORT") and the default places of the
// per-user runtime directory, the default socket and discovery files.

#include <cstdint>
#include <string>
#include <string_view>

#include "wire/result.h"

namespace shardscope::wire {

struct Endpoint
{
    enum class Kind
    {
        Unix,
        Tcp
    };
    Kind kind = Kind::Unix;
    std::string path; // Unix
    std::string host; // Tcp: name, IPv4 or IPv6 (without brackets)
    std::uint16_t port = 0;
};

// "unix:/run/user/1000/shardscope/42.sock", "tcp:127.0.0.1:0", "tcp:[::1]:7000".
Result<Endpoint> parseEndpoint(std::string_view text);
std::string formatEndpoint(const Endpoint &endpoint);
// localhost, 127.0.0.0/8 and ::1 (literal check; names other than localhost are not resolved).
bool isLoopbackHost(std::string_view host);

// The endpoint the process holding rank `rank` of a job listens on when every process was
// given the same one (shardscope-train --listen, the DeepSpeed agent's listen=): rank 0
// keeps it, unix:PATH becomes PATH.rank<N>, tcp:HOST:PORT listens on PORT+N (port 0 stays
// 0: the kernel picks). An empty endpoint (the default, per process already) stays empty;
// text that does not parse is returned as it is (the Inspector reports it). An error when
// PORT+N is past 65535.
Result<std::string> endpointOfRank(const std::string &endpoint, int rank);

// $XDG_RUNTIME_DIR/shardscope, or /tmp/shardscope-<uid> when XDG_RUNTIME_DIR is unset.
std::string defaultRuntimeDir();
std::string defaultSocketPath(std::int64_t pid); // <runtime dir>/<pid>.sock

} // namespace shardscope::wire

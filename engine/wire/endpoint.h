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

// $XDG_RUNTIME_DIR/shardscope, or /tmp/shardscope-<uid> when XDG_RUNTIME_DIR is unset.
std::string defaultRuntimeDir();
std::string defaultSocketPath(std::int64_t pid); // <runtime dir>/<pid>.sock

} // namespace shardscope::wire

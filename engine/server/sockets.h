#pragma once
// POSIX socket plumbing for the inspector endpoint: listening on a Unix socket or a TCP
// address (with the loopback/token rule and the private runtime directory). Connecting to
// an endpoint is wire::connectTo (wire/endpoint.h). Errors are readable strings.

#include <cstdint>
#include <string>
#include <string_view>

#include "wire/endpoint.h"
#include "wire/result.h"

namespace shardscope::server {

struct Listener
{
    int fd = -1;
    wire::Endpoint bound;   // with the real port for tcp:HOST:0
    std::string socketPath; // Unix socket file to remove when done; empty for TCP
};

// Creates dir (mode 0700) if needed; refuses a directory of another user or one that
// others can read, and a symlink.
wire::Status ensurePrivateDir(const std::string &dir);

// Binds and listens (non-blocking). A Unix socket gets mode 0600; a stale socket file
// of a dead engine is replaced. A TCP host that is not loopback is refused unless
// haveToken.
wire::Result<Listener> listenOn(const wire::Endpoint &endpoint, bool haveToken);

bool setNonBlocking(int fd);

} // namespace shardscope::server

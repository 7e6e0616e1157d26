#pragma once
// Endpoint strings ("unix:PATH", "tcp:HOST:PORT") and the default places of the
// per-user runtime directory, the default socket and discovery files.

#include <cstdint>
#include <string>
#include <string_view>
#include <sys/un.h>
#include <vector>

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
// What a user attaches to (shardscope --attach, shardscope-capture --attach, the attach dialog):
// "job:NAME", every live process of that job found through discovery, or one or more
// endpoints separated by commas, the processes of one job (e.g. on several hosts:
// "tcp:node1:7000,tcp:node2:7000"). A comma starts a new endpoint only where unix: or tcp:
// follows it, so a socket path may hold one. The one parser of these: every program gives the
// same answer, in the same words, to the same text.
struct AttachTarget
{
    std::string job;                    // NAME of job:NAME; empty when endpoints are given
    std::vector<std::string> endpoints; // each parsed and written once, in the order given
};
Result<AttachTarget> parseAttachTarget(std::string_view text);
// Whether an engine answers at an endpoint now: a connection is opened (connectTo) and closed
// at once. The error says what is wrong and what to do; both programs print it as it is, at
// attach, instead of retrying a place where nothing listens.
Status checkReachable(std::string_view endpoint);

// localhost, 127.0.0.0/8 and ::1 (literal check; names other than localhost are not resolved).
bool isLoopbackHost(std::string_view host);

// The endpoint the process holding rank `rank` of a job listens on when every process was
// given the same one (shardscope-train --listen, the DeepSpeed agent's listen=): rank 0
// keeps it, unix:PATH becomes PATH.rank<N>, tcp:HOST:PORT listens on PORT+N (port 0 stays
// 0: the kernel picks). An empty endpoint (the default, per process already) stays empty;
// text that does not parse is returned as it is (the Inspector reports it). An error when
// PORT+N is past 65535.
Result<std::string> endpointOfRank(const std::string &endpoint, int rank);
// The address of a Unix socket at path; a path longer than sun_path allows is an error that
// says so (the server listens there, a client connects there).
Result<sockaddr_un> unixSocketAddress(const std::string &path);
// Blocking connect to "unix:PATH" or "tcp:HOST:PORT" (TCP_NODELAY); returns the socket. The
// client side (client::InspectorClient, client::probeClock) and tests connect with it.
Result<int> connectTo(std::string_view endpoint);

// $XDG_RUNTIME_DIR/shardscope, or /tmp/shardscope-<uid> when XDG_RUNTIME_DIR is unset.
std::string defaultRuntimeDir();
std::string defaultSocketPath(std::int64_t pid); // <runtime dir>/<pid>.sock

} // namespace shardscope::wire

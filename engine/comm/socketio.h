#pragma once
// Blocking socket I/O bounded by a deadline, shared by the rendezvous servers of the
// process-per-rank backends (comm/tcprendezvous for NCCL, comm/tcpstore for gloo).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace shardscope::comm::detail {

using SocketClock = std::chrono::steady_clock;

enum class Io
{
    Done,
    Closed, // EOF or a socket error: the peer is gone
    Timeout,
    Stopped // *stop became true
};

// Milliseconds until the deadline, 0 once it passed.
int msLeft(SocketClock::time_point deadline);

// Reads (or writes) exactly n bytes before the deadline; with stop, looks at it every 100 ms.
Io ioAll(int fd, void *buf, std::size_t n, SocketClock::time_point deadline, bool write,
         const std::atomic<bool> *stop = nullptr);

// Connects to host:port (IPv4, like torchrun's MASTER_ADDR; TCP_NODELAY) and runs
// handshake(fd) on the connection, again every 100 ms until the deadline (or *stop): a
// refused connection or a handshake that returns false (it sets error) is tried again.
// Returns the connected fd whose handshake returned true, or -1 with the last reason in
// lastError. A handshake that throws has its fd closed and the exception passed on.
int connectWithRetries(const std::string &host, int port, SocketClock::time_point deadline,
                       const std::atomic<bool> *stop, std::string &lastError,
                       const std::function<bool(int fd, std::string &error)> &handshake);

void putU32(unsigned char *p, std::uint32_t v); // little endian
std::uint32_t getU32(const unsigned char *p);

// "5 s" for whole seconds, otherwise "2500 ms".
std::string secondsText(std::chrono::milliseconds t);

} // namespace shardscope::comm::detail

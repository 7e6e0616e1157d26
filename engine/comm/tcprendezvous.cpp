// Wire format: the client sends "SSRDZV01", its rank and the world size (int32 LE);
// rank 0 answers a status byte, then either the blob (uint32 LE size + bytes) or a
// reason (uint32 LE size + text).

#include "comm/tcprendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "comm/socketio.h"

namespace shardscope::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'S', 'S', 'R', 'D', 'Z', 'V', '0', '1'};

class Fd
{
  public:
    explicit Fd(int fd = -1) : m_fd(fd) {}
    ~Fd() { reset(); }
    Fd(Fd &&o) noexcept : m_fd(o.m_fd) { o.m_fd = -1; }
    Fd &operator=(Fd &&o) noexcept
    {
        if (this != &o) {
            reset();
            m_fd = o.m_fd;
            o.m_fd = -1;
        }
        return *this;
    }
    int get() const { return m_fd; }
    void reset()
    {
        if (m_fd >= 0) ::close(m_fd);
        m_fd = -1;
    }

  private:
    int m_fd;
};

using comm::detail::getU32;
using comm::detail::msLeft;
using comm::detail::putU32;
using comm::detail::secondsText;

// Reads/writes exactly n bytes before the deadline; false on timeout, EOF or error.
bool ioAll(int fd, void *buf, std::size_t n, Clock::time_point deadline, bool write)
{
    return comm::detail::ioAll(fd, buf, n, deadline, write) == comm::detail::Io::Done;
}

std::string where(const comm::RendezvousConfig &c)
{
    return c.masterAddr + ":" + std::to_string(c.masterPort);
}

} // namespace

struct RendezvousServer::Impl
{
    comm::RendezvousConfig config;
    std::vector<std::byte> blob;
    Fd listener;
    int port = 0;
    std::atomic<bool> stop{false};
    std::thread thread;
    std::mutex mutex;
    std::string error; // set by the serving thread
    bool done = false;

    void serve();
    void fail(std::string why)
    {
        std::lock_guard lock(mutex);
        if (error.empty()) error = std::move(why);
    }
};

void RendezvousServer::Impl::serve()
{
    std::set<int> served;
    const auto deadline = Clock::now() + config.timeout;
    while (static_cast<int>(served.size()) < config.worldSize - 1) {
        if (stop.load()) return;
        if (Clock::now() >= deadline) {
            fail("rank 0 waited " + secondsText(config.timeout) + " on port " +
                 std::to_string(port) + " but only " + std::to_string(served.size()) + " of " +
                 std::to_string(config.worldSize - 1) +
                 " other ranks connected; start every rank with the same MASTER_ADDR, "
                 "MASTER_PORT and WORLD_SIZE");
            return;
        }
        pollfd pfd{listener.get(), POLLIN, 0};
        if (::poll(&pfd, 1, 100) <= 0) continue;
        Fd peer(::accept(listener.get(), nullptr, nullptr));
        if (peer.get() < 0) continue;
        unsigned char hello[16];
        const auto peerDeadline = Clock::now() + std::chrono::seconds(5);
        if (!ioAll(peer.get(), hello, sizeof hello, peerDeadline, false) ||
            std::memcmp(hello, kMagic, sizeof kMagic) != 0)
            continue; // not one of ours (a port scanner, a stale process): ignore it
        const int rank = static_cast<int>(getU32(hello + 8));
        const int world = static_cast<int>(getU32(hello + 12));
        std::string refusal;
        if (world != config.worldSize)
            refusal = "rank " + std::to_string(rank) + " says WORLD_SIZE=" + std::to_string(world) +
                      " but rank 0 has WORLD_SIZE=" + std::to_string(config.worldSize);
        else if (rank <= 0 || rank >= world)
            refusal = "RANK=" + std::to_string(rank) + " is not a non-zero rank of a world of " +
                      std::to_string(world);
        else if (served.count(rank))
            refusal = "two processes both claim RANK=" + std::to_string(rank);
        unsigned char head[5];
        if (!refusal.empty()) {
            head[0] = 1;
            putU32(head + 1, static_cast<std::uint32_t>(refusal.size()));
            ioAll(peer.get(), head, sizeof head, peerDeadline, true);
            ioAll(peer.get(), refusal.data(), refusal.size(), peerDeadline, true);
            fail(refusal);
            continue;
        }
        head[0] = 0;
        putU32(head + 1, static_cast<std::uint32_t>(blob.size()));
        if (ioAll(peer.get(), head, sizeof head, peerDeadline, true) &&
            ioAll(peer.get(), blob.data(), blob.size(), peerDeadline, true))
            served.insert(rank);
    }
    std::lock_guard lock(mutex);
    done = true;
}

RendezvousServer::RendezvousServer(const comm::RendezvousConfig &config,
                                   std::vector<std::byte> blob)
    : d(std::make_unique<Impl>())
{
    d->config = config;
    d->blob = std::move(blob);
    d->listener = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (d->listener.get() < 0)
        throw comm::CommError(std::string("rank 0 could not create the rendezvous socket: ") +
                              std::strerror(errno));
    const int one = 1;
    ::setsockopt(d->listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<std::uint16_t>(config.masterPort));
    if (::bind(d->listener.get(), reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 ||
        ::listen(d->listener.get(), 128) != 0)
        throw comm::CommError(
            "rank 0 could not listen on MASTER_PORT=" + std::to_string(config.masterPort) +
            " for the NCCL rendezvous: " + std::strerror(errno) +
            "; choose a free port with MASTER_PORT");
    socklen_t len = sizeof addr;
    ::getsockname(d->listener.get(), reinterpret_cast<sockaddr *>(&addr), &len);
    d->port = ntohs(addr.sin_port);
    if (config.worldSize <= 1) {
        d->done = true;
        return;
    }
    d->thread = std::thread([impl = d.get()] { impl->serve(); });
}

RendezvousServer::~RendezvousServer()
{
    d->stop.store(true);
    if (d->thread.joinable()) d->thread.join();
}

int RendezvousServer::port() const
{
    return d->port;
}

void RendezvousServer::wait()
{
    if (d->thread.joinable()) d->thread.join();
    std::lock_guard lock(d->mutex);
    if (!d->done)
        throw comm::CommError(
            "NCCL rendezvous failed: " +
            (d->error.empty() ? std::string("rank 0 stopped serving") : d->error));
}

std::vector<std::byte> fetchRendezvousBlob(const comm::RendezvousConfig &config)
{
    const auto deadline = Clock::now() + config.timeout;
    const std::string who =
        "rank " + std::to_string(config.rank) + " of " + std::to_string(config.worldSize);
    std::string lastError;
    std::vector<std::byte> body;
    const int connected = comm::detail::connectWithRetries(
        config.masterAddr, config.masterPort, deadline, nullptr, lastError,
        [&](int fd, std::string &error) {
            unsigned char hello[16];
            std::memcpy(hello, kMagic, sizeof kMagic);
            putU32(hello + 8, static_cast<std::uint32_t>(config.rank));
            putU32(hello + 12, static_cast<std::uint32_t>(config.worldSize));
            unsigned char head[5];
            if (!ioAll(fd, hello, sizeof hello, deadline, true) ||
                !ioAll(fd, head, sizeof head, deadline, false)) {
                error = "connection closed before rank 0 answered";
                return false;
            }
            const std::uint32_t size = getU32(head + 1);
            if (size > (1u << 20))
                throw comm::CommError(who + ": the rendezvous at " + where(config) +
                                      " is not a ShardScope rank 0 (answer too large)");
            body.assign(size, std::byte{0});
            if (!ioAll(fd, body.data(), size, deadline, false)) {
                error = "connection closed while reading rank 0's answer";
                return false;
            }
            if (head[0] != 0)
                throw comm::CommError(
                    who + ": rank 0 at " + where(config) +
                    " refused: " + std::string(reinterpret_cast<const char *>(body.data()), size));
            return true;
        });
    if (connected >= 0) {
        Fd fd(connected);
        return body;
    }
    throw comm::CommError(who + " could not get the NCCL id from rank 0 at " + where(config) +
                          " within " + secondsText(config.timeout) + " (" + lastError +
                          "); start rank 0 with the same MASTER_ADDR/MASTER_PORT, or raise "
                          "SHARDSCOPE_RENDEZVOUS_TIMEOUT_S");
}

} // namespace shardscope::comm

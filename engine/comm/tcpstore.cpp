// Wire format (integers are uint32 LE). A client opens with "SSGLOO01", its rank, the world
// size and a role byte (0: store, 1: liveness watch); rank 0 answers a status byte and a
// text (empty, or why it refuses). Store requests: 'S' key value -> status; 'G' key
// timeout_ms -> status (0: found, then the value; 1: not there in time). Watch: the client
// sends 'H' (alive) and gets rank 0's verdict text back; before it closes it sends 'B'
// (finished), 'F' (leaving after a failed collective: someone else is the cause) or 'X'
// (leaving because of an error of its own).

#include "comm/tcpstore.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "comm/communicator.h"
#include "comm/socketio.h"

namespace shardscope::comm {

namespace {

using Clock = detail::SocketClock;
using std::chrono::milliseconds;
constexpr char kMagic[8] = {'S', 'S', 'G', 'L', 'O', 'O', '0', '1'};
constexpr std::uint32_t kMaxValue = 64u << 20;
constexpr milliseconds kSlice{100}; // how often blocked loops look at their stop flag

using detail::getU32;
using detail::Io;
using detail::ioAll;
using detail::msLeft;
using detail::secondsText;

void putU32(std::vector<char> &out, std::uint32_t v)
{
    unsigned char b[4];
    detail::putU32(b, v);
    out.insert(out.end(), b, b + 4);
}

Io readU32(int fd, std::uint32_t &v, Clock::time_point deadline,
           const std::atomic<bool> *stop = nullptr)
{
    unsigned char b[4];
    const Io io = ioAll(fd, b, 4, deadline, false, stop);
    v = getU32(b);
    return io;
}

std::string where(const RendezvousConfig &c)
{
    return c.masterAddr + ":" + std::to_string(c.masterPort);
}

std::string goneText(int rank)
{
    return "rank " + std::to_string(rank) +
           " is gone: its connection closed without a goodbye (the process exited, crashed or "
           "was killed)";
}

std::string silentText(int rank, milliseconds silence)
{
    return "rank " + std::to_string(rank) + " stopped answering: no heartbeat for " +
           secondsText(silence) + " (the process is stopped or hung, or its host is unreachable)";
}

// Connects to rank 0 and says hello, retrying until config.timeout; the connected socket.
int connectToRankZero(const RendezvousConfig &config, char role, const std::atomic<bool> *stop)
{
    const auto deadline = Clock::now() + config.timeout;
    const std::string who =
        "rank " + std::to_string(config.rank) + " of " + std::to_string(config.worldSize);
    std::string lastError;
    const int sock = detail::connectWithRetries(
        config.masterAddr, config.masterPort, deadline, stop, lastError,
        [&](int fd, std::string &error) {
            std::vector<char> hello(kMagic, kMagic + sizeof kMagic);
            putU32(hello, static_cast<std::uint32_t>(config.rank));
            putU32(hello, static_cast<std::uint32_t>(config.worldSize));
            hello.push_back(role);
            unsigned char status = 0;
            std::uint32_t size = 0;
            if (ioAll(fd, hello.data(), hello.size(), deadline, true) == Io::Done &&
                ioAll(fd, &status, 1, deadline, false) == Io::Done &&
                readU32(fd, size, deadline) == Io::Done && size <= 4096) {
                std::string text(size, '\0');
                if (ioAll(fd, text.data(), size, deadline, false) == Io::Done) {
                    if (status == 0) return true;
                    throw CommError(who + ": rank 0 at " + where(config) + " refused: " + text);
                }
            }
            error = "the connection closed before rank 0 answered";
            return false;
        });
    if (sock >= 0) return sock;
    throw CommError(who + " could not reach rank 0's rendezvous at " + where(config) + " within " +
                    secondsText(config.timeout) + " (" + lastError +
                    "); start rank 0 with the same MASTER_ADDR/MASTER_PORT, or raise "
                    "SHARDSCOPE_RENDEZVOUS_TIMEOUT_S");
}

} // namespace

// ------------------------------------------------------------------------- server

struct TcpStoreServer::Impl
{
    RendezvousConfig config;
    LivenessTiming timing;
    int listener = -1;
    int port = 0;
    std::atomic<bool> stop{false};
    std::thread acceptor;

    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::string, std::vector<char>> data;
    std::vector<std::thread> connections;
    std::vector<int> fds;
    std::string verdict;
    int watching = 0; // watch connections open

    void acceptLoop();
    void serve(int fd);
    void serveStore(int fd);
    void watch(int fd, int rank);
    void fail(std::string why)
    {
        std::lock_guard lock(mutex);
        if (verdict.empty()) verdict = std::move(why);
    }
};

void TcpStoreServer::Impl::acceptLoop()
{
    while (!stop.load()) {
        pollfd pfd{listener, POLLIN, 0};
        if (::poll(&pfd, 1, static_cast<int>(kSlice.count())) <= 0) continue;
        const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        std::lock_guard lock(mutex);
        if (stop.load()) {
            ::close(fd);
            return;
        }
        fds.push_back(fd);
        connections.emplace_back([this, fd] { serve(fd); });
    }
}

void TcpStoreServer::Impl::serve(int fd)
{
    unsigned char hello[17];
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    if (ioAll(fd, hello, sizeof hello, deadline, false, &stop) != Io::Done ||
        std::memcmp(hello, kMagic, sizeof kMagic) != 0)
        return; // not one of ours (a port scanner, a stale process): ignore it
    const int rank = static_cast<int>(getU32(hello + 8));
    const int world = static_cast<int>(getU32(hello + 12));
    const char role = static_cast<char>(hello[16]);
    std::string refusal;
    if (world != config.worldSize)
        refusal = "rank " + std::to_string(rank) + " says WORLD_SIZE=" + std::to_string(world) +
                  " but rank 0 has WORLD_SIZE=" + std::to_string(config.worldSize);
    else if (rank < 0 || rank >= world)
        refusal = "RANK=" + std::to_string(rank) + " is not a rank of a world of " +
                  std::to_string(world);
    std::vector<char> answer{static_cast<char>(refusal.empty() ? 0 : 1)};
    putU32(answer, static_cast<std::uint32_t>(refusal.size()));
    answer.insert(answer.end(), refusal.begin(), refusal.end());
    if (ioAll(fd, answer.data(), answer.size(), deadline, true, &stop) != Io::Done ||
        !refusal.empty())
        return;
    if (role == 1)
        watch(fd, rank);
    else
        serveStore(fd);
}

void TcpStoreServer::Impl::serveStore(int fd)
{
    const auto forever = Clock::time_point::max();
    for (;;) {
        char op = 0;
        std::uint32_t keySize = 0;
        if (ioAll(fd, &op, 1, forever, false, &stop) != Io::Done ||
            readU32(fd, keySize, forever, &stop) != Io::Done || keySize > 4096)
            return;
        std::string key(keySize, '\0');
        if (ioAll(fd, key.data(), keySize, forever, false, &stop) != Io::Done) return;
        std::uint32_t arg = 0; // the value's size, or a get's timeout in ms
        if (readU32(fd, arg, forever, &stop) != Io::Done) return;
        std::vector<char> reply;
        if (op == 'S') {
            if (arg > kMaxValue) return;
            std::vector<char> value(arg);
            if (ioAll(fd, value.data(), arg, forever, false, &stop) != Io::Done) return;
            {
                std::lock_guard lock(mutex);
                data[key] = std::move(value);
            }
            changed.notify_all();
            reply.push_back(0);
        } else if (op == 'G') {
            std::unique_lock lock(mutex);
            const auto until = Clock::now() + milliseconds(arg);
            while (!data.count(key) && !stop.load() && Clock::now() < until)
                changed.wait_for(lock, kSlice);
            auto it = data.find(key);
            if (it == data.end()) {
                reply.push_back(1);
            } else {
                reply.push_back(0);
                putU32(reply, static_cast<std::uint32_t>(it->second.size()));
                reply.insert(reply.end(), it->second.begin(), it->second.end());
            }
        } else {
            return;
        }
        if (ioAll(fd, reply.data(), reply.size(), forever, true, &stop) != Io::Done) return;
    }
}

void TcpStoreServer::Impl::watch(int fd, int rank)
{
    {
        std::lock_guard lock(mutex);
        ++watching;
    }
    struct Leave
    {
        Impl *impl;
        ~Leave()
        {
            {
                std::lock_guard lock(impl->mutex);
                --impl->watching;
            }
            impl->changed.notify_all();
        }
    } leave{this};
    auto lastSeen = Clock::now();
    while (!stop.load()) {
        char op = 0;
        const Io io = ioAll(fd, &op, 1, Clock::now() + timing.heartbeat, false, &stop);
        if (io == Io::Stopped) return;
        if (io == Io::Closed ||
            (io == Io::Done && op != 'H' && op != 'B' && op != 'F' && op != 'X')) {
            fail(goneText(rank));
            return;
        }
        if (op == 'X') {
            fail("rank " + std::to_string(rank) +
                 " stopped with an error of its own (its output says which)");
            return;
        }
        if (io == Io::Timeout) {
            if (Clock::now() - lastSeen > timing.silence) {
                fail(silentText(rank, timing.silence));
                return;
            }
            continue;
        }
        if (op == 'B' || op == 'F') return;
        lastSeen = Clock::now();
        std::string text;
        {
            std::lock_guard lock(mutex);
            text = verdict;
        }
        std::vector<char> reply;
        putU32(reply, static_cast<std::uint32_t>(text.size()));
        reply.insert(reply.end(), text.begin(), text.end());
        if (ioAll(fd, reply.data(), reply.size(), Clock::now() + timing.silence, true, &stop) !=
            Io::Done)
            return; // its next heartbeat tells (closed or silent)
    }
}

TcpStoreServer::TcpStoreServer(const RendezvousConfig &config, LivenessTiming timing)
    : d(std::make_unique<Impl>())
{
    d->config = config;
    d->timing = timing;
    d->listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (d->listener < 0)
        throw CommError(std::string("rank 0 could not create the rendezvous socket: ") +
                        std::strerror(errno));
    const int one = 1;
    ::setsockopt(d->listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<std::uint16_t>(config.masterPort));
    if (::bind(d->listener, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 ||
        ::listen(d->listener, 128) != 0) {
        const std::string why = std::strerror(errno);
        ::close(d->listener);
        throw CommError(
            "rank 0 could not listen on MASTER_PORT=" + std::to_string(config.masterPort) +
            " for the gloo rendezvous: " + why + "; choose a free port with MASTER_PORT");
    }
    socklen_t len = sizeof addr;
    ::getsockname(d->listener, reinterpret_cast<sockaddr *>(&addr), &len);
    d->port = ntohs(addr.sin_port);
    d->acceptor = std::thread([impl = d.get()] { impl->acceptLoop(); });
}

TcpStoreServer::~TcpStoreServer()
{
    d->stop.store(true);
    d->changed.notify_all();
    d->acceptor.join();
    std::vector<std::thread> connections;
    {
        std::lock_guard lock(d->mutex);
        connections.swap(d->connections);
        for (int fd : d->fds)
            ::shutdown(fd, SHUT_RDWR);
    }
    for (auto &t : connections)
        t.join();
    for (int fd : d->fds)
        ::close(fd);
    ::close(d->listener);
}

int TcpStoreServer::port() const
{
    return d->port;
}

void TcpStoreServer::leave(const std::string &why, milliseconds linger)
{
    std::unique_lock lock(d->mutex);
    if (d->verdict.empty()) d->verdict = why;
    d->changed.wait_for(lock, linger, [this] { return d->watching == 0; });
}

std::string TcpStoreServer::verdict() const
{
    std::lock_guard lock(d->mutex);
    return d->verdict;
}

// ------------------------------------------------------------------------- client

TcpStoreClient::TcpStoreClient(const RendezvousConfig &config)
    : m_config(config), m_fd(connectToRankZero(config, 0, nullptr))
{
}

TcpStoreClient::~TcpStoreClient()
{
    ::close(m_fd);
}

std::vector<char> TcpStoreClient::request(char op, const std::string &key,
                                          const std::vector<char> &value, milliseconds timeout)
{
    std::vector<char> msg{op};
    putU32(msg, static_cast<std::uint32_t>(key.size()));
    msg.insert(msg.end(), key.begin(), key.end());
    if (op == 'S') {
        putU32(msg, static_cast<std::uint32_t>(value.size()));
        msg.insert(msg.end(), value.begin(), value.end());
    } else {
        putU32(msg, static_cast<std::uint32_t>(timeout.count()));
    }
    const auto deadline = Clock::now() + timeout + std::chrono::seconds(5);
    unsigned char status = 0;
    const std::string who = "rank " + std::to_string(m_config.rank);
    if (ioAll(m_fd, msg.data(), msg.size(), deadline, true) != Io::Done ||
        ioAll(m_fd, &status, 1, deadline, false) != Io::Done)
        throw CommError(who + " lost rank 0's rendezvous at " + where(m_config) +
                        " (rank 0 exited or stopped answering)");
    if (op == 'S') return {};
    if (status != 0)
        throw CommError(who + " waited " + secondsText(timeout) + " for key '" + key +
                        "' in the gloo rendezvous at " + where(m_config) +
                        ", but no rank published it: a rank did not start, or has a different "
                        "MASTER_ADDR/MASTER_PORT/WORLD_SIZE");
    std::uint32_t size = 0;
    if (readU32(m_fd, size, deadline) != Io::Done || size > kMaxValue)
        throw CommError(who + " lost rank 0's rendezvous while reading key '" + key + "'");
    std::vector<char> out(size);
    if (ioAll(m_fd, out.data(), size, deadline, false) != Io::Done)
        throw CommError(who + " lost rank 0's rendezvous while reading key '" + key + "'");
    return out;
}

void TcpStoreClient::set(const std::string &key, const std::vector<char> &data)
{
    request('S', key, data, m_config.timeout);
}

std::vector<char> TcpStoreClient::get(const std::string &key)
{
    return request('G', key, {}, m_config.timeout);
}

void TcpStoreClient::wait(const std::vector<std::string> &keys)
{
    wait(keys, m_config.timeout);
}

void TcpStoreClient::wait(const std::vector<std::string> &keys, const milliseconds &timeout)
{
    for (const std::string &key : keys)
        request('G', key, {}, timeout);
}

std::string TcpStoreClient::localAddress() const
{
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    ::getsockname(m_fd, reinterpret_cast<sockaddr *>(&addr), &len);
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof text);
    return text;
}

// ------------------------------------------------------------------------- watch

struct LivenessWatch::Impl
{
    RendezvousConfig config;
    LivenessTiming timing;
    const TcpStoreServer *server = nullptr;
    int fd = -1;
    std::atomic<bool> stop{false};
    std::atomic<char> leaving{'B'};
    std::mutex mutex;
    std::condition_variable changed;
    std::string verdict;
    std::thread thread;

    void run();
    void judge(std::string why)
    {
        {
            std::lock_guard lock(mutex);
            if (verdict.empty()) verdict = std::move(why);
        }
        changed.notify_all();
    }
};

void LivenessWatch::Impl::run()
{
    for (;;) {
        {
            std::unique_lock lock(mutex);
            if (changed.wait_for(lock, timing.heartbeat, [this] { return stop.load(); })) return;
        }
        const auto deadline = Clock::now() + timing.silence;
        char beat = 'H';
        std::uint32_t size = 0;
        Io io = ioAll(fd, &beat, 1, deadline, true, &stop);
        if (io == Io::Done) io = readU32(fd, size, deadline, &stop);
        std::string text(std::min<std::uint32_t>(size, 4096), '\0');
        if (io == Io::Done) io = ioAll(fd, text.data(), text.size(), deadline, false, &stop);
        if (io == Io::Stopped) return;
        if (io == Io::Closed) {
            judge(goneText(0));
            return;
        }
        if (io == Io::Timeout) {
            judge(silentText(0, timing.silence));
            return;
        }
        if (!text.empty()) judge(text);
    }
}

LivenessWatch::LivenessWatch(const RendezvousConfig &config, LivenessTiming timing,
                             const TcpStoreServer *server)
    : d(std::make_unique<Impl>())
{
    d->config = config;
    d->timing = timing;
    d->server = server;
    if (server || config.worldSize <= 1) return;
    d->fd = connectToRankZero(config, 1, nullptr);
    d->thread = std::thread([impl = d.get()] { impl->run(); });
}

LivenessWatch::~LivenessWatch()
{
    d->stop.store(true);
    d->changed.notify_all();
    if (d->thread.joinable()) d->thread.join();
    if (d->fd >= 0) {
        char bye = d->leaving.load();
        ioAll(d->fd, &bye, 1, Clock::now() + std::chrono::seconds(1), true);
        ::close(d->fd);
    }
}

std::string LivenessWatch::verdict(milliseconds patience)
{
    const auto until = Clock::now() + patience;
    if (d->server) {
        for (;;) {
            std::string v = d->server->verdict();
            if (!v.empty() || Clock::now() >= until) return v;
            std::this_thread::sleep_for(std::min(milliseconds(50), patience));
        }
    }
    std::unique_lock lock(d->mutex);
    d->changed.wait_until(lock, until, [this] { return !d->verdict.empty(); });
    return d->verdict;
}

void LivenessWatch::markFailed()
{
    d->leaving.store('F');
}

void LivenessWatch::markOwnError()
{
    if (d->leaving.load() == 'B') d->leaving.store('X');
}

} // namespace shardscope::comm

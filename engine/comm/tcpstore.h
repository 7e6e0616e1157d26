#pragma once
// The rendezvous of a gloo world, and the watch that names a rank that died or stopped.
// gloo has no TCP store: rank 0 serves a small key-value store on MASTER_ADDR:MASTER_PORT,
// every rank (rank 0 too) connects to it, retrying until a timeout, and gloo's
// connectFullMesh swaps the ranks' addresses through it. Afterwards every other rank keeps
// one more connection to rank 0 on which it sends heartbeats; rank 0 records the first rank
// whose connection closed without a goodbye, or that stayed silent too long, and answers
// every heartbeat with that verdict. So when a collective fails, every rank can say which
// rank caused it instead of only "timed out".

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "comm/torchrunenv.h"

namespace shardscope::comm {

struct LivenessTiming
{
    std::chrono::milliseconds heartbeat{1000}; // how often a rank says it is alive
    std::chrono::milliseconds silence{30000};  // a rank silent this long has stopped answering
};

// Rank 0's side. Listens on config.masterPort as soon as it is constructed (a busy port is
// a CommError right away) and serves from background threads until destroyed.
class TcpStoreServer
{
  public:
    TcpStoreServer(const RendezvousConfig &config, LivenessTiming timing);
    ~TcpStoreServer();
    TcpStoreServer(const TcpStoreServer &) = delete;
    TcpStoreServer &operator=(const TcpStoreServer &) = delete;

    int port() const; // masterPort, or the kernel's choice when it was 0
    // The first failure seen ("rank 2 is gone (...)"), or empty while every rank is well.
    std::string verdict() const;
    // Rank 0 is leaving a failed run: records why (unless a verdict came first), then keeps
    // answering heartbeats until every other rank has left or `linger` passed, so the ranks
    // still waiting learn the cause rather than only that rank 0 went away.
    void leave(const std::string &why, std::chrono::milliseconds linger);

    struct Impl;

  private:
    std::unique_ptr<Impl> d;
};

// A rank's key-value client: connects to masterAddr:masterPort, retrying every 100 ms until
// config.timeout. get() and wait() block until the keys exist, at most the timeout; a
// missing key is a CommError that names the rank whose key it is.
class TcpStoreClient : public gloo::rendezvous::Store
{
  public:
    explicit TcpStoreClient(const RendezvousConfig &config);
    ~TcpStoreClient() override;

    void set(const std::string &key, const std::vector<char> &data) override;
    std::vector<char> get(const std::string &key) override;
    void wait(const std::vector<std::string> &keys) override;
    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override;

    // The local IP address of the connection to rank 0: the one peers can reach this
    // process on (the interface that routes to MASTER_ADDR).
    std::string localAddress() const;

  private:
    std::vector<char> request(char op, const std::string &key, const std::vector<char> &value,
                              std::chrono::milliseconds timeout);

    RendezvousConfig m_config;
    int m_fd = -1;
};

// Each rank's view of the world's health. On rank 0 it reads the server's verdict; on the
// other ranks a thread sends a heartbeat every timing.heartbeat and reads rank 0's verdict,
// and judges rank 0 itself (connection closed: gone; no answer within timing.silence:
// stopped answering).
class LivenessWatch
{
  public:
    // server: rank 0's own server (null on the other ranks).
    LivenessWatch(const RendezvousConfig &config, LivenessTiming timing,
                  const TcpStoreServer *server);
    ~LivenessWatch(); // tells rank 0 how this rank leaves (see the marks below)
    LivenessWatch(const LivenessWatch &) = delete;
    LivenessWatch &operator=(const LivenessWatch &) = delete;

    // The first failure known, waiting up to `patience` for one to appear.
    std::string verdict(std::chrono::milliseconds patience);
    // A collective of this rank failed because of another rank: rank 0 must not blame
    // this rank for leaving.
    void markFailed();
    // This rank leaves because of an error of its own (not a failed collective): rank 0
    // names it to ranks that have no earlier verdict.
    void markOwnError();

    struct Impl;

  private:
    std::unique_ptr<Impl> d;
};

} // namespace shardscope::comm

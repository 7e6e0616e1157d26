#include "comm/gloocommunicator.h"

#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "comm/rankordersum.h"
#include "comm/tcpstore.h"

namespace shardscope::comm {

namespace {

using std::chrono::milliseconds;

LivenessTiming timingFor(milliseconds timeout)
{
    LivenessTiming t;
    t.silence = std::max(milliseconds(1000), timeout / 2);
    t.heartbeat = std::clamp(t.silence / 10, milliseconds(100), milliseconds(1000));
    return t;
}

// A peer that is gone makes gloo's sockets fail; writing to them must be an error, not a
// SIGPIPE that kills this rank silently. Only a default disposition is changed.
void ignoreSigpipe()
{
    struct sigaction old = {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
        struct sigaction ign = {};
        ign.sa_handler = SIG_IGN;
        ::sigemptyset(&ign.sa_mask);
        ::sigaction(SIGPIPE, &ign, nullptr);
    }
}

class GlooCommunicator final : public Communicator
{
  public:
    explicit GlooCommunicator(const GlooOptions &options)
        : m_config(options.rendezvous), m_timeout(options.timeout),
          m_timing(timingFor(options.timeout))
    {
        ignoreSigpipe();
        const std::string who =
            "rank " + std::to_string(m_config.rank) + " of " + std::to_string(m_config.worldSize);
        if (m_config.rank == 0) m_server = std::make_unique<TcpStoreServer>(m_config, m_timing);
        try {
            TcpStoreClient store(m_config);
            gloo::transport::tcp::attr attr;
            if (const char *iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface)
                attr.iface = iface;
            else
                attr.hostname = store.localAddress();
            auto device = gloo::transport::tcp::CreateDevice(attr);
            auto context =
                std::make_shared<gloo::rendezvous::Context>(m_config.rank, m_config.worldSize);
            context->setTimeout(m_config.timeout);
            context->connectFullMesh(store, device);
            m_context = std::move(context);
            // No rank may use or close its pairs before every peer has finished connecting.
            meet(m_config.timeout);
            m_context->setTimeout(m_timeout);
        } catch (const CommError &) {
            throw;
        } catch (const std::exception &e) {
            throw CommError(who + " could not join the gloo world through " + m_config.masterAddr +
                            ":" + std::to_string(m_config.masterPort) + ": " + e.what());
        }
        m_watch = std::make_unique<LivenessWatch>(m_config, m_timing, m_server.get());
    }

    ~GlooCommunicator() override
    {
        // Destroyed while an exception unwinds (the engine goes with the failed run): unless
        // a collective failed because of a peer, the error is this rank's own, and the
        // ranks still waiting for it should hear so rather than time out without a cause.
        const bool ownError = std::uncaught_exceptions() > 0 && m_failure.empty();
        // A clean end: every rank leaves together, so none closes its pairs while a peer
        // still reads from them.
        if (!ownError && m_failure.empty() && !m_aborted.load()) {
            try {
                meet(m_timeout);
            } catch (const std::exception &) {
                // the peers are gone already; nothing is left to protect
            }
        }
        if (ownError) m_watch->markOwnError();
        m_watch.reset(); // goodbye first: rank 0 must not judge a rank that left cleanly
        m_context.reset();
        if (m_server && (ownError || !m_failure.empty()))
            m_server->leave(ownError ? "rank 0 stopped with an error of its own (its output "
                                       "says which)"
                                     : "rank 0 gave up on a collective that failed with no "
                                       "known cause",
                            2 * m_timing.heartbeat + milliseconds(200));
        m_server.reset();
    }

    int rank() const override { return m_config.rank; }
    int worldSize() const override { return m_config.worldSize; }
    Backend backend() const override { return Backend::Gloo; }

    void abort() noexcept override { m_aborted.store(true); }

    CommHandle allGather(const void *send, void *recv, std::size_t bytes) override
    {
        run("allGather", bytes, [&](std::uint32_t tag) {
            auto *out = static_cast<char *>(recv);
            gloo::AllgatherOptions o(m_context);
            // In place when send is already this rank's slot of recv.
            if (send != out + static_cast<std::size_t>(m_config.rank) * bytes)
                o.setInput(const_cast<char *>(static_cast<const char *>(send)), bytes);
            o.setOutput(out, bytes * static_cast<std::size_t>(m_config.worldSize));
            o.setTag(tag);
            o.setTimeout(m_timeout);
            gloo::allgather(o);
        });
        return {};
    }

    CommHandle broadcast(void *buf, std::size_t bytes, int root) override
    {
        if (root < 0 || root >= m_config.worldSize)
            throw CommError("broadcast from root " + std::to_string(root) +
                            ", which is not a rank of a world of " +
                            std::to_string(m_config.worldSize));
        run("broadcast", bytes, [&](std::uint32_t tag) {
            gloo::BroadcastOptions o(m_context);
            o.setOutput(static_cast<char *>(buf), bytes);
            o.setRoot(root);
            o.setTag(tag);
            o.setTimeout(m_timeout);
            gloo::broadcast(o);
        });
        return {};
    }

    // Every rank sends each peer its slice (alltoall), then sums what it received in rank
    // order, exactly as the threads backend does, so both agree to the bit.
    CommHandle reduceScatter(const void *send, void *recv, std::size_t count, DType dtype) override
    {
        const std::size_t slice = count * dtypeSize(dtype);
        const auto world = static_cast<std::size_t>(m_config.worldSize);
        run("reduceScatter", slice * world, [&](std::uint32_t tag) {
            m_scratch.resize(slice * world);
            gloo::AlltoallOptions o(m_context);
            o.setInput(const_cast<char *>(static_cast<const char *>(send)), slice * world);
            o.setOutput(m_scratch.data(), slice * world);
            o.setTag(tag);
            o.setTimeout(m_timeout);
            gloo::alltoall(o);
            m_inputs.resize(world);
            for (std::size_t r = 0; r < world; ++r)
                m_inputs[r] = m_scratch.data() + r * slice;
            detail::sumInRankOrder(m_inputs.data(), m_config.worldSize, recv, count, dtype);
        });
        return {};
    }

    void barrier() override
    {
        run("barrier", 0, [&](std::uint32_t tag) {
            gloo::BarrierOptions o(m_context);
            o.setTag(tag);
            o.setTimeout(m_timeout);
            gloo::barrier(o);
        });
    }

  private:
    // A barrier outside run(): part of joining or leaving the world, not a collective
    // the engine issued.
    void meet(milliseconds timeout)
    {
        gloo::BarrierOptions o(m_context);
        o.setTag(m_nextTag++);
        o.setTimeout(timeout);
        gloo::barrier(o);
    }

    // Runs one collective; a gloo failure becomes a CommError that names the rank that
    // caused it, and the communicator is unusable afterwards (gloo's pairs are broken).
    void run(const char *op, std::size_t bytes, const std::function<void(std::uint32_t)> &fn)
    {
        const std::string head = "gloo " + std::string(op) + " on rank " +
                                 std::to_string(m_config.rank) + " of " +
                                 std::to_string(m_config.worldSize);
        if (m_aborted.load())
            throw CommError(head + " was refused: this rank was aborted after a failure "
                                   "elsewhere; see the error reported first");
        if (!m_failure.empty()) throw CommError(m_failure);
        const std::uint32_t tag = m_nextTag++;
        if (bytes == 0 && std::strcmp(op, "barrier") != 0) return; // nothing to move
        try {
            fn(tag);
        } catch (const std::exception &e) {
            m_watch->markFailed();
            // Wait for the verdict a little longer than rank 0 needs to judge a silent rank.
            const std::string verdict = m_watch->verdict(m_timing.silence + 2 * m_timing.heartbeat);
            m_failure = head + " (" + std::to_string(bytes) + " bytes) failed: " +
                        (verdict.empty()
                             ? "no rank was reported gone or stopped; a peer may be slower than "
                               "--comm-timeout allows, or ranks issued different collectives"
                             : verdict) +
                        ". gloo said: " + e.what();
            throw CommError(m_failure);
        }
    }

    RendezvousConfig m_config;
    milliseconds m_timeout;
    LivenessTiming m_timing;
    std::unique_ptr<TcpStoreServer> m_server; // rank 0 only
    std::shared_ptr<gloo::Context> m_context;
    std::unique_ptr<LivenessWatch> m_watch;
    std::vector<char> m_scratch;        // reduceScatter's received slices
    std::vector<const void *> m_inputs; // and pointers to them, rank by rank
    std::uint32_t m_nextTag = 0;
    std::string m_failure; // set once a collective failed
    std::atomic<bool> m_aborted{false};
};

} // namespace

std::unique_ptr<Communicator> makeGlooCommunicator(const GlooOptions &options)
{
    if (options.timeout.count() <= 0)
        throw CommError("the gloo collective timeout must be positive, got " +
                        std::to_string(options.timeout.count()) + " ms");
    return std::make_unique<GlooCommunicator>(options);
}

} // namespace shardscope::comm

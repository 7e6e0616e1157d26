#include "comm/asynccommunicator.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace shardscope::comm {

namespace {

enum class Kind : std::uint8_t
{
    AllGather,
    Broadcast,
    ReduceScatter,
    Barrier
};

// One issued collective: its arguments, then its outcome. The handle and the queue share
// it, so an op costs one allocation.
class PendingOp final : public CommHandle::Impl
{
  public:
    PendingOp(Kind kind, const void *send, void *recv, std::size_t size, int root, DType dtype)
        : m_send(send), m_recv(recv), m_size(size), m_root(root), m_kind(kind), m_dtype(dtype)
    {
    }

    bool ready() override { return m_done.load(std::memory_order_acquire) != 0; }
    void wait() override
    {
        m_done.wait(0, std::memory_order_acquire);
        if (m_error) std::rethrow_exception(m_error);
    }

    void run(Communicator &inner)
    {
        try {
            switch (m_kind) {
            case Kind::AllGather:
                inner.allGather(m_send, m_recv, m_size).wait();
                break;
            case Kind::Broadcast:
                inner.broadcast(m_recv, m_size, m_root).wait();
                break;
            case Kind::ReduceScatter:
                inner.reduceScatter(m_send, m_recv, m_size, m_dtype).wait();
                break;
            case Kind::Barrier:
                inner.barrier();
                break;
            }
        } catch (...) {
            m_error = std::current_exception();
        }
        finish();
    }

    void fail(std::exception_ptr error) noexcept
    {
        m_error = std::move(error);
        finish();
    }

  private:
    // The release store publishes m_error and what the collective wrote to its waiters.
    void finish() noexcept
    {
        m_done.store(1, std::memory_order_release);
        m_done.notify_all();
    }

    const void *m_send;
    void *m_recv;
    std::size_t m_size;
    int m_root;
    Kind m_kind;
    DType m_dtype;
    std::exception_ptr m_error;
    // A 32-bit word: atomic::wait on it is a plain futex wait.
    std::atomic<std::uint32_t> m_done{0};
};

class AsyncCommunicator final : public Communicator
{
  public:
    explicit AsyncCommunicator(std::unique_ptr<Communicator> inner)
        : m_inner(std::move(inner)), m_thread([this] { progress(); })
    {
    }

    ~AsyncCommunicator() override
    {
        {
            std::lock_guard lock(m_mutex);
            m_stopping = true;
        }
        m_wake.notify_one();
        m_thread.join();
    }

    int rank() const override { return m_inner->rank(); }
    int worldSize() const override { return m_inner->worldSize(); }
    Backend backend() const override { return m_inner->backend(); }
    bool deviceBuffers() const override { return m_inner->deviceBuffers(); }
    MemorySpace &memory() override { return m_inner->memory(); }
    // Host compute is synchronous: what the rank's thread wrote before issuing is done,
    // and the queue's mutex (released by issue(), acquired by the progress thread before
    // it takes the op) orders those writes before the collective's reads.
    void waitForCompute() override {}
    void bindThread() override { m_inner->bindThread(); }

    void abort() noexcept override
    {
        std::deque<std::shared_ptr<PendingOp>> cancelled;
        std::exception_ptr error;
        {
            std::lock_guard lock(m_mutex);
            if (!m_aborted) m_aborted = abortedError();
            error = m_aborted;
            cancelled.swap(m_queue);
        }
        m_inner->abort();
        for (auto &op : cancelled)
            op->fail(error);
    }

    CommHandle allGather(const void *send, void *recv, std::size_t bytes) override
    {
        return CommHandle(issue(Kind::AllGather, send, recv, bytes, 0, DType::F32));
    }
    CommHandle broadcast(void *buf, std::size_t bytes, int root) override
    {
        return CommHandle(issue(Kind::Broadcast, buf, buf, bytes, root, DType::F32));
    }
    CommHandle reduceScatter(const void *send, void *recv, std::size_t count, DType dtype) override
    {
        return CommHandle(issue(Kind::ReduceScatter, send, recv, count, 0, dtype));
    }
    void barrier() override { issue(Kind::Barrier, nullptr, nullptr, 0, 0, DType::F32)->wait(); }

  private:
    std::exception_ptr abortedError() const noexcept
    {
        try {
            throw CommError("rank " + std::to_string(m_inner->rank()) +
                            " was aborted after a failure on another rank; its queued "
                            "collectives were cancelled and it accepts no new ones. See the "
                            "error the failing rank reported first.");
        } catch (...) {
            return std::current_exception(); // std::bad_alloc if even that failed
        }
    }

    std::shared_ptr<PendingOp> issue(Kind kind, const void *send, void *recv, std::size_t size,
                                     int root, DType dtype)
    {
        auto op = std::make_shared<PendingOp>(kind, send, recv, size, root, dtype);
        {
            std::lock_guard lock(m_mutex);
            if (m_aborted) std::rethrow_exception(m_aborted);
            m_queue.push_back(op);
        }
        m_wake.notify_one();
        return op;
    }

    void progress()
    {
        std::exception_ptr bindError;
        try {
            m_inner->bindThread();
        } catch (...) {
            bindError = std::current_exception();
        }
        for (;;) {
            std::shared_ptr<PendingOp> op;
            {
                std::unique_lock lock(m_mutex);
                m_wake.wait(lock, [this] { return !m_queue.empty() || m_stopping; });
                if (m_queue.empty()) return; // stopping, and everything issued has run
                op = std::move(m_queue.front());
                m_queue.pop_front();
            }
            // A thread the backend could not bind must not run collectives on the
            // wrong device; every op reports why instead.
            if (bindError)
                op->fail(bindError);
            else
                op->run(*m_inner);
        }
    }

    std::unique_ptr<Communicator> m_inner;
    std::mutex m_mutex;
    std::condition_variable m_wake;
    std::deque<std::shared_ptr<PendingOp>> m_queue; // issued, not started
    std::exception_ptr m_aborted;                   // set once abort() was called
    bool m_stopping = false;
    std::thread m_thread; // last: starts once everything above is constructed
};

} // namespace

std::unique_ptr<Communicator> makeAsyncCommunicator(std::unique_ptr<Communicator> inner)
{
    if (!inner) {
        throw std::invalid_argument(
            "makeAsyncCommunicator: got no communicator to wrap; pass one of makeCpuWorld's.");
    }
    return std::make_unique<AsyncCommunicator>(std::move(inner));
}

std::vector<std::unique_ptr<Communicator>>
makeAsyncCommunicators(std::vector<std::unique_ptr<Communicator>> world)
{
    std::vector<std::unique_ptr<Communicator>> out;
    out.reserve(world.size());
    for (auto &c : world)
        out.push_back(makeAsyncCommunicator(std::move(c)));
    return out;
}

} // namespace shardscope::comm

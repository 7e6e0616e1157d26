#pragma once
// The collective operations ZeRO-3 needs, for one rank. Every rank of a world calls
// the same collectives in the same order with the same sizes (as with NCCL). Each
// call returns a handle: CPU collectives are complete when the call returns; device
// backends complete when the handle's event fires, so callers overlap work with
// communication and wait() before touching the output.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "base/types.h"
#include "comm/memoryspace.h"

namespace shardscope::comm {

enum class Backend : std::uint8_t
{
    Cpu = 0,
    Nccl = 1,
    Gloo = 2
};
std::string_view backendName(Backend b); // "cpu", "nccl", "gloo"

// Thrown when ranks disagree on a collective (different sizes, root or dtype), or the
// backend fails. The message says which collective, which ranks and what differed.
class CommError : public std::runtime_error
{
  public:
    using std::runtime_error::runtime_error;
};

// Completion of one asynchronous collective. A collective that failed reports it from
// wait() (CommError); ready() is true once it has finished, successfully or not.
class CommHandle
{
  public:
    class Impl
    {
      public:
        virtual ~Impl() = default;
        virtual bool ready() = 0;
        virtual void wait() = 0;
    };

    CommHandle() = default; // an already-complete handle
    explicit CommHandle(std::shared_ptr<Impl> impl) : m_impl(std::move(impl)) {}

    bool ready() const { return !m_impl || m_impl->ready(); }
    void wait() const
    {
        if (m_impl) m_impl->wait();
    }

  private:
    std::shared_ptr<Impl> m_impl;
};

class Communicator
{
  public:
    virtual ~Communicator() = default;

    virtual int rank() const = 0;
    virtual int worldSize() const = 0;
    virtual Backend backend() const = 0;
    // True when buffers passed to collectives live in device memory.
    virtual bool deviceBuffers() const { return false; }
    // Where this rank's buffers live; the engine allocates shards, gathered tensors and
    // gradients there (see comm/memoryspace.h for the ordering contract).
    virtual MemorySpace &memory() { return hostMemory(); }
    // Collectives issued after this call see every effect of the compute work (and the
    // MemorySpace operations) the rank issued before it. The CPU backend is synchronous:
    // nothing to do. On a GPU the communication stream waits for the compute stream.
    virtual void waitForCompute() {}
    // Called on each thread that will act as this rank (e.g. cudaSetDevice) before it
    // issues anything; Engine::forEachLocalRank does this for its threads.
    virtual void bindThread() {}
    // Releases this rank and its local peers from collectives that will never complete
    // because another rank failed; the communicator is unusable afterwards. Callable from
    // any thread. The CPU backend releases every rank of its world.
    virtual void abort() noexcept {}

    // recv (worldSize * bytes) receives every rank's send (bytes), in rank order.
    virtual CommHandle allGather(const void *send, void *recv, std::size_t bytes) = 0;
    // root's buf (bytes) is copied into every rank's buf.
    virtual CommHandle broadcast(void *buf, std::size_t bytes, int root) = 0;
    // send holds worldSize * count elements; recv (count) receives the element-wise
    // sum over ranks of send's slice [rank*count, (rank+1)*count). Summation is in rank
    // order, so results are deterministic.
    virtual CommHandle reduceScatter(const void *send, void *recv, std::size_t count,
                                     DType dtype) = 0;
    virtual void barrier() = 0;
};

} // namespace shardscope::comm

#pragma once
// Where a rank's tensors live. The engine keeps every shard, gathered tensor and shard
// gradient in its rank's MemorySpace and touches them only through it, so one engine
// serves ranks whose tensors are in host memory (the CPU backend) and ranks whose
// tensors are in GPU memory (NCCL).
//
// Ordering contract (what the engine relies on):
// - allocate(), copy(), zero() and addF32() are ordered with the rank's compute work:
//   work the rank issues afterwards sees their effect. copy() to host memory has
//   completed when it returns.
// - Collectives do not order themselves after compute work: the engine calls
//   Communicator::waitForCompute() before a collective reads data written by these
//   operations or by the caller's own kernels.
// - deallocate() frees after every use already issued by the rank's compute work (on a
//   GPU: stream-ordered on the compute stream), so releasing a gathered tensor right
//   after queueing the kernels that read it is safe.
// The host space does everything synchronously.

#include <cstddef>
#include <string>
#include <utility>

namespace shardscope::comm {

enum class CopyKind : unsigned char
{
    HostToSpace,
    SpaceToHost,
    WithinSpace
};

class MemorySpace
{
  public:
    virtual ~MemorySpace() = default;

    virtual bool isHost() const = 0;
    // "host", "cuda:0": how errors and the docs name it.
    virtual std::string name() const = 0;

    // Uninitialised memory, or nullptr for 0 bytes. Throws std::bad_alloc or the
    // backend's error with the size and what is free.
    virtual std::byte *allocate(std::size_t bytes) = 0;
    // The output buffer of a collective about to be issued: on a GPU it is ordered on the
    // communication stream, so allocating it does not wait for compute. Default: allocate.
    virtual std::byte *allocateForCollective(std::size_t bytes) { return allocate(bytes); }
    virtual void deallocate(std::byte *p, std::size_t bytes) noexcept = 0;

    virtual void copy(void *dst, const void *src, std::size_t bytes, CopyKind kind) = 0;
    virtual void zero(void *dst, std::size_t bytes) = 0;
    // dst[i] += src[i] for i < n (fp32), both in this space.
    virtual void addF32(float *dst, const float *src, std::size_t n) = 0;
};

// The process's host memory (64-byte aligned allocations).
MemorySpace &hostMemory();

// An owning allocation in a MemorySpace; move-only.
class Buffer
{
  public:
    Buffer() = default;
    Buffer(MemorySpace &space, std::size_t bytes)
        : m_space(&space), m_data(space.allocate(bytes)), m_bytes(bytes)
    {
    }
    // Takes ownership of p (bytes long, allocated by space).
    static Buffer adopt(MemorySpace &space, std::byte *p, std::size_t bytes)
    {
        Buffer b;
        b.m_space = &space;
        b.m_data = p;
        b.m_bytes = bytes;
        return b;
    }
    ~Buffer() { reset(); }
    Buffer(Buffer &&o) noexcept
        : m_space(o.m_space), m_data(std::exchange(o.m_data, nullptr)),
          m_bytes(std::exchange(o.m_bytes, 0))
    {
    }
    Buffer &operator=(Buffer &&o) noexcept
    {
        if (this != &o) {
            reset();
            m_space = o.m_space;
            m_data = std::exchange(o.m_data, nullptr);
            m_bytes = std::exchange(o.m_bytes, 0);
        }
        return *this;
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;

    void reset() noexcept
    {
        if (m_data) m_space->deallocate(m_data, m_bytes);
        m_data = nullptr;
        m_bytes = 0;
    }
    std::byte *data() const { return m_data; }
    float *f32() const { return reinterpret_cast<float *>(m_data); }
    std::size_t size() const { return m_bytes; }
    bool empty() const { return m_bytes == 0; }
    explicit operator bool() const { return m_data != nullptr; }
    MemorySpace *space() const { return m_space; }

  private:
    MemorySpace *m_space = nullptr;
    std::byte *m_data = nullptr;
    std::size_t m_bytes = 0;
};

} // namespace shardscope::comm

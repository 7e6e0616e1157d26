#include "comm/memoryspace.h"

#include <cstring>
#include <new>

namespace shardscope::comm {

namespace {

class HostMemory final : public MemorySpace
{
  public:
    bool isHost() const override { return true; }
    std::string name() const override { return "host"; }
    std::byte *allocate(std::size_t bytes) override
    {
        if (bytes == 0) return nullptr;
        return static_cast<std::byte *>(::operator new (bytes, std::align_val_t{64}));
    }
    void deallocate(std::byte *p, std::size_t) noexcept override
    {
        if (p) ::operator delete (p, std::align_val_t{64});
    }
    void copy(void *dst, const void *src, std::size_t bytes, CopyKind) override
    {
        if (bytes) std::memmove(dst, src, bytes);
    }
    void zero(void *dst, std::size_t bytes) override
    {
        if (bytes) std::memset(dst, 0, bytes);
    }
    void addF32(float *dst, const float *src, std::size_t n) override
    {
        for (std::size_t i = 0; i < n; ++i)
            dst[i] += src[i];
    }
};

} // namespace

MemorySpace &hostMemory()
{
    static HostMemory host;
    return host;
}

} // namespace shardscope::comm

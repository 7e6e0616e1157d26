// CudaMemory: stream-ordered allocations and copies on one device. Errors name the call,
// the device and, for allocations, the size asked for and what the device has free.

#include "comm/nccl/cudamemory.h"

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>

#include "comm/communicator.h"
#include "comm/nccl/deviceadd.h"

namespace shardscope::comm {

namespace {

std::string mib(std::size_t bytes)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

} // namespace

void keepPoolMemory(int device)
{
    static std::mutex mutex;
    static std::set<int> done;
    std::lock_guard lock(mutex);
    if (done.count(device)) return;
    cudaMemPool_t pool = nullptr;
    cudaError_t err = cudaDeviceGetDefaultMemPool(&pool, device);
    std::uint64_t keep = UINT64_MAX;
    if (err == cudaSuccess)
        err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (err != cudaSuccess) {
        cudaGetLastError();
        throw comm::CommError(
            "CUDA call cudaMemPoolSetAttribute(ReleaseThreshold) failed on cuda:" +
            std::to_string(device) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
    }
    done.insert(device);
}

CudaMemory::CudaMemory(int device, cudaStream_t compute, cudaStream_t comm)
    : m_device(device), m_compute(compute), m_comm(comm)
{
    bind();
    keepPoolMemory(device);
}

std::string CudaMemory::name() const
{
    return "cuda:" + std::to_string(m_device);
}

void CudaMemory::bind() const
{
    int current = -1;
    const cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess) fail(err, "cudaGetDevice");
    if (current != m_device) {
        const cudaError_t set = cudaSetDevice(m_device);
        if (set != cudaSuccess) fail(set, "cudaSetDevice");
    }
}

void CudaMemory::fail(cudaError_t err, const char *call) const
{
    cudaGetLastError(); // clear a non-sticky error so the next call is not blamed for it
    throw comm::CommError(std::string("CUDA call ") + call + " failed on " + name() + ": " +
                          cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

void CudaMemory::failAllocation(cudaError_t err, const char *call, std::size_t bytes) const
{
    cudaGetLastError();
    std::size_t freeBytes = 0, total = 0;
    std::string free = "unknown";
    if (cudaMemGetInfo(&freeBytes, &total) == cudaSuccess)
        free = mib(freeBytes) + " of " + mib(total);
    else
        cudaGetLastError();
    throw comm::CommError(std::string("CUDA call ") + call + " could not allocate " + mib(bytes) +
                          " on " + name() + " (" + cudaGetErrorName(err) + ": " +
                          cudaGetErrorString(err) + "); the device has " + free +
                          " free. Use a smaller model or batch, more ranks, or a lower "
                          "--persistence-threshold");
}

std::byte *CudaMemory::allocate(std::size_t bytes)
{
    if (bytes == 0) return nullptr;
    bind();
    const cudaStream_t s = computeStream();
    void *p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, bytes, s);
    if (err != cudaSuccess) failAllocation(err, "cudaMallocAsync", bytes);
    err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) {
        cudaFreeAsync(p, s);
        fail(err, "cudaStreamSynchronize (after cudaMallocAsync)");
    }
    return static_cast<std::byte *>(p);
}

std::byte *CudaMemory::allocateForCollective(std::size_t bytes)
{
    if (bytes == 0) return nullptr;
    bind();
    void *p = nullptr;
    const cudaError_t err = cudaMallocAsync(&p, bytes, m_comm);
    if (err != cudaSuccess) failAllocation(err, "cudaMallocAsync (collective output)", bytes);
    return static_cast<std::byte *>(p);
}

void CudaMemory::deallocate(std::byte *p, std::size_t bytes) noexcept
{
    if (!p) return;
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err == cudaSuccess && current != m_device) err = cudaSetDevice(m_device);
    if (err == cudaSuccess) err = cudaFreeAsync(p, computeStream());
    if (err == cudaSuccess) return;
    cudaGetLastError();
    // Freeing runs in destructors and on error paths: say it once, never throw.
    if (!m_freeFailureReported.exchange(true))
        std::fprintf(stderr,
                     "shardscope: cudaFreeAsync of %zu bytes on cuda:%d failed (%s: %s); device "
                     "memory is leaking, later failures of this kind are not reported\n",
                     bytes, m_device, cudaGetErrorName(err), cudaGetErrorString(err));
}

void CudaMemory::copy(void *dst, const void *src, std::size_t bytes, comm::CopyKind kind)
{
    if (bytes == 0) return;
    bind();
    const cudaStream_t s = computeStream();
    switch (kind) {
    case comm::CopyKind::HostToSpace: {
        // A pageable source is staged before cudaMemcpyAsync returns: the caller may
        // reuse it at once.
        const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s);
        if (err != cudaSuccess) fail(err, "cudaMemcpyAsync (host to device)");
        return;
    }
    case comm::CopyKind::SpaceToHost: {
        cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
        if (err != cudaSuccess) fail(err, "cudaMemcpyAsync (device to host)");
        err = cudaStreamSynchronize(s);
        if (err != cudaSuccess) fail(err, "cudaStreamSynchronize (device to host copy)");
        return;
    }
    case comm::CopyKind::WithinSpace: {
        const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
        if (err != cudaSuccess) fail(err, "cudaMemcpyAsync (device to device)");
        return;
    }
    }
}

void CudaMemory::zero(void *dst, std::size_t bytes)
{
    if (bytes == 0) return;
    bind();
    const cudaError_t err = cudaMemsetAsync(dst, 0, bytes, computeStream());
    if (err != cudaSuccess) fail(err, "cudaMemsetAsync");
}

void CudaMemory::addF32(float *dst, const float *src, std::size_t n)
{
    if (n == 0) return;
    bind();
    try {
        addInPlace(dst, src, static_cast<std::int64_t>(n), computeStream());
    } catch (const comm::CommError &e) {
        throw comm::CommError(std::string(e.what()) + " (MemorySpace::addF32 on " + name() + ")");
    }
}

} // namespace shardscope::comm

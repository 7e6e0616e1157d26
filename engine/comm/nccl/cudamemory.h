#pragma once
// One GPU's memory as an engine MemorySpace (see comm/memoryspace.h for the contract):
// everything is ordered on the rank's compute stream, except the output buffers of
// collectives, which are allocated on the communication stream so that a prefetch does
// not wait for the compute work queued before it. Memory comes from the device's
// stream-ordered pool, which keeps what is freed for the next step instead of returning
// it to the driver.

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

#include "comm/memoryspace.h"

namespace shardscope::comm {

class CudaMemory final : public comm::MemorySpace
{
  public:
    CudaMemory(int device, cudaStream_t compute, cudaStream_t comm);

    bool isHost() const override { return false; }
    std::string name() const override; // "cuda:0"

    // Allocated in the compute stream's order, then that stream is synchronised, so the
    // memory is usable from any stream (partition, scratch: rare).
    std::byte *allocate(std::size_t bytes) override;
    // Allocated in the communication stream's order, without synchronising: only that
    // stream may use it before the collective issued next on it has completed.
    std::byte *allocateForCollective(std::size_t bytes) override;
    // Freed in the compute stream's order (after the kernels already queued that read it).
    void deallocate(std::byte *p, std::size_t bytes) noexcept override;

    void copy(void *dst, const void *src, std::size_t bytes, comm::CopyKind kind) override;
    void zero(void *dst, std::size_t bytes) override;
    void addF32(float *dst, const float *src, std::size_t n) override;

    int device() const { return m_device; }
    cudaStream_t computeStream() const { return m_compute.load(std::memory_order_acquire); }
    cudaStream_t commStream() const { return m_comm; }
    // The communicator's compute stream changed (NcclCommunicator::setComputeStream).
    void setComputeStream(cudaStream_t stream)
    {
        m_compute.store(stream, std::memory_order_release);
    }

  private:
    void bind() const;
    [[noreturn]] void fail(cudaError_t err, const char *call) const;
    [[noreturn]] void failAllocation(cudaError_t err, const char *call, std::size_t bytes) const;

    int m_device;
    std::atomic<cudaStream_t> m_compute;
    cudaStream_t m_comm;
    std::atomic<bool> m_freeFailureReported{false};
};

// Keeps the memory the device's default pool frees (release threshold: unlimited), so
// stream-ordered allocations of one step reuse the previous step's. Once per device.
void keepPoolMemory(int device);

} // namespace shardscope::comm

// RAII wrappers over cudaMalloc and cudaStreamCreate.

#include "cuda/devicebuffer.h"

#include "comm/nccl/cudacheck.h"

namespace shardscope::cuda {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : m_bytes(bytes)
{
    if (bytes == 0) return;
    SHARDSCOPE_CUDA_CHECK(cudaMalloc(&m_ptr, bytes));
    // cudaMemset runs on the legacy default stream, which the non-blocking streams of
    // the communicator and the trainer do not wait for: finish it here.
    cudaError_t err = cudaMemset(m_ptr, 0, bytes);
    if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
    if (err != cudaSuccess) {
        release();
        comm::throwCudaError(err, "cudaMemset(buffer, 0, bytes)", __FILE__, __LINE__);
    }
}

DeviceBuffer::~DeviceBuffer()
{
    release();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer &&o) noexcept : m_ptr(o.m_ptr), m_bytes(o.m_bytes)
{
    o.m_ptr = nullptr;
    o.m_bytes = 0;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept
{
    if (this != &o) {
        release();
        m_ptr = o.m_ptr;
        m_bytes = o.m_bytes;
        o.m_ptr = nullptr;
        o.m_bytes = 0;
    }
    return *this;
}

void DeviceBuffer::release() noexcept
{
    if (m_ptr) cudaFree(m_ptr);
    m_ptr = nullptr;
    m_bytes = 0;
}

void DeviceBuffer::upload(const void *host, std::size_t bytes, std::size_t offset)
{
    if (offset + bytes > m_bytes)
        throw comm::CommError("DeviceBuffer::upload of " + std::to_string(bytes) +
                              " bytes at offset " + std::to_string(offset) +
                              " overruns a buffer of " + std::to_string(m_bytes));
    if (bytes) {
        SHARDSCOPE_CUDA_CHECK(
            cudaMemcpy(static_cast<char *>(m_ptr) + offset, host, bytes, cudaMemcpyHostToDevice));
        // A pageable copy may return before its DMA lands; non-blocking streams must see it.
        SHARDSCOPE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
}

void DeviceBuffer::download(void *host, std::size_t bytes, std::size_t offset) const
{
    if (offset + bytes > m_bytes)
        throw comm::CommError("DeviceBuffer::download of " + std::to_string(bytes) +
                              " bytes at offset " + std::to_string(offset) +
                              " overruns a buffer of " + std::to_string(m_bytes));
    if (bytes)
        SHARDSCOPE_CUDA_CHECK(cudaMemcpy(host, static_cast<const char *>(m_ptr) + offset, bytes,
                                         cudaMemcpyDeviceToHost));
}

Stream::Stream()
{
    SHARDSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
}

Stream::~Stream()
{
    if (m_stream) cudaStreamDestroy(m_stream);
}

void Stream::synchronize() const
{
    SHARDSCOPE_CUDA_CHECK(cudaStreamSynchronize(m_stream));
}

void setDevice(int device)
{
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(device));
}

} // namespace shardscope::cuda

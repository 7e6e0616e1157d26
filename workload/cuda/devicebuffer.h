#pragma once
// Owned device memory and CUDA streams/events, released on destruction, so that an
// exception halfway through setting up a GPU run leaks nothing.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardscope::cuda {

// Device memory from cudaMalloc (zero-filled before the constructor returns), freed by
// the destructor.
class DeviceBuffer
{
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer &&o) noexcept;
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept;
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;

    void *data() const { return m_ptr; }
    float *f32() const { return static_cast<float *>(m_ptr); }
    std::int32_t *i32() const { return static_cast<std::int32_t *>(m_ptr); }
    double *f64() const { return static_cast<double *>(m_ptr); }
    std::size_t bytes() const { return m_bytes; }

    // Complete when they return. download() does not wait for other streams: synchronize
    // the stream that wrote the buffer first.
    void upload(const void *host, std::size_t bytes, std::size_t offset = 0);
    void download(void *host, std::size_t bytes, std::size_t offset = 0) const;
    template <typename T> std::vector<T> toHost() const
    {
        std::vector<T> out(m_bytes / sizeof(T));
        download(out.data(), out.size() * sizeof(T));
        return out;
    }

  private:
    void release() noexcept;
    void *m_ptr = nullptr;
    std::size_t m_bytes = 0;
};

// A non-blocking stream of the current device.
class Stream
{
  public:
    Stream();
    ~Stream();
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    cudaStream_t get() const { return m_stream; }
    void synchronize() const;

  private:
    cudaStream_t m_stream = nullptr;
};

// Selects device for the calling thread; checked.
void setDevice(int device);

} // namespace shardscope::cuda

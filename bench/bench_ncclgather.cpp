// Gather benchmark for scripts/gpu-check (not a test): NCCL all_gather through
// NcclCommunicator, world 1 on GPU 0, against cudaMemcpy device-to-device of the same
// bytes, 4 KiB to 256 MiB. Prints a Markdown table; times come from CUDA events.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "comm/nccl/cudacheck.h"
#include "comm/nccl/ncclcommunicator.h"
#include "cuda/backendselect.h"
#include "cuda/devicebuffer.h"

using namespace shardscope;

namespace {

// Mean milliseconds of one op over iters, after warm-up, timed on stream.
template <typename Op> double timeMs(cudaStream_t stream, int iters, Op op)
{
    for (int i = 0; i < 3; ++i)
        op();
    SHARDSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaEvent_t a = nullptr, b = nullptr;
    SHARDSCOPE_CUDA_CHECK(cudaEventCreate(&a));
    SHARDSCOPE_CUDA_CHECK(cudaEventCreate(&b));
    SHARDSCOPE_CUDA_CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < iters; ++i)
        op();
    SHARDSCOPE_CUDA_CHECK(cudaEventRecord(b, stream));
    SHARDSCOPE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    SHARDSCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / iters;
}

std::string sizeText(std::size_t bytes)
{
    if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
    return std::to_string(bytes >> 10) + " KiB";
}

} // namespace

int main()
{
    try {
        const cuda::BackendChoice choice = cuda::chooseBackend("nccl");
        std::printf("%s\n\n", choice.reason.c_str());
        auto world = comm::makeNcclLocalWorld({0});
        comm::NcclCommunicator &comm = world.front();
        cuda::setDevice(0);
        cuda::Stream copyStream;
        const std::size_t maxBytes = std::size_t(256) << 20;
        cuda::DeviceBuffer src(maxBytes), dst(maxBytes);
        std::printf(
            "| bytes | NCCL all_gather (world 1) µs | GB/s | cudaMemcpy D2D µs | GB/s | ratio |\n");
        std::printf("|---:|---:|---:|---:|---:|---:|\n");
        for (std::size_t bytes = 4096; bytes <= maxBytes; bytes *= 4) {
            const int iters =
                static_cast<int>(std::clamp<std::size_t>((std::size_t(4) << 30) / bytes, 10, 2000));
            const double gatherMs = timeMs(comm.commStream(), iters,
                                           [&] { comm.allGather(src.data(), dst.data(), bytes); });
            const double copyMs = timeMs(copyStream.get(), iters, [&] {
                SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes,
                                                      cudaMemcpyDeviceToDevice, copyStream.get()));
            });
            const double gatherGBs = double(bytes) / (gatherMs * 1e-3) / 1e9;
            const double copyGBs = double(bytes) / (copyMs * 1e-3) / 1e9;
            std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2f |\n", sizeText(bytes).c_str(),
                        gatherMs * 1e3, gatherGBs, copyMs * 1e3, copyGBs, gatherGBs / copyGBs);
            std::fflush(stdout);
        }
        std::printf(
            "\nGB/s = bytes moved into the destination / time (1 GB = 1e9 bytes); each row is "
            "the mean of 10..2000 back-to-back operations after 3 warm-ups, timed with CUDA "
            "events.\n");
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "gpu-gather-bench: %s\n", e.what());
        return 1;
    }
}

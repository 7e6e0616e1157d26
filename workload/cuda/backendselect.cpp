// chooseBackend(): the run-time decision between the CPU and the NCCL backend.
// Built without CUDA it always falls back to the CPU; built with CUDA it asks the
// (static) CUDA runtime for devices, which answers even where libcuda.so.1 is absent.

#include "cuda/backendselect.h"

#include <stdexcept>
#include <string>

#if SHARDSCOPE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "comm/nccl/ncclapi.h"
#include "cuda/cublasapi.h"
#endif

namespace shardscope::cuda {

namespace {

enum class Request
{
    Cpu,
    Nccl,
    Gloo,
    Auto
};

Request parseRequest(std::string_view requested)
{
    if (requested == "cpu") return Request::Cpu;
    if (requested == "nccl") return Request::Nccl;
    if (requested == "gloo") return Request::Gloo;
    if (requested == "auto") return Request::Auto;
    throw std::invalid_argument("unknown backend '" + std::string(requested) +
                                "': expected cpu, nccl, gloo or auto");
}

// Empty when the GPU path can run; otherwise what is missing, in one line.
std::string missingForNccl(int &deviceCount, std::string &found)
{
    deviceCount = 0;
#if SHARDSCOPE_HAVE_CUDA
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorInsufficientDriver)
        return "no usable NVIDIA driver (libcuda.so.1 is missing or older than this CUDA "
               "runtime)";
    if (err == cudaErrorNoDevice) return "no CUDA GPU found";
    if (err != cudaSuccess)
        return std::string("the CUDA runtime cannot list GPUs (") + cudaGetErrorName(err) + ": " +
               cudaGetErrorString(err) + ")";
    if (count <= 0) return "no CUDA GPU found";
    deviceCount = count;
    const comm::NcclApi &nccl = comm::ncclApi();
    if (!nccl.loaded) return "NCCL could not be loaded (" + nccl.error + ")";
    const CublasApi &blas = cublasApi();
    if (!blas.loaded) return "cuBLAS could not be loaded (" + blas.error + ")";
    cudaDeviceProp prop{};
    std::string name = "GPU";
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) name = prop.name;
    found = std::to_string(count) + (count == 1 ? " GPU (" : " GPUs (") + name + "), NCCL " +
            nccl.version;
    return {};
#else
    (void)found;
    return "this build has no CUDA/NCCL support (configured with SHARDSCOPE_CUDA=OFF, or nvcc "
           "and NCCL were not found at build time)";
#endif
}

} // namespace

BackendChoice chooseBackend(std::string_view requested)
{
    const Request req = parseRequest(requested);
    BackendChoice choice;
    if (req == Request::Cpu) {
        choice.reason = "CPU backend: requested with --backend cpu";
        return choice;
    }
    if (req == Request::Gloo) {
        choice.backend = comm::Backend::Gloo;
        choice.reason = "gloo backend: one process per rank, collectives over TCP";
        return choice;
    }
    std::string found;
    const std::string missing = missingForNccl(choice.deviceCount, found);
    if (!missing.empty()) {
        if (req == Request::Nccl)
            throw comm::CommError("--backend nccl cannot be used: " + missing +
                                  ". Run with --backend cpu (or auto) on this machine.");
        choice.reason = "CPU backend: " + missing;
        return choice;
    }
    choice.backend = comm::Backend::Nccl;
    choice.reason = "NCCL backend: " + found;
    return choice;
}

} // namespace shardscope::cuda

// dlopen/dlsym of libnccl.so.2 and libcublas.so.<major>: the build's library folder is
// tried after the default search path, and SHARDSCOPE_NCCL_LIBRARY /
// SHARDSCOPE_CUBLAS_LIBRARY name a file explicitly.

#include "cuda/gpulibs.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardscope::cuda {

namespace {

void *openFirst(const std::vector<std::string> &candidates, std::string &path, std::string &error)
{
    for (const std::string &name : candidates) {
        if (name.empty()) continue;
        if (void *h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
            path = name;
            return h;
        }
        const char *why = dlerror();
        error += (error.empty() ? "" : "; ") + std::string(why ? why : name.c_str());
    }
    return nullptr;
}

template <typename Fn> bool bind(void *handle, const char *symbol, Fn &out, std::string &error)
{
    out = reinterpret_cast<Fn>(dlsym(handle, symbol));
    if (!out) error = std::string("symbol ") + symbol + " is missing from the library";
    return out != nullptr;
}

std::string envOr(const char *name)
{
    const char *v = std::getenv(name);
    return v ? v : "";
}

NcclApi loadNccl()
{
    NcclApi api;
    void *h = openFirst({envOr("SHARDSCOPE_NCCL_LIBRARY"), "libnccl.so.2",
                         std::string(SHARDSCOPE_NCCL_LIBDIR) + "/libnccl.so.2"},
                        api.path, api.error);
    if (!h) return api;
    api.error.clear();
    const bool ok = bind(h, "ncclGetVersion", api.getVersion, api.error) &&
                    bind(h, "ncclGetUniqueId", api.getUniqueId, api.error) &&
                    bind(h, "ncclCommInitRank", api.commInitRank, api.error) &&
                    bind(h, "ncclCommInitAll", api.commInitAll, api.error) &&
                    bind(h, "ncclCommDestroy", api.commDestroy, api.error) &&
                    bind(h, "ncclCommAbort", api.commAbort, api.error) &&
                    bind(h, "ncclCommGetAsyncError", api.commGetAsyncError, api.error) &&
                    bind(h, "ncclGetErrorString", api.getErrorString, api.error) &&
                    bind(h, "ncclGetLastError", api.getLastError, api.error) &&
                    bind(h, "ncclAllGather", api.allGather, api.error) &&
                    bind(h, "ncclBroadcast", api.broadcast, api.error) &&
                    bind(h, "ncclReduceScatter", api.reduceScatter, api.error) &&
                    bind(h, "ncclAllReduce", api.allReduce, api.error) &&
                    bind(h, "ncclGroupStart", api.groupStart, api.error) &&
                    bind(h, "ncclGroupEnd", api.groupEnd, api.error);
    if (!ok) {
        api.error = api.path + ": " + api.error + " (NCCL 2.19 or newer is needed)";
        return api;
    }
    int code = 0;
    if (api.getVersion(&code) == ncclSuccess) {
        // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
        api.version = std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
                      std::to_string(code % 100);
    }
    api.loaded = true;
    return api;
}

CublasApi loadCublas()
{
    CublasApi api;
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void *h = openFirst({envOr("SHARDSCOPE_CUBLAS_LIBRARY"), soname,
                         std::string(SHARDSCOPE_CUDA_LIBDIR) + "/" + soname},
                        api.path, api.error);
    if (!h) return api;
    api.error.clear();
    const bool ok = bind(h, "cublasCreate_v2", api.create, api.error) &&
                    bind(h, "cublasDestroy_v2", api.destroy, api.error) &&
                    bind(h, "cublasSetStream_v2", api.setStream, api.error) &&
                    bind(h, "cublasSetMathMode", api.setMathMode, api.error) &&
                    bind(h, "cublasSgemm_v2", api.sgemm, api.error) &&
                    bind(h, "cublasGetStatusString", api.getStatusString, api.error);
    if (!ok) {
        api.error = api.path + ": " + api.error;
        return api;
    }
    api.loaded = true;
    return api;
}

} // namespace

const NcclApi &ncclApi()
{
    static const NcclApi api = loadNccl();
    return api;
}

const CublasApi &cublasApi()
{
    static const CublasApi api = loadCublas();
    return api;
}

const NcclApi &requireNccl()
{
    const NcclApi &api = ncclApi();
    if (!api.loaded)
        throw comm::CommError(
            "NCCL could not be loaded: " + api.error +
            ". Install NCCL 2 (libnccl.so.2) or point SHARDSCOPE_NCCL_LIBRARY at it.");
    return api;
}

const CublasApi &requireCublas()
{
    const CublasApi &api = cublasApi();
    if (!api.loaded)
        throw comm::CommError(
            "cuBLAS could not be loaded: " + api.error +
            ". Install the CUDA toolkit's cuBLAS or point SHARDSCOPE_CUBLAS_LIBRARY at it.");
    return api;
}

} // namespace shardscope::cuda

// dlopen/dlsym of libnccl.so.2: the build's library folder is tried after the default
// search path, and SHARDSCOPE_NCCL_LIBRARY names a file explicitly.

#include "comm/nccl/ncclapi.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardscope::comm {

void *openFirstLibrary(const std::vector<std::string> &candidates, std::string &path,
                       std::string &error)
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

std::string environmentOr(const char *name)
{
    const char *v = std::getenv(name);
    return v ? v : "";
}

void *findSymbol(void *library, const char *symbol)
{
    return dlsym(library, symbol);
}

namespace {

NcclApi loadNccl()
{
    NcclApi api;
    void *h = openFirstLibrary({environmentOr("SHARDSCOPE_NCCL_LIBRARY"), "libnccl.so.2",
                                std::string(SHARDSCOPE_NCCL_LIBDIR) + "/libnccl.so.2"},
                               api.path, api.error);
    if (!h) return api;
    api.error.clear();
    const bool ok = bindSymbol(h, "ncclGetVersion", api.getVersion, api.error) &&
                    bindSymbol(h, "ncclGetUniqueId", api.getUniqueId, api.error) &&
                    bindSymbol(h, "ncclCommInitRank", api.commInitRank, api.error) &&
                    bindSymbol(h, "ncclCommInitAll", api.commInitAll, api.error) &&
                    bindSymbol(h, "ncclCommDestroy", api.commDestroy, api.error) &&
                    bindSymbol(h, "ncclCommAbort", api.commAbort, api.error) &&
                    bindSymbol(h, "ncclCommGetAsyncError", api.commGetAsyncError, api.error) &&
                    bindSymbol(h, "ncclGetErrorString", api.getErrorString, api.error) &&
                    bindSymbol(h, "ncclGetLastError", api.getLastError, api.error) &&
                    bindSymbol(h, "ncclAllGather", api.allGather, api.error) &&
                    bindSymbol(h, "ncclBroadcast", api.broadcast, api.error) &&
                    bindSymbol(h, "ncclReduceScatter", api.reduceScatter, api.error) &&
                    bindSymbol(h, "ncclAllReduce", api.allReduce, api.error) &&
                    bindSymbol(h, "ncclGroupStart", api.groupStart, api.error) &&
                    bindSymbol(h, "ncclGroupEnd", api.groupEnd, api.error);
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

} // namespace

const NcclApi &ncclApi()
{
    static const NcclApi api = loadNccl();
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

} // namespace shardscope::comm

#pragma once
// NCCL loaded with dlopen on first use, so that no ShardScope binary needs it (or libcuda,
// which it opens itself) to start. The function pointers have the exact types of the
// functions declared in nccl.h. (cuBLAS, which only the workload's layers use, is loaded
// the same way by cuda/cublasapi.h.)

#include <nccl.h>

#include <string>
#include <vector>

namespace shardscope::comm {

struct NcclApi
{
    bool loaded = false;
    std::string error;   // why it did not load: the names tried and dlerror()
    std::string path;    // the library that was loaded
    std::string version; // "2.28.9"
    decltype(&::ncclGetVersion) getVersion = nullptr;
    decltype(&::ncclGetUniqueId) getUniqueId = nullptr;
    decltype(&::ncclCommInitRank) commInitRank = nullptr;
    decltype(&::ncclCommInitAll) commInitAll = nullptr;
    decltype(&::ncclCommDestroy) commDestroy = nullptr;
    decltype(&::ncclCommAbort) commAbort = nullptr;
    decltype(&::ncclCommGetAsyncError) commGetAsyncError = nullptr;
    decltype(&::ncclGetErrorString) getErrorString = nullptr;
    decltype(&::ncclGetLastError) getLastError = nullptr;
    decltype(&::ncclAllGather) allGather = nullptr;
    decltype(&::ncclBroadcast) broadcast = nullptr;
    decltype(&::ncclReduceScatter) reduceScatter = nullptr;
    decltype(&::ncclAllReduce) allReduce = nullptr;
    decltype(&::ncclGroupStart) groupStart = nullptr;
    decltype(&::ncclGroupEnd) groupEnd = nullptr;
};

// Loaded once, thread-safe; never throws (check loaded / error).
const NcclApi &ncclApi();
// The same, but throws CommError saying what is missing and what to do.
const NcclApi &requireNccl();

// The loading itself, shared with cuda/cublasapi.h (cuBLAS):
// dlopen of the first candidate that opens (empty names are skipped): path is the one
// opened; error collects dlerror() of each that did not.
void *openFirstLibrary(const std::vector<std::string> &candidates, std::string &path,
                       std::string &error);
// The value of an environment variable, empty when unset.
std::string environmentOr(const char *name);
// dlsym(library, symbol).
void *findSymbol(void *library, const char *symbol);
// out = symbol, typed; false, with error saying which symbol, when it is missing.
template <typename Fn>
bool bindSymbol(void *library, const char *symbol, Fn &out, std::string &error)
{
    out = reinterpret_cast<Fn>(findSymbol(library, symbol));
    if (!out) error = std::string("symbol ") + symbol + " is missing from the library";
    return out != nullptr;
}

} // namespace shardscope::comm

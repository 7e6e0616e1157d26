// dlopen/dlsym of libcublas.so.<major>: the folder the build found cuBLAS in (the CUDA
// install's, or NVIDIA's nvidia-cublas wheel's) and the CUDA install's are tried after the
// default search path, and SHARDSCOPE_CUBLAS_LIBRARY names a file explicitly.

#include "cuda/cublasapi.h"

#include <string>

#include "comm/communicator.h"
#include "comm/nccl/ncclapi.h"

namespace shardscope::cuda {

namespace {

CublasApi loadCublas()
{
    CublasApi api;
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void *h = comm::openFirstLibrary({comm::environmentOr("SHARDSCOPE_CUBLAS_LIBRARY"), soname,
                                      std::string(SHARDSCOPE_CUBLAS_LIBDIR) + "/" + soname,
                                      std::string(SHARDSCOPE_CUDA_LIBDIR) + "/" + soname},
                                     api.path, api.error);
    if (!h) return api;
    api.error.clear();
    const bool ok = comm::bindSymbol(h, "cublasCreate_v2", api.create, api.error) &&
                    comm::bindSymbol(h, "cublasDestroy_v2", api.destroy, api.error) &&
                    comm::bindSymbol(h, "cublasSetStream_v2", api.setStream, api.error) &&
                    comm::bindSymbol(h, "cublasSetMathMode", api.setMathMode, api.error) &&
                    comm::bindSymbol(h, "cublasSgemm_v2", api.sgemm, api.error) &&
                    comm::bindSymbol(h, "cublasGetStatusString", api.getStatusString, api.error);
    if (!ok) {
        api.error = api.path + ": " + api.error;
        return api;
    }
    api.loaded = true;
    return api;
}

} // namespace

const CublasApi &cublasApi()
{
    static const CublasApi api = loadCublas();
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

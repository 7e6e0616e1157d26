// cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major
// C^T = op(B)^T op(A)^T, so the operands are passed swapped.

#include "cuda/blas.h"

#include <string>

#include "comm/nccl/cudacheck.h"
#include "cuda/cublasapi.h"
#include "cuda/layers.h"

namespace shardscope::cuda {

namespace {

void check(cublasStatus_t status, const char *call)
{
    if (status != CUBLAS_STATUS_SUCCESS) {
        const CublasApi &api = cublasApi();
        const char *text = api.getStatusString ? api.getStatusString(status) : "unknown status";
        throw comm::CommError(std::string("cuBLAS call ") + call + " failed: " + text);
    }
}

} // namespace

Blas::Blas(int device, cudaStream_t stream) : m_stream(stream)
{
    const CublasApi &api = requireCublas();
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(device));
    cublasHandle_t h = nullptr;
    check(api.create(&h), "cublasCreate");
    m_handle = h;
    check(api.setStream(h, stream), "cublasSetStream");
    check(api.setMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

Blas::~Blas()
{
    if (m_handle) cublasApi().destroy(static_cast<cublasHandle_t>(m_handle));
}

void Blas::gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float *a, int lda,
                const float *b, int ldb, float beta, float *c, int ldc)
{
    if (m == 0 || n == 0) return;
    check(cublasApi().sgemm(static_cast<cublasHandle_t>(m_handle),
                            transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                            n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
          "cublasSgemm");
}

void Blas::linearForward(const float *x, int rows, int in, int out, const float *weight,
                         const float *bias, float *y)
{
    gemm(false, true, rows, out, in, 1.0f, x, in, weight, in, 0.0f, y, out);
    if (bias) addBiasRows(y, bias, rows, out, m_stream);
}

void Blas::linearBackward(const float *x, int rows, int in, int out, const float *weight,
                          const float *dy, float *dx, float *dWeight, float *dBias)
{
    if (dx) gemm(false, false, rows, in, out, 1.0f, dy, out, weight, in, 0.0f, dx, in);
    gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dWeight, in);
    if (dBias) sumRowsInto(dy, rows, out, dBias, m_stream);
}

} // namespace shardscope::cuda

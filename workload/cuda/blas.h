#pragma once
// Matrix products on the GPU through cuBLAS (loaded at run time), with the row-major
// conventions of nn/layers.h, plus the linear and tied-head layers built on them.

#include <cuda_runtime_api.h>

#include <memory>

namespace shardscope::cuda {

// One cuBLAS handle bound to one device and stream. Full fp32 math (no TF32), so the
// results match the CPU layers to fp32 rounding.
class Blas
{
  public:
    Blas(int device, cudaStream_t stream); // throws CommError when cuBLAS is missing or fails
    ~Blas();
    Blas(const Blas &) = delete;
    Blas &operator=(const Blas &) = delete;

    // C[m,n] = alpha * op(A) * op(B) + beta * C, row-major (as nn::gemm).
    void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

    // y[rows,out] = x[rows,in] * weight[out,in]^T + bias[out] (bias may be null).
    void linearForward(const float *x, int rows, int in, int out, const float *weight,
                       const float *bias, float *y);
    // dx may be null; dBias may be null. dWeight/dBias accumulate, dx is overwritten.
    void linearBackward(const float *x, int rows, int in, int out, const float *weight,
                        const float *dy, float *dx, float *dWeight, float *dBias);

    cudaStream_t stream() const { return m_stream; }

  private:
    void *m_handle = nullptr;
    cudaStream_t m_stream = nullptr;
};

} // namespace shardscope::cuda

// CUDA kernels of the trainer's layers. Written for clarity and determinism first:
// row reductions run in one block per row, parameter-gradient reductions in one thread
// per parameter element, so only the embedding backward (atomicAdd) depends on timing.

#include "cuda/layers.h"

#include <cuda_runtime.h>

#include <cmath>

#include "comm/nccl/cudacheck.h"

namespace shardscope::cuda {

namespace {

constexpr int kThreads = 256;
// blockSum/blockMax shuffle with a full mask and keep one slot per warp in 32 floats.
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "kThreads must be whole warps, at most 1024");

int blocksFor(std::int64_t n)
{
    const std::int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

void checkLaunch(const char *kernel)
{
    comm::checkCuda(cudaGetLastError(), kernel, __FILE__, __LINE__);
}

// Block-wide sum of one float per thread; every thread gets the result.
__device__ float blockSum(float v, float *scratch)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    float total = 0.0f;
    for (int w = 0; w < warps; ++w)
        total += scratch[w];
    __syncthreads();
    return total;
}

__device__ float blockMax(float v, float *scratch)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    float best = scratch[0];
    for (int w = 1; w < warps; ++w)
        best = fmaxf(best, scratch[w]);
    __syncthreads();
    return best;
}

#define GRID_STRIDE(i, n)                                                                          \
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;        \
         i < (n); i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

__global__ void embeddingForwardKernel(const std::int32_t *tokens, int rows, const float *weight,
                                       int vocab, int dim, float *out)
{
    GRID_STRIDE(i, static_cast<std::int64_t>(rows) * dim)
    {
        const std::int64_t r = i / dim;
        const int d = static_cast<int>(i % dim);
        const int t = tokens[r];
        out[i] = (t >= 0 && t < vocab) ? weight[static_cast<std::int64_t>(t) * dim + d] : 0.0f;
    }
}

__global__ void embeddingBackwardKernel(const std::int32_t *tokens, int rows, const float *dOut,
                                        int vocab, int dim, float *dWeight)
{
    GRID_STRIDE(i, static_cast<std::int64_t>(rows) * dim)
    {
        const std::int64_t r = i / dim;
        const int d = static_cast<int>(i % dim);
        const int t = tokens[r];
        if (t >= 0 && t < vocab)
            atomicAdd(&dWeight[static_cast<std::int64_t>(t) * dim + d], dOut[i]);
    }
}

__device__ float geluOf(float x)
{
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

__device__ float geluGrad(float x)
{
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
    return cdf + x * pdf;
}

__global__ void geluForwardKernel(const float *x, std::int64_t n, float *y)
{
    GRID_STRIDE(i, n) y[i] = geluOf(x[i]);
}

__global__ void geluBackwardKernel(const float *x, std::int64_t n, const float *dy, float *dx)
{
    GRID_STRIDE(i, n) dx[i] = dy[i] * geluGrad(x[i]);
}

__global__ void layerNormForwardKernel(const float *x, int dim, const float *gamma,
                                       const float *beta, float eps, float *y, float *mean,
                                       float *rstd)
{
    __shared__ float scratch[32];
    const std::int64_t row = blockIdx.x;
    const float *xr = x + row * dim;
    float s = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        s += xr[j];
    const float mu = blockSum(s, scratch) / dim;
    float q = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float c = xr[j] - mu;
        q += c * c;
    }
    const float rs = rsqrtf(blockSum(q, scratch) / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        y[row * dim + j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

__global__ void layerNormBackwardInputKernel(const float *x, int dim, const float *gamma,
                                             const float *mean, const float *rstd, const float *dy,
                                             float *dx)
{
    __shared__ float scratch[32];
    const std::int64_t row = blockIdx.x;
    const float mu = mean[row];
    const float rs = rstd[row];
    float a = 0.0f; // sum dxhat
    float b = 0.0f; // sum dxhat * xhat
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float xhat = (x[row * dim + j] - mu) * rs;
        const float g = dy[row * dim + j] * gamma[j];
        a += g;
        b += g * xhat;
    }
    const float meanA = blockSum(a, scratch) / dim;
    const float meanB = blockSum(b, scratch) / dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float xhat = (x[row * dim + j] - mu) * rs;
        const float g = dy[row * dim + j] * gamma[j];
        dx[row * dim + j] = rs * (g - meanA - xhat * meanB);
    }
}

__global__ void layerNormBackwardParamKernel(const float *x, int rows, int dim, const float *mean,
                                             const float *rstd, const float *dy, float *dGamma,
                                             float *dBeta)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    float sg = 0.0f;
    float sb = 0.0f;
    for (int r = 0; r < rows; ++r) {
        const std::int64_t idx = static_cast<std::int64_t>(r) * dim + j;
        sg += dy[idx] * (x[idx] - mean[r]) * rstd[r];
        sb += dy[idx];
    }
    dGamma[j] += sg;
    dBeta[j] += sb;
}

__global__ void conv1dForwardKernel(ConvShape s, const float *x, const float *weight,
                                    const float *bias, float *y)
{
    const int cg = (s.channels / s.groups);
    const int pad = s.causal ? s.kernel - 1 : s.kernel / 2; // ConvShape::padLeft (host only)
    GRID_STRIDE(idx, static_cast<std::int64_t>(s.batch) * s.seq * s.channels)
    {
        const int o = static_cast<int>(idx % s.channels);
        const std::int64_t bt = idx / s.channels;
        const int t = static_cast<int>(bt % s.seq);
        const std::int64_t b = bt / s.seq;
        const int g = o / cg;
        float acc = bias ? bias[o] : 0.0f;
        for (int k = 0; k < s.kernel; ++k) {
            const int src = t + k - pad;
            if (src < 0 || src >= s.seq) continue;
            const float *xr = x + (b * s.seq + src) * s.channels + g * cg;
            const float *wr = weight + static_cast<std::int64_t>(o) * cg * s.kernel + k;
            for (int i = 0; i < cg; ++i)
                acc += wr[static_cast<std::int64_t>(i) * s.kernel] * xr[i];
        }
        y[idx] = acc;
    }
}

__global__ void conv1dBackwardInputKernel(ConvShape s, const float *weight, const float *dy,
                                          float *dx)
{
    const int cg = (s.channels / s.groups);
    const int pad = s.causal ? s.kernel - 1 : s.kernel / 2; // ConvShape::padLeft (host only)
    GRID_STRIDE(idx, static_cast<std::int64_t>(s.batch) * s.seq * s.channels)
    {
        const int c = static_cast<int>(idx % s.channels);
        const std::int64_t bt = idx / s.channels;
        const int t = static_cast<int>(bt % s.seq);
        const std::int64_t b = bt / s.seq;
        const int g = c / cg;
        const int i = c % cg;
        float acc = 0.0f;
        for (int k = 0; k < s.kernel; ++k) {
            const int dst = t - k + pad; // the output position that read x[t] through tap k
            if (dst < 0 || dst >= s.seq) continue;
            const float *dyr = dy + (b * s.seq + dst) * s.channels;
            for (int o = g * cg; o < (g + 1) * cg; ++o)
                acc += weight[(static_cast<std::int64_t>(o) * cg + i) * s.kernel + k] * dyr[o];
        }
        dx[idx] = acc;
    }
}

__global__ void conv1dBackwardWeightKernel(ConvShape s, const float *x, const float *dy,
                                           float *dWeight)
{
    const int cg = (s.channels / s.groups);
    const int pad = s.causal ? s.kernel - 1 : s.kernel / 2;
    GRID_STRIDE(idx, static_cast<std::int64_t>(s.channels) * cg * s.kernel)
    {
        const int k = static_cast<int>(idx % s.kernel);
        const int i = static_cast<int>((idx / s.kernel) % cg);
        const int o = static_cast<int>(idx / (static_cast<std::int64_t>(s.kernel) * cg));
        const int c = (o / cg) * cg + i;
        float acc = 0.0f;
        for (int b = 0; b < s.batch; ++b) {
            for (int t = 0; t < s.seq; ++t) {
                const int src = t + k - pad;
                if (src < 0 || src >= s.seq) continue;
                acc += dy[(static_cast<std::int64_t>(b) * s.seq + t) * s.channels + o] *
                       x[(static_cast<std::int64_t>(b) * s.seq + src) * s.channels + c];
            }
        }
        dWeight[idx] += acc;
    }
}

__global__ void sumRowsKernel(const float *x, int rows, int cols, float *out)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r)
        acc += x[static_cast<std::int64_t>(r) * cols + j];
    out[j] += acc;
}

// One block per tap k: norms[k] = ||v[:,:,k]||, weight[:,:,k] = g[k] * v[:,:,k] / norms[k].
__global__ void weightNormForwardKernel(const float *v, const float *g, int rowsOI, int kernel,
                                        float *weight, float *norms)
{
    __shared__ float scratch[32];
    const int k = blockIdx.x;
    float s = 0.0f;
    for (int r = threadIdx.x; r < rowsOI; r += blockDim.x) {
        const float x = v[static_cast<std::int64_t>(r) * kernel + k];
        s += x * x;
    }
    const float norm = sqrtf(blockSum(s, scratch));
    const float factor = g[k] / norm;
    for (int r = threadIdx.x; r < rowsOI; r += blockDim.x) {
        const std::int64_t idx = static_cast<std::int64_t>(r) * kernel + k;
        weight[idx] = v[idx] * factor;
    }
    if (threadIdx.x == 0) norms[k] = norm;
}

// dg[k] += <dW, v>/n; dv += g/n * (dW - (<dW, v>/n) * v / n), per tap k.
__global__ void weightNormBackwardKernel(const float *v, const float *g, const float *norms,
                                         const float *dWeight, int rowsOI, int kernel, float *dv,
                                         float *dg)
{
    __shared__ float scratch[32];
    const int k = blockIdx.x;
    const float norm = norms[k];
    float s = 0.0f;
    for (int r = threadIdx.x; r < rowsOI; r += blockDim.x) {
        const std::int64_t idx = static_cast<std::int64_t>(r) * kernel + k;
        s += dWeight[idx] * v[idx];
    }
    const float dgk = blockSum(s, scratch) / norm;
    const float gOverN = g[k] / norm;
    for (int r = threadIdx.x; r < rowsOI; r += blockDim.x) {
        const std::int64_t idx = static_cast<std::int64_t>(r) * kernel + k;
        dv[idx] += gOverN * (dWeight[idx] - dgk * v[idx] / norm);
    }
    if (threadIdx.x == 0) dg[k] += dgk;
}

__global__ void crossEntropyKernel(const float *logits, int vocab, const std::int32_t *targets,
                                   float invDenominator, float *dLogits, double *rowLoss)
{
    __shared__ float scratch[32];
    const std::int64_t row = blockIdx.x;
    const float *lr = logits + row * vocab;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        m = fmaxf(m, lr[j]);
    m = blockMax(m, scratch);
    float s = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        s += expf(lr[j] - m);
    s = blockSum(s, scratch);
    const int target = targets[row];
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float p = expf(lr[j] - m) / s;
        dLogits[row * vocab + j] = (p - (j == target ? 1.0f : 0.0f)) * invDenominator;
    }
    if (threadIdx.x == 0) {
        const bool valid = target >= 0 && target < vocab;
        rowLoss[row] = valid ? static_cast<double>(logf(s) + m - lr[target]) : 0.0;
    }
}

__global__ void addBiasRowsKernel(float *y, const float *bias, int rows, int cols)
{
    GRID_STRIDE(i, static_cast<std::int64_t>(rows) * cols) y[i] += bias[i % cols];
}

__global__ void scaleKernel(float *x, float factor, std::int64_t n)
{
    GRID_STRIDE(i, n) x[i] *= factor;
}

// The same expression as nn::Adam::update (decay as one factor on the old value), so the
// two round alike apart from nvcc's fused multiply-adds.
__global__ void adamKernel(float *param, const float *grad, float *m, float *v, std::int64_t n,
                           nn::AdamOptions p, float biasCorrection1, float biasCorrection2,
                           float shrink)
{
    GRID_STRIDE(i, n)
    {
        const float g = grad[i];
        const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * g;
        const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / biasCorrection1;
        const float vhat = vi / biasCorrection2;
        param[i] = param[i] * shrink - p.lr * mhat / (sqrtf(vhat) + p.eps);
    }
}

} // namespace

void embeddingForward(const std::int32_t *tokens, int rows, const float *weight, int vocab, int dim,
                      float *out, cudaStream_t stream)
{
    const std::int64_t n = static_cast<std::int64_t>(rows) * dim;
    if (n == 0) return;
    embeddingForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(tokens, rows, weight, vocab, dim,
                                                                  out);
    checkLaunch("embeddingForwardKernel");
}

void embeddingBackward(const std::int32_t *tokens, int rows, const float *dOut, int vocab, int dim,
                       float *dWeight, cudaStream_t stream)
{
    const std::int64_t n = static_cast<std::int64_t>(rows) * dim;
    if (n == 0) return;
    embeddingBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(tokens, rows, dOut, vocab, dim,
                                                                   dWeight);
    checkLaunch("embeddingBackwardKernel");
}

void geluForward(const float *x, std::int64_t n, float *y, cudaStream_t stream)
{
    if (n == 0) return;
    geluForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, n, y);
    checkLaunch("geluForwardKernel");
}

void geluBackward(const float *x, std::int64_t n, const float *dy, float *dx, cudaStream_t stream)
{
    if (n == 0) return;
    geluBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, n, dy, dx);
    checkLaunch("geluBackwardKernel");
}

void layerNormForward(const float *x, int rows, int dim, const float *gamma, const float *beta,
                      float eps, float *y, float *mean, float *rstd, cudaStream_t stream)
{
    if (rows == 0) return;
    layerNormForwardKernel<<<rows, kThreads, 0, stream>>>(x, dim, gamma, beta, eps, y, mean, rstd);
    checkLaunch("layerNormForwardKernel");
}

void layerNormBackward(const float *x, int rows, int dim, const float *gamma, const float *mean,
                       const float *rstd, const float *dy, float *dx, float *dGamma, float *dBeta,
                       cudaStream_t stream)
{
    if (rows == 0) return;
    layerNormBackwardInputKernel<<<rows, kThreads, 0, stream>>>(x, dim, gamma, mean, rstd, dy, dx);
    checkLaunch("layerNormBackwardInputKernel");
    layerNormBackwardParamKernel<<<(dim + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        x, rows, dim, mean, rstd, dy, dGamma, dBeta);
    checkLaunch("layerNormBackwardParamKernel");
}

void conv1dForward(const ConvShape &s, const float *x, const float *weight, const float *bias,
                   float *y, cudaStream_t stream)
{
    const std::int64_t n = static_cast<std::int64_t>(s.batch) * s.seq * s.channels;
    if (n == 0) return;
    conv1dForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(s, x, weight, bias, y);
    checkLaunch("conv1dForwardKernel");
}

void conv1dBackward(const ConvShape &s, const float *x, const float *weight, const float *dy,
                    float *dx, float *dWeight, float *dBias, cudaStream_t stream)
{
    const std::int64_t n = static_cast<std::int64_t>(s.batch) * s.seq * s.channels;
    if (n == 0) return;
    if (dx) {
        conv1dBackwardInputKernel<<<blocksFor(n), kThreads, 0, stream>>>(s, weight, dy, dx);
        checkLaunch("conv1dBackwardInputKernel");
    }
    conv1dBackwardWeightKernel<<<blocksFor(s.weightNumel()), kThreads, 0, stream>>>(s, x, dy,
                                                                                    dWeight);
    checkLaunch("conv1dBackwardWeightKernel");
    if (dBias) sumRowsInto(dy, s.batch * s.seq, s.channels, dBias, stream);
}

void weightNormForward(const float *v, const float *g, int out, int in, int kernel, float *weight,
                       float *norms, cudaStream_t stream)
{
    if (kernel == 0) return;
    weightNormForwardKernel<<<kernel, kThreads, 0, stream>>>(v, g, out * in, kernel, weight, norms);
    checkLaunch("weightNormForwardKernel");
}

void weightNormBackward(const float *v, const float *g, const float *norms, const float *dWeight,
                        int out, int in, int kernel, float *dv, float *dg, cudaStream_t stream)
{
    if (kernel == 0) return;
    weightNormBackwardKernel<<<kernel, kThreads, 0, stream>>>(v, g, norms, dWeight, out * in,
                                                              kernel, dv, dg);
    checkLaunch("weightNormBackwardKernel");
}

void crossEntropy(const float *logits, int rows, int vocab, const std::int32_t *targets,
                  double denominator, float *dLogits, double *rowLoss, cudaStream_t stream)
{
    if (rows == 0) return;
    crossEntropyKernel<<<rows, kThreads, 0, stream>>>(
        logits, vocab, targets, static_cast<float>(1.0 / denominator), dLogits, rowLoss);
    checkLaunch("crossEntropyKernel");
}

void addBiasRows(float *y, const float *bias, int rows, int cols, cudaStream_t stream)
{
    const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
    if (n == 0) return;
    addBiasRowsKernel<<<blocksFor(n), kThreads, 0, stream>>>(y, bias, rows, cols);
    checkLaunch("addBiasRowsKernel");
}

void sumRowsInto(const float *x, int rows, int cols, float *out, cudaStream_t stream)
{
    if (cols == 0) return;
    sumRowsKernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, stream>>>(x, rows, cols, out);
    checkLaunch("sumRowsKernel");
}

void scale(float *x, float factor, std::int64_t n, cudaStream_t stream)
{
    if (n == 0) return;
    scaleKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, factor, n);
    checkLaunch("scaleKernel");
}

void adamStep(float *param, const float *grad, float *m, float *v, std::int64_t n,
              const nn::AdamOptions &p, int step, cudaStream_t stream)
{
    if (n == 0) return;
    const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta1), step));
    const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta2), step));
    const float shrink = 1.0f - p.lr * p.weightDecay;
    adamKernel<<<blocksFor(n), kThreads, 0, stream>>>(param, grad, m, v, n, p, bc1, bc2, shrink);
    checkLaunch("adamKernel");
}

} // namespace shardscope::cuda

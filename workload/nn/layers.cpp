#include "nn/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include <cblas.h>

namespace shardscope::nn {

namespace {

constexpr CBLAS_TRANSPOSE op(bool trans)
{
    return trans ? CblasTrans : CblasNoTrans;
}

// im2col for one group: cols[(n*seq + t), ci*kernel + k] = x[n, t + k - pad, g*cin + ci]
// (zero outside the sequence), matching the flattened weight row [ci, k] of the group.
template <typename T> void im2col(const ConvShape &s, int group, const T *x, T *cols)
{
    const int cin = s.channelsPerGroup();
    const int width = cin * s.kernel;
    const int pad = s.padLeft();
    for (int n = 0; n < s.batch; ++n) {
        for (int t = 0; t < s.seq; ++t) {
            T *row = cols + (static_cast<std::int64_t>(n) * s.seq + t) * width;
            for (int k = 0; k < s.kernel; ++k) {
                const int src = t + k - pad;
                const bool inside = src >= 0 && src < s.seq;
                const T *xs = inside
                                  ? x + (static_cast<std::int64_t>(n) * s.seq + src) * s.channels +
                                        group * cin
                                  : nullptr;
                for (int ci = 0; ci < cin; ++ci)
                    row[ci * s.kernel + k] = inside ? xs[ci] : T(0);
            }
        }
    }
}

// The adjoint of im2col: adds cols back into dx.
template <typename T> void col2imAdd(const ConvShape &s, int group, const T *cols, T *dx)
{
    const int cin = s.channelsPerGroup();
    const int width = cin * s.kernel;
    const int pad = s.padLeft();
    for (int n = 0; n < s.batch; ++n) {
        for (int t = 0; t < s.seq; ++t) {
            const T *row = cols + (static_cast<std::int64_t>(n) * s.seq + t) * width;
            for (int k = 0; k < s.kernel; ++k) {
                const int src = t + k - pad;
                if (src < 0 || src >= s.seq) continue;
                T *xs =
                    dx + (static_cast<std::int64_t>(n) * s.seq + src) * s.channels + group * cin;
                for (int ci = 0; ci < cin; ++ci)
                    xs[ci] += row[ci * s.kernel + k];
            }
        }
    }
}

} // namespace

template <>
void gemm<float>(bool transA, bool transB, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, op(transA), op(transB), m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}

template <>
void gemm<double>(bool transA, bool transB, int m, int n, int k, double alpha, const double *a,
                  int lda, const double *b, int ldb, double beta, double *c, int ldc)
{
    if (m == 0 || n == 0) return;
    cblas_dgemm(CblasRowMajor, op(transA), op(transB), m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}

template <typename T>
void embeddingForward(const std::int32_t *tokens, int rows, const T *weight, int dim, T *out)
{
    for (int i = 0; i < rows; ++i)
        std::memcpy(out + static_cast<std::int64_t>(i) * dim,
                    weight + static_cast<std::int64_t>(tokens[i]) * dim, sizeof(T) * dim);
}

template <typename T>
void embeddingBackward(const std::int32_t *tokens, int rows, const T *dOut, int dim, T *dWeight)
{
    for (int i = 0; i < rows; ++i) {
        T *dst = dWeight + static_cast<std::int64_t>(tokens[i]) * dim;
        const T *src = dOut + static_cast<std::int64_t>(i) * dim;
        for (int j = 0; j < dim; ++j)
            dst[j] += src[j];
    }
}

template <typename T>
void linearForward(const T *x, int rows, int in, int out, const T *weight, const T *bias, T *y)
{
    if (bias) {
        for (int i = 0; i < rows; ++i)
            std::memcpy(y + static_cast<std::int64_t>(i) * out, bias, sizeof(T) * out);
    }
    gemm<T>(false, true, rows, out, in, T(1), x, in, weight, in, bias ? T(1) : T(0), y, out);
}

template <typename T>
void linearBackward(const T *x, int rows, int in, int out, const T *weight, const T *dy, T *dx,
                    T *dWeight, T *dBias)
{
    if (rows == 0) return;
    gemm<T>(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dWeight, in);
    if (dx) gemm<T>(false, false, rows, in, out, T(1), dy, out, weight, in, T(0), dx, in);
    if (dBias) {
        for (int i = 0; i < rows; ++i) {
            const T *row = dy + static_cast<std::int64_t>(i) * out;
            for (int j = 0; j < out; ++j)
                dBias[j] += row[j];
        }
    }
}

template <typename T>
void tiedHeadForward(const T *h, int rows, int hidden, int vocab, const T *embed, const T *bias,
                     T *logits)
{
    linearForward<T>(h, rows, hidden, vocab, embed, bias, logits);
}

template <typename T>
void tiedHeadBackward(const T *h, int rows, int hidden, int vocab, const T *embed, const T *dLogits,
                      T *dh, T *dEmbed, T *dBias)
{
    linearBackward<T>(h, rows, hidden, vocab, embed, dLogits, dh, dEmbed, dBias);
}

template <typename T> void geluForward(const T *x, std::int64_t n, T *y)
{
    const T invSqrt2 = T(1) / std::sqrt(T(2));
    for (std::int64_t i = 0; i < n; ++i)
        y[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * invSqrt2));
}

template <typename T> void geluBackward(const T *x, std::int64_t n, const T *dy, T *dx)
{
    const T invSqrt2 = T(1) / std::sqrt(T(2));
    const T invSqrt2Pi = T(1) / std::sqrt(T(2) * std::numbers::pi_v<T>);
    for (std::int64_t i = 0; i < n; ++i) {
        const T cdf = T(0.5) * (T(1) + std::erf(x[i] * invSqrt2));
        const T pdf = invSqrt2Pi * std::exp(T(-0.5) * x[i] * x[i]);
        dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
}

template <typename T>
void layerNormForward(const T *x, int rows, int dim, const T *gamma, const T *beta, T eps, T *y,
                      T *mean, T *rstd)
{
    for (int r = 0; r < rows; ++r) {
        const T *xr = x + static_cast<std::int64_t>(r) * dim;
        T *yr = y + static_cast<std::int64_t>(r) * dim;
        double sum = 0.0;
        for (int j = 0; j < dim; ++j)
            sum += xr[j];
        const double mu = sum / dim;
        double var = 0.0;
        for (int j = 0; j < dim; ++j)
            var += (xr[j] - mu) * (xr[j] - mu);
        var /= dim;
        const T rs = static_cast<T>(1.0 / std::sqrt(var + static_cast<double>(eps)));
        const T m = static_cast<T>(mu);
        mean[r] = m;
        rstd[r] = rs;
        for (int j = 0; j < dim; ++j)
            yr[j] = (xr[j] - m) * rs * gamma[j] + beta[j];
    }
}

template <typename T>
void layerNormBackward(const T *x, int rows, int dim, const T *gamma, const T *mean, const T *rstd,
                       const T *dy, T *dx, T *dGamma, T *dBeta)
{
    for (int r = 0; r < rows; ++r) {
        const T *xr = x + static_cast<std::int64_t>(r) * dim;
        const T *dyr = dy + static_cast<std::int64_t>(r) * dim;
        T *dxr = dx + static_cast<std::int64_t>(r) * dim;
        double sumD = 0.0;
        double sumDX = 0.0;
        for (int j = 0; j < dim; ++j) {
            const T xhat = (xr[j] - mean[r]) * rstd[r];
            const T d = dyr[j] * gamma[j];
            dGamma[j] += dyr[j] * xhat;
            dBeta[j] += dyr[j];
            sumD += d;
            sumDX += d * xhat;
        }
        const T meanD = static_cast<T>(sumD / dim);
        const T meanDX = static_cast<T>(sumDX / dim);
        for (int j = 0; j < dim; ++j) {
            const T xhat = (xr[j] - mean[r]) * rstd[r];
            dxr[j] = rstd[r] * (dyr[j] * gamma[j] - meanD - xhat * meanDX);
        }
    }
}

template <typename T>
void conv1dForward(const ConvShape &s, const T *x, const T *weight, const T *bias, T *y)
{
    const int rows = s.batch * s.seq;
    const int cin = s.channelsPerGroup();
    const int width = cin * s.kernel;
    for (int i = 0; i < rows; ++i)
        std::memcpy(y + static_cast<std::int64_t>(i) * s.channels, bias, sizeof(T) * s.channels);
    std::vector<T> cols(static_cast<std::size_t>(rows) * width);
    for (int g = 0; g < s.groups; ++g) {
        im2col(s, g, x, cols.data());
        const T *wg = weight + static_cast<std::int64_t>(g) * cin * width;
        gemm<T>(false, true, rows, cin, width, T(1), cols.data(), width, wg, width, T(1),
                y + g * cin, s.channels);
    }
}

template <typename T>
void conv1dBackward(const ConvShape &s, const T *x, const T *weight, const T *dy, T *dx, T *dWeight,
                    T *dBias)
{
    const int rows = s.batch * s.seq;
    const int cin = s.channelsPerGroup();
    const int width = cin * s.kernel;
    if (dx) std::fill(dx, dx + static_cast<std::int64_t>(rows) * s.channels, T(0));
    if (rows == 0) return;
    std::vector<T> cols(static_cast<std::size_t>(rows) * width);
    std::vector<T> dCols(dx ? cols.size() : 0);
    for (int g = 0; g < s.groups; ++g) {
        const T *wg = weight + static_cast<std::int64_t>(g) * cin * width;
        T *dwg = dWeight + static_cast<std::int64_t>(g) * cin * width;
        const T *dyg = dy + g * cin;
        im2col(s, g, x, cols.data());
        gemm<T>(true, false, cin, width, rows, T(1), dyg, s.channels, cols.data(), width, T(1), dwg,
                width);
        if (dx) {
            gemm<T>(false, false, rows, width, cin, T(1), dyg, s.channels, wg, width, T(0),
                    dCols.data(), width);
            col2imAdd(s, g, dCols.data(), dx);
        }
    }
    for (int i = 0; i < rows; ++i) {
        const T *row = dy + static_cast<std::int64_t>(i) * s.channels;
        for (int c = 0; c < s.channels; ++c)
            dBias[c] += row[c];
    }
}

template <typename T>
void weightNormForward(const T *v, const T *g, int out, int in, int kernel, T *weight, T *norms)
{
    const std::int64_t planes = static_cast<std::int64_t>(out) * in;
    for (int k = 0; k < kernel; ++k) {
        double sq = 0.0;
        for (std::int64_t p = 0; p < planes; ++p)
            sq += static_cast<double>(v[p * kernel + k]) * v[p * kernel + k];
        norms[k] = static_cast<T>(std::sqrt(sq));
    }
    for (std::int64_t p = 0; p < planes; ++p)
        for (int k = 0; k < kernel; ++k)
            weight[p * kernel + k] = g[k] * v[p * kernel + k] / norms[k];
}

template <typename T>
void weightNormBackward(const T *v, const T *g, const T *norms, const T *dWeight, int out, int in,
                        int kernel, T *dv, T *dg)
{
    const std::int64_t planes = static_cast<std::int64_t>(out) * in;
    std::vector<double> dot(kernel, 0.0);
    for (std::int64_t p = 0; p < planes; ++p)
        for (int k = 0; k < kernel; ++k)
            dot[k] += static_cast<double>(dWeight[p * kernel + k]) * v[p * kernel + k];
    for (int k = 0; k < kernel; ++k)
        dg[k] += static_cast<T>(dot[k] / norms[k]);
    for (std::int64_t p = 0; p < planes; ++p) {
        for (int k = 0; k < kernel; ++k) {
            const T n = norms[k];
            const T proj = static_cast<T>(dot[k] / (static_cast<double>(n) * n * n));
            dv[p * kernel + k] +=
                g[k] / n * dWeight[p * kernel + k] - g[k] * proj * v[p * kernel + k];
        }
    }
}

template <typename T>
void weightNormDecompose(const T *weight, int out, int in, int kernel, T *v, T *g)
{
    const std::int64_t planes = static_cast<std::int64_t>(out) * in;
    for (int k = 0; k < kernel; ++k) {
        double sq = 0.0;
        for (std::int64_t p = 0; p < planes; ++p)
            sq += static_cast<double>(weight[p * kernel + k]) * weight[p * kernel + k];
        g[k] = static_cast<T>(std::sqrt(sq));
    }
    std::memcpy(v, weight, sizeof(T) * planes * kernel);
}

template <typename T>
double crossEntropy(const T *logits, int rows, int vocab, const std::int32_t *targets,
                    double denominator, T *dLogits)
{
    double total = 0.0;
    for (int r = 0; r < rows; ++r) {
        const T *z = logits + static_cast<std::int64_t>(r) * vocab;
        T *dz = dLogits + static_cast<std::int64_t>(r) * vocab;
        const T zmax = *std::max_element(z, z + vocab);
        double sum = 0.0;
        for (int j = 0; j < vocab; ++j)
            sum += std::exp(static_cast<double>(z[j] - zmax));
        const double logSum = std::log(sum);
        total += logSum - static_cast<double>(z[targets[r]] - zmax);
        for (int j = 0; j < vocab; ++j)
            dz[j] =
                static_cast<T>(std::exp(static_cast<double>(z[j] - zmax) - logSum) / denominator);
        dz[targets[r]] -= static_cast<T>(1.0 / denominator);
    }
    return total;
}

#define SHARDSCOPE_NN_INSTANTIATE(T)                                                               \
    template void embeddingForward<T>(const std::int32_t *, int, const T *, int, T *);             \
    template void embeddingBackward<T>(const std::int32_t *, int, const T *, int, T *);            \
    template void linearForward<T>(const T *, int, int, int, const T *, const T *, T *);           \
    template void linearBackward<T>(const T *, int, int, int, const T *, const T *, T *, T *,      \
                                    T *);                                                          \
    template void tiedHeadForward<T>(const T *, int, int, int, const T *, const T *, T *);         \
    template void tiedHeadBackward<T>(const T *, int, int, int, const T *, const T *, T *, T *,    \
                                      T *);                                                        \
    template void geluForward<T>(const T *, std::int64_t, T *);                                    \
    template void geluBackward<T>(const T *, std::int64_t, const T *, T *);                        \
    template void layerNormForward<T>(const T *, int, int, const T *, const T *, T, T *, T *,      \
                                      T *);                                                        \
    template void layerNormBackward<T>(const T *, int, int, const T *, const T *, const T *,       \
                                       const T *, T *, T *, T *);                                  \
    template void conv1dForward<T>(const ConvShape &, const T *, const T *, const T *, T *);       \
    template void conv1dBackward<T>(const ConvShape &, const T *, const T *, const T *, T *, T *,  \
                                    T *);                                                          \
    template void weightNormForward<T>(const T *, const T *, int, int, int, T *, T *);             \
    template void weightNormBackward<T>(const T *, const T *, const T *, const T *, int, int, int, \
                                        T *, T *);                                                 \
    template void weightNormDecompose<T>(const T *, int, int, int, T *, T *);                      \
    template double crossEntropy<T>(const T *, int, int, const std::int32_t *, double, T *);

SHARDSCOPE_NN_INSTANTIATE(float)
SHARDSCOPE_NN_INSTANTIATE(double)

} // namespace shardscope::nn

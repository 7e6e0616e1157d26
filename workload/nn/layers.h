#pragma once
// The CPU layers of the demo language model, forward and backward, on plain row-major
// arrays. Matrix products go through BLAS. Instantiated for float (training) and double
// (finite-difference checks). Parameter gradients accumulate (+=); input gradients are
// overwritten (=). Parameter layouts follow PyTorch, so names and shapes read the same.

#include <cstdint>
#include <vector>

#include "nn/convshape.h"

namespace shardscope::nn {

// C[m,n] = alpha * op(A) * op(B) + beta * C, row-major, through cblas_?gemm.
template <typename T>
void gemm(bool transA, bool transB, int m, int n, int k, T alpha, const T *a, int lda, const T *b,
          int ldb, T beta, T *c, int ldc);

// ---- Embedding: out[i] = weight[tokens[i]], weight [vocab, dim]
template <typename T>
void embeddingForward(const std::int32_t *tokens, int rows, const T *weight, int dim, T *out);
template <typename T>
void embeddingBackward(const std::int32_t *tokens, int rows, const T *dOut, int dim, T *dWeight);

// ---- Linear: y[rows,out] = x[rows,in] * weight[out,in]^T + bias[out] (bias may be null)
template <typename T>
void linearForward(const T *x, int rows, int in, int out, const T *weight, const T *bias, T *y);
// dx may be null (no input gradient wanted); dBias may be null.
template <typename T>
void linearBackward(const T *x, int rows, int in, int out, const T *weight, const T *dy, T *dx,
                    T *dWeight, T *dBias);

// ---- Tied LM head: logits[rows,vocab] = h[rows,hidden] * embed[vocab,hidden]^T + bias[vocab]
template <typename T>
void tiedHeadForward(const T *h, int rows, int hidden, int vocab, const T *embed, const T *bias,
                     T *logits);
template <typename T>
void tiedHeadBackward(const T *h, int rows, int hidden, int vocab, const T *embed, const T *dLogits,
                      T *dh, T *dEmbed, T *dBias);

// ---- GELU, the exact (erf) form, as torch.nn.GELU() by default.
template <typename T> void geluForward(const T *x, std::int64_t n, T *y);
template <typename T> void geluBackward(const T *x, std::int64_t n, const T *dy, T *dx);

// ---- LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta.
// mean and rstd (rows each) are saved by the forward for the backward.
template <typename T>
void layerNormForward(const T *x, int rows, int dim, const T *gamma, const T *beta, T eps, T *y,
                      T *mean, T *rstd);
template <typename T>
void layerNormBackward(const T *x, int rows, int dim, const T *gamma, const T *mean, const T *rstd,
                       const T *dy, T *dx, T *dGamma, T *dBeta);

// ---- Conv1d over the sequence, channels last (nn/convshape.h says the shape and padding).

template <typename T>
void conv1dForward(const ConvShape &s, const T *x, const T *weight, const T *bias, T *y);
// dx may be null.
template <typename T>
void conv1dBackward(const ConvShape &s, const T *x, const T *weight, const T *dy, T *dx, T *dWeight,
                    T *dBias);

// ---- Weight normalisation over dim 2, as torch.nn.utils.weight_norm(conv, "weight", dim=2):
// weight[o,i,k] = g[k] * v[o,i,k] / ||v[:,:,k]||, g of shape [1,1,kernel], v like weight.
// norms (kernel) is saved by the forward for the backward.
template <typename T>
void weightNormForward(const T *v, const T *g, int out, int in, int kernel, T *weight, T *norms);
template <typename T>
void weightNormBackward(const T *v, const T *g, const T *norms, const T *dWeight, int out, int in,
                        int kernel, T *dv, T *dg);
// What weight_norm does when applied: g = ||weight[:,:,k]||, v = weight.
template <typename T>
void weightNormDecompose(const T *weight, int out, int in, int kernel, T *v, T *g);

// ---- Next-token cross-entropy. Returns the sum over rows of -log softmax(logits)[target]
// (in double) and writes dLogits = (softmax - onehot) / denominator, so that with
// denominator = rows it is the gradient of the mean.
template <typename T>
double crossEntropy(const T *logits, int rows, int vocab, const std::int32_t *targets,
                    double denominator, T *dLogits);

} // namespace shardscope::nn

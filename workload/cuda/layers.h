#pragma once
// The trainer's layers on the GPU, forward and backward, mirroring nn/layers.h name
// for name and convention (row-major, PyTorch parameter layouts; parameter gradients
// accumulate (+=), input gradients are overwritten (=)). Every pointer is device
// memory; every call is enqueued on `stream` and returns at once. Matrix products are
// in blas.h (cuBLAS).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "comm/nccl/deviceadd.h"
#include "nn/adamoptions.h"
#include "nn/convshape.h"

namespace shardscope::cuda {

// ---- Embedding: out[i] = weight[tokens[i]], weight [vocab, dim]. Tokens outside
// [0, vocab) give a zero row (forward) and no gradient (backward).
void embeddingForward(const std::int32_t *tokens, int rows, const float *weight, int vocab, int dim,
                      float *out, cudaStream_t stream);
// dWeight[tokens[i]] += dOut[i] (atomicAdd: rows sharing a token add in any order).
void embeddingBackward(const std::int32_t *tokens, int rows, const float *dOut, int vocab, int dim,
                       float *dWeight, cudaStream_t stream);

// ---- GELU, the exact (erf) form.
void geluForward(const float *x, std::int64_t n, float *y, cudaStream_t stream);
void geluBackward(const float *x, std::int64_t n, const float *dy, float *dx, cudaStream_t stream);

// ---- LayerNorm over the last dimension; mean and rstd (rows each) saved for the backward.
void layerNormForward(const float *x, int rows, int dim, const float *gamma, const float *beta,
                      float eps, float *y, float *mean, float *rstd, cudaStream_t stream);
void layerNormBackward(const float *x, int rows, int dim, const float *gamma, const float *mean,
                       const float *rstd, const float *dy, float *dx, float *dGamma, float *dBeta,
                       cudaStream_t stream);

// ---- Conv1d over the sequence, channels last, as nn::conv1dForward, on nn's ConvShape:
// causal (the default, padLeft = kernel-1: y[t] sees x[<= t]) or "same" padding
// (padLeft = kernel/2, wav2vec2's).
using nn::ConvShape;
void conv1dForward(const ConvShape &s, const float *x, const float *weight, const float *bias,
                   float *y, cudaStream_t stream);
// dx may be null.
void conv1dBackward(const ConvShape &s, const float *x, const float *weight, const float *dy,
                    float *dx, float *dWeight, float *dBias, cudaStream_t stream);

// ---- Weight normalisation over dim 2 (torch.nn.utils.weight_norm(conv, dim=2)):
// weight[o,i,k] = g[k] * v[o,i,k] / ||v[:,:,k]||; norms (kernel) saved for the backward.
void weightNormForward(const float *v, const float *g, int out, int in, int kernel, float *weight,
                       float *norms, cudaStream_t stream);
void weightNormBackward(const float *v, const float *g, const float *norms, const float *dWeight,
                        int out, int in, int kernel, float *dv, float *dg, cudaStream_t stream);

// ---- Next-token cross-entropy: rowLoss[i] = -log softmax(logits[i])[targets[i]] and
// dLogits = (softmax - onehot) / denominator. The caller sums rowLoss (in double).
void crossEntropy(const float *logits, int rows, int vocab, const std::int32_t *targets,
                  double denominator, float *dLogits, double *rowLoss, cudaStream_t stream);

// ---- Small element-wise helpers the model needs.
using comm::addInPlace; // y += x: the kernel CudaMemory::addF32 uses (comm/nccl/deviceadd.h)
void addBiasRows(float *y, const float *bias, int rows, int cols,
                 cudaStream_t stream); // y[r] += bias
void sumRowsInto(const float *x, int rows, int cols, float *out,
                 cudaStream_t stream);                                   // out += sum_r x[r]
void scale(float *x, float factor, std::int64_t n, cudaStream_t stream); // x *= factor

// ---- Adam / AdamW on one rank's shard with nn's options (torch.optim.AdamW semantics;
// weightDecay 0 is plain Adam). step counts from 1.
void adamStep(float *param, const float *grad, float *m, float *v, std::int64_t n,
              const nn::AdamOptions &options, int step, cudaStream_t stream);

} // namespace shardscope::cuda

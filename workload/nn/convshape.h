#pragma once
// The shape of a Conv1d over the sequence, channels last, shared by the CPU layers
// (nn/layers.h) and the CUDA ones (cuda/layers.h). x and y are [batch, seq, channels],
// weight [channels, channels/groups, kernel] (PyTorch's layout), bias [channels]. The
// output has the input's length ("same"): y[t] = b + sum_k W[:,:,k] x[t + k - padLeft].
// Causal, the default (y[t] sees x[<= t] only, for a next-token model that must not see its
// targets): padLeft = kernel - 1. Symmetric, as wav2vec2's positional convolution (padding
// kernel/2 on both sides, the last output dropped for an even kernel): padLeft = kernel/2.
// Plain C++17: nvcc compiles it too.

#include <cstdint>

namespace shardscope::nn {

struct ConvShape
{
    int batch = 1;
    int seq = 1;
    int channels = 1;
    int kernel = 1;
    int groups = 1;
    bool causal = true;

    int channelsPerGroup() const { return channels / groups; }
    int padLeft() const { return causal ? kernel - 1 : kernel / 2; }
    std::int64_t weightNumel() const
    {
        return static_cast<std::int64_t>(channels) * channelsPerGroup() * kernel;
    }
};

} // namespace shardscope::nn

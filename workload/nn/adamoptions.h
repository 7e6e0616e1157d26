#pragma once
// The options of Adam with decoupled weight decay (AdamW; weightDecay 0 is plain Adam), as
// torch.optim.AdamW names them: shared by the CPU optimizer (nn/adam.h) and the CUDA one
// (cuda/layers.h). Plain C++17: nvcc compiles it too.

namespace shardscope::nn {

struct AdamOptions
{
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weightDecay = 0.0f;
};

} // namespace shardscope::nn

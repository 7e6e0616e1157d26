#pragma once
// The demo language model on the engine: its module tree and parameters (names as in
// PyTorch: embed, pos_conv, blocks.<i>.{ln,fc1,fc2}, ln_f, lm_head), how weight_norm is
// applied after partitioning, and one rank's forward and backward through module scopes.

#include <cstdint>
#include <vector>

#include "core/engine.h"
#include "nn/layers.h"
#include "nn/trainconfig.h"

namespace shardscope::nn {

// The ids of the model's modules and parameters in an engine, found by name.
struct ModelHandles
{
    struct Block
    {
        ModuleId block = kNoModule, ln = kNoModule, fc1 = kNoModule, fc2 = kNoModule;
        ParamId lnWeight = kNoParam, lnBias = kNoParam;
        ParamId fc1Weight = kNoParam, fc1Bias = kNoParam;
        ParamId fc2Weight = kNoParam, fc2Bias = kNoParam;
    };

    ModuleId embed = kNoModule, posConv = kNoModule, lnF = kNoModule, lmHead = kNoModule;
    ParamId embedWeight = kNoParam;
    ParamId convG = kNoParam, convV = kNoParam, convBias = kNoParam;
    ParamId lnFWeight = kNoParam, lnFBias = kNoParam;
    ParamId headBias = kNoParam;
    std::vector<Block> blocks;

    // Every trainable parameter, in module order.
    std::vector<ParamId> params() const;
};

// Looks the model up by name; throws EngineError naming what is missing (e.g. weight_norm
// was not applied yet).
ModelHandles findModel(const core::Engine &engine, int layers);

// One rank's forward and backward over its micro-batch, with the activations it keeps
// between them. Parameters are read only through engine.access() inside module scopes;
// every parameter gradient is reduce-scattered as soon as its module's backward is done.
class RankModel
{
  public:
    RankModel(core::Engine &engine, int rank, const TrainConfig &config, ModelHandles handles);

    // tokens and targets: sequences * seq tokens each (sequences may be 0). Gradients are
    // scaled by 1 / globalTokens, so that summed over ranks they are those of the global
    // mean loss. Returns this rank's sum of token losses.
    double forwardBackward(const std::int32_t *tokens, const std::int32_t *targets, int sequences,
                           double globalTokens);
    // An evaluation batch: the forward alone (its gathers, no backward, no gradient); returns
    // the mean token loss.
    double evaluate(const std::int32_t *tokens, const std::int32_t *targets, int sequences);

  private:
    void forwardBackwardShapes(int sequences); // sizes the activations of one micro-batch
    struct BlockActs
    {
        std::vector<float> in, normed, mean, rstd, hidden, activated;
    };

    void forward(const std::int32_t *tokens);
    void backward(const std::int32_t *tokens);
    std::vector<float> &gradBuffer(ParamId p);
    void reduce(ParamId p);
    const float *read(ParamId p);

    core::Engine &m_engine;
    int m_rank;
    TrainConfig m_config;
    ModelHandles m_h;
    int m_rows = 0;
    ConvShape m_conv;

    // Activations of the current micro-batch.
    std::vector<float> m_x0, m_convWeight, m_convNorms, m_convOut, m_x1;
    std::vector<BlockActs> m_blocks;
    std::vector<float> m_xL, m_hF, m_lnFMean, m_lnFRstd, m_logits, m_dLogits;
    // Full-size gradients, by parameter id, before they are reduce-scattered.
    std::vector<std::vector<float>> m_grads;
};

} // namespace shardscope::nn

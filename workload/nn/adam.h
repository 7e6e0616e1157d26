#pragma once
// Adam with decoupled weight decay (AdamW) on one rank's fp32 shards: the optimizer state
// of a parameter lives only where its shard lives, as in ZeRO.

#include <cstdint>
#include <span>
#include <vector>

#include "nn/adamoptions.h"

namespace shardscope::nn {

class Adam
{
  public:
    explicit Adam(AdamOptions options) : m_options(options) {}

    // Call once per optimizer step, before the updates of that step.
    void beginStep() { ++m_step; }
    // Updates data from grad; slot names the parameter's moment buffers (created on first use).
    void update(std::size_t slot, std::span<float> data, std::span<const float> grad, bool decay);
    int step() const { return m_step; }

  private:
    AdamOptions m_options;
    int m_step = 0;
    std::vector<std::vector<float>> m_m;
    std::vector<std::vector<float>> m_v;
};

} // namespace shardscope::nn

#pragma once
// What the GPU tests share: the small model they train (sizes no rank count divides,
// a batch that leaves ranks uneven) and a sink that keeps every event.

#include <mutex>
#include <vector>

#include "nn/trainconfig.h"
#include "telemetry/event.h"

namespace shardscope::test {

inline nn::TrainConfig smallGpuConfig(int world)
{
    nn::TrainConfig c;
    c.worldSize = world;
    c.steps = 3;
    c.layers = 2;
    c.hidden = 32;
    c.vocab = 40;
    c.seq = 16;
    c.kernel = 4;
    c.groups = 2;
    c.batch = 7; // does not divide 2 or 3 ranks
    c.lr = 1e-2f;
    c.persistenceThreshold = 500; // partitions embed.weight and the fc weights
    c.listen = false;
    return c;
}

class RecordingSink final : public telemetry::EventSink
{
  public:
    void write(const telemetry::Event &ev) noexcept override
    {
        std::lock_guard lock(m_mutex);
        m_events.push_back(ev);
    }
    std::vector<telemetry::Event> events()
    {
        std::lock_guard lock(m_mutex);
        return m_events;
    }

  private:
    std::mutex m_mutex;
    std::vector<telemetry::Event> m_events;
};

} // namespace shardscope::test

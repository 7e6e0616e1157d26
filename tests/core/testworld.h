#pragma once
// Test helpers: an engine on a CPU world and an in-memory event sink.

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "telemetry/event.h"

namespace shardscope::test {

class MemorySink : public telemetry::EventSink
{
  public:
    void write(const telemetry::Event &ev) noexcept override
    {
        std::lock_guard lock(m_mutex);
        m_events.push_back(ev);
    }
    std::vector<telemetry::Event> events() const
    {
        std::lock_guard lock(m_mutex);
        return m_events;
    }
    std::vector<telemetry::Event> ofType(EventType t, int rank = -1) const
    {
        std::vector<telemetry::Event> out;
        for (const telemetry::Event &e : events())
            if (e.type == t && (rank < 0 || e.rank == rank)) out.push_back(e);
        return out;
    }
    void clear()
    {
        std::lock_guard lock(m_mutex);
        m_events.clear();
    }

  private:
    mutable std::mutex m_mutex;
    std::vector<telemetry::Event> m_events;
};

inline std::unique_ptr<core::Engine> makeEngine(int world, core::EngineConfig cfg = {})
{
    cfg.worldSize = world;
    return std::make_unique<core::Engine>(cfg, comm::makeCpuWorld(world));
}

inline std::vector<float> iota(std::int64_t n, float start = 1.0f)
{
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = start + static_cast<float>(i);
    return v;
}

} // namespace shardscope::test

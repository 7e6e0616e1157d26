#pragma once
// Our Engine as a state provider: what shardscope-train hands the inspector's server.

#include "state/stateprovider.h"

namespace shardscope::core {

class Engine;

class EngineStateProvider final : public state::StateProvider
{
  public:
    explicit EngineStateProvider(Engine &engine) : m_engine(engine) {}

    state::EngineState state() const override;
    void stateColumns(state::StateColumns &out) const override;
    std::uint64_t stateVersion() const override;
    std::string modelName() const override;
    int worldSize() const override;
    std::string backend() const override;
    std::vector<int> localRanks() const override;
    void setEventSink(telemetry::EventSink *sink) override;
    void setTelemetryEnabled(bool on) override;

  private:
    Engine &m_engine;
};

} // namespace shardscope::core

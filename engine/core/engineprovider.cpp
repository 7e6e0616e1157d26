#include "core/engineprovider.h"

#include "core/engine.h"

namespace shardscope::core {

state::EngineState EngineStateProvider::state() const
{
    return m_engine.state();
}

void EngineStateProvider::stateColumns(state::StateColumns &out) const
{
    m_engine.stateColumns(out);
}

std::uint64_t EngineStateProvider::stateVersion() const
{
    return m_engine.stateVersion();
}

std::string EngineStateProvider::modelName() const
{
    return m_engine.config().modelName;
}

int EngineStateProvider::worldSize() const
{
    return m_engine.worldSize();
}

std::string EngineStateProvider::backend() const
{
    return std::string(comm::backendName(m_engine.backend()));
}

std::vector<int> EngineStateProvider::localRanks() const
{
    return m_engine.localRanks();
}

void EngineStateProvider::setEventSink(telemetry::EventSink *sink)
{
    m_engine.setEventSink(sink);
}

void EngineStateProvider::setTelemetryEnabled(bool on)
{
    m_engine.setTelemetryEnabled(on);
}

} // namespace shardscope::core

#pragma once
// What the inspector endpoint serves: a source of the engine state and of events. Our own
// Engine is one (EngineStateProvider); the DeepSpeed agent's process state is another
// (python/shardscope). The server reads state() on its own thread at any time. Plain data and
// an interface: a producer implements it, the server serves it, neither links the other.

#include <cstdint>
#include <string>
#include <vector>

#include "state/state.h"
#include "state/statecolumns.h"
#include "telemetry/event.h"

namespace shardscope::state {

class StateProvider
{
  public:
    virtual ~StateProvider() = default;

    // A consistent copy of the whole state; called from the server thread.
    virtual EngineState state() const = 0;
    // The same as columns, written into `out` (its memory reused): what the binary State is
    // encoded from. This default converts state(); a provider that can fill the columns
    // directly (our Engine) skips the EngineState.
    virtual void stateColumns(StateColumns &out) const { columnsOf(state(), out); }
    // Changes whenever state() may have changed, so the server rebuilds only then.
    virtual std::uint64_t stateVersion() const = 0;
    virtual std::string modelName() const = 0;
    virtual int worldSize() const = 0;
    virtual std::string backend() const = 0;         // "cpu", "nccl", "gloo"
    virtual std::vector<int> localRanks() const = 0; // the global ranks this process runs
    // Where events go from now on (nullptr: nowhere). The sink outlives the provider's use.
    virtual void setEventSink(telemetry::EventSink *sink) = 0;
    virtual void setTelemetryEnabled(bool on) = 0;
};

} // namespace shardscope::state

#pragma once
// Engine telemetry as NVTX annotations, so Nsight Systems shows the engine's gathers next
// to NCCL's kernels: a decorator that forwards every event to an inner sink (may be null)
// and turns FetchBegin/FetchEnd into a range ("fetch <param> (module <m>, <reason>)"),
// Release and Broadcast into marks. NVTX3 is header-only: no library is linked, and
// without a profiler attached each annotation is one branch.

#include <nvtx3/nvToolsExt.h>

#include <string>
#include <vector>

#include "telemetry/event.h"

namespace shardscope::core {
class Engine;
}

namespace shardscope::cuda {

class NvtxEventSink final : public telemetry::EventSink
{
  public:
    // Takes the engine's parameter and module names now; refreshNames() takes them again.
    NvtxEventSink(const core::Engine &engine, telemetry::EventSink *inner);

    // Parameters and modules added since construction (the model is built after the sink
    // is installed) get their names; until then they are labelled by id. Call while no
    // thread is emitting events (before training), as write() reads the names unlocked.
    void refreshNames(const core::Engine &engine);

    // Never blocks and never allocates: labels are formatted on the stack.
    void write(const telemetry::Event &ev) noexcept override;

    telemetry::EventSink *inner() const { return m_inner; }

  private:
    const char *paramName(std::uint32_t id) const;
    const char *moduleName(std::uint32_t id) const;
    nvtxRangeId_t *openRange(std::uint16_t rank, std::uint32_t param);

    telemetry::EventSink *m_inner;
    std::vector<std::string> m_params;  // by ParamId
    std::vector<std::string> m_modules; // by ModuleId ("<root>" for the root)
    std::vector<int> m_localIndex;      // world rank -> local index, -1 when not local
    std::size_t m_stride = 0;           // m_params.size() when m_open was laid out
    std::vector<nvtxRangeId_t> m_open;  // [local index * m_stride + param]; 0 = none open
};

} // namespace shardscope::cuda

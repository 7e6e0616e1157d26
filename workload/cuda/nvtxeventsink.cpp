#include "cuda/nvtxeventsink.h"

#include <cstdio>

#include "core/engine.h"
#include "telemetry/eventfields.h"

namespace shardscope::cuda {

NvtxEventSink::NvtxEventSink(const core::Engine &engine, telemetry::EventSink *inner)
    : m_inner(inner)
{
    refreshNames(engine);
}

void NvtxEventSink::refreshNames(const core::Engine &engine)
{
    std::vector<std::string> params(engine.paramCount());
    for (std::size_t i = 0; i < params.size(); ++i) {
        // Ids of removed parameters (weight_norm's pos_conv.weight) stay counted, but
        // Engine::param refuses them; they emit no more events, so any label will do.
        try {
            params[i] = engine.param(static_cast<ParamId>(i)).name;
        } catch (const core::EngineError &) {
            params[i] = "<removed parameter>";
        }
    }
    std::vector<std::string> modules(engine.moduleCount());
    for (std::size_t i = 0; i < modules.size(); ++i)
        modules[i] = engine.modulePath(static_cast<ModuleId>(i));

    std::vector<int> localIndex(static_cast<std::size_t>(engine.worldSize()), -1);
    const std::vector<int> &locals = engine.localRanks();
    for (std::size_t i = 0; i < locals.size(); ++i)
        localIndex[static_cast<std::size_t>(locals[i])] = static_cast<int>(i);

    // Ranges still open keep their ids under the new layout.
    std::vector<nvtxRangeId_t> open(locals.size() * params.size(), 0);
    for (std::size_t l = 0; l < locals.size() && m_stride > 0; ++l)
        for (std::size_t p = 0; p < m_stride && p < params.size(); ++p)
            if (l * m_stride + p < m_open.size())
                open[l * params.size() + p] = m_open[l * m_stride + p];

    m_params = std::move(params);
    m_modules = std::move(modules);
    m_localIndex = std::move(localIndex);
    m_stride = m_params.size();
    m_open = std::move(open);
}

const char *NvtxEventSink::paramName(std::uint32_t id) const
{
    return id < m_params.size() ? m_params[id].c_str() : "<new parameter>";
}

const char *NvtxEventSink::moduleName(std::uint32_t id) const
{
    if (id == kNoModule) return "<none>";
    return id < m_modules.size() ? m_modules[id].c_str() : "<new module>";
}

nvtxRangeId_t *NvtxEventSink::openRange(std::uint16_t rank, std::uint32_t param)
{
    if (rank >= m_localIndex.size() || param >= m_stride) return nullptr;
    const int local = m_localIndex[rank];
    if (local < 0) return nullptr;
    return &m_open[static_cast<std::size_t>(local) * m_stride + param];
}

void NvtxEventSink::write(const telemetry::Event &ev) noexcept
{
    if (m_inner) m_inner->write(ev);
    char label[384];
    switch (ev.type) {
    case EventType::FetchBegin: {
        const telemetry::FetchFields f = telemetry::readFetch(ev);
        const std::string_view reason = fetchReasonName(f.reason);
        std::snprintf(label, sizeof label, "fetch %s (module %s, %.*s)", paramName(f.param),
                      moduleName(f.cause), static_cast<int>(reason.size()), reason.data());
        if (nvtxRangeId_t *slot = openRange(ev.rank, f.param))
            *slot = nvtxRangeStartA(label);
        else
            nvtxMarkA(label);
        break;
    }
    case EventType::FetchEnd:
        if (nvtxRangeId_t *slot = openRange(ev.rank, telemetry::readFetch(ev).param);
            slot && *slot) {
            nvtxRangeEnd(*slot);
            *slot = 0;
        }
        break;
    case EventType::Release: {
        const telemetry::ReleaseFields f = telemetry::readRelease(ev);
        std::snprintf(label, sizeof label, "release %s (module %s)", paramName(f.param),
                      moduleName(f.cause));
        nvtxMarkA(label);
        break;
    }
    case EventType::Broadcast: {
        const telemetry::BroadcastFields f = telemetry::readBroadcast(ev);
        std::snprintf(label, sizeof label, "broadcast %s (root %u)", paramName(f.param), f.root);
        nvtxMarkA(label);
        break;
    }
    // The engine's reduce-scatter begins and ends on the rank's thread within one call, with
    // nothing pushed between: a pushed range.
    case EventType::ReduceScatterBegin: {
        const telemetry::ReduceScatterFields f = telemetry::readReduceScatter(ev);
        std::snprintf(label, sizeof label, "reduce-scatter %s (module %s)",
                      f.param == kNoParam ? "<group>" : paramName(f.param), moduleName(f.module));
        nvtxRangePushA(label);
        break;
    }
    case EventType::ReduceScatterEnd:
        nvtxRangePop();
        break;
    default:
        break;
    }
}

} // namespace shardscope::cuda

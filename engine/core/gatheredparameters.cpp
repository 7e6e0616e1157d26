#include <algorithm>
#include <cstring>
#include <exception>

#include "core/engine.h"
#include "core/engineimpl.h"
#include "state/violationtext.h"
#include "telemetry/clock.h"

namespace shardscope::core {

std::vector<std::uint64_t> Engine::Impl::openScope(RankState &rs, const std::vector<ParamId> &ps,
                                                   std::source_location where)
{
    rs.site = where;
    for (std::size_t i = 0; i < ps.size(); ++i) {
        const ParamId p = ps[i];
        if (p >= params.size() || params[p].removed)
            throw EngineError("GatheredParameters: parameter id " + std::to_string(p) +
                              " does not exist");
        if (rs.params[p].inScope || std::find(ps.begin(), ps.begin() + i, p) != ps.begin() + i)
            throw EngineError("GatheredParameters over " + params[p].name +
                              " is nested inside another GatheredParameters over it (rank " +
                              std::to_string(rs.rank) + "); close the outer scope first or leave " +
                              params[p].name + " out of the inner one");
    }
    std::vector<std::uint64_t> hashes;
    hashes.reserve(ps.size());
    for (ParamId p : ps) {
        gather(rs, p, kNoModule, FetchReason::GatheredParameters);
        RankParam &rp = rs.params[p];
        {
            std::lock_guard rl(rs.mu);
            rp.inScope = true;
            clearPrefetched(rs, p);
        }
        ++rs.fast[p].readable;
        hashes.push_back(hashFull(rs, p));
    }
    return hashes;
}

std::vector<std::string> Engine::Impl::closeScope(RankState &rs, const std::vector<ParamId> &ps,
                                                  std::optional<int> modifier,
                                                  const std::vector<std::uint64_t> &hashes,
                                                  std::source_location where)
{
    rs.site = where;
    std::vector<std::string> modified;
    for (std::size_t i = 0; i < ps.size(); ++i) {
        const ParamId p = ps[i];
        const ParamInfo &info = params[p];
        RankParam &rp = rs.params[p];
        if (info.removed) {
            rp.inScope = false;
            --rs.fast[p].readable;
            continue;
        }
        const std::size_t bytes = static_cast<std::size_t>(info.numel) * elemSize(p);
        if (modifier) {
            // u0 as fetches carry it: the padded bytes (docs/protocol.md, "Bytes").
            emit(rs, telemetry::makeBroadcast({.param = p,
                                               .root = static_cast<std::uint32_t>(*modifier),
                                               .bytes = fullBytes(p)}));
            // Its place in the rank's collective sequence (issue 51): the parameter's owner,
            // for GatheredParameters.
            const telemetry::CollectiveFields collective{.kind = CollectiveKind::Broadcast,
                                                         .module = info.owner,
                                                         .seq = ++rs.collectiveSeq,
                                                         .bytes = bytes,
                                                         .reason = FetchReason::GatheredParameters,
                                                         .params = 1};
            emit(rs, telemetry::makeCollectiveBegin(collective));
            rs.comm->waitForCompute(); // the modifier's edits may come from its own kernels
            {
                const WaitingScope waiting(rs, collective, telemetry::nowNs());
                rs.comm->broadcast(rp.full.data(), bytes, *modifier).wait();
            }
            emit(rs, telemetry::makeCollectiveEnd(collective));
            if (!rp.shard.empty()) {
                shardFromFull(rs, p);
                rs.comm->waitForCompute(); // later gathers read the new shard
            }
        } else if (hashFull(rs, p) != hashes[i]) {
            modified.push_back(info.name);
            emit(rs, telemetry::makeGatheredWriteError(p));
            state::ViolationRecord v;
            v.kind = ViolationKind::GatheredWriteWithoutModifier;
            v.step = rs.step.load();
            v.rank = rs.rank;
            v.param = p;
            v.paramName = info.name;
            v.owner = info.owner;
            v.status = ParamStatus::Available;
            v.action = GuardAction::Raised;
            state::ViolationSubject subject;
            subject.kind = ViolationKind::GatheredWriteWithoutModifier;
            subject.param = info.name;
            subject.owner = modules[info.owner].path;
            subject.modifierRank = rs.rank;
            auto text = state::describeViolation(subject, state::FixDialect::ShardScope);
            v.fix = std::move(text.fix);
            v.message = std::move(text.message);
            recordViolation(std::move(v));
        }
        {
            std::lock_guard rl(rs.mu);
            rp.inScope = false;
        }
        --rs.fast[p].readable;
    }
    // Release what no module uses, dropping discarded edits with the gathered copy.
    for (ParamId p : ps) {
        RankParam &rp = rs.params[p];
        if (!params[p].removed && rp.active.empty()) release(rs, p, kNoModule);
    }
    return modified;
}

namespace {

std::string modifiedMessage(const std::vector<std::string> &names, int rank)
{
    std::string list;
    for (const auto &n : names)
        list += (list.empty() ? "" : ", ") + n;
    return "GatheredParameters: " + list + (names.size() > 1 ? " were" : " was") +
           " modified in place on rank " + std::to_string(rank) +
           " without modifier_rank; the change was discarded and no shard changed. Pass "
           "modifier_rank=<the rank whose values to keep> to keep it";
}

} // namespace

GatheredParameters::GatheredParameters(Engine &engine, int rank, std::vector<ParamId> params,
                                       std::optional<int> modifierRank, std::source_location where)
    : m_engine(engine), m_rank(rank), m_params(std::move(params)), m_modifier(modifierRank),
      m_where(where)
{
    if (m_modifier && (*m_modifier < 0 || *m_modifier >= engine.worldSize()))
        throw EngineError("GatheredParameters: modifier_rank " + std::to_string(*m_modifier) +
                          " is outside [0, " + std::to_string(engine.worldSize()) + ")");
    RankState &rs = engine.d->rankState(rank);
    m_hashes.push_back(engine.d->openScope(rs, m_params, m_where));
}

GatheredParameters::GatheredParameters(Engine &engine, std::vector<ParamId> params,
                                       std::optional<int> modifierRank, std::source_location where)
    : m_engine(engine), m_rank(-1), m_params(std::move(params)), m_modifier(modifierRank),
      m_where(where)
{
    if (m_modifier && (*m_modifier < 0 || *m_modifier >= engine.worldSize()))
        throw EngineError("GatheredParameters: modifier_rank " + std::to_string(*m_modifier) +
                          " is outside [0, " + std::to_string(engine.worldSize()) + ")");
    const auto &local = engine.localRanks();
    m_hashes.resize(local.size());
    engine.forEachLocalRank([&](int rank) {
        const auto idx =
            static_cast<std::size_t>(std::find(local.begin(), local.end(), rank) - local.begin());
        m_hashes[idx] = engine.d->openScope(engine.d->rankState(rank), m_params, m_where);
    });
}

GatheredParameters::~GatheredParameters() noexcept(false)
{
    if (!m_open) return;
    if (std::uncaught_exceptions() > 0) {
        try {
            close();
        } catch (...) {
        }
        return;
    }
    close();
}

void GatheredParameters::close()
{
    if (!m_open) return;
    m_open = false;
    Engine::Impl &d = *m_engine.d;
    if (m_rank >= 0) {
        auto modified =
            d.closeScope(d.rankState(m_rank), m_params, m_modifier, m_hashes.front(), m_where);
        if (!modified.empty()) throw EngineError(modifiedMessage(modified, m_rank));
        return;
    }
    const auto &local = m_engine.localRanks();
    std::vector<std::vector<std::string>> modified(local.size());
    m_engine.forEachLocalRank([&](int rank) {
        const auto idx =
            static_cast<std::size_t>(std::find(local.begin(), local.end(), rank) - local.begin());
        modified[idx] =
            d.closeScope(d.rankState(rank), m_params, m_modifier, m_hashes[idx], m_where);
    });
    for (std::size_t i = 0; i < local.size(); ++i)
        if (!modified[i].empty()) throw EngineError(modifiedMessage(modified[i], local[i]));
}

std::vector<std::byte> GatheredParameters::toHost(std::size_t i) const
{
    const TensorView v = (*this)[i];
    return m_engine.toHost(viewRank(), v);
}

int GatheredParameters::viewRank() const
{
    if (m_rank >= 0) return m_rank;
    const auto &local = m_engine.localRanks();
    return (m_modifier && std::find(local.begin(), local.end(), *m_modifier) != local.end())
               ? *m_modifier
               : local.front();
}

TensorView GatheredParameters::operator[](std::size_t i) const
{
    if (i >= m_params.size())
        throw EngineError("GatheredParameters: index " + std::to_string(i) + " out of range (" +
                          std::to_string(m_params.size()) + " parameters)");
    if (!m_open)
        throw EngineError("GatheredParameters: the scope is closed; its tensors are released");
    RankState &rs = m_engine.d->rankState(viewRank());
    return m_engine.d->view(rs, m_params[i]);
}

} // namespace shardscope::core

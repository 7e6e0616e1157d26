// The access guard and violation recording: what happens when a module reads a parameter
// it neither owns nor registered, and how each sighting reaches the one violation ledger
// (state/violationledger.h).

#include <algorithm>

#include "core/engine.h"
#include "core/engineimpl.h"
#include "state/violationtext.h"
#include "telemetry/clock.h"

namespace shardscope::core {
// ---------------------------------------------------------------- the access guard

TensorView Engine::Impl::view(RankState &rs, ParamId p)
{
    RankParam &rp = rs.params[p];
    return TensorView{rp.full.data(), params[p].numel, params[p].dtype};
}

TensorView Engine::accessSlow(int rank, ParamId p, std::source_location where)
{
    RankState &rs = d->rankState(rank);
    if (p < rs.fast.size() && rs.fast[p].readable > 0)
        return TensorView{rs.fast[p].data, rs.fast[p].numel, rs.fast[p].dtype};
    return d->slowAccess(rs, p, where);
}

bool Engine::Impl::registeredOnStack(const RankState &rs, ParamId p) const
{
    const ModuleId owner = params[p].owner;
    for (std::size_t i = 0; i < rs.depth; ++i) {
        const ModuleId m = rs.frames[i].module;
        if (m == owner) return true;
        for (const ExternalEntry &e : rs.externals[m])
            if (e.param == p) return true;
    }
    return false;
}

TensorView Engine::Impl::slowAccess(RankState &rs, ParamId p, std::source_location where)
{
    rs.site = where; // a gather this read issues waits with the reader's line
    if (p >= params.size() || params[p].removed)
        throw EngineError("access to parameter id " + std::to_string(p) +
                          ", which does not exist (was it removed, e.g. by weight_norm?)");
    const ParamInfo &info = params[p];
    const ModuleId accessor = rs.depth ? rs.frames[rs.depth - 1].module : kNoModule;
    const Phase phase = rs.depth ? rs.frames[rs.depth - 1].phase : Phase::Forward;
    const FetchReason reason =
        phase == Phase::Forward ? FetchReason::Forward : FetchReason::Backward;

    // Owned or registered by a module on the stack after that module was entered: legal.
    if (accessor != kNoModule && registeredOnStack(rs, p)) {
        useParam(rs, p, accessor, true, reason);
        return view(rs, p);
    }

    const GuardPolicy policy = q->m_config.guard;
    const ParamStatus st = rs.status[p].load(std::memory_order_acquire);

    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.step = rs.step.load();
    v.rank = rs.rank;
    v.accessor = accessor;
    v.param = p;
    v.paramName = info.name;
    v.owner = info.owner;
    v.status = st;
    state::ViolationSubject subject;
    subject.kind = ViolationKind::UnregisteredAccess;
    subject.hasAccessor = accessor != kNoModule;
    if (subject.hasAccessor) subject.accessor = modules[accessor].path;
    subject.param = info.name;
    subject.owner = modules[info.owner].path;
    subject.status = st;
    auto text = state::describeViolation(subject, state::FixDialect::ShardScope);
    v.fix = std::move(text.fix);
    v.message = std::move(text.message);

    const bool first =
        rs.violationsThisStep.emplace(accessor, p, where.file_name(), where.line()).second;

    GuardAction action = GuardAction::Gathered;
    if (policy == GuardPolicy::Error)
        action = GuardAction::Raised;
    else if (policy == GuardPolicy::Auto && accessor != kNoModule)
        action = GuardAction::AutoRegistered;
    v.action = action;

    if (first) {
        v.location.file = where.file_name();
        v.location.line = where.line();
        v.location.function = where.function_name();
        emit(rs, telemetry::makeUnregisteredAccess({.accessor = accessor,
                                                    .param = p,
                                                    .owner = info.owner,
                                                    .status = st,
                                                    .action = action}));
        unregisteredCount.fetch_add(1, std::memory_order_relaxed);
        state::ViolationRecord copy = v;
        recordViolation(std::move(copy));
    }

    switch (action) {
    case GuardAction::Raised:
        throw UnregisteredAccessError(v.message + " (rank " + std::to_string(rs.rank) + ", step " +
                                          std::to_string(v.step) + "); fix: " + v.fix,
                                      v.fix);
    case GuardAction::AutoRegistered:
        addExternal(rs, accessor, p, true);
        useParam(rs, p, accessor, true, FetchReason::Guard);
        break;
    default:
        if (accessor != kNoModule) {
            useParam(rs, p, accessor, false, FetchReason::Guard);
        } else {
            gather(rs, p, kNoModule, FetchReason::Guard);
        }
        break;
    }
    return view(rs, p);
}

// The parameter a late one replaced: a removed parameter of the same module whose name
// the late one extends (weight_norm turns `weight` into `weight_g` and `weight_v`).
std::string Engine::Impl::replacedBy(ParamId late) const
{
    const ParamInfo &info = params[late];
    for (const ParamInfo &old : params)
        if (old.removed && old.owner == info.owner && old.id != late &&
            info.localName.size() > old.localName.size() &&
            info.localName.compare(0, old.localName.size(), old.localName) == 0)
            return old.name;
    return {};
}

void Engine::Impl::recordViolation(state::ViolationRecord v)
{
    v.tsNs = telemetry::nowNs();
    touch();
    v.count = 1;
    v.lastStep = v.step;
    std::lock_guard lock(violationMutex);
    if (v.kind == ViolationKind::LateParameter && !lateReported[v.param]) {
        lateReported[v.param] = true;
        lateCount.fetch_add(1, std::memory_order_relaxed);
    }
    violations.add(v, state::Tally::Add);
}

} // namespace shardscope::core

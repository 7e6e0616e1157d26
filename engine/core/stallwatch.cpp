// The engine's stall watchdog (issue 51): which rank waits in which collective, and on which
// line of its C++ code. A rank's thread marks the collective it is blocked in (RankState's
// Waiting, set by WaitingScope around every blocking all-gather, reduce-scatter and broadcast);
// this thread reads the marks a few times a second and, for a rank that has waited longer than
// the threshold (state/stallthreshold.h), records one rank_stalled violation of that rank with
// its call site, the same record an agent's watchdog makes with its Python line. The job's
// aligner (sessioncore/collectivealigner.h) reads it as that rank's own record.

#include <algorithm>
#include <chrono>

#include "core/engine.h"
#include "core/engineimpl.h"
#include "state/violationtext.h"
#include "telemetry/clock.h"

namespace shardscope::core {

void Engine::Impl::watch()
{
    // A quarter of the threshold, at most half a second: a stall is said within 1.25 x it.
    const auto period = std::chrono::nanoseconds(
        std::clamp<std::uint64_t>(stallNs / 4, 1'000'000ull, 500'000'000ull));
    std::unique_lock lock(watchMu);
    while (!watchCv.wait_for(lock, period, [this] { return watchStop; })) {
        const std::uint64_t now = telemetry::nowNs();
        for (const std::unique_ptr<RankState> &rs : ranks) {
            RankState::Waiting w;
            {
                std::lock_guard wl(rs->waitMu);
                if (!rs->waiting.active) continue;
                w = rs->waiting;
            }
            if (now < w.sinceNs || now - w.sinceNs < stallNs || w.what.seq == rs->stalledSeq)
                continue;
            rs->stalledSeq = w.what.seq;
            recordStall(*rs, w, now);
        }
    }
}

void Engine::Impl::recordStall(RankState &rs, const RankState::Waiting &w, std::uint64_t nowNs)
{
    state::SourceLocation where;
    if (w.site.line() != 0) {
        where.file = w.site.file_name();
        where.line = w.site.line();
        where.function = w.site.function_name();
    }
    state::ViolationSubject subject;
    subject.kind = ViolationKind::RankStalled;
    subject.ownRank = true;
    state::CollectiveDetail &d = subject.collective;
    d.group = w.what.group;
    d.seq = w.what.seq;
    d.waitedMs = (nowNs - w.sinceNs + 500'000) / 1'000'000;
    state::CollectiveSide side;
    side.ranks = {rs.rank};
    side.position = CollectivePosition::Waiting;
    side.kind = w.what.kind;
    {
        std::shared_lock sl(structure);
        side.hasModule = w.what.module < modules.size();
        if (side.hasModule) side.module = modules[w.what.module].path;
    }
    side.reason = w.what.reason;
    side.bytes = w.what.bytes;
    side.params = w.what.params;
    side.lastSeq = w.what.seq;
    d.sides.push_back(side);
    d.sites.push_back({rs.rank, w.what.seq, d.waitedMs, where});
    const state::ViolationText text =
        state::describeViolation(subject, state::FixDialect::ShardScope);
    state::ViolationRecord v;
    v.kind = ViolationKind::RankStalled;
    v.step = rs.step.load(std::memory_order_relaxed);
    v.rank = rs.rank;
    v.accessor = side.hasModule ? w.what.module : kNoModule;
    v.action = GuardAction::Recorded;
    v.location = where;
    v.collective = d;
    v.message = text.message;
    v.fix = text.fix;
    recordViolation(std::move(v));
}

} // namespace shardscope::core

#pragma once
// A recorded job whose ranks diverged (issue 51), as the merge of its ranks' snapshots holds
// it: two ranks of a tiny model ran one step's five collectives alike (rank 1 always 2 ms after
// rank 0); then rank 0 issued a sixth (the embedding's forward all-gather: an extra forward)
// and waited in it, its watchdog naming the script's line, while rank 1's run ended. Read by
// the Collectives panel's and the main window's tests, written as a snapshot file.

#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/eventfields.h"
#include "wire/snapshot.h"

namespace shardscope::test {

inline constexpr std::uint32_t kDivergedLine = 77;

inline wire::Snapshot divergedJob()
{
    constexpr std::uint64_t ms = 1'000'000ull;
    struct Op
    {
        CollectiveKind kind;
        ModuleId module;
        FetchReason reason;
        std::uint64_t bytes;
    };
    const std::vector<Op> step = {
        {CollectiveKind::AllGather, 1, FetchReason::Forward, 4096},
        {CollectiveKind::AllGather, 2, FetchReason::Forward, 8192},
        {CollectiveKind::AllGather, 2, FetchReason::Backward, 8192},
        {CollectiveKind::ReduceScatter, 2, FetchReason::Backward, 8192},
        {CollectiveKind::ReduceScatter, 1, FetchReason::Backward, 4096},
    };
    wire::Snapshot s;
    s.meta.producer = "shardscope-capture";
    s.state.modelName = "tiny-job";
    s.state.worldSize = 2;
    s.state.step = 1;
    s.state.backend = "gloo";
    s.state.fixDialect = "deepspeed";
    s.state.modules = {
        {0, "", "Model", kNoModule}, {1, "embed", "Embedding", 0}, {2, "head", "Linear", 0}};
    const auto collective = [](bool begin, int rank, std::uint64_t seq, const Op &op,
                               std::uint64_t ts) {
        const telemetry::CollectiveFields f{op.kind, op.module, 0, seq, op.bytes, op.reason, 1};
        return telemetry::stamped(begin ? telemetry::makeCollectiveBegin(f)
                                        : telemetry::makeCollectiveEnd(f),
                                  ts, 1, std::uint16_t(rank));
    };
    for (std::uint64_t i = 0; i < step.size(); ++i)
        for (int r = 0; r < 2; ++r) {
            const std::uint64_t t = (i + 1) * 10 * ms + std::uint64_t(r) * 2 * ms;
            s.events.push_back(collective(true, r, i + 1, step[i], t));
            s.events.push_back(collective(false, r, i + 1, step[i], (i + 1) * 10 * ms + 5 * ms));
        }
    s.events.push_back(collective(true, 0, 6, step[0], 100 * ms)); // rank 1 never comes
    // Rank 0's watchdog: it has waited 6 s in #6, at the script's line.
    state::ViolationRecord v;
    v.kind = ViolationKind::RankStalled;
    v.step = 1;
    v.lastStep = 1;
    v.rank = 0;
    v.accessor = 1;
    v.status = ParamStatus::Inflight;
    v.location.file = "train.py";
    v.location.line = kDivergedLine;
    v.location.function = "evaluate";
    v.collective.seq = 6;
    v.collective.waitedMs = 6000;
    state::CollectiveSide side;
    side.ranks = {0};
    side.position = CollectivePosition::Waiting;
    side.hasModule = true;
    side.module = "embed";
    side.bytes = 4096;
    side.params = 1;
    side.lastSeq = 6;
    v.collective.sides = {side};
    v.collective.sites = {{0, 6, 6000, v.location}};
    s.state.violations.push_back(v);
    return s;
}

} // namespace shardscope::test

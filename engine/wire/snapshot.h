#pragma once
// The snapshot: the engine's state, the recent events and the dropped-event count, as
// one JSON document (docs/snapshot.md). The wire's State message and the snapshot file
// use this same codec.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "state/state.h"
#include "telemetry/event.h"
#include "wire/atomicfile.h" // writeSnapshotFile writes through it
#include "wire/result.h"

namespace shardscope::wire {

inline constexpr std::string_view kSnapshotFormat = "shardscope-snapshot";
// Version 3 writes the events as columns (a document without events is written as version
// 2, the same document); versions 1 (status as an array of names) and 2 are still read.
inline constexpr int kSnapshotVersion = 3;
// Files larger than this, or gzip'd files whose text is, are refused by readSnapshotFile.
inline constexpr std::uint64_t kMaxSnapshotFileBytes = 1ull << 30;

struct SnapshotMeta
{
    std::string producer; // "shardscope-train", "shardscope-capture", ...
    std::int64_t pid = 0; // process that produced the state
    std::uint64_t createdUnixMs = 0;
    std::string endpoint; // where it was served or captured from; may be empty
};

struct Snapshot
{
    SnapshotMeta meta;
    state::EngineState state;
    std::vector<telemetry::Event> events; // oldest first
    std::uint64_t droppedEvents = 0;      // events lost before they reached this snapshot
};

std::string encodeSnapshot(const Snapshot &snapshot, bool pretty = false);
// Checks the format tag, version, every field's type and every module reference.
Result<Snapshot> decodeSnapshot(std::string_view json);
// The same; parses the text where it lies, without a copy, when json has kPayloadPadding
// bytes of spare capacity (as a large payload from FrameDecoder has).
Result<Snapshot> decodeSnapshot(const std::string &json);
inline Result<Snapshot> decodeSnapshot(const char *json)
{
    return decodeSnapshot(std::string_view(json));
}

// The snapshot file of the process holding rank `rank` when every process of a job of
// worldSize ranks was given the same name: "{rank}" in it is replaced by the rank; without
// it rank 0 keeps the name and rank N > 0 writes PATH.rank<N> (shardscope-train
// --snapshot-out, the DeepSpeed agent's snapshot_out), so no rank's snapshot is lost.
std::string outputOfRank(const std::string &path, int rank, int worldSize);
// The pretty-printed document; gzip'd when path ends in ".gz" (wire/compress.h).
Status writeSnapshotFile(const std::string &path, const Snapshot &snapshot);
// The bytes of a snapshot file, plain or gzip'd (told apart by gzip's magic bytes, not by
// the name); a gzip'd one may hold at most maxText bytes of text.
Result<Snapshot> decodeSnapshotFile(std::string bytes,
                                    std::uint64_t maxText = kMaxSnapshotFileBytes);
Result<Snapshot> readSnapshotFile(const std::string &path);

std::uint64_t unixTimeMs();

namespace detail {
// A violation's `collective` (docs/snapshot.md) as compact JSON, and back: StateBinary's
// layout 5 carries it as one string (docs/protocol.md, part 53).
std::string collectiveJson(const state::CollectiveDetail &d);
Result<state::CollectiveDetail> decodeCollectiveJson(std::string_view json);
} // namespace detail

} // namespace shardscope::wire

#pragma once
// The binary State (message type 12, docs/protocol.md "StateBinary"): the same Snapshot the
// JSON State carries, as little-endian columns behind one string table, for clients that
// list the capability "state_binary" in their Hello. A 100,000-parameter, 64-rank state is
// a fifth of its JSON size and encodes and decodes in a fraction of the time.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "state/statecolumns.h"

#include "wire/frame.h"
#include "wire/result.h"
#include "wire/snapshot.h"

namespace shardscope::wire {

// The payload's first four bytes, "SSTB", read as a little-endian u32.
inline constexpr std::uint32_t kBinaryStateMagic = 0x42545353u;
// The layout of the payload: 2 adds violations' source locations, 3 FSDP2's units and
// parameters' placements, 4 violations' severity and read, 5 violations' collective
// (collective_mismatch, rank_stalled) (docs/protocol.md, "StateBinary"). A decoder reads 1 to
// 5 and refuses any other; an encoder writes the newest layout a client's Hello lists
// (binaryLayoutOf).
inline constexpr std::uint16_t kBinaryStateLayout = 5;
inline constexpr std::uint16_t kBinaryStateOldestLayout = 1;
inline constexpr std::size_t kBinaryStateHeaderSize = 128;

// Encodes everything a Snapshot holds. Names that are not valid UTF-8 get U+FFFD for each
// invalid byte, as in the JSON, so both decode to the same Snapshot.
std::string encodeBinaryState(const Snapshot &snapshot, std::uint16_t layout = kBinaryStateLayout);
// The same from a state's columns, with the meta and events a Snapshot would add (a live
// State carries none): what the server sends, without building an EngineState first. Both
// write the same bytes for the same state (tst_statebinary). Throws std::invalid_argument
// when the columns disagree on the number of parameters (a bug, never the user's input).
std::string encodeBinaryState(const state::StateColumns &columns, const SnapshotMeta &meta,
                              std::uint64_t droppedEvents,
                              std::span<const telemetry::Event> events = {},
                              std::uint16_t layout = kBinaryStateLayout);
// Checks the magic, the layout, that the payload's size is exactly what its counts say, and
// every value and reference the JSON decoder checks; an error says which field was wrong.
Result<Snapshot> decodeBinaryState(std::string_view payload);

// The State of either message type: State (JSON) or StateBinary. Any other frame is an error.
Result<Snapshot> decodeStateFrame(const Frame &frame);

} // namespace shardscope::wire

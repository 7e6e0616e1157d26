#pragma once
// Payloads of the inspector protocol's messages (docs/protocol.md) and the handshake
// rules both sides apply. Encoders never fail; decoders return an error for bad input.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/names.h"
#include "telemetry/event.h"
#include "wire/frame.h"
#include "wire/job.h"
#include "wire/result.h"

namespace shardscope::wire {

inline constexpr std::uint16_t kProtocolVersion = 1;
inline constexpr std::string_view kProtocolName = "shardscope";
// A client that lists this capability in its Hello gets every State as a StateBinary frame
// (wire/statebinary.h); one that does not gets JSON State frames, as before it existed.
inline constexpr std::string_view kCapabilityStateBinary = "state_binary";
// With it as well, the StateBinary frames use layout 2 (violations' source locations);
// a client listing only "state_binary" gets layout 1, as before layout 2 existed.
inline constexpr std::string_view kCapabilityStateBinary2 = "state_binary_2";
// With it as well, layout 3 (FSDP2's units and parameters' placements).
inline constexpr std::string_view kCapabilityStateBinary3 = "state_binary_3";
// With it as well, layout 4 (violations' severity and what their read touched).
inline constexpr std::string_view kCapabilityStateBinary4 = "state_binary_4";
// With it as well, layout 5 (violations' collective: collective_mismatch, rank_stalled).
inline constexpr std::string_view kCapabilityStateBinary5 = "state_binary_5";
// A client that lists this capability gets the event kinds added within version 1 after the
// first eighteen (reduce_scatter_begin/end, allocator_sample); a server leaves them out of
// what it sends a client that does not, which would refuse the whole batch.
inline constexpr std::string_view kCapabilityEvents2 = "events_2";
// With it as well, the collectives' kinds (collective_begin/end, 22 and 23).
inline constexpr std::string_view kCapabilityEvents3 = "events_3";
// The event kinds a client reads, by the capabilities of its Hello: 1 (kinds 1-18), 2 (with
// "events_2": up to 21), 3 (with "events_3" as well: up to 23).
inline constexpr int eventsLevelOfType(EventType t)
{
    const auto v = static_cast<std::uint8_t>(t);
    return v >= static_cast<std::uint8_t>(EventType::CollectiveBegin)      ? 3
           : v >= static_cast<std::uint8_t>(EventType::ReduceScatterBegin) ? 2
                                                                           : 1;
}
inline constexpr int kEventsLevel = 3; // this release's
// True for a kind added after the first eighteen (a client without "events_2" cannot read it).
inline constexpr bool isEvents2Type(EventType t)
{
    return eventsLevelOfType(t) >= 2;
}

// Client -> server, the first frame of a connection. Every C++ client asks for the binary State.
struct Hello
{
    std::uint16_t version = kProtocolVersion;
    std::vector<std::string> capabilities{"state",
                                          "events",
                                          "history",
                                          "dropped",
                                          std::string(kCapabilityStateBinary),
                                          std::string(kCapabilityStateBinary2),
                                          std::string(kCapabilityStateBinary3),
                                          std::string(kCapabilityStateBinary4),
                                          std::string(kCapabilityStateBinary5),
                                          std::string(kCapabilityEvents2),
                                          std::string(kCapabilityEvents3)};
    std::string token;  // must match the server's token when it has one
    std::string client; // free text, e.g. "shardscope-capture 0.1"
};

// Server -> client when the Hello was accepted; State follows. The capabilities are what the
// server can do; it sends a StateBinary only to a client that asked for it.
struct Welcome
{
    std::uint16_t version = kProtocolVersion;
    std::vector<std::string> capabilities{"state",
                                          "events",
                                          "history",
                                          "dropped",
                                          std::string(kCapabilityStateBinary),
                                          std::string(kCapabilityStateBinary2),
                                          std::string(kCapabilityStateBinary3),
                                          std::string(kCapabilityStateBinary4),
                                          std::string(kCapabilityStateBinary5),
                                          std::string(kCapabilityEvents2),
                                          std::string(kCapabilityEvents3)};
    std::string server; // e.g. "shardscope-train"
    std::int64_t pid = 0;
    std::string model;
    int worldSize = 1;
    std::string backend;
    std::uint64_t historyCapacity = 0; // N of the bounded recent history
    JobIdentity job;                   // optional on the wire; id "" when absent
};

// Either direction; the sender closes the connection after it.
// code: "bad_magic", "bad_frame", "version_mismatch", "bad_token", "handshake_timeout", "protocol".
struct ErrorMessage
{
    std::string code;
    std::string message;
};

// Server -> client: events this connection lost because it did not read fast enough.
struct DroppedNotice
{
    std::uint64_t dropped = 0; // since the previous notice
    std::uint64_t total = 0;   // since connecting
};

// Server -> client when the engine finishes: counts for this connection's live stream.
struct Goodbye
{
    std::string reason;
    std::uint64_t eventsOffered = 0; // live events produced while connected
    std::uint64_t eventsSent = 0;    // of those, queued to this client
    std::uint64_t eventsDropped =
        0; // of those, dropped for this client (sent + dropped == offered)
};

// A Goodbye's reason says how the run ended (docs/protocol.md): "training finished", or
// "training failed: WHY" (an exception, a rank gone), or "training stopped: WHY" (a signal).
inline constexpr std::string_view kTrainingFailed = "training failed";
// True when the reason says the run failed: a capture of it is not a success.
inline bool goodbyeSaysFailed(const Goodbye &bye)
{
    return std::string_view(bye.reason).starts_with(kTrainingFailed);
}

std::string encodeHello(const Hello &m);
Result<Hello> decodeHello(std::string_view payload);
std::string encodeWelcome(const Welcome &m);
Result<Welcome> decodeWelcome(std::string_view payload);
std::string encodeError(const ErrorMessage &m);
Result<ErrorMessage> decodeError(std::string_view payload);
std::string encodeGoodbye(const Goodbye &m);
Result<Goodbye> decodeGoodbye(std::string_view payload);
std::string encodeDropped(const DroppedNotice &m);
Result<DroppedNotice> decodeDropped(std::string_view payload);
std::string encodeHistoryBegin(std::uint64_t count);
Result<std::uint64_t> decodeHistoryBegin(std::string_view payload);

// A clock probe (docs/protocol.md, "Clock probes"): the client sends ClockRequest frames
// instead of a Hello, each carrying a u64 the server echoes; the server answers each with a
// ClockReply carrying the echo and its telemetry clock when it answered.
struct ClockReply
{
    std::uint64_t echo = 0;
    std::uint64_t serverNs = 0;
};
std::string encodeClockRequest(std::uint64_t echo);
Result<std::uint64_t> decodeClockRequest(std::string_view payload);
std::string encodeClockReply(const ClockReply &m);
Result<ClockReply> decodeClockReply(std::string_view payload);

// EventBatch payload: the records as-is (48 bytes each, little-endian).
std::string encodeEvents(std::span<const telemetry::Event> events);
void appendEvents(std::string &out, std::span<const telemetry::Event> events);
// Rejects a length that is not a multiple of 48 and records of an unknown EventType.
Result<std::vector<telemetry::Event>> decodeEvents(std::string_view payload);

bool hasCapability(const std::vector<std::string> &capabilities, std::string_view name);
// The StateBinary layout a client's Hello asks for: the newest of "state_binary" (1),
// "state_binary_2" (2), "state_binary_3" (3) and "state_binary_4" (4) it lists along with
// "state_binary"; 0 when it lists no "state_binary" and reads JSON State frames.
std::uint16_t binaryLayoutOf(const std::vector<std::string> &capabilities);
// The event kinds a Hello's capabilities read (eventsLevelOfType): 3 with "events_3", 2 with
// "events_2", else 1. A server sends such a client only the kinds of its level and below.
int eventsLevelOf(const std::vector<std::string> &capabilities);

// Handshake, server side: nullopt if the Hello is accepted, else the refusal to send.
std::optional<ErrorMessage> checkHello(const Hello &hello, std::string_view requiredToken);
// Handshake, client side: the server's first frame is a Welcome (returned) or an Error
// (its message, prefixed "the engine refused the connection: "); anything else is an error.
Result<Welcome> acceptWelcome(const Frame &frame);

// Event type names used in JSON and docs ("module_enter", "fetch_begin", ...): base/names.h.
using shardscope::eventTypeFromName;
using shardscope::eventTypeName;
using shardscope::isKnownEventType;

} // namespace shardscope::wire

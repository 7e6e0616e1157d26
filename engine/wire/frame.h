#pragma once
// Framing of the inspector protocol (docs/protocol.md): a fixed 12-byte little-endian
// header (magic, type, reserved, payload length) followed by the payload, and a
// streaming decoder that takes bytes in any chunking and yields frames or one clean error.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "wire/result.h"

namespace shardscope::wire {

// The bytes 'S' 'S' 'C' 'P' read as a little-endian u32.
inline constexpr std::uint32_t kFrameMagic = 0x50435353u;
inline constexpr std::size_t kFrameHeaderSize = 12;
// Largest payload a decoder accepts unless told otherwise (the State of a very large model
// fits). Payload memory grows only as bytes arrive, never from a length field alone.
inline constexpr std::uint32_t kDefaultMaxPayload = 256u << 20;
// Largest payload a server accepts from a client (the client only sends Hello, or clock
// probes).
inline constexpr std::uint32_t kMaxClientPayload = 64u << 10;
// Spare capacity after a large payload that FrameDecoder leaves, so a parser that reads
// up to this many bytes past the end (simdjson) can parse it in place.
inline constexpr std::size_t kPayloadPadding = 64;

enum class MessageType : std::uint16_t
{
    Hello = 1,         // client -> server, JSON
    Welcome = 2,       // server -> client, JSON
    Error = 3,         // either way, JSON {"code", "message"}; the sender closes afterwards
    State = 4,         // server -> client, snapshot JSON (docs/snapshot.md) with no events
    HistoryBegin = 5,  // server -> client, u64 number of history events that follow
    EventBatch = 6,    // server -> client, n * 48-byte Event records
    HistoryEnd = 7,    // server -> client, empty
    Dropped = 8,       // server -> client, u64 dropped since last notice, u64 total for this client
    Goodbye = 9,       // server -> client, JSON: the engine finished; the connection closes
    ClockRequest = 10, // client -> server, instead of Hello: u64 echo (a clock probe)
    ClockReply = 11,   // server -> client, u64 echo, u64 the server's telemetry clock
    // server -> client instead of State, to a client whose Hello listed "state_binary":
    // the same snapshot as little-endian columns (wire/statebinary.h)
    StateBinary = 12,
};
inline constexpr std::uint16_t kLastMessageType = 12;

bool isKnownMessageType(std::uint16_t type);
std::string_view messageTypeName(MessageType type); // "hello", "event_batch", ...

struct Frame
{
    MessageType type = MessageType::Error;
    std::string payload;
};

// Appends header + payload to out. The payload must not exceed kDefaultMaxPayload.
void appendFrame(std::string &out, MessageType type, std::string_view payload);
// Appends only the header of a frame whose payload of payloadSize bytes the caller sends next.
void appendFrameHeader(std::string &out, MessageType type, std::size_t payloadSize);
std::string encodeFrame(MessageType type, std::string_view payload);

class FrameDecoder
{
  public:
    explicit FrameDecoder(std::uint32_t maxPayload = kDefaultMaxPayload);

    // Buffers bytes; call next() until it yields nothing after each feed. Ignored after an error.
    void feed(const void *data, std::size_t size);
    void feed(std::string_view bytes) { feed(bytes.data(), bytes.size()); }

    // The next complete frame, std::nullopt when more bytes are needed, or the error that
    // stopped the stream (bad magic, unknown type, oversized length). Errors are sticky.
    Result<std::optional<Frame>> next();

    bool failed() const { return !m_error.empty(); }
    const std::string &error() const { return m_error; }
    // Bytes fed and not yet returned in a frame.
    std::size_t buffered() const
    {
        return m_buf.size() - m_pos + (m_inPayload ? kFrameHeaderSize + m_payload.size() : 0);
    }

  private:
    void appendPayload(const char *data, std::size_t size);

    std::uint32_t m_maxPayload;
    std::string m_buf;
    std::size_t m_pos = 0;
    // A frame too large to arrive in one feed (a State of tens of megabytes): its payload
    // is collected here directly and handed out without another copy; the capacity grows
    // to at most four times what arrived, plus the padding a JSON parser reads past the end.
    bool m_inPayload = false;
    MessageType m_payloadType = MessageType::Error;
    std::uint32_t m_payloadLength = 0;
    std::string m_payload;
    std::string m_error;
};

} // namespace shardscope::wire

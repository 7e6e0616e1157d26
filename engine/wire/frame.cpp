#include "wire/frame.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "base/hugepages.h"

namespace shardscope::wire {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; add byte swapping for big-endian hosts");

namespace {

// Payloads larger than this skip the stream buffer (see m_inPayload).
constexpr std::uint32_t kDirectPayloadMin = 64u << 10;
constexpr std::size_t kPayloadGrowth = 4;

void putU16(std::string &out, std::uint16_t v)
{
    char b[2];
    std::memcpy(b, &v, 2);
    out.append(b, 2);
}

void putU32(std::string &out, std::uint32_t v)
{
    char b[4];
    std::memcpy(b, &v, 4);
    out.append(b, 4);
}

template <class T> T load(const char *p)
{
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

std::string hex32(std::uint32_t v)
{
    static const char digits[] = "0123456789abcdef";
    std::string s = "0x";
    for (int shift = 28; shift >= 0; shift -= 4)
        s += digits[(v >> shift) & 0xF];
    return s;
}

} // namespace

bool isKnownMessageType(std::uint16_t type)
{
    return type >= 1 && type <= kLastMessageType;
}

std::string_view messageTypeName(MessageType type)
{
    switch (type) {
    case MessageType::Hello:
        return "hello";
    case MessageType::Welcome:
        return "welcome";
    case MessageType::Error:
        return "error";
    case MessageType::State:
        return "state";
    case MessageType::HistoryBegin:
        return "history_begin";
    case MessageType::EventBatch:
        return "event_batch";
    case MessageType::HistoryEnd:
        return "history_end";
    case MessageType::Dropped:
        return "dropped";
    case MessageType::Goodbye:
        return "goodbye";
    case MessageType::ClockRequest:
        return "clock_request";
    case MessageType::ClockReply:
        return "clock_reply";
    case MessageType::StateBinary:
        return "state_binary";
    }
    return "unknown";
}

void appendFrameHeader(std::string &out, MessageType type, std::size_t payloadSize)
{
    putU32(out, kFrameMagic);
    putU16(out, static_cast<std::uint16_t>(type));
    putU16(out, 0);
    putU32(out, static_cast<std::uint32_t>(payloadSize));
}

void appendFrame(std::string &out, MessageType type, std::string_view payload)
{
    out.reserve(out.size() + kFrameHeaderSize + payload.size());
    appendFrameHeader(out, type, payload.size());
    out.append(payload);
}

std::string encodeFrame(MessageType type, std::string_view payload)
{
    std::string out;
    appendFrame(out, type, payload);
    return out;
}

FrameDecoder::FrameDecoder(std::uint32_t maxPayload) : m_maxPayload(maxPayload) {}

void FrameDecoder::appendPayload(const char *data, std::size_t size)
{
    const std::size_t need = m_payload.size() + size;
    if (need > m_payload.capacity()) {
        const std::size_t whole = std::size_t{m_payloadLength} + kPayloadPadding;
        // Growing fourfold rather than twofold copies about a third as many bytes on the way
        // to a 50 MB State; the capacity stays below four times what arrived.
        reserveHuge(m_payload,
                    need == m_payloadLength
                        ? whole
                        : std::min(std::max(need, kPayloadGrowth * m_payload.capacity()), whole));
    }
    m_payload.append(data, size);
}

void FrameDecoder::feed(const void *data, std::size_t size)
{
    if (failed() || size == 0) return;
    const char *bytes = static_cast<const char *>(data);
    if (m_inPayload && m_payload.size() < m_payloadLength) {
        const std::size_t take = std::min(size, std::size_t{m_payloadLength} - m_payload.size());
        appendPayload(bytes, take);
        bytes += take;
        size -= take;
        if (size == 0) return;
    }
    if (m_pos > 0 && (m_pos >= m_buf.size() || m_pos > (1u << 16))) {
        m_buf.erase(0, m_pos);
        m_pos = 0;
    }
    m_buf.append(bytes, size);
}

Result<std::optional<Frame>> FrameDecoder::next()
{
    if (failed()) return fail(m_error);
    if (m_inPayload) {
        if (m_payload.size() < m_payloadLength) return std::optional<Frame>{};
        Frame frame;
        frame.type = m_payloadType;
        frame.payload = std::move(m_payload);
        m_payload = std::string();
        m_inPayload = false;
        return std::optional<Frame>{std::move(frame)};
    }
    const std::size_t avail = m_buf.size() - m_pos;
    if (avail < kFrameHeaderSize) return std::optional<Frame>{};
    const char *h = m_buf.data() + m_pos;
    const auto magic = load<std::uint32_t>(h);
    const auto type = load<std::uint16_t>(h + 4);
    const auto reserved = load<std::uint16_t>(h + 6);
    const auto length = load<std::uint32_t>(h + 8);
    if (magic != kFrameMagic)
        m_error = "not a ShardScope stream: frame magic " + hex32(magic) +
                  " where \"SSCP\" was expected; is the endpoint a ShardScope engine?";
    else if (!isKnownMessageType(type))
        m_error = "unknown message type " + std::to_string(type) +
                  "; the peer speaks a newer or a different protocol";
    else if (reserved != 0)
        m_error = "bad frame header: reserved field is " + std::to_string(reserved) + ", must be 0";
    else if (length > m_maxPayload)
        m_error = "frame of " + std::to_string(length) + " bytes exceeds the limit of " +
                  std::to_string(m_maxPayload) + " bytes";
    if (failed()) {
        m_buf.clear();
        m_pos = 0;
        return fail(m_error);
    }
    if (avail - kFrameHeaderSize < length) {
        // Small frames wait in m_buf; a large one collects its payload where it is handed out.
        if (length > kDirectPayloadMin) {
            m_inPayload = true;
            m_payloadType = static_cast<MessageType>(type);
            m_payloadLength = length;
            m_payload.clear();
            appendPayload(h + kFrameHeaderSize, avail - kFrameHeaderSize);
            m_buf.clear();
            m_pos = 0;
        }
        return std::optional<Frame>{};
    }
    Frame frame;
    frame.type = static_cast<MessageType>(type);
    frame.payload.assign(h + kFrameHeaderSize, length);
    m_pos += kFrameHeaderSize + length;
    if (m_pos == m_buf.size()) {
        m_buf.clear();
        m_pos = 0;
    }
    return std::optional<Frame>{std::move(frame)};
}

} // namespace shardscope::wire

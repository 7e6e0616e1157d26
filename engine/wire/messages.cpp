#include "wire/messages.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "wire/jsonread.h"

namespace shardscope::wire {

using detail::Json;

namespace {

Json stringArray(const std::vector<std::string> &v)
{
    Json a = Json::array();
    for (const auto &s : v)
        a.push_back(s);
    return a;
}

std::vector<std::string> readStringArray(const Json &obj, const char *key, const std::string &where)
{
    std::vector<std::string> out;
    if (!detail::hasMember(obj, key)) return out;
    const Json &a = detail::asArray(obj[key], where + "." + key);
    for (std::size_t i = 0; i < a.size(); ++i)
        out.push_back(detail::asString(a[i], where + "." + key + "[" + std::to_string(i) + "]"));
    return out;
}

std::string optString(const Json &obj, const char *key, const std::string &where)
{
    return detail::hasMember(obj, key) ? detail::asString(obj[key], where + "." + key)
                                       : std::string();
}

std::uint64_t optU64(const Json &obj, const char *key, const std::string &where)
{
    return detail::hasMember(obj, key) ? detail::asU64(obj[key], where + "." + key) : 0;
}

template <class T> void putLe(std::string &out, T v)
{
    char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    out.append(b, sizeof v);
}

template <class T> T getLe(const char *p)
{
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

} // namespace

std::string encodeHello(const Hello &m)
{
    Json j;
    j["protocol"] = kProtocolName;
    j["version"] = m.version;
    j["capabilities"] = stringArray(m.capabilities);
    j["token"] = m.token;
    j["client"] = m.client;
    return detail::dumpJson(j);
}

Result<Hello> decodeHello(std::string_view payload)
{
    return detail::guarded<Hello>("bad hello", [&] {
        const Json j = detail::parseJson(payload);
        detail::requireObject(j, "hello");
        if (detail::asString(detail::member(j, "protocol", "hello"), "hello.protocol") !=
            kProtocolName)
            detail::failAt("hello.protocol", "not \"shardscope\"");
        Hello m;
        m.version = static_cast<std::uint16_t>(
            detail::asBounded(detail::member(j, "version", "hello"), 0xFFFF, "hello.version"));
        m.capabilities = readStringArray(j, "capabilities", "hello");
        m.token = optString(j, "token", "hello");
        m.client = optString(j, "client", "hello");
        return m;
    });
}

std::string encodeWelcome(const Welcome &m)
{
    Json j;
    j["protocol"] = kProtocolName;
    j["version"] = m.version;
    j["capabilities"] = stringArray(m.capabilities);
    j["server"] = m.server;
    j["pid"] = m.pid;
    j["model"] = m.model;
    j["world_size"] = m.worldSize;
    j["backend"] = m.backend;
    j["history_capacity"] = m.historyCapacity;
    j["job"] = encodeJob(m.job);
    return detail::dumpJson(j);
}

Result<Welcome> decodeWelcome(std::string_view payload)
{
    return detail::guarded<Welcome>("bad welcome", [&] {
        const Json j = detail::parseJson(payload);
        detail::requireObject(j, "welcome");
        Welcome m;
        m.version = static_cast<std::uint16_t>(
            detail::asBounded(detail::member(j, "version", "welcome"), 0xFFFF, "welcome.version"));
        m.capabilities = readStringArray(j, "capabilities", "welcome");
        m.server = optString(j, "server", "welcome");
        m.pid = detail::hasMember(j, "pid") ? detail::asI64(j["pid"], "welcome.pid") : 0;
        m.model = optString(j, "model", "welcome");
        m.worldSize = detail::hasMember(j, "world_size")
                          ? static_cast<int>(
                                detail::asBounded(j["world_size"], 1 << 16, "welcome.world_size"))
                          : 1;
        m.backend = optString(j, "backend", "welcome");
        m.historyCapacity = optU64(j, "history_capacity", "welcome");
        if (detail::hasMember(j, "job")) m.job = decodeJob(j["job"], "welcome.job");
        return m;
    });
}

std::string encodeError(const ErrorMessage &m)
{
    Json j;
    j["code"] = m.code;
    j["message"] = m.message;
    return detail::dumpJson(j);
}

Result<ErrorMessage> decodeError(std::string_view payload)
{
    return detail::guarded<ErrorMessage>("bad error message", [&] {
        const Json j = detail::parseJson(payload);
        detail::requireObject(j, "error");
        ErrorMessage m;
        m.code = optString(j, "code", "error");
        m.message = detail::asString(detail::member(j, "message", "error"), "error.message");
        return m;
    });
}

std::string encodeGoodbye(const Goodbye &m)
{
    Json j;
    j["reason"] = m.reason;
    j["events_offered"] = m.eventsOffered;
    j["events_sent"] = m.eventsSent;
    j["events_dropped"] = m.eventsDropped;
    return detail::dumpJson(j);
}

Result<Goodbye> decodeGoodbye(std::string_view payload)
{
    return detail::guarded<Goodbye>("bad goodbye", [&] {
        const Json j = detail::parseJson(payload);
        detail::requireObject(j, "goodbye");
        Goodbye m;
        m.reason = optString(j, "reason", "goodbye");
        m.eventsOffered = optU64(j, "events_offered", "goodbye");
        m.eventsSent = optU64(j, "events_sent", "goodbye");
        m.eventsDropped = optU64(j, "events_dropped", "goodbye");
        return m;
    });
}

std::string encodeDropped(const DroppedNotice &m)
{
    std::string out;
    putLe<std::uint64_t>(out, m.dropped);
    putLe<std::uint64_t>(out, m.total);
    return out;
}

Result<DroppedNotice> decodeDropped(std::string_view payload)
{
    if (payload.size() != 16)
        return fail("bad dropped notice: " + std::to_string(payload.size()) +
                    " bytes where 16 were expected");
    DroppedNotice m;
    m.dropped = getLe<std::uint64_t>(payload.data());
    m.total = getLe<std::uint64_t>(payload.data() + 8);
    if (m.dropped > m.total)
        return fail("bad dropped notice: dropped " + std::to_string(m.dropped) +
                    " exceeds the total " + std::to_string(m.total));
    return m;
}

std::string encodeHistoryBegin(std::uint64_t count)
{
    std::string out;
    putLe<std::uint64_t>(out, count);
    return out;
}

Result<std::uint64_t> decodeHistoryBegin(std::string_view payload)
{
    if (payload.size() != 8)
        return fail("bad history_begin: " + std::to_string(payload.size()) +
                    " bytes where 8 were expected");
    return getLe<std::uint64_t>(payload.data());
}

std::string encodeClockRequest(std::uint64_t echo)
{
    std::string out;
    putLe<std::uint64_t>(out, echo);
    return out;
}

Result<std::uint64_t> decodeClockRequest(std::string_view payload)
{
    if (payload.size() != 8)
        return fail("bad clock_request: " + std::to_string(payload.size()) +
                    " bytes where 8 were expected");
    return getLe<std::uint64_t>(payload.data());
}

std::string encodeClockReply(const ClockReply &m)
{
    std::string out;
    putLe<std::uint64_t>(out, m.echo);
    putLe<std::uint64_t>(out, m.serverNs);
    return out;
}

Result<ClockReply> decodeClockReply(std::string_view payload)
{
    if (payload.size() != 16)
        return fail("bad clock_reply: " + std::to_string(payload.size()) +
                    " bytes where 16 were expected");
    ClockReply m;
    m.echo = getLe<std::uint64_t>(payload.data());
    m.serverNs = getLe<std::uint64_t>(payload.data() + 8);
    return m;
}

void appendEvents(std::string &out, std::span<const telemetry::Event> events)
{
    out.append(reinterpret_cast<const char *>(events.data()), events.size_bytes());
}

std::string encodeEvents(std::span<const telemetry::Event> events)
{
    std::string out;
    appendEvents(out, events);
    return out;
}

Result<std::vector<telemetry::Event>> decodeEvents(std::string_view payload)
{
    if (payload.size() % sizeof(telemetry::Event) != 0)
        return fail("bad event batch: " + std::to_string(payload.size()) +
                    " bytes is not a whole number of 48-byte records");
    std::vector<telemetry::Event> events(payload.size() / sizeof(telemetry::Event));
    if (events.empty()) return events; // memcpy from a null pointer is undefined, even of 0 bytes
    std::memcpy(events.data(), payload.data(), payload.size());
    for (std::size_t i = 0; i < events.size(); ++i) {
        const auto t = static_cast<std::uint8_t>(events[i].type);
        if (!isKnownEventType(t))
            return fail("bad event batch: record " + std::to_string(i) + " has unknown type " +
                        std::to_string(t));
    }
    return events;
}

bool hasCapability(const std::vector<std::string> &capabilities, std::string_view name)
{
    return std::find(capabilities.begin(), capabilities.end(), name) != capabilities.end();
}

int eventsLevelOf(const std::vector<std::string> &capabilities)
{
    if (hasCapability(capabilities, kCapabilityEvents3)) return 3;
    return hasCapability(capabilities, kCapabilityEvents2) ? 2 : 1;
}

std::uint16_t binaryLayoutOf(const std::vector<std::string> &capabilities)
{
    if (!hasCapability(capabilities, kCapabilityStateBinary)) return 0;
    if (hasCapability(capabilities, kCapabilityStateBinary5)) return 5;
    if (hasCapability(capabilities, kCapabilityStateBinary4)) return 4;
    if (hasCapability(capabilities, kCapabilityStateBinary3)) return 3;
    return hasCapability(capabilities, kCapabilityStateBinary2) ? 2 : 1;
}

std::optional<ErrorMessage> checkHello(const Hello &hello, std::string_view requiredToken)
{
    if (hello.version != kProtocolVersion)
        return ErrorMessage{"version_mismatch",
                            "protocol version " + std::to_string(hello.version) +
                                " is not supported: this engine speaks version " +
                                std::to_string(kProtocolVersion) +
                                "; use a ShardScope client of the same release"};
    if (!requiredToken.empty()) {
        // Compare in constant time so the token cannot be guessed byte by byte.
        unsigned diff = hello.token.size() != requiredToken.size() ? 1u : 0u;
        for (std::size_t i = 0; i < requiredToken.size(); ++i)
            diff |= static_cast<unsigned char>(requiredToken[i]) ^
                    static_cast<unsigned char>(i < hello.token.size() ? hello.token[i] : 0);
        if (diff != 0)
            return ErrorMessage{"bad_token",
                                hello.token.empty()
                                    ? "this engine requires a token; pass --token SECRET"
                                    : "wrong token; pass the --token the engine was started with"};
    }
    return std::nullopt;
}

Result<Welcome> acceptWelcome(const Frame &frame)
{
    if (frame.type == MessageType::Error) {
        auto err = decodeError(frame.payload);
        if (!err) return fail("the engine refused the connection (" + err.error() + ")");
        return fail("the engine refused the connection: " + err->message);
    }
    if (frame.type != MessageType::Welcome)
        return fail("the engine answered the hello with a " +
                    std::string(messageTypeName(frame.type)) + " frame instead of a welcome");
    auto welcome = decodeWelcome(frame.payload);
    if (!welcome) return welcome;
    if (welcome->version != kProtocolVersion)
        return fail("the engine speaks protocol version " + std::to_string(welcome->version) +
                    ", this client speaks " + std::to_string(kProtocolVersion) +
                    "; use a ShardScope client of the same release");
    return welcome;
}

} // namespace shardscope::wire

#pragma once
// Feeds one byte string to every decoder the wire library has, the way a client or a
// file reader would. Shared by the robustness test and the libFuzzer target; it must
// never crash, hang or allocate beyond the input's size.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "client/clientstate.h"
#include "wire/compress.h"
#include "wire/discovery.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/snapshot.h"
#include "wire/statebinary.h"

namespace shardscope::test {

struct DecodeCounts
{
    std::size_t frames = 0;
    std::size_t streamErrors = 0;
    std::size_t payloadErrors = 0;
};

// Interprets data as a byte stream fed in chunks of the given sizes, then decodes
// every frame's payload as its type says (through ClientState) and as every other type.
inline DecodeCounts decodeEverything(std::string_view data, std::uint32_t maxPayload = 1u << 20,
                                     std::size_t chunk = 4096)
{
    DecodeCounts counts;
    wire::FrameDecoder decoder(maxPayload);
    client::ClientState state(1000);
    std::size_t fed = 0;
    while (fed < data.size() && !decoder.failed()) {
        const std::size_t n = std::min(chunk, data.size() - fed);
        decoder.feed(data.data() + fed, n);
        fed += n;
        if (decoder.buffered() > fed) __builtin_trap(); // the decoder holds more than it was given
        for (;;) {
            auto frame = decoder.next();
            if (!frame) {
                ++counts.streamErrors;
                break;
            }
            if (!frame->has_value()) break;
            const wire::Frame &f = **frame;
            if (f.payload.size() > maxPayload) __builtin_trap();
            ++counts.frames;
            if (!state.apply(f)) ++counts.payloadErrors;
            (void)wire::decodeHello(f.payload);
            (void)wire::decodeWelcome(f.payload);
            (void)wire::acceptWelcome(f);
            (void)wire::decodeError(f.payload);
            (void)wire::decodeGoodbye(f.payload);
            (void)wire::decodeDropped(f.payload);
            (void)wire::decodeHistoryBegin(f.payload);
            (void)wire::decodeClockRequest(f.payload);
            (void)wire::decodeClockReply(f.payload);
            (void)wire::decodeStateFrame(f);
            if (auto binary = wire::decodeBinaryState(f.payload);
                binary && !wire::decodeBinaryState(wire::encodeBinaryState(*binary)))
                __builtin_trap(); // an accepted binary State must encode to one that decodes
            auto events = wire::decodeEvents(f.payload);
            if (events && events->size() * sizeof(telemetry::Event) != f.payload.size())
                __builtin_trap();
        }
    }
    return counts;
}

// The JSON decoders and the binary State's, on the raw bytes; the snapshot also as a file's bytes,
// which may be gzip'd (inflated to at most 16 MiB here, so a small input cannot exhaust the
// fuzzer).
inline bool decodeJsonDocuments(std::string_view data)
{
    const bool snapshot = wire::decodeSnapshot(data).ok();
    if (wire::decodeSnapshotFile(std::string(data), 1u << 24).ok() != snapshot &&
        !wire::isGzip(data))
        __builtin_trap(); // a plain file must decode as its text does
    (void)wire::decodeDiscovery(data);
    (void)wire::decodeHello(data);
    (void)wire::decodeBinaryState(data);
    return snapshot;
}

} // namespace shardscope::test

#include <QtTest>

#include <random>
#include <sys/resource.h>

#include "fuzzinput.h"
#include "samplesnapshot.h"
#include "wire/statebinary.h"

using namespace shardscope;
using namespace shardscope::wire;

namespace {

// A valid server stream: welcome, state, history, live batches, a drop notice, goodbye.
std::string validStream()
{
    const std::vector<telemetry::Event> events = test::everyEventType();
    Snapshot state = test::sampleSnapshot();
    state.events.clear();
    std::string s;
    appendFrame(s, MessageType::Welcome, encodeWelcome(Welcome{}));
    appendFrame(s, MessageType::State, encodeSnapshot(state));
    appendFrame(s, MessageType::StateBinary, encodeBinaryState(state));
    appendFrame(s, MessageType::HistoryBegin, encodeHistoryBegin(events.size()));
    appendFrame(s, MessageType::EventBatch, encodeEvents(events));
    appendFrame(s, MessageType::HistoryEnd, "");
    appendFrame(s, MessageType::EventBatch, encodeEvents(std::span(events).subspan(3, 5)));
    appendFrame(s, MessageType::Dropped, encodeDropped({4, 4}));
    appendFrame(s, MessageType::Goodbye, encodeGoodbye({"done", 9, 5, 4}));
    appendFrame(s, MessageType::Error, encodeError({"x", "y"}));
    appendFrame(s, MessageType::Hello, encodeHello(Hello{}));
    return s;
}

} // namespace

class TestDecoderRobustness : public QObject
{
    Q_OBJECT
  private slots:
    void initTestCase();
    void validStreamDecodesCompletely();
    void hundredThousandMutatedFramesFailCleanly();
    void mutatedSnapshotJsonFailsCleanly();
    void mutatedBinaryStatesFailCleanly();
};

void TestDecoderRobustness::initTestCase()
{
    // A decoder that trusted a length field would try to allocate gigabytes: make that fatal.
    rlimit limit{4ull << 30, 4ull << 30};
    QCOMPARE(::setrlimit(RLIMIT_AS, &limit), 0);
}

void TestDecoderRobustness::validStreamDecodesCompletely()
{
    const std::string s = validStream();
    for (std::size_t chunk : {std::size_t(1), std::size_t(7), std::size_t(48), s.size()}) {
        const auto c = test::decodeEverything(s, 1u << 20, chunk);
        QCOMPARE(c.frames, std::size_t(11));
        QCOMPARE(c.streamErrors, std::size_t(0));
        QCOMPARE(
            c.payloadErrors,
            std::size_t(3)); // ClientState rejects Welcome, Error and Hello after the handshake
    }
}

void TestDecoderRobustness::hundredThousandMutatedFramesFailCleanly()
{
    std::mt19937_64 rng(20261130);
    const std::string valid = validStream();
    const std::vector<telemetry::Event> events = test::everyEventType();
    std::size_t frames = 0, streamErrors = 0, payloadErrors = 0, inputs = 0;
    auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    while (frames + streamErrors < 100000) {
        std::string s;
        switch (pick(8)) {
        case 0: // random bytes, sometimes behind a valid header
            s.resize(pick(200));
            for (char &c : s)
                c = static_cast<char>(rng());
            if (pick(2)) s = encodeFrame(static_cast<MessageType>(1 + pick(kLastMessageType)), s);
            break;
        case 1: { // flipped bytes in a valid stream
            s = valid;
            for (std::size_t k = 0, n = 1 + pick(8); k < n; ++k)
                s[pick(s.size())] ^= static_cast<char>(1 + pick(255));
            break;
        }
        case 2: // truncated
            s = valid.substr(0, pick(valid.size()));
            break;
        case 3: { // oversized or lying length fields
            s = encodeFrame(MessageType::EventBatch, encodeEvents(events));
            const std::uint32_t len = pick(2) ? static_cast<std::uint32_t>(rng())
                                              : static_cast<std::uint32_t>(48 * pick(40) + pick(3));
            std::memcpy(s.data() + 8, &len, 4);
            break;
        }
        case 4: { // bad types: frame type and event record types
            s = encodeFrame(MessageType::EventBatch, encodeEvents(events));
            if (pick(2)) {
                const auto t = static_cast<std::uint16_t>(rng());
                std::memcpy(s.data() + 4, &t, 2);
            } else {
                s[kFrameHeaderSize + 48 * pick(events.size()) + 14] = static_cast<char>(rng());
            }
            break;
        }
        case 7: { // a binary State damaged, truncated or with lying counts
            Snapshot snap = test::sampleSnapshot();
            std::string bin = encodeBinaryState(snap);
            switch (pick(3)) {
            case 0:
                for (std::size_t k = 0, n = 1 + pick(6); k < n; ++k)
                    bin[pick(bin.size())] = static_cast<char>(rng());
                break;
            case 1:
                bin.resize(pick(bin.size()));
                break;
            default: { // a count (header bytes 8-51) set to anything
                const auto v = static_cast<std::uint32_t>(pick(2) ? rng() : pick(64));
                std::memcpy(bin.data() + 8 + 4 * pick(11), &v, 4);
                break;
            }
            }
            s = encodeFrame(MessageType::StateBinary, bin);
            break;
        }
        case 5: { // bad UTF-8 and bad JSON inside a state frame
            Snapshot snap = test::sampleSnapshot();
            std::string json = encodeSnapshot(snap);
            const std::size_t at = json.find("embed.weight");
            json[at + pick(12)] = static_cast<char>(0x80 + pick(0x80));
            if (pick(2)) json[pick(json.size())] = "{}[]\",:\\"[pick(8)];
            s = encodeFrame(MessageType::State, json);
            break;
        }
        default: { // a valid stream spliced with random frames at random cut points
            const std::string other =
                encodeFrame(static_cast<MessageType>(1 + pick(kLastMessageType)),
                            std::string(pick(64), static_cast<char>(rng())));
            s = valid.substr(0, pick(valid.size())) + other + valid.substr(pick(valid.size()));
            break;
        }
        }
        const auto c = test::decodeEverything(s, 1u << 20, 1 + pick(512));
        frames += c.frames;
        streamErrors += c.streamErrors;
        payloadErrors += c.payloadErrors;
        ++inputs;
    }
    qInfo("%zu inputs: %zu frames decoded, %zu stream errors, %zu payload errors", inputs, frames,
          streamErrors, payloadErrors);
    QVERIFY(frames + streamErrors >= 100000);
    QVERIFY(streamErrors > 1000);
    QVERIFY(payloadErrors > 1000);
}

void TestDecoderRobustness::mutatedSnapshotJsonFailsCleanly()
{
    std::mt19937_64 rng(7);
    const std::string json = encodeSnapshot(test::sampleSnapshot());
    QVERIFY(test::decodeJsonDocuments(json));
    int rejected = 0;
    for (int i = 0; i < 5000; ++i) {
        std::string s = json;
        const int kind = static_cast<int>(rng() % 3);
        if (kind == 0)
            s.resize(rng() % s.size());
        else if (kind == 1)
            for (int k = 0; k < 4; ++k)
                s[rng() % s.size()] = static_cast<char>(rng());
        else
            s.insert(rng() % s.size(), std::string(1 + rng() % 40, "[{\"1-e:,]}"[rng() % 10]));
        if (!test::decodeJsonDocuments(s)) ++rejected;
    }
    QVERIFY(rejected > 2500);
}

// Every prefix, every single-byte change and random changes of a binary State: each is
// decoded (through a frame and ClientState, as a client does) or refused, never a crash.
void TestDecoderRobustness::mutatedBinaryStatesFailCleanly()
{
    std::mt19937_64 rng(12);
    const std::string bin = encodeBinaryState(test::sampleSnapshot());
    QVERIFY(decodeBinaryState(bin).ok());
    std::size_t rejected = 0, inputs = 0;
    auto feed = [&](const std::string &payload) {
        client::ClientState state;
        const bool ok = state.apply(Frame{MessageType::StateBinary, payload}).ok();
        if (ok != decodeBinaryState(payload).ok()) QFAIL("ClientState and the decoder disagree");
        if (!ok) {
            ++rejected;
            if (state.hasState()) QFAIL("a refused State changed the client's state");
        }
        ++inputs;
    };
    for (std::size_t n = 0; n < bin.size(); ++n)
        feed(bin.substr(0, n));
    QCOMPARE(rejected, bin.size()); // every truncation
    for (std::size_t at = 0; at < bin.size(); ++at)
        for (int x : {0x01, 0x80, 0xFF}) {
            std::string s = bin;
            s[at] = static_cast<char>(s[at] ^ x);
            feed(s);
        }
    for (int i = 0; i < 20000; ++i) {
        std::string s = bin;
        for (int k = 0, n = 1 + static_cast<int>(rng() % 8); k < n; ++k)
            s[rng() % s.size()] = static_cast<char>(rng());
        feed(s);
    }
    qInfo("%zu binary States: %zu refused", inputs, rejected);
    QVERIFY(rejected > inputs / 4);
}

QTEST_APPLESS_MAIN(TestDecoderRobustness)
#include "tst_decoderrobustness.moc"

#include <QtTest>

#include <cstring>

#include "wire/frame.h"

using namespace shardscope::wire;

class TestFrame : public QObject
{
    Q_OBJECT
  private slots:
    void headerIsLittleEndianAndDocumented();
    void decodesFramesFedByteByByte();
    void decodesManyFramesFromOneChunk();
    void largePayloadFedInPiecesArrivesWholeAndPadded();
    void emptyPayload();
    void badMagicIsAReadableError();
    void unknownTypeIsAnError();
    void nonZeroReservedIsAnError();
    void oversizedLengthIsRefusedBeforeItArrives();
    void errorsAreSticky();
};

void TestFrame::headerIsLittleEndianAndDocumented()
{
    const std::string f = encodeFrame(MessageType::State, "abc");
    QCOMPARE(f.size(), std::size_t(15));
    const unsigned char expected[] = {'S', 'S', 'C', 'P', 4, 0, 0, 0, 3, 0, 0, 0, 'a', 'b', 'c'};
    QVERIFY(std::memcmp(f.data(), expected, sizeof expected) == 0);
}

void TestFrame::decodesFramesFedByteByByte()
{
    const std::string payload(1000, 'x');
    const std::string bytes =
        encodeFrame(MessageType::EventBatch, payload) + encodeFrame(MessageType::HistoryEnd, "");
    FrameDecoder d;
    std::vector<Frame> frames;
    for (char c : bytes) {
        d.feed(&c, 1);
        for (;;) {
            auto f = d.next();
            QVERIFY(f.ok());
            if (!f->has_value()) break;
            frames.push_back(std::move(**f));
        }
    }
    QCOMPARE(frames.size(), std::size_t(2));
    QCOMPARE(frames[0].type, MessageType::EventBatch);
    QCOMPARE(frames[0].payload, payload);
    QCOMPARE(frames[1].type, MessageType::HistoryEnd);
    QVERIFY(frames[1].payload.empty());
    QCOMPARE(d.buffered(), std::size_t(0));
}

void TestFrame::decodesManyFramesFromOneChunk()
{
    std::string bytes;
    for (int i = 0; i < 100; ++i)
        appendFrame(bytes, MessageType::Dropped,
                    std::string(static_cast<std::size_t>(i), char('a' + i % 26)));
    FrameDecoder d;
    d.feed(bytes.substr(0, bytes.size() - 5));
    int n = 0;
    for (;;) {
        auto f = d.next();
        QVERIFY(f.ok());
        if (!f->has_value()) break;
        QCOMPARE((*f)->payload.size(), std::size_t(n));
        ++n;
    }
    QCOMPARE(n, 99);
    d.feed(bytes.substr(bytes.size() - 5));
    auto last = d.next();
    QVERIFY(last.ok() && last->has_value());
    QCOMPARE((*last)->payload, std::string(99, char('a' + 99 % 26)));
}

// A State of tens of megabytes is collected straight into its payload: the frames around
// it, split anywhere, still come out in order, and the payload keeps the spare bytes a
// JSON parser reads past the end without holding much more than it carries.
void TestFrame::largePayloadFedInPiecesArrivesWholeAndPadded()
{
    std::string payload(3u << 20, '\0');
    for (std::size_t i = 0; i < payload.size(); ++i)
        payload[i] = char('a' + (i * 7919) % 26);
    const std::string bytes = encodeFrame(MessageType::Welcome, "{}") +
                              encodeFrame(MessageType::State, payload) +
                              encodeFrame(MessageType::HistoryBegin, "12345678");
    for (const std::size_t piece : {std::size_t(1000), std::size_t(65536), std::size_t(1) << 20}) {
        FrameDecoder d;
        std::vector<Frame> frames;
        std::size_t fed = 0;
        for (std::size_t at = 0; at < bytes.size(); at += piece) {
            const std::string_view chunk = std::string_view(bytes).substr(at, piece);
            d.feed(chunk);
            fed += chunk.size();
            for (;;) {
                auto f = d.next();
                QVERIFY(f.ok());
                if (!f->has_value()) break;
                frames.push_back(std::move(**f));
            }
            std::size_t handedOut = 0;
            for (const Frame &f : frames)
                handedOut += kFrameHeaderSize + f.payload.size();
            QCOMPARE(d.buffered(), fed - handedOut);
        }
        QCOMPARE(frames.size(), std::size_t(3));
        QCOMPARE(frames[0].type, MessageType::Welcome);
        QCOMPARE(frames[1].type, MessageType::State);
        QVERIFY(frames[1].payload == payload);
        QVERIFY(frames[1].payload.capacity() >= payload.size() + kPayloadPadding);
        QVERIFY(frames[1].payload.capacity() <= 4 * payload.size() + kPayloadPadding);
        QCOMPARE(frames[2].type, MessageType::HistoryBegin);
        QCOMPARE(frames[2].payload, std::string("12345678"));
        QCOMPARE(d.buffered(), std::size_t(0));
    }
}

void TestFrame::emptyPayload()
{
    FrameDecoder d;
    d.feed(encodeFrame(MessageType::HistoryEnd, ""));
    auto f = d.next();
    QVERIFY(f.ok() && f->has_value());
    QCOMPARE((*f)->type, MessageType::HistoryEnd);
}

void TestFrame::badMagicIsAReadableError()
{
    FrameDecoder d;
    d.feed(std::string_view("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    auto f = d.next();
    QVERIFY(!f.ok());
    QVERIFY2(f.error().find("not a ShardScope stream") != std::string::npos, f.error().c_str());
    QVERIFY(d.failed());
}

void TestFrame::unknownTypeIsAnError()
{
    std::string bytes = encodeFrame(MessageType::State, "{}");
    bytes[4] = 77;
    FrameDecoder d;
    d.feed(bytes);
    auto f = d.next();
    QVERIFY(!f.ok());
    QVERIFY2(f.error().find("unknown message type 77") != std::string::npos, f.error().c_str());
}

void TestFrame::nonZeroReservedIsAnError()
{
    std::string bytes = encodeFrame(MessageType::State, "{}");
    bytes[6] = 1;
    FrameDecoder d;
    d.feed(bytes);
    QVERIFY(!d.next().ok());
}

void TestFrame::oversizedLengthIsRefusedBeforeItArrives()
{
    FrameDecoder d(1024);
    std::string header = encodeFrame(MessageType::State, "");
    const std::uint32_t huge = 0xFFFFFFF0u;
    std::memcpy(header.data() + 8, &huge, 4);
    d.feed(header);
    auto f = d.next();
    QVERIFY(!f.ok());
    QVERIFY2(f.error().find("exceeds the limit of 1024 bytes") != std::string::npos,
             f.error().c_str());
    QCOMPARE(d.buffered(), std::size_t(0));
}

void TestFrame::errorsAreSticky()
{
    FrameDecoder d;
    d.feed(std::string_view("garbage-garbage"));
    QVERIFY(!d.next().ok());
    d.feed(encodeFrame(MessageType::HistoryEnd, ""));
    QVERIFY(!d.next().ok());
    QCOMPARE(d.buffered(), std::size_t(0));
}

QTEST_APPLESS_MAIN(TestFrame)
#include "tst_frame.moc"

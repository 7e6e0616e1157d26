#include <QtTest>

#include <cstring>

#include "samplesnapshot.h"
#include "wire/frame.h"
#include "wire/messages.h"

using namespace shardscope;
using namespace shardscope::wire;

class TestMessages : public QObject
{
    Q_OBJECT
  private slots:
    void everyEventTypeRoundTripsThroughAFrame();
    void eventRecordLayoutIsTheDocumentedOne();
    void eventBatchRejectsPartialRecordsAndUnknownTypes();
    void eventTypeNamesRoundTrip();
    void helloWelcomeErrorGoodbyeRoundTrip();
    void binaryNoticesRoundTripAndCheckSizes();
    void handshakeAcceptsMatchingHello();
    void handshakeRefusesWrongVersionWithAReason();
    void handshakeRefusesWrongOrMissingToken();
    void clientReadsRefusalAndRejectsNewerServer();
};

void TestMessages::everyEventTypeRoundTripsThroughAFrame()
{
    const std::vector<telemetry::Event> events = test::everyEventType();
    QCOMPARE(events.size(), std::size_t(23));
    FrameDecoder d;
    d.feed(encodeFrame(MessageType::EventBatch, encodeEvents(events)));
    auto frame = d.next();
    QVERIFY(frame.ok() && frame->has_value());
    auto decoded = decodeEvents((*frame)->payload);
    QVERIFY2(decoded.ok(), decoded.error().c_str());
    QCOMPARE(decoded->size(), events.size());
    for (std::size_t i = 0; i < events.size(); ++i)
        QVERIFY(std::memcmp(&(*decoded)[i], &events[i], sizeof(telemetry::Event)) == 0);
}

void TestMessages::eventRecordLayoutIsTheDocumentedOne()
{
    telemetry::Event e{}; // raw: the byte layout itself, a distinct pattern in every field
    e.tsNs = 0x0102030405060708ull;
    e.step = 0x11121314u;
    e.rank = 0x2122;
    e.type = EventType::FetchBegin;
    e.flags = 0x31;
    e.a = 0x41424344u;
    e.b = 0x51525354u;
    e.u0 = 0x6162636465666768ull;
    e.u1 = 0x7172737475767778ull;
    e.u2 = 0x8182838485868788ull;
    const std::string bytes = encodeEvents(std::span<const telemetry::Event>(&e, 1));
    const unsigned char expected[48] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x14, 0x13,
                                        0x12, 0x11, 0x22, 0x21, 3,    0x31, 0x44, 0x43, 0x42, 0x41,
                                        0x54, 0x53, 0x52, 0x51, 0x68, 0x67, 0x66, 0x65, 0x64, 0x63,
                                        0x62, 0x61, 0x78, 0x77, 0x76, 0x75, 0x74, 0x73, 0x72, 0x71,
                                        0x88, 0x87, 0x86, 0x85, 0x84, 0x83, 0x82, 0x81};
    QCOMPARE(bytes.size(), std::size_t(48));
    QVERIFY(std::memcmp(bytes.data(), expected, 48) == 0);
}

void TestMessages::eventBatchRejectsPartialRecordsAndUnknownTypes()
{
    std::string bytes = encodeEvents(test::everyEventType());
    auto partial = decodeEvents(std::string_view(bytes).substr(0, 47));
    QVERIFY(!partial.ok());
    QVERIFY2(partial.error().find("48-byte") != std::string::npos, partial.error().c_str());
    bytes[48 + 14] = 0;
    auto zero = decodeEvents(bytes);
    QVERIFY(!zero.ok());
    QVERIFY2(zero.error().find("record 1 has unknown type 0") != std::string::npos,
             zero.error().c_str());
    bytes[48 + 14] = static_cast<char>(200);
    QVERIFY(!decodeEvents(bytes).ok());
    // The kinds end at collective_end (23): 24 is refused, 19..23 decode.
    QCOMPARE(test::everyEventType().back().type, EventType::CollectiveEnd);
    bytes[48 + 14] = static_cast<char>(24);
    auto past = decodeEvents(bytes);
    QVERIFY(!past.ok());
    QVERIFY2(past.error().find("record 1 has unknown type 24") != std::string::npos,
             past.error().c_str());
    for (const EventType t :
         {EventType::ReduceScatterBegin, EventType::ReduceScatterEnd, EventType::AllocatorSample,
          EventType::CollectiveBegin, EventType::CollectiveEnd}) {
        bytes[48 + 14] = static_cast<char>(t);
        auto ok = decodeEvents(bytes);
        QVERIFY2(ok.ok(), ok.ok() ? "" : ok.error().c_str());
        QCOMPARE((*ok)[1].type, t);
    }
    QVERIFY(decodeEvents("").ok());
}

void TestMessages::eventTypeNamesRoundTrip()
{
    for (const telemetry::Event &e : test::everyEventType()) {
        const std::string_view name = eventTypeName(e.type);
        QVERIFY(name != "unknown");
        QCOMPARE(eventTypeFromName(name), std::optional<EventType>(e.type));
    }
    QCOMPARE(eventTypeName(EventType::UnregisteredAccess), std::string_view("unregistered_access"));
    QCOMPARE(eventTypeName(EventType::ReduceScatterBegin),
             std::string_view("reduce_scatter_begin"));
    QCOMPARE(eventTypeName(EventType::ReduceScatterEnd), std::string_view("reduce_scatter_end"));
    QCOMPARE(eventTypeName(EventType::AllocatorSample), std::string_view("allocator_sample"));
    QCOMPARE(eventTypeName(EventType::CollectiveBegin), std::string_view("collective_begin"));
    QCOMPARE(eventTypeName(EventType::CollectiveEnd), std::string_view("collective_end"));
    QCOMPARE(collectiveKindName(CollectiveKind::ReduceScatter), std::string_view("reduce_scatter"));
    QCOMPARE(collectiveKindFromName("broadcast"), std::optional(CollectiveKind::Broadcast));
    QVERIFY(!collectiveKindFromName("all_reduce").has_value());
    QVERIFY(!eventTypeFromName("bogus").has_value());
    QCOMPARE(eventTypeName(static_cast<EventType>(99)), std::string_view("unknown"));
}

void TestMessages::helloWelcomeErrorGoodbyeRoundTrip()
{
    Hello h;
    h.token = "s3cr\xC3\xA9t";
    h.client = "tst";
    auto h2 = decodeHello(encodeHello(h));
    QVERIFY2(h2.ok(), h2.error().c_str());
    QCOMPARE(h2->version, kProtocolVersion);
    QCOMPARE(h2->token, h.token);
    QCOMPARE(h2->client, h.client);
    QCOMPARE(h2->capabilities, h.capabilities);

    Welcome w;
    w.server = "shardscope-train";
    w.pid = 1234;
    w.model = "tied";
    w.worldSize = 4;
    w.backend = "cpu";
    w.historyCapacity = 65536;
    auto w2 = decodeWelcome(encodeWelcome(w));
    QVERIFY2(w2.ok(), w2.error().c_str());
    QCOMPARE(w2->pid, w.pid);
    QCOMPARE(w2->worldSize, 4);
    QCOMPARE(w2->model, w.model);
    QCOMPARE(w2->historyCapacity, w.historyCapacity);

    auto e2 = decodeError(encodeError({"bad_token", "wrong token"}));
    QVERIFY(e2.ok());
    QCOMPARE(e2->code, std::string("bad_token"));
    QCOMPARE(e2->message, std::string("wrong token"));

    Goodbye g{"training finished", 100, 60, 40};
    auto g2 = decodeGoodbye(encodeGoodbye(g));
    QVERIFY(g2.ok());
    QCOMPARE(g2->eventsOffered, 100u);
    QCOMPARE(g2->eventsSent, 60u);
    QCOMPARE(g2->eventsDropped, 40u);

    QVERIFY(!decodeHello("{\"protocol\":\"http\",\"version\":1}").ok());
    QVERIFY(!decodeHello("{\"protocol\":\"shardscope\",\"version\":\"1\"}").ok());
    QVERIFY(!decodeHello("[1,2]").ok());
    // capabilities is optional; a byte order mark is refused; a version above 65535 is no Hello
    const auto bare = decodeHello(R"({"protocol":"shardscope","version":1})");
    QVERIFY(bare.ok());
    QVERIFY(bare->capabilities.empty());
    const auto bom = decodeHello("\xEF\xBB\xBF"
                                 R"({"protocol":"shardscope","version":1})");
    QVERIFY(!bom.ok());
    QVERIFY2(bom.error().find("byte order mark") != std::string::npos, bom.error().c_str());
    QVERIFY(!decodeHello(R"({"protocol":"shardscope","version":65536})").ok());
    QVERIFY(decodeHello(R"({"protocol":"shardscope","version":65535})").ok());
    QVERIFY(!decodeWelcome("{\"version\":1,\"world_size\":-3}").ok());
}

void TestMessages::binaryNoticesRoundTripAndCheckSizes()
{
    auto d = decodeDropped(encodeDropped({5, 12}));
    QVERIFY(d.ok());
    QCOMPARE(d->dropped, 5u);
    QCOMPARE(d->total, 12u);
    QVERIFY(!decodeDropped(encodeDropped({13, 12})).ok());
    QVERIFY(!decodeDropped("1234567").ok());
    auto h = decodeHistoryBegin(encodeHistoryBegin(65536));
    QVERIFY(h.ok());
    QCOMPARE(*h, 65536u);
    QVERIFY(!decodeHistoryBegin("123").ok());
}

void TestMessages::handshakeAcceptsMatchingHello()
{
    Hello h;
    QVERIFY(!checkHello(h, "").has_value());
    h.token = "abc";
    QVERIFY(!checkHello(h, "abc").has_value());
    QVERIFY(!checkHello(h, "").has_value());
}

void TestMessages::handshakeRefusesWrongVersionWithAReason()
{
    Hello h;
    h.version = 2;
    auto refusal = checkHello(h, "");
    QVERIFY(refusal.has_value());
    QCOMPARE(refusal->code, std::string("version_mismatch"));
    QVERIFY2(refusal->message.find("protocol version 2 is not supported") != std::string::npos,
             refusal->message.c_str());
    QVERIFY(refusal->message.find("speaks version 1") != std::string::npos);
}

void TestMessages::handshakeRefusesWrongOrMissingToken()
{
    Hello h;
    auto missing = checkHello(h, "secret");
    QVERIFY(missing.has_value());
    QCOMPARE(missing->code, std::string("bad_token"));
    QVERIFY2(missing->message.find("requires a token") != std::string::npos,
             missing->message.c_str());
    h.token = "secreT";
    auto wrong = checkHello(h, "secret");
    QVERIFY(wrong.has_value());
    QVERIFY2(wrong->message.find("wrong token") != std::string::npos, wrong->message.c_str());
    h.token = "secret-and-more";
    QVERIFY(checkHello(h, "secret").has_value());
}

void TestMessages::clientReadsRefusalAndRejectsNewerServer()
{
    Frame refusal{MessageType::Error, encodeError({"bad_token", "wrong token; pass --token"})};
    auto r = acceptWelcome(refusal);
    QVERIFY(!r.ok());
    QCOMPARE(r.error(),
             std::string("the engine refused the connection: wrong token; pass --token"));

    Welcome w;
    w.version = 9;
    auto newer = acceptWelcome(Frame{MessageType::Welcome, encodeWelcome(w)});
    QVERIFY(!newer.ok());
    QVERIFY2(newer.error().find("protocol version 9") != std::string::npos, newer.error().c_str());

    auto odd = acceptWelcome(Frame{MessageType::State, "{}"});
    QVERIFY(!odd.ok());
    QVERIFY2(odd.error().find("state frame instead of a welcome") != std::string::npos,
             odd.error().c_str());
}

QTEST_APPLESS_MAIN(TestMessages)
#include "tst_messages.moc"

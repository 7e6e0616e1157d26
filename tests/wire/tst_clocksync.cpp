// Clock mapping between processes (wire/clocksync.h) with synthetic round trips, and the
// clock probe's two messages (docs/protocol.md, "Clock probes").

#include <QtTest>

#include <vector>

#include "wire/clocksync.h"
#include "wire/frame.h"
#include "wire/messages.h"

using namespace shardscope::wire;

class TestClockSync : public QObject
{
    Q_OBJECT

  private slots:
    void theTightestRoundTripEstimatesTheOffset();
    void asymmetricDelaysStayWithinTheUncertainty();
    void backwardSamplesAreIgnored();
    void oneHostSharesItsClockUnlessTheEstimatesDisagree();
    void otherHostsAreShiftedByTheDifference();
    void clockMessagesRoundTripAndRejectBadLengths();
};

void TestClockSync::theTightestRoundTripEstimatesTheOffset()
{
    // The server's clock is 5 s ahead. Samples: (send, server, recv) in our clock / its clock.
    const std::int64_t offset = 5'000'000'000;
    const auto at = [&](std::uint64_t ourNs) { return ourNs + static_cast<std::uint64_t>(offset); };
    const std::vector<ClockSample> samples = {
        {1000, at(1000 + 400), 2000},  // RTT 1000, answered 100 ns after the midpoint
        {5000, at(5000 + 60), 5100},   // RTT 100: the best
        {9000, at(9000 + 2500), 14000} // RTT 5000
    };
    const ClockEstimate e = estimateClockOffset(samples);
    QVERIFY(e.valid);
    QCOMPARE(e.samples, 3);
    QCOMPARE(e.uncertaintyNs, std::uint64_t(50));
    // The server answered 10 ns after the midpoint of the best sample.
    QCOMPARE(e.offsetNs, offset + 10);
    QVERIFY(std::llabs(e.offsetNs - offset) <= static_cast<long long>(e.uncertaintyNs));
}

void TestClockSync::asymmetricDelaysStayWithinTheUncertainty()
{
    // The server is 3 ms behind; the way there takes 900 ns, the way back 100 ns.
    const std::int64_t offset = -3'000'000;
    const std::uint64_t send = 10'000'000;
    const std::uint64_t server = send + 900 + static_cast<std::uint64_t>(offset);
    const ClockSample s{send, server, send + 1000};
    const ClockEstimate e = estimateClockOffset(std::vector<ClockSample>{s});
    QVERIFY(e.valid);
    QCOMPARE(e.uncertaintyNs, std::uint64_t(500));
    QCOMPARE(e.offsetNs, offset + 400); // off by the asymmetry, inside RTT / 2
    QVERIFY(std::llabs(e.offsetNs - offset) <= static_cast<long long>(e.uncertaintyNs));
}

void TestClockSync::backwardSamplesAreIgnored()
{
    QVERIFY(!estimateClockOffset({}).valid);
    const std::vector<ClockSample> bad = {{2000, 1500, 1000}};
    const ClockEstimate e = estimateClockOffset(bad);
    QVERIFY(!e.valid);
    QCOMPARE(e.samples, 0);
}

void TestClockSync::oneHostSharesItsClockUnlessTheEstimatesDisagree()
{
    ClockEstimate ref{true, 120, 40, 8};
    ClockEstimate same{true, 150, 30, 8}; // 30 ns apart, uncertainties 70 ns: one clock
    ClockShift s = clockShift(same, ref, true);
    QVERIFY(s.known && s.sharedClock);
    QCOMPARE(s.shiftNs, std::int64_t(0));
    QCOMPARE(describeClockShift(s), std::string("shared clock (same host)"));
    // Measurably different on one host (a process whose clock is offset): the measurement wins.
    ClockEstimate ahead{true, 2'000'120, 30, 8};
    s = clockShift(ahead, ref, true);
    QVERIFY(!s.sharedClock);
    QCOMPARE(s.shiftNs, std::int64_t(2'000'000));
    QCOMPARE(s.uncertaintyNs, std::uint64_t(70));
    // An older engine answers no probe: nothing to shift by, and it says so.
    s = clockShift(ClockEstimate{}, ref, true);
    QVERIFY(!s.known);
    QCOMPARE(s.shiftNs, std::int64_t(0));
    QVERIFY(describeClockShift(s).find("not probed") != std::string::npos);
}

void TestClockSync::otherHostsAreShiftedByTheDifference()
{
    ClockEstimate ref{true, -1'000'000'000, 20'000, 8};
    ClockEstimate other{true, 2'500'000'000, 150'000, 8};
    const ClockShift s = clockShift(other, ref, false);
    QVERIFY(s.known && !s.sharedClock);
    QCOMPARE(s.shiftNs, std::int64_t(3'500'000'000));
    QCOMPARE(s.uncertaintyNs, std::uint64_t(170'000));
    QCOMPARE(describeClockShift(s), std::string("+3.500 s ± 170 µs"));
    // Even a tiny difference is applied across hosts: they share nothing.
    const ClockShift t =
        clockShift(ClockEstimate{true, 10, 20, 1}, ClockEstimate{true, 0, 20, 1}, false);
    QCOMPARE(t.shiftNs, std::int64_t(10));
}

void TestClockSync::clockMessagesRoundTripAndRejectBadLengths()
{
    auto echo = decodeClockRequest(encodeClockRequest(0x0102030405060708ull));
    QVERIFY(echo);
    QCOMPARE(*echo, 0x0102030405060708ull);
    // Little-endian, as every integer of the protocol.
    QCOMPARE(encodeClockRequest(1), std::string("\x01\0\0\0\0\0\0\0", 8));
    auto reply = decodeClockReply(encodeClockReply({7, 0xFFFFFFFFFFFFFFF0ull}));
    QVERIFY(reply);
    QCOMPARE(reply->echo, std::uint64_t(7));
    QCOMPARE(reply->serverNs, 0xFFFFFFFFFFFFFFF0ull);
    QVERIFY(!decodeClockRequest(std::string(7, '\0')));
    QVERIFY(!decodeClockReply(std::string(8, '\0')));
    QVERIFY(!decodeClockReply(std::string(17, '\0')));
    // Types 10 and 11 are frames a decoder accepts, with their names (12 is StateBinary; 13 is
    // not a type).
    QVERIFY(isKnownMessageType(10) && isKnownMessageType(11) && isKnownMessageType(12) &&
            !isKnownMessageType(13));
    QCOMPARE(messageTypeName(MessageType::ClockRequest), std::string_view("clock_request"));
    QCOMPARE(messageTypeName(MessageType::ClockReply), std::string_view("clock_reply"));
}

QTEST_MAIN(TestClockSync)
#include "tst_clocksync.moc"

#include <QtTest>

#include <cstring>
#include <thread>

#include "telemetry/eventhistory.h"
#include "telemetry/eventring.h"
#include "telemetry/telemetryhub.h"
#include "testevents.h"

using namespace shardscope;

namespace {

// The n-th event of a sequence: a FetchBegin whose bytes are n, at 1000 + n ns.
telemetry::Event seq(int rank, std::uint64_t n)
{
    return test::eventAt(1000 + n, rank,
                         telemetry::makeFetchBegin({.param = 0, .cause = 0, .bytes = n}), 0);
}

// Where in its sequence seq() made ev.
std::uint64_t seqOf(const telemetry::Event &ev)
{
    return telemetry::readFetch(ev).bytes;
}

} // namespace

class TestTelemetryHub : public QObject
{
    Q_OBJECT
  private slots:
    void ringRoundsUpToAPowerOfTwo();
    void ringKeepsOrderAndDropsWhenFull();
    void ringCopiesEveryFieldExactly();
    void hubHasRingsOnlyForLocalRanks();
    void hubReportsRingOverflowAsDroppedEventsRecord();
    void hubStampsZeroTimestampsAndCountsUnknownRanks();
    void concurrentRanksLoseNothingUncounted();
    void historyKeepsTheLastNInOrder();
    void historyWrapsAcrossItsBlocks();
};

void TestTelemetryHub::ringRoundsUpToAPowerOfTwo()
{
    QCOMPARE(telemetry::EventRing(1000).capacity(), std::size_t(1024));
    QCOMPARE(telemetry::EventRing(1024).capacity(), std::size_t(1024));
    QCOMPARE(telemetry::EventRing(0).capacity(), std::size_t(2));
}

void TestTelemetryHub::ringKeepsOrderAndDropsWhenFull()
{
    telemetry::EventRing ring(8);
    for (std::uint64_t i = 0; i < 8; ++i)
        QVERIFY(ring.push(seq(0, i)));
    QVERIFY(!ring.push(seq(0, 8)));
    QVERIFY(!ring.push(seq(0, 9)));
    QCOMPARE(ring.dropped(), std::uint64_t(2));
    telemetry::Event out[16];
    QCOMPARE(ring.pop(out, 3), std::size_t(3));
    QCOMPARE(seqOf(out[0]), std::uint64_t(0));
    QCOMPARE(seqOf(out[2]), std::uint64_t(2));
    QVERIFY(ring.push(seq(0, 10)));
    QCOMPARE(ring.pop(out, 16), std::size_t(6));
    QCOMPARE(seqOf(out[0]), std::uint64_t(3));
    QCOMPARE(seqOf(out[4]), std::uint64_t(7));
    QCOMPARE(seqOf(out[5]), std::uint64_t(10)); // unread events were never overwritten
    QCOMPARE(ring.pushed(), std::uint64_t(9));
}

// The ring writes a record as six 8-byte words: every field lands where the wire expects it.
void TestTelemetryHub::ringCopiesEveryFieldExactly()
{
    telemetry::Event e{}; // raw: a distinct byte pattern in every field, meaning or not
    e.tsNs = 0x0102030405060708ull;
    e.step = 0x11121314u;
    e.rank = 0x2122;
    e.type = EventType::GatheredWriteError;
    e.flags = 0xF1;
    e.a = 0x31323334u;
    e.b = 0x41424344u;
    e.u0 = 0x5152535455565758ull;
    e.u1 = 0x6162636465666768ull;
    e.u2 = 0xFFFFFFFFFFFFFFFFull;
    telemetry::EventRing ring(4);
    for (int i = 0; i < 3; ++i) // also into a slot that held another record
        QVERIFY(ring.push(i == 1 ? e : seq(0, 99)));
    telemetry::Event out[3];
    QCOMPARE(ring.pop(out, 3), std::size_t(3));
    QCOMPARE(std::memcmp(&out[1], &e, sizeof e), 0);
    QCOMPARE(seqOf(out[2]), std::uint64_t(99));
}

void TestTelemetryHub::hubHasRingsOnlyForLocalRanks()
{
    telemetry::TelemetryHub hub(8, std::vector<int>{2, 5, 5, 9}, 16); // 9 is not a rank, 5 twice
    QCOMPARE(hub.rankCount(), 8);
    QCOMPARE(hub.localRingCount(), 2);
    hub.write(seq(2, 1));
    hub.write(seq(3, 1)); // another process's rank: counted, not kept
    std::vector<telemetry::Event> out;
    QCOMPARE(hub.drain(out), std::size_t(1));
    QCOMPARE(hub.droppedEvents(), std::uint64_t(1));
}

void TestTelemetryHub::hubReportsRingOverflowAsDroppedEventsRecord()
{
    telemetry::TelemetryHub hub(2, 16);
    for (std::uint64_t i = 0; i < 20; ++i)
        hub.write(seq(1, i));
    hub.write(seq(0, 100));
    QCOMPARE(hub.droppedEvents(1), std::uint64_t(4));
    QCOMPARE(hub.droppedEvents(0), std::uint64_t(0));
    QCOMPARE(hub.droppedEvents(), std::uint64_t(4));
    std::vector<telemetry::Event> out;
    QCOMPARE(hub.drain(out), std::size_t(1 + 1 + 16));
    QCOMPARE(seqOf(out[0]), std::uint64_t(100));
    QCOMPARE(out[1].type, EventType::DroppedEvents);
    QCOMPARE(out[1].rank, std::uint16_t(1));
    QCOMPARE(telemetry::readDroppedEvents(out[1]), std::uint64_t(4));
    QCOMPARE(seqOf(out[2]), std::uint64_t(0));
    QCOMPARE(seqOf(out[17]), std::uint64_t(15));
    out.clear();
    QCOMPARE(hub.drain(out), std::size_t(0)); // the loss is reported once
    for (std::uint64_t i = 0; i < 18; ++i)
        hub.write(seq(1, i));
    QCOMPARE(hub.drain(out), std::size_t(17));
    QCOMPARE(out[0].type, EventType::DroppedEvents);
    QCOMPARE(telemetry::readDroppedEvents(out[0]), std::uint64_t(2));
}

void TestTelemetryHub::hubStampsZeroTimestampsAndCountsUnknownRanks()
{
    telemetry::TelemetryHub hub(1, 4);
    telemetry::Event e = seq(0, 1);
    e.tsNs = 0;
    hub.write(e);
    hub.write(seq(7, 1));
    std::vector<telemetry::Event> out;
    QCOMPARE(hub.drain(out), std::size_t(1));
    QVERIFY(out[0].tsNs > 0);
    QCOMPARE(hub.droppedEvents(), std::uint64_t(1));
}

void TestTelemetryHub::concurrentRanksLoseNothingUncounted()
{
    constexpr int kRanks = 4;
    constexpr std::uint64_t kPerRank = 300000;
    telemetry::TelemetryHub hub(kRanks, 1024);
    std::atomic<int> running{kRanks};
    std::vector<std::thread> producers;
    for (int r = 0; r < kRanks; ++r)
        producers.emplace_back([&, r] {
            for (std::uint64_t i = 0; i < kPerRank; ++i)
                hub.write(seq(r, i));
            running.fetch_sub(1);
        });
    std::vector<std::uint64_t> received(kRanks), reportedDrops(kRanks), last(kRanks, 0);
    std::vector<bool> ordered(kRanks, true);
    std::vector<telemetry::Event> out;
    for (;;) {
        const bool done = running.load() == 0;
        out.clear();
        hub.drain(out);
        for (const telemetry::Event &e : out) {
            if (e.type == EventType::DroppedEvents) {
                reportedDrops[e.rank] += telemetry::readDroppedEvents(e);
                continue;
            }
            if (received[e.rank] > 0 && seqOf(e) <= last[e.rank]) ordered[e.rank] = false;
            last[e.rank] = seqOf(e);
            ++received[e.rank];
        }
        if (done && out.empty()) break;
    }
    for (auto &t : producers)
        t.join();
    for (int r = 0; r < kRanks; ++r) {
        QVERIFY(ordered[r]);
        QCOMPARE(reportedDrops[r], hub.droppedEvents(r));
        QCOMPARE(received[r] + reportedDrops[r], kPerRank);
    }
}

void TestTelemetryHub::historyKeepsTheLastNInOrder()
{
    telemetry::EventHistory h(5);
    std::vector<telemetry::Event> a;
    for (std::uint64_t i = 0; i < 3; ++i)
        a.push_back(seq(0, i));
    h.append(a);
    QCOMPARE(h.events().size(), std::size_t(3));
    a.clear();
    for (std::uint64_t i = 3; i < 9; ++i)
        a.push_back(seq(0, i));
    h.append(std::span(a).subspan(0, 4));
    h.append(std::span(a).subspan(4));
    auto ev = h.events();
    QCOMPARE(ev.size(), std::size_t(5));
    for (std::size_t i = 0; i < 5; ++i)
        QCOMPARE(seqOf(ev[i]), std::uint64_t(4 + i));
    a.clear(); // the oldest slot is the last one: these wrap around the buffer's end
    for (std::uint64_t i = 9; i < 12; ++i)
        a.push_back(seq(0, i));
    h.append(a);
    ev = h.events();
    QCOMPARE(ev.size(), std::size_t(5));
    for (std::size_t i = 0; i < 5; ++i)
        QCOMPARE(seqOf(ev[i]), std::uint64_t(7 + i));
    QCOMPARE(seqOf(h.newest(2).front()), std::uint64_t(10));
    std::vector<telemetry::Event> big;
    for (std::uint64_t i = 0; i < 12; ++i)
        big.push_back(seq(0, 100 + i));
    h.append(big);
    ev = h.events();
    QCOMPARE(seqOf(ev.front()), std::uint64_t(107));
    QCOMPARE(seqOf(ev.back()), std::uint64_t(111));
    telemetry::EventHistory none(0);
    none.append(big);
    QVERIFY(none.events().empty());
}

// A capacity that is not a multiple of the block: runs that cross blocks, the partial last
// block and the ring's end, checked against the sequence numbers that must remain.
void TestTelemetryHub::historyWrapsAcrossItsBlocks()
{
    constexpr std::size_t kBlock = telemetry::EventHistory::kBlockEvents;
    const std::size_t capacity = 2 * kBlock + 1000;
    telemetry::EventHistory h(capacity);
    std::uint64_t next = 0;
    auto appendRun = [&](std::size_t n) {
        std::vector<telemetry::Event> run;
        for (std::size_t i = 0; i < n; ++i)
            run.push_back(seq(1, next++));
        h.append(run);
    };
    auto check = [&](const char *when) {
        const auto ev = h.events();
        const std::size_t expected = std::min<std::size_t>(next, capacity);
        QVERIFY2(ev.size() == expected, when);
        for (std::size_t i = 0; i < ev.size(); ++i)
            QVERIFY2(ev[i].u0 == next - expected + i, when);
        const auto last = h.newest(3);
        QVERIFY2(last.size() == 3 && last.back().u0 == next - 1 && last.front().u0 == next - 3,
                 when);
    };
    appendRun(kBlock - 10);
    appendRun(25); // crosses into the second block
    check("growing");
    appendRun(kBlock + 990); // fills the partial third block exactly
    QCOMPARE(h.size(), capacity);
    check("full");
    for (std::size_t n : {std::size_t(7), kBlock + 3, std::size_t(1500), 2 * kBlock})
        appendRun(n); // overwrite the oldest, across blocks and around the end
    check("wrapped");
    appendRun(capacity + 17); // more than it holds at once: the newest capacity events
    check("replaced");
}

QTEST_APPLESS_MAIN(TestTelemetryHub)
#include "tst_telemetryhub.moc"

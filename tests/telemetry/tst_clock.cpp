#include <QtTest>

#include <atomic>
#include <thread>

#include "telemetry/clock.h"

using namespace shardscope;

namespace {

// The TSC mapping is steered onto steady_clock; this is how far apart the two may be.
constexpr std::uint64_t kAgreementNs = 200'000;

// nowNs() read between two steady_clock reads must fall between them, give or take `slack`.
void expectBetweenSteadyReads(std::uint64_t slack)
{
    for (int i = 0; i < 1000; ++i) {
        const std::uint64_t before = telemetry::steadyNs();
        const std::uint64_t t = telemetry::nowNs();
        const std::uint64_t after = telemetry::steadyNs();
        QVERIFY2(t + slack >= before && t <= after + slack,
                 qPrintable(QString("nowNs() %1 outside steady_clock's [%2, %3] by more than %4 ns")
                                .arg(t)
                                .arg(before)
                                .arg(after)
                                .arg(slack)));
    }
}

// Restores the clock the process started with, whatever a test switched to.
struct ClockGuard
{
    telemetry::ClockSource saved = telemetry::clockSource();
    ~ClockGuard() { telemetry::useClock(saved); }
};

} // namespace

class TestClock : public QObject
{
    Q_OBJECT
  private slots:
    void steadyFallbackIsSteadyClock();
    void tscPathAgreesWithSteadyClock();
    void tscPathStaysOnSteadyClockAcrossRefinements();
    void readsAreMonotonicAcrossThreads_data();
    void readsAreMonotonicAcrossThreads();
    void environmentChoosesTheClock();
    void describesTheClockInUse();
};

void TestClock::steadyFallbackIsSteadyClock()
{
    ClockGuard guard;
    QCOMPARE(telemetry::useClock(telemetry::ClockSource::Steady), telemetry::ClockSource::Steady);
    QCOMPARE(telemetry::clockSource(), telemetry::ClockSource::Steady);
    expectBetweenSteadyReads(0);
}

void TestClock::tscPathAgreesWithSteadyClock()
{
    if (!telemetry::tscUsable())
        QSKIP("no invariant TSC on this machine: nowNs() is steady_clock (tested above)");
    ClockGuard guard;
    QCOMPARE(telemetry::useClock(telemetry::ClockSource::Tsc), telemetry::ClockSource::Tsc);
    QVERIFY(telemetry::tscHz() > 5e7 && telemetry::tscHz() < 2e10);
    expectBetweenSteadyReads(kAgreementNs);
}

void TestClock::tscPathStaysOnSteadyClockAcrossRefinements()
{
    if (!telemetry::tscUsable()) QSKIP("no invariant TSC on this machine");
    ClockGuard guard;
    telemetry::useClock(telemetry::ClockSource::Tsc);
    // Each forced refinement re-measures the rate and slews; the mapping must stay
    // continuous (monotonic reads) and on steady_clock.
    std::uint64_t last = telemetry::nowNs();
    for (int i = 0; i < 200; ++i) {
        telemetry::detail::g_tsc.refineAtTsc.store(0, std::memory_order_relaxed);
        const std::uint64_t t =
            telemetry::nowNs(); // refines, then maps with the parameters it read
        QVERIFY2(t >= last, "nowNs() went backwards across a refinement");
        last = t;
        // The refined mapping, read between two steady_clock reads: a thread preempted
        // between the reads widens the bracket instead of failing the test.
        const std::uint64_t steadyBefore = telemetry::steadyNs();
        const std::uint64_t after = telemetry::nowNs();
        const std::uint64_t steadyAfter = telemetry::steadyNs();
        QVERIFY2(after >= t, "nowNs() went backwards right after a refinement");
        last = after;
        QVERIFY2(after + kAgreementNs >= steadyBefore && after <= steadyAfter + kAgreementNs,
                 qPrintable(QString("refined nowNs() %1 outside steady_clock's [%2, %3] by more "
                                    "than %4 ns")
                                .arg(after)
                                .arg(steadyBefore)
                                .arg(steadyAfter)
                                .arg(kAgreementNs)));
    }
    expectBetweenSteadyReads(kAgreementNs);
}

void TestClock::readsAreMonotonicAcrossThreads_data()
{
    QTest::addColumn<bool>("tsc");
    QTest::newRow("steady_clock") << false;
    QTest::newRow("TSC") << true;
}

// What the rings rely on to merge ranks: a time one thread read and published is never
// later than a time another thread reads after seeing it (on a VM: the vCPUs' TSCs agree).
void TestClock::readsAreMonotonicAcrossThreads()
{
    QFETCH(bool, tsc);
    if (tsc && !telemetry::tscUsable()) QSKIP("no invariant TSC on this machine");
    ClockGuard guard;
    telemetry::useClock(tsc ? telemetry::ClockSource::Tsc : telemetry::ClockSource::Steady);
    std::atomic<std::uint64_t> published{0};
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        while (!stop.load(std::memory_order_relaxed))
            published.store(telemetry::nowNs(), std::memory_order_release);
    });
    std::uint64_t worst = 0;
    for (int i = 0; i < 200000; ++i) {
        const std::uint64_t seen = published.load(std::memory_order_acquire);
        const std::uint64_t t = telemetry::nowNs();
        if (seen > t) worst = std::max(worst, seen - t);
    }
    stop.store(true);
    writer.join();
    QVERIFY2(
        worst == 0,
        qPrintable(QString("a reader saw another thread's time %1 ns in its future").arg(worst)));
}

void TestClock::environmentChoosesTheClock()
{
    bool steady = true;
    std::string error = "stale";
    QVERIFY(telemetry::detail::parseClockChoice(nullptr, steady, error));
    QVERIFY(!steady);
    QVERIFY(error.empty());
    QVERIFY(telemetry::detail::parseClockChoice("auto", steady, error));
    QVERIFY(!steady);
    QVERIFY(telemetry::detail::parseClockChoice("steady", steady, error));
    QVERIFY(steady);
    QVERIFY(!telemetry::detail::parseClockChoice("hpet", steady, error));
    QVERIFY(!steady); // a bad value changes nothing: auto
    QCOMPARE(QString::fromStdString(error),
             QString("SHARDSCOPE_CLOCK=hpet is not a clock; use auto or steady (using auto)"));
    // This test runs with the environment CTest gives it: SHARDSCOPE_CLOCK unset, or steady
    // in the run that checks the variable end to end.
    const char *env = std::getenv("SHARDSCOPE_CLOCK");
    const bool forced = env && std::string(env) == "steady";
    QCOMPARE(telemetry::detail::g_tsc.forcedSteady, forced);
    if (forced || !telemetry::tscUsable())
        QCOMPARE(telemetry::clockSource(), telemetry::ClockSource::Steady);
    else
        QCOMPARE(telemetry::clockSource(), telemetry::ClockSource::Tsc);
}

void TestClock::describesTheClockInUse()
{
    ClockGuard guard;
    if (telemetry::tscUsable()) {
        telemetry::useClock(telemetry::ClockSource::Tsc);
        QVERIFY(QString::fromStdString(telemetry::clockDescription())
                    .startsWith("rdtsc mapped onto steady_clock"));
    }
    telemetry::useClock(telemetry::ClockSource::Steady);
    QVERIFY(QString::fromStdString(telemetry::clockDescription()).startsWith("steady_clock ("));
}

QTEST_GUILESS_MAIN(TestClock)
#include "tst_clock.moc"

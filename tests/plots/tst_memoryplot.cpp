// The memory plot keeps one graph per rank per series with the sampled bytes, and draws
// the max-live-parameters limit in bytes.

#include <QTest>
#include <qcustomplot.h>

#include "views/memoryplot.h"

using namespace shardscope;
using shardscope::views::MemoryPlot;
using Series = MemoryPlot::Series;

namespace {

Event sample(int rank, std::uint64_t tsNs, std::uint64_t partitioned, std::uint64_t gathered,
             std::uint64_t peak, std::uint64_t liveElements)
{
    Event ev{};
    ev.tsNs = tsNs;
    ev.rank = std::uint16_t(rank);
    ev.type = EventType::MemorySample;
    ev.u0 = partitioned;
    ev.u1 = gathered;
    ev.u2 = peak;
    ev.a = std::uint32_t(liveElements & 0xFFFFFFFFu);
    ev.b = std::uint32_t(liveElements >> 32);
    return ev;
}

QVector<double> values(const QCPGraph *g)
{
    QVector<double> out;
    for (auto it = g->data()->constBegin(); it != g->data()->constEnd(); ++it)
        out.push_back(it->value);
    return out;
}

QVector<double> keys(const QCPGraph *g)
{
    QVector<double> out;
    for (auto it = g->data()->constBegin(); it != g->data()->constEnd(); ++it)
        out.push_back(it->key);
    return out;
}

constexpr std::uint64_t sec = 1000000000ull;

} // namespace

class TestMemoryPlot : public QObject
{
    Q_OBJECT

  private slots:
    void oneGraphPerRankPerSeriesWithTheSampledBytes();
    void otherEventsAndBadRanksAreIgnored();
    void limitIsMaxLiveParametersTimesElementSize();
    void followLiveAndClear();
    void toolTipNamesTheNearestLine();
};

void TestMemoryPlot::oneGraphPerRankPerSeriesWithTheSampledBytes()
{
    MemoryPlot plot;
    plot.resize(800, 300);
    plot.setTimeOrigin(0);
    plot.setWorldSize(2);
    QCOMPARE(plot.rankCount(), 2);
    QCOMPARE(plot.plot()->graphCount(), 2 * MemoryPlot::kSeriesCount);

    std::vector<Event> events = {
        sample(0, 1 * sec, 1000, 0, 0, 0),
        sample(1, 1 * sec, 1000, 0, 0, 0),
        sample(0, 2 * sec, 1000, 4000, 4000, 1000),
        sample(1, 2 * sec, 1000, 8000, 8000, 2000),
        sample(0, 3 * sec, 1000, 0, 4000, 0),
        sample(1, 3 * sec, 1000, 2000, 8000, (1ull << 32) + 5),
    };
    plot.appendEvents(events);
    QCOMPARE(plot.graph(0, Series::Gathered)->dataCount(), 0); // only a refresh moves them in
    plot.refresh();

    QCOMPARE(keys(plot.graph(0, Series::Gathered)), (QVector<double>{1, 2, 3}));
    QCOMPARE(values(plot.graph(0, Series::Partitioned)), (QVector<double>{1000, 1000, 1000}));
    QCOMPARE(values(plot.graph(0, Series::Gathered)), (QVector<double>{0, 4000, 0}));
    QCOMPARE(values(plot.graph(0, Series::PeakGathered)), (QVector<double>{0, 4000, 4000}));
    QCOMPARE(values(plot.graph(1, Series::Gathered)), (QVector<double>{0, 8000, 2000}));
    QCOMPARE(values(plot.graph(1, Series::PeakGathered)), (QVector<double>{0, 8000, 8000}));
    QCOMPARE(plot.liveElements(0), qint64(0));
    QCOMPARE(plot.liveElements(1), qint64((1ll << 32) + 5));

    // Rank 2 appears with its first sample.
    std::vector<Event> more = {sample(2, 4 * sec, 500, 700, 700, 0)};
    plot.appendEvents(more);
    plot.refresh();
    QCOMPARE(plot.rankCount(), 3);
    QCOMPARE(plot.plot()->graphCount(), 3 * MemoryPlot::kSeriesCount);
    QCOMPARE(values(plot.graph(2, Series::Partitioned)), QVector<double>{500});
    QVERIFY(!plot.graph(3, Series::Gathered));
    QVERIFY(plot.plot()->yAxis->range().upper >= 8000);

    // Peak is hidden by default and in the legend only once shown; one entry per series.
    QVERIFY(!plot.graph(1, Series::PeakGathered)->visible());
    QCOMPARE(plot.plot()->legend->itemCount(), 2);
    plot.setSeriesVisible(Series::PeakGathered, true);
    QVERIFY(plot.graph(1, Series::PeakGathered)->visible());
    QCOMPARE(plot.plot()->legend->itemCount(), 3);
    QVERIFY(!plot.grab().isNull());
}

void TestMemoryPlot::otherEventsAndBadRanksAreIgnored()
{
    MemoryPlot plot;
    plot.setTimeOrigin(0);
    Event fetch{};
    fetch.type = EventType::FetchBegin;
    fetch.u0 = 999;
    Event corrupt = sample(5000, sec, 1, 1, 1, 1);
    std::vector<Event> events = {fetch, corrupt, sample(0, 2 * sec, 10, 20, 30, 40)};
    plot.appendEvents(events);
    plot.refresh();
    QCOMPARE(plot.rankCount(), 1);
    QCOMPARE(values(plot.graph(0, Series::Partitioned)), QVector<double>{10});
    QCOMPARE(keys(plot.graph(0, Series::Partitioned)), QVector<double>{2});
}

void TestMemoryPlot::limitIsMaxLiveParametersTimesElementSize()
{
    EngineState state;
    state.worldSize = 4;
    state.config.maxLiveParameters = 3000;
    ParamRecord big;
    big.numel = 1000;
    big.dtype = DType::BF16;
    ParamRecord small;
    small.id = 1;
    small.numel = 10;
    small.dtype = DType::F32;
    state.params = {big, small};

    MemoryPlot plot;
    plot.setState(state);
    QCOMPARE(plot.rankCount(), 4);
    QCOMPARE(plot.limitElements(), qint64(3000));
    QCOMPARE(plot.limitBytes(), 6000.0); // bfloat16 holds most elements: 2 bytes each
    plot.refresh();
    QVERIFY(plot.plot()->yAxis->range().upper >= 6000.0);

    plot.setLimit(0, 4);
    QCOMPARE(plot.limitBytes(), 0.0);
    plot.setLimit(-5, 0);
    QCOMPARE(plot.limitBytes(), 0.0);
    QCOMPARE(MemoryPlot::formatBytes(6000), QStringLiteral("6 kB"));
    QCOMPARE(MemoryPlot::formatBytes(2.5e9), QStringLiteral("2.5 GB"));
}

void TestMemoryPlot::followLiveAndClear()
{
    MemoryPlot plot;
    plot.resize(800, 300);
    plot.setTimeOrigin(0);
    std::vector<Event> events;
    for (int i = 0; i <= 100; ++i)
        events.push_back(sample(0, std::uint64_t(i) * sec, 100, std::uint64_t(i), 0, 0));
    plot.appendEvents(events);
    plot.refresh();
    QVERIFY(plot.followLive());
    QVERIFY(plot.plot()->xAxis->range().upper >= 100.0);
    QVERIFY(plot.plot()->xAxis->range().lower > 60.0);

    plot.setVisibleRange(0, 10);
    QVERIFY(!plot.followLive());
    plot.refresh();
    QCOMPARE(plot.plot()->xAxis->range().lower, 0.0);

    plot.clear();
    plot.refresh();
    QCOMPARE(plot.graph(0, Series::Gathered)->dataCount(), 0);
    QCOMPARE(plot.rankCount(), 1);
}

void TestMemoryPlot::toolTipNamesTheNearestLine()
{
    MemoryPlot plot;
    plot.resize(800, 400);
    plot.show();
    QVERIFY(QTest::qWaitForWindowExposed(&plot));
    plot.setTimeOrigin(0);
    std::vector<Event> events = {
        sample(0, 1 * sec, 1000, 2000, 0, 0), sample(1, 1 * sec, 1000, 8000, 0, 0),
        sample(0, 3 * sec, 1000, 2000, 0, 0), sample(1, 3 * sec, 1000, 8000, 0, 0)};
    plot.appendEvents(events);
    plot.setVisibleRange(0, 4);
    plot.refresh();
    plot.plot()->replot();
    auto at = [&](double t, double bytes) {
        return QPointF(plot.plot()->xAxis->coordToPixel(t),
                       plot.plot()->yAxis->coordToPixel(bytes));
    };
    QCOMPARE(plot.toolTipAt(at(2.0, 8000)), QStringLiteral("rank 1, gathered: 8 kB at 1.000 s"));
    QCOMPARE(plot.toolTipAt(at(2.0, 2000)), QStringLiteral("rank 0, gathered: 2 kB at 1.000 s"));
    QVERIFY(plot.toolTipAt(at(0.5, 8000)).isEmpty()); // before the first sample
    QVERIFY(plot.toolTipAt(at(2.0, 5000)).isEmpty()); // far from every line
}

QTEST_MAIN(TestMemoryPlot)
#include "tst_memoryplot.moc"

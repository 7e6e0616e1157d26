// The memory plot keeps one graph per rank per series with the sampled bytes, tells ranks
// apart by colour (named in the legend), shows min/median/max bands over many ranks with a
// picked rank over them, and draws the max-live-parameters limit in bytes.

#include <QComboBox>
#include <QSet>
#include <QTest>
#include <qcustomplot.h>
#include <set>

#include "testevents.h"
#include "views/memoryplot.h"

using namespace shardscope;
using shardscope::views::MemoryPlot;
using Series = MemoryPlot::Series;

namespace {

telemetry::Event sample(int rank, std::uint64_t tsNs, std::uint64_t partitioned,
                        std::uint64_t gathered, std::uint64_t peak, std::uint64_t liveElements)
{
    return test::eventAt(tsNs, rank,
                         telemetry::makeMemorySample({.partitionedBytes = partitioned,
                                                      .gatheredBytes = gathered,
                                                      .peakGatheredBytes = peak,
                                                      .liveElements = liveElements}),
                         0);
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
    void ranksHaveDistinctColoursNamedInTheLegend();
    void manyRanksShowBandsAndAPickedRank();
    void allocatorSeriesWhenARunSendsThem();
};

namespace {

QStringList legendNames(const MemoryPlot &plot)
{
    QStringList names;
    for (int i = 0; i < plot.plot()->legend->itemCount(); ++i)
        if (auto *item = qobject_cast<QCPPlottableLegendItem *>(plot.plot()->legend->item(i)))
            names << item->plottable()->name();
    return names;
}

} // namespace

void TestMemoryPlot::oneGraphPerRankPerSeriesWithTheSampledBytes()
{
    MemoryPlot plot;
    plot.resize(800, 300);
    plot.setTimeOrigin(0);
    plot.setWorldSize(2);
    QCOMPARE(plot.rankCount(), 2);
    QVERIFY(plot.graph(1, Series::PeakGathered));
    QVERIFY(!plot.graph(2, Series::Gathered));

    std::vector<telemetry::Event> events = {
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
    std::vector<telemetry::Event> more = {sample(2, 4 * sec, 500, 700, 700, 0)};
    plot.appendEvents(more);
    plot.refresh();
    QCOMPARE(plot.rankCount(), 3);
    QCOMPARE(values(plot.graph(2, Series::Partitioned)), QVector<double>{500});
    QVERIFY(!plot.graph(3, Series::Gathered));
    QVERIFY(plot.plot()->yAxis->range().upper >= 8000);

    // Peak is hidden by default and in the legend only once shown: one entry per rank and
    // one per line style.
    QVERIFY(!plot.graph(1, Series::PeakGathered)->visible());
    QCOMPARE(legendNames(plot),
             (QStringList{"rank 0", "rank 1", "rank 2", "partitioned", "gathered"}));
    plot.setSeriesVisible(Series::PeakGathered, true);
    QVERIFY(plot.graph(1, Series::PeakGathered)->visible());
    QCOMPARE(legendNames(plot), (QStringList{"rank 0", "rank 1", "rank 2", "partitioned",
                                             "gathered", "peak gathered"}));
    QVERIFY(!plot.grab().isNull());
}

void TestMemoryPlot::otherEventsAndBadRanksAreIgnored()
{
    MemoryPlot plot;
    plot.setTimeOrigin(0);
    // A fetch's bytes are not memory: the plot reads only MemorySample.
    const telemetry::Event fetch =
        test::eventAt(0, 0, telemetry::makeFetchBegin({.bytes = 999}), 0);
    telemetry::Event corrupt = sample(5000, sec, 1, 1, 1, 1);
    std::vector<telemetry::Event> events = {fetch, corrupt, sample(0, 2 * sec, 10, 20, 30, 40)};
    plot.appendEvents(events);
    plot.refresh();
    QCOMPARE(plot.rankCount(), 1);
    QCOMPARE(values(plot.graph(0, Series::Partitioned)), QVector<double>{10});
    QCOMPARE(keys(plot.graph(0, Series::Partitioned)), QVector<double>{2});
}

void TestMemoryPlot::limitIsMaxLiveParametersTimesElementSize()
{
    state::EngineState state;
    state.worldSize = 4;
    state.config.maxLiveParameters = 3000;
    state::ParamRecord big;
    big.numel = 1000;
    big.dtype = DType::BF16;
    state::ParamRecord small;
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
    QVERIFY(plot.strips()); // 4 ranks: a strip each, the limit drawn in the band view
    plot.setRankView(MemoryPlot::RankView::Bands);
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
    std::vector<telemetry::Event> events;
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
    std::vector<telemetry::Event> events = {
        sample(0, 1 * sec, 1000, 2000, 0, 0), sample(1, 1 * sec, 1000, 8000, 0, 0),
        sample(0, 3 * sec, 1000, 2000, 0, 0), sample(1, 3 * sec, 1000, 8000, 0, 0)};
    plot.appendEvents(events);
    plot.setVisibleRange(0, 4);
    plot.refresh();
    plot.plot()->replot();
    // Two ranks: a strip each, so the point is on the rank's own value axis.
    QVERIFY(plot.strips());
    auto at = [&](int rank, double t, double bytes) {
        return QPointF(plot.plot()->xAxis->coordToPixel(t),
                       plot.graph(rank, Series::Gathered)->valueAxis()->coordToPixel(bytes));
    };
    QCOMPARE(plot.toolTipAt(at(1, 2.0, 8000)), QStringLiteral("rank 1, gathered: 8 kB at 1.000 s"));
    QCOMPARE(plot.toolTipAt(at(0, 2.0, 2000)), QStringLiteral("rank 0, gathered: 2 kB at 1.000 s"));
    QVERIFY(plot.toolTipAt(at(1, 0.5, 8000)).isEmpty()); // before the first sample
    QVERIFY(plot.toolTipAt(at(1, 2.0, 5000)).isEmpty()); // far from every line
    // Rank 0's strip is above rank 1's: the same bytes are drawn higher.
    QVERIFY(at(0, 2.0, 1000).y() < at(1, 2.0, 8000).y());
}

// Four ranks are four colours, not four shades of one: every rank's lines share its
// colour, no two ranks share one, and the series differ by line style.
void TestMemoryPlot::ranksHaveDistinctColoursNamedInTheLegend()
{
    MemoryPlot plot;
    plot.setWorldSize(4);
    QCOMPARE(plot.rankView(), MemoryPlot::RankView::AllRanks);
    QSet<QRgb> colours;
    for (int r = 0; r < 4; ++r) {
        const QColor c = plot.graph(r, Series::Gathered)->pen().color();
        QCOMPARE(plot.graph(r, Series::Partitioned)->pen().color(), c);
        QCOMPARE(c, [&] {
            QColor expected = MemoryPlot::rankColor(r);
            expected.setAlpha(c.alpha());
            return expected;
        }());
        colours.insert(c.rgb());
        QVERIFY(plot.graph(r, Series::Gathered)->pen().style() !=
                plot.graph(r, Series::Partitioned)->pen().style());
    }
    QCOMPARE(colours.size(), 4);
    // Hues far apart: no two of the first eight palette colours are within 25 degrees
    // unless one of them is much lighter or darker.
    for (int a = 0; a < MemoryPlot::kMaxRankLines; ++a)
        for (int b = a + 1; b < MemoryPlot::kMaxRankLines; ++b) {
            const QColor ca = MemoryPlot::rankColor(a), cb = MemoryPlot::rankColor(b);
            const int dh = std::abs(ca.hsvHue() - cb.hsvHue());
            const int hueDistance = std::min(dh, 360 - dh);
            QVERIFY2(hueDistance >= 25 || std::abs(ca.value() - cb.value()) >= 40 ||
                         std::abs(ca.saturation() - cb.saturation()) >= 60,
                     qPrintable(QStringLiteral("ranks %1 and %2").arg(a).arg(b)));
        }
    QCOMPARE(legendNames(plot).mid(0, 4), (QStringList{"rank 0", "rank 1", "rank 2", "rank 3"}));
    // ... and each in its own strip: ranks that gather the same bytes do not cover each other.
    QVERIFY(plot.strips());
    for (int r = 1; r < 4; ++r)
        QVERIFY(plot.graph(r, Series::Gathered)->valueAxis() !=
                plot.graph(r - 1, Series::Gathered)->valueAxis());
}

// 64 ranks: per series the minimum, median and maximum over the ranks' latest samples,
// and the rank picked in the combo box drawn over them.
void TestMemoryPlot::manyRanksShowBandsAndAPickedRank()
{
    MemoryPlot plot;
    plot.resize(900, 400);
    plot.show();
    QVERIFY(QTest::qWaitForWindowExposed(&plot));
    plot.setTimeOrigin(0);
    plot.setWorldSize(64);
    QCOMPARE(plot.rankView(), MemoryPlot::RankView::Bands);
    QCOMPARE(plot.rankPicker()->count(), 2 + 64);
    std::vector<telemetry::Event> events;
    for (int r = 0; r < 64; ++r)
        events.push_back(sample(r, 1 * sec, 1000 + std::uint64_t(r), std::uint64_t(r) * 100, 0, 0));
    events.push_back(sample(7, 2 * sec, 1007, 10000, 0, 0)); // rank 7 gathers more
    plot.appendEvents(events);
    plot.refresh();

    auto last = [](const QCPGraph *g) { return (g->data()->constEnd() - 1)->value; };
    QCOMPARE(last(plot.band(Series::Gathered, MemoryPlot::Band::Min)), 0.0);
    QCOMPARE(last(plot.band(Series::Gathered, MemoryPlot::Band::Max)), 10000.0);
    // Median of 0, 100, ... 6300 with rank 7's 700 replaced by 10000: (3200 + 3300) / 2.
    QCOMPARE(last(plot.band(Series::Gathered, MemoryPlot::Band::Median)), 3250.0);
    QCOMPARE(last(plot.band(Series::Partitioned, MemoryPlot::Band::Max)), 1063.0);
    QVERIFY(plot.band(Series::Gathered, MemoryPlot::Band::Median)->visible());
    QVERIFY(!plot.graph(7, Series::Gathered)->visible());

    // Picking rank 7 in the combo box draws it over the bands, in black.
    Q_EMIT plot.rankPicker()->activated(2 + 7);
    QCOMPARE(plot.pickedRank(), 7);
    QVERIFY(plot.graph(7, Series::Gathered)->visible());
    QVERIFY(!plot.graph(6, Series::Gathered)->visible());
    QVERIFY(plot.band(Series::Gathered, MemoryPlot::Band::Median)->visible());
    QVERIFY(legendNames(plot).last().startsWith("rank 7"));
    plot.refresh();
    plot.plot()->replot();
    QCOMPARE(plot.toolTipAt(QPointF(plot.plot()->xAxis->coordToPixel(2.5),
                                    plot.plot()->yAxis->coordToPixel(10000))),
             QStringLiteral("rank 7, gathered: 10 kB at 2.000 s"));

    // Samples come a rank at a time (a lane per rank); the band follows time, not arrival:
    // rank 1 holds 500 B from 2 s to 4 s, across rank 0's sample at 3 s.
    MemoryPlot two;
    two.setTimeOrigin(0);
    two.setWorldSize(2);
    two.setRankView(MemoryPlot::RankView::Bands);
    two.appendEvents(std::vector<telemetry::Event>{sample(0, 1 * sec, 0, 100, 0, 0),
                                                   sample(0, 3 * sec, 0, 100, 0, 0)});
    two.appendEvents(std::vector<telemetry::Event>{sample(1, 2 * sec, 0, 500, 0, 0),
                                                   sample(1, 4 * sec, 0, 0, 0, 0)});
    two.refresh();
    QCOMPARE(values(two.band(Series::Gathered, MemoryPlot::Band::Max)),
             (QVector<double>{100, 500, 500, 100}));
    QCOMPARE(values(two.band(Series::Gathered, MemoryPlot::Band::Min)),
             (QVector<double>{100, 100, 100, 0}));

    // All ranks on request: 64 lines, colours repeating past the legend's eight.
    Q_EMIT plot.rankPicker()->activated(0);
    QCOMPARE(plot.rankView(), MemoryPlot::RankView::AllRanks);
    QVERIFY(plot.graph(63, Series::Gathered)->visible());
    QVERIFY(!plot.band(Series::Gathered, MemoryPlot::Band::Median)->visible());
    QVERIFY(!plot.grab().isNull());
}

// A GPU run's allocator samples (allocated, reserved) are series of their own, at their own
// times, listed in the legend in the docs' words; a run without them (the CPU) lists neither.
void TestMemoryPlot::allocatorSeriesWhenARunSendsThem()
{
    auto allocator = [](int rank, std::uint64_t ts, std::uint64_t allocated,
                        std::uint64_t reserved) {
        return test::eventAt(ts, rank,
                             telemetry::makeAllocatorSample({.allocatedBytes = allocated,
                                                             .reservedBytes = reserved,
                                                             .peakAllocatedBytes = allocated}),
                             0);
    };
    MemoryPlot plot;
    plot.resize(800, 300);
    plot.setTimeOrigin(0);
    plot.setWorldSize(2);
    std::vector<telemetry::Event> events = {
        sample(0, 1 * sec, 1000, 0, 0, 0),
        sample(1, 1 * sec, 1000, 0, 0, 0),
        sample(0, 2 * sec, 1000, 4000, 4000, 1000),
        sample(1, 2 * sec, 1000, 8000, 8000, 2000),
    };
    plot.appendEvents(events);
    plot.refresh();
    QVERIFY(!plot.hasAllocatorSeries());
    QVERIFY(!legendNames(plot).contains("allocated (CUDA)"));
    QVERIFY(!plot.graph(0, Series::Allocated)->visible());

    std::vector<telemetry::Event> gpu = {
        allocator(0, 1500000000ull, 5000, 8192),
        allocator(0, 2500000000ull, 7000, 8192),
        allocator(1, 2500000000ull, 6000, 16384),
    };
    plot.appendEvents(gpu);
    plot.refresh();
    QVERIFY(plot.hasAllocatorSeries());
    QCOMPARE(keys(plot.graph(0, Series::Allocated)), (QVector<double>{1.5, 2.5}));
    QCOMPARE(values(plot.graph(0, Series::Allocated)), (QVector<double>{5000, 7000}));
    QCOMPARE(values(plot.graph(0, Series::Reserved)), (QVector<double>{8192, 8192}));
    QCOMPARE(values(plot.graph(1, Series::Reserved)), QVector<double>{16384});
    // The parameter series keep their own samples.
    QCOMPARE(keys(plot.graph(0, Series::Gathered)), (QVector<double>{1, 2}));
    QCOMPARE(values(plot.graph(1, Series::Gathered)), (QVector<double>{0, 8000}));
    QVERIFY(plot.graph(0, Series::Allocated)->visible());
    QVERIFY(plot.graph(1, Series::Reserved)->visible());
    QCOMPARE(legendNames(plot), (QStringList{"rank 0", "rank 1", "partitioned", "gathered",
                                             "allocated (CUDA)", "reserved (CUDA)"}));
    const Qt::PenStyle styles[] = {plot.graph(0, Series::Partitioned)->pen().style(),
                                   plot.graph(0, Series::Gathered)->pen().style(),
                                   plot.graph(0, Series::PeakGathered)->pen().style(),
                                   plot.graph(0, Series::Allocated)->pen().style(),
                                   plot.graph(0, Series::Reserved)->pen().style()};
    QCOMPARE(std::set<Qt::PenStyle>(std::begin(styles), std::end(styles)).size(), std::size_t(5));
    QVERIFY(plot.plot()->yAxis->range().upper >= 8192);
    // Bands over ranks: the allocator's maximum over the ranks' latest samples.
    plot.setRankView(MemoryPlot::RankView::Bands);
    QCOMPARE(values(plot.band(Series::Reserved, MemoryPlot::Band::Max)).back(), 16384.0);
    QCOMPARE(values(plot.band(Series::Allocated, MemoryPlot::Band::Min)).back(), 6000.0);
    QVERIFY(legendNames(plot).contains("reserved (CUDA) (median, min–max)"));
    plot.clear();
    QVERIFY(!plot.hasAllocatorSeries());
}

QTEST_MAIN(TestMemoryPlot)
#include "tst_memoryplot.moc"

// The gather timeline builds spans from FetchBegin/FetchEnd pairs, stacks fetches in
// flight together in sub-rows, selects the parameters of the span or fetch in flight under
// a click and names them on hover, merges sub-pixel spans when zoomed out and keeps exact
// spans when zoomed in, and takes a million events.

#include <array>
#include <map>
#include <numeric>

#include <QApplication>
#include <QMouseEvent>
#include <QRandomGenerator>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTest>
#include <QToolButton>
#include <qcustomplot.h>

#include "testevents.h"
#include "views/gathertimeline.h"

using namespace shardscope;
using namespace shardscope::views;
using shardscope::telemetry::makeFetchBegin;
using shardscope::telemetry::makeFetchEnd;
using shardscope::telemetry::makeModuleEnter;
using shardscope::telemetry::makeRelease;
using shardscope::telemetry::makeStepBegin;
using shardscope::telemetry::makeUnregisteredAccess;
using shardscope::test::eventAt;

namespace {

constexpr std::uint64_t us = 1000;
constexpr std::uint64_t ms = 1000 * us;

std::vector<telemetry::Event> twoRankRun()
{
    const auto fwd = FetchReason::Forward;
    const auto pre = FetchReason::Prefetch;
    return {
        eventAt(0, 0, makeStepBegin(), 1),
        eventAt(1 * ms, 0, makeFetchBegin({.param = 5, .cause = 2, .reason = fwd})),
        eventAt(2 * ms, 1, makeFetchBegin({.param = 6, .reason = pre})),
        eventAt(3 * ms, 0, makeFetchEnd({.param = 5, .cause = 2, .reason = fwd})),
        eventAt(4 * ms, 0, makeRelease({.param = 5, .cause = 2})),
        eventAt(5 * ms, 1, makeFetchEnd({.param = 6, .reason = pre})),
        eventAt(6 * ms, 1, makeUnregisteredAccess({.accessor = 3, .param = 9})),
        eventAt(6 * ms, 0, makeModuleEnter({.module = 3})),
    };
}

std::size_t mergedCount(const std::vector<TimelineBlock> &blocks)
{
    return std::accumulate(blocks.begin(), blocks.end(), std::size_t(0),
                           [](std::size_t n, const TimelineBlock &b) { return n + b.count; });
}

} // namespace

class TestGatherTimeline : public QObject
{
    Q_OBJECT

  private slots:
    void fetchPairsBecomeSpans();
    void spansStaySortedWhenCompletedOutOfOrder();
    void badEventsAreIgnoredOrKeptHarmless();
    void concurrentFetchesTakeTheLowestFreeRow();
    void concurrentFetchesAreDrawnAndClickedInTheirRows();
    void inFlightFetchesAreHoveredAndClicked();
    void blocksHoldExactlyTheSpansInRange();
    void clickOnSpanEmitsItsParameters();
    void clickOnViolationMarkerEmitsTheParameter();
    void selectionMarksBlocks();
    void subPixelSpansMergeWhenZoomedOut();
    void millionEvents();
    void followLiveTracksTheNewestEvents();
    void stepNavigationShowsTheStep();
    void violationNavigationLandsOnEachInTurn();
    void gatherNavigationFollowsOneParameter();
    void keysZoomPanAndFit();
    void rangeSummaryEqualsTheEventsSums();
    void shiftDragSelectsARange();
    void foldedLaneCountsTheRanksGathering();
    void sixtyFourLanesThinTheirLabels();
    void stepLabelsShowAsManyAsFit();
    void reduceScattersHaveTheirOwnTrack();
};

void TestGatherTimeline::fetchPairsBecomeSpans()
{
    GatherSpans spans;
    spans.setTimeOrigin(0);
    const auto events = twoRankRun();
    spans.append(events);
    QCOMPARE(spans.spanCount(), std::size_t(2));
    QCOMPARE(spans.markCount(), std::size_t(1));
    QCOMPARE(spans.violationCount(), std::size_t(1));
    QCOMPARE(spans.laneCount(), 2);

    const auto &r0 = spans.track(0, SpanTrack::Fetch);
    QCOMPARE(r0.size(), std::size_t(1));
    QCOMPARE(r0[0].param, ParamId(5));
    QCOMPARE(r0[0].module, ModuleId(2));
    QCOMPARE(r0[0].kind, SpanKind::Forward);
    QCOMPARE(r0[0].start, 0.001);
    QCOMPARE(r0[0].end, 0.003);

    const auto &r1 = spans.track(1, SpanTrack::Fetch);
    QCOMPARE(r1.size(), std::size_t(1));
    QCOMPARE(r1[0].kind, SpanKind::Prefetch);
    QCOMPARE(r1[0].start, 0.002);
    QCOMPARE(r1[0].end, 0.005);

    QCOMPARE(spans.track(0, SpanTrack::Mark).at(0).kind, SpanKind::Release);
    QCOMPARE(spans.track(1, SpanTrack::Violation).at(0).param, ParamId(9));
    QCOMPARE(spans.track(1, SpanTrack::Violation).at(0).module, ModuleId(3));
    QCOMPARE(spans.steps().size(), std::size_t(1));
    QCOMPARE(spans.steps().at(1), 0.0);
    QCOMPARE(spans.lastTime(), 0.006);
    QVERIFY(spans.openFetches().empty());

    GatherTimeline timeline;
    timeline.appendEvents(events);
    QCOMPARE(timeline.spanCount(), std::size_t(2));
    QCOMPARE(timeline.laneCount(), 2);
}

void TestGatherTimeline::spansStaySortedWhenCompletedOutOfOrder()
{
    GatherSpans spans;
    spans.setTimeOrigin(0);
    const auto pre = FetchReason::Prefetch;
    std::vector<telemetry::Event> first = {
        eventAt(10 * ms, 0, makeFetchBegin({.param = 1, .reason = pre})),
        eventAt(11 * ms, 0, makeFetchBegin({.param = 2, .reason = pre})),
        eventAt(12 * ms, 0, makeFetchEnd({.param = 2, .reason = pre}))};
    spans.append(first);
    QCOMPARE(spans.openFetches().size(), std::size_t(1));
    QCOMPARE(spans.openFetches()[0].param, ParamId(1));
    std::vector<telemetry::Event> second = {
        eventAt(14 * ms, 0, makeFetchEnd({.param = 1, .reason = pre})),
        eventAt(1 * ms, 0, makeFetchBegin({.param = 3})),
        eventAt(2 * ms, 0, makeFetchEnd({.param = 3}))};
    spans.append(second);
    const auto &v = spans.track(0, SpanTrack::Fetch);
    QCOMPARE(v.size(), std::size_t(3));
    QCOMPARE(v[0].param, ParamId(3));
    QCOMPARE(v[1].param, ParamId(1));
    QCOMPARE(v[2].param, ParamId(2));
    QCOMPARE(v[1].start, 0.010);
    QCOMPARE(v[1].end, 0.014);

    // An overlapping long span is found from a range that starts after its begin.
    std::vector<TimelineBlock> blocks;
    spans.blocks(0, SpanTrack::Fetch, 0.0125, 0.0135, 1e-6, blocks);
    QCOMPARE(blocks.size(), std::size_t(1));
    QCOMPARE(spans.paramsIn(blocks[0]), std::vector<ParamId>{1});
}

void TestGatherTimeline::badEventsAreIgnoredOrKeptHarmless()
{
    GatherSpans spans;
    spans.setTimeOrigin(0);
    std::vector<telemetry::Event> events = {
        eventAt(5 * ms, 0, makeFetchEnd({.param = 4})),      // attached mid-fetch
        eventAt(1 * ms, 2000, makeFetchBegin({.param = 1})), // corrupt rank
        // Raw records: a reason byte no FetchReason names, and a kind no EventType names.
        test::makeEvent(1 * ms, 1, EventType::FetchBegin, 7, 0, 0, 200), // unknown reason
        test::makeEvent(2 * ms, 1, EventType::FetchEnd, 7, 0, 0, 200),
        test::makeEvent(1 * ms, 0, EventType(99), 1), // unknown type
    };
    spans.append(events);
    QCOMPARE(spans.laneCount(), 2);
    QCOMPARE(spans.spanCount(), std::size_t(2));
    const auto &r0 = spans.track(0, SpanTrack::Fetch);
    QCOMPARE(r0[0].start, r0[0].end);
    QCOMPARE(spans.track(1, SpanTrack::Fetch)[0].kind, SpanKind::Forward);

    // A fetch whose end was lost stays open only until its rank starts the next step.
    std::vector<telemetry::Event> lost = {eventAt(6 * ms, 0, makeFetchBegin({.param = 8})),
                                          eventAt(6 * ms, 1, makeFetchBegin({.param = 8})),
                                          eventAt(7 * ms, 0, makeStepBegin(), 2)};
    spans.append(lost);
    QCOMPARE(spans.openFetches().size(), std::size_t(1));
    QCOMPARE(spans.openFetches()[0].rank, 1);
    QVERIFY(spans.track(5, SpanTrack::Fetch).empty());
    QVERIFY(spans.track(-1, SpanTrack::Fetch).empty());

    GatherTimeline timeline;
    timeline.resize(600, 300);
    timeline.appendEvents(events);
    timeline.fitAll();
    timeline.refresh();
    timeline.plot()->replot();
    QVERIFY(timeline.paramsAt(QPointF(-10, -10)).isEmpty());
}

namespace {

// Rank 0 prefetches 1 while 2 (forward) is gathered too; 3 is issued once 1 is done and
// 4 (backward) once 2 is, and 4 is still in flight at the end. Rank 1 has one fetch.
std::vector<telemetry::Event> overlappingRun()
{
    const auto fwd = FetchReason::Forward;
    const auto bwd = FetchReason::Backward;
    const auto pre = FetchReason::Prefetch;
    return {
        eventAt(1 * ms, 0, makeFetchBegin({.param = 1, .reason = pre})),
        eventAt(2 * ms, 0, makeFetchBegin({.param = 2, .reason = fwd})),
        eventAt(2500 * us, 0, makeModuleEnter({.module = 3})),
        eventAt(1 * ms, 1, makeFetchBegin({.param = 7, .reason = fwd})),
        eventAt(3 * ms, 1, makeFetchEnd({.param = 7, .reason = fwd})),
        eventAt(4 * ms, 0, makeFetchEnd({.param = 1, .reason = pre})),
        eventAt(4500 * us, 0, makeFetchBegin({.param = 3, .reason = pre})),
        eventAt(5 * ms, 0, makeFetchEnd({.param = 2, .reason = fwd})),
        eventAt(5500 * us, 0, makeFetchBegin({.param = 4, .reason = bwd})),
        eventAt(6 * ms, 0, makeFetchEnd({.param = 3, .reason = pre})),
    };
}

} // namespace

void TestGatherTimeline::concurrentFetchesTakeTheLowestFreeRow()
{
    GatherSpans spans;
    spans.setTimeOrigin(0);
    spans.append(overlappingRun());
    const auto &v = spans.track(0, SpanTrack::Fetch);
    QCOMPARE(v.size(), std::size_t(3));
    QCOMPARE(v[0].param, ParamId(1));
    QCOMPARE(int(v[0].row), 0);
    QCOMPARE(v[1].param, ParamId(2));
    QCOMPARE(int(v[1].row), 1);
    QCOMPARE(v[2].param, ParamId(3)); // row 0 is free again after 1 ended
    QCOMPARE(int(v[2].row), 0);
    QCOMPARE(spans.fetchRows(0), 2);
    QCOMPARE(spans.fetchRows(1), 1);
    QCOMPARE(int(spans.track(1, SpanTrack::Fetch).at(0).row), 0);
    const auto open = spans.openFetches();
    QCOMPARE(open.size(), std::size_t(1));
    QCOMPARE(open[0].param, ParamId(4));
    QCOMPARE(open[0].row, 1);

    // Overlapping spans never merge across rows, even zoomed out to one pixel.
    for (double secondsPerPixel : {1e-6, 1.0}) {
        std::vector<TimelineBlock> blocks;
        spans.blocks(0, SpanTrack::Fetch, 0, 0.01, secondsPerPixel, blocks);
        QCOMPARE(mergedCount(blocks), std::size_t(3));
        for (const TimelineBlock &b : blocks) {
            const std::vector<ParamId> params = spans.paramsIn(b);
            QVERIFY(!params.empty());
            for (ParamId p : params)
                QCOMPARE(b.row, p == 2 ? 1 : 0);
        }
    }

    // Six in flight at once: rows 0 to 3, the last shared by the rest.
    std::vector<telemetry::Event> many;
    for (std::uint32_t p = 10; p < 16; ++p)
        many.push_back(eventAt(10 * ms + p * us, 2, makeFetchBegin({.param = p})));
    for (std::uint32_t p = 10; p < 16; ++p)
        many.push_back(eventAt(12 * ms + p * us, 2, makeFetchEnd({.param = p})));
    // A new step drops a fetch whose end was lost and frees its row.
    many.push_back(eventAt(13 * ms, 2, makeFetchBegin({.param = 20})));
    many.push_back(eventAt(14 * ms, 2, makeStepBegin(), 2));
    many.push_back(eventAt(15 * ms, 2, makeFetchBegin({.param = 21})));
    spans.append(many);
    std::vector<int> rows;
    for (const GatherSpan &s : spans.track(2, SpanTrack::Fetch))
        rows.push_back(s.row);
    QCOMPARE(rows, (std::vector<int>{0, 1, 2, 3, 3, 3}));
    QCOMPARE(spans.fetchRows(2), GatherSpans::kMaxFetchRows);
    QCOMPARE(spans.openFetches().back().param, ParamId(21));
    QCOMPARE(spans.openFetches().back().row, 0);
}

void TestGatherTimeline::concurrentFetchesAreDrawnAndClickedInTheirRows()
{
    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    timeline.setWorldSize(2);
    timeline.appendEvents(overlappingRun());
    timeline.refresh();
    timeline.setVisibleRange(0, 0.007);
    timeline.plot()->replot();

    // At 3 ms parameters 1 and 2 are both being gathered on rank 0, one above the other.
    const QPoint row0 = timeline.positionOf(0, 0.003, 0).toPoint();
    const QPoint row1 = timeline.positionOf(0, 0.003, 1).toPoint();
    QVERIFY(row1.y() - row0.y() >= 3);
    const auto block0 = timeline.blockAt(row0);
    const auto block1 = timeline.blockAt(row1);
    QVERIFY(block0 && block1);
    QCOMPARE(block0->row, 0);
    QCOMPARE(block1->row, 1);

    const QImage image = timeline.plot()->grab().toImage();
    QCOMPARE(image.pixelColor(row0), GatherTimeline::kindColor(SpanKind::Prefetch));
    QCOMPARE(image.pixelColor(row1), GatherTimeline::kindColor(SpanKind::Forward));
    // Parameter 4 is still in flight at the end, in row 1 under the finished 3 in row 0.
    const QPoint open0 = timeline.positionOf(0, 0.0058, 0).toPoint();
    const QPoint open1 = timeline.positionOf(0, 0.0058, 1).toPoint();
    QCOMPARE(image.pixelColor(open0), GatherTimeline::kindColor(SpanKind::Prefetch));
    const QColor backward = GatherTimeline::kindColor(SpanKind::Backward);
    const QColor inFlight = image.pixelColor(open1);
    QVERIFY2(inFlight != QColor(Qt::white) && inFlight.red() > inFlight.blue() &&
                 std::abs(inFlight.hue() - backward.hue()) <= 3,
             qPrintable(inFlight.name()));
    // Rank 1 never had two in flight: its one row is the whole fetch band.
    QCOMPARE(timeline.positionOf(1, 0.002, 0).y(), timeline.positionOf(1, 0.002, 1).y());

    QSignalSpy spy(&timeline, &GatherTimeline::paramsClicked);
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, row0);
    QCOMPARE(spy.count(), 1);
    QCOMPARE(spy.at(0).at(0).value<QList<quint32>>(), QList<quint32>{1});
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, row1);
    QCOMPARE(spy.count(), 2);
    QCOMPARE(spy.at(1).at(0).value<QList<quint32>>(), QList<quint32>{2});
    QCOMPARE(timeline.selection(), QList<quint32>{2});
    // In row 0 at 4.2 ms nothing runs (1 ended, 3 not begun) although row 1 holds 2.
    QVERIFY(timeline.paramsAt(timeline.positionOf(0, 0.0042, 0)).isEmpty());
    QCOMPARE(timeline.paramsAt(timeline.positionOf(0, 0.0042, 1)), QList<quint32>{2});
}

void TestGatherTimeline::inFlightFetchesAreHoveredAndClicked()
{
    const auto fwd = FetchReason::Forward;
    const auto pre = FetchReason::Prefetch;
    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    timeline.setWorldSize(2);
    // Rank 1 gathers 11 (row 0) and 12 (row 1), neither finished; rank 0's fetch of 5
    // ending at 6 ms is the newest event, so "now" is 6 ms.
    timeline.appendEvents(std::vector<telemetry::Event>{
        eventAt(1 * ms, 0, makeFetchBegin({.param = 5, .reason = fwd})),
        eventAt(1 * ms, 1, makeFetchBegin({.param = 11, .reason = fwd})),
        eventAt(2 * ms, 1, makeFetchBegin({.param = 12, .reason = pre})),
        eventAt(6 * ms, 0, makeFetchEnd({.param = 5, .reason = fwd})),
    });
    timeline.refresh();
    timeline.setVisibleRange(0, 0.008);
    timeline.plot()->replot();

    const QPoint row0 = timeline.positionOf(1, 0.004, 0).toPoint();
    const QPoint row1 = timeline.positionOf(1, 0.004, 1).toPoint();
    QVERIFY(row1.y() - row0.y() >= 3);
    QVERIFY(!timeline.blockAt(row0) && !timeline.blockAt(row1)); // nothing finished there
    const auto open0 = timeline.openFetchAt(row0);
    const auto open1 = timeline.openFetchAt(row1);
    QVERIFY(open0 && open1);
    QCOMPARE(open0->param, ParamId(11));
    QCOMPARE(open1->param, ParamId(12));
    QCOMPARE(timeline.toolTipAt(row0),
             QStringLiteral("rank 1 · forward\nparameter 11\nin flight since 1.000 ms, for "
                            "5.000 ms"));
    QCOMPARE(timeline.toolTipAt(row1),
             QStringLiteral("rank 1 · prefetch\nparameter 12\nin flight since 2.000 ms, for "
                            "4.000 ms"));
    // They are drawn up to now, and hit no further.
    QVERIFY(timeline.toolTipAt(timeline.positionOf(1, 0.0065, 0)).isEmpty());
    QVERIFY(timeline.paramsAt(timeline.positionOf(1, 0.0065, 1)).isEmpty());

    QSignalSpy spy(&timeline, &GatherTimeline::paramsClicked);
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, row0);
    QCOMPARE(spy.count(), 1);
    QCOMPARE(spy.at(0).at(0).value<QList<quint32>>(), QList<quint32>{11});
    QCOMPARE(timeline.selection(), QList<quint32>{11});
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, row1);
    QCOMPARE(spy.count(), 2);
    QCOMPARE(spy.at(1).at(0).value<QList<quint32>>(), QList<quint32>{12});
    QCOMPARE(timeline.selection(), QList<quint32>{12});

    // 11 ends at 7 ms and 13 begins then in the row it freed: the click still selects 11,
    // now a finished span, and where both are under the mouse the finished one wins.
    timeline.appendEvents(std::vector<telemetry::Event>{
        eventAt(7 * ms, 1, makeFetchEnd({.param = 11, .reason = fwd})),
        eventAt(7 * ms, 1, makeFetchBegin({.param = 13, .reason = pre})),
    });
    timeline.refresh();
    timeline.plot()->replot();
    const QPoint finished = timeline.positionOf(1, 0.004, 0).toPoint();
    QCOMPARE(finished, row0);
    const auto block = timeline.blockAt(finished);
    QVERIFY(block && block->track == SpanTrack::Fetch && block->row == 0);
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, finished);
    QCOMPARE(spy.count(), 3);
    QCOMPARE(spy.at(2).at(0).value<QList<quint32>>(), QList<quint32>{11});
    QCOMPARE(timeline.selection(), QList<quint32>{11});
    QCOMPARE(timeline.toolTipAt(finished),
             QStringLiteral("rank 1 · forward\nparameter 11\nat 1.000 ms, took 6.000 ms"));
    QCOMPARE(timeline.toolTipAt(row1),
             QStringLiteral("rank 1 · prefetch\nparameter 12\nin flight since 2.000 ms, for "
                            "5.000 ms"));
    const QPoint boundary = timeline.positionOf(1, 0.007, 0).toPoint();
    const auto open13 = timeline.openFetchAt(boundary);
    QVERIFY(open13);
    QCOMPARE(open13->param, ParamId(13));
    QCOMPARE(timeline.paramsAt(boundary), QList<quint32>{11});
}

void TestGatherTimeline::blocksHoldExactlyTheSpansInRange()
{
    // One 100 s fetch, then 20,000 short ones arriving in shuffled batches.
    GatherSpans spans;
    spans.setTimeOrigin(0);
    std::vector<telemetry::Event> events = {
        eventAt(0, 0, makeFetchBegin({.param = 1, .reason = FetchReason::GatheredParameters})),
        eventAt(100000 * ms, 0,
                makeFetchEnd({.param = 1, .reason = FetchReason::GatheredParameters}))};
    spans.append(events);
    std::vector<std::pair<double, double>> truth = {{0.0, 100.0}};
    QRandomGenerator rng(7);
    for (int batch = 0; batch < 20; ++batch) {
        events.clear();
        for (int i = 0; i < 1000; ++i) {
            const std::uint64_t start = rng.bounded(100000) * ms / 1000 * 1000;
            const std::uint64_t length = rng.bounded(1, 2000) * us;
            const ParamId p = ParamId(2 + batch * 1000 + i);
            events.push_back(eventAt(start, 0, makeFetchBegin({.param = p})));
            events.push_back(eventAt(start + length, 0, makeFetchEnd({.param = p})));
            truth.emplace_back(double(start) * 1e-9, double(start + length) * 1e-9);
        }
        spans.append(events);
    }
    QCOMPARE(spans.spanCount(), truth.size());
    const auto &v = spans.track(0, SpanTrack::Fetch);
    QVERIFY(std::is_sorted(v.begin(), v.end(), [](const GatherSpan &a, const GatherSpan &b) {
        return a.start < b.start;
    }));

    const std::pair<double, double> windows[] = {
        {50.0, 50.01}, {0.0, 100.0}, {99.99, 101.0}, {12.345, 12.346}, {-5.0, -1.0}};
    for (const auto &[t0, t1] : windows) {
        for (double secondsPerPixel : {1e-7, 1e-3, 1.0}) {
            std::vector<TimelineBlock> blocks;
            spans.blocks(0, SpanTrack::Fetch, t0, t1, secondsPerPixel, blocks);
            const auto expected = std::count_if(truth.begin(), truth.end(), [&](const auto &s) {
                return s.second >= t0 && s.first <= t1;
            });
            QCOMPARE(mergedCount(blocks), std::size_t(expected));
        }
    }
    // Windows that begin exactly where a chunk's latest span ends still hold that span.
    for (std::size_t c = 0; c * GatherSpans::kChunk < v.size(); c += 7) {
        const auto first = v.begin() + std::ptrdiff_t(c * GatherSpans::kChunk);
        const auto last =
            v.begin() + std::ptrdiff_t(std::min(v.size(), (c + 1) * GatherSpans::kChunk));
        double t0 = first->end;
        for (auto it = first; it != last; ++it)
            t0 = std::max(t0, it->end);
        if (t0 >= 100.0) continue; // the long span ends there
        const double t1 = t0 + 1e-9;
        std::vector<TimelineBlock> blocks;
        spans.blocks(0, SpanTrack::Fetch, t0, t1, 1e-3, blocks);
        const auto expected = std::count_if(truth.begin(), truth.end(), [&](const auto &s) {
            return s.second >= t0 && s.first <= t1;
        });
        QVERIFY(expected >= 2);
        QCOMPARE(mergedCount(blocks), std::size_t(expected));
    }
}

void TestGatherTimeline::clickOnSpanEmitsItsParameters()
{
    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    timeline.setWorldSize(2);
    const auto events = twoRankRun();
    timeline.appendEvents(events);
    timeline.refresh();
    timeline.setVisibleRange(0, 0.007);
    QVERIFY(!timeline.followLive());
    timeline.plot()->replot();

    QSignalSpy spy(&timeline, &GatherTimeline::paramsClicked);
    const QPoint onRank0 = timeline.positionOf(0, 0.002).toPoint();
    QCOMPARE(timeline.paramsAt(onRank0), QList<quint32>{5});
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, onRank0);
    QCOMPARE(spy.count(), 1);
    QCOMPARE(spy.at(0).at(0).value<QList<quint32>>(), QList<quint32>{5});
    QCOMPARE(timeline.selection(), QList<quint32>{5});

    const QPoint onRank1 = timeline.positionOf(1, 0.004).toPoint();
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, onRank1);
    QCOMPARE(spy.count(), 2);
    QCOMPARE(spy.at(1).at(0).value<QList<quint32>>(), QList<quint32>{6});
    QCOMPARE(timeline.selection(), QList<quint32>{6});

    // Between spans on rank 0 there is nothing: no signal, the selection is cleared.
    const QPoint gap = timeline.positionOf(0, 0.0055).toPoint();
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, gap);
    QCOMPARE(spy.count(), 2);
    QVERIFY(timeline.selection().isEmpty());

    // Rank 0 at 1.5 ms lies before rank 1's span: lanes do not leak into each other.
    QVERIFY(timeline.paramsAt(timeline.positionOf(1, 0.0015)).isEmpty());
}

void TestGatherTimeline::clickOnViolationMarkerEmitsTheParameter()
{
    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    const auto events = twoRankRun();
    timeline.appendEvents(events);
    timeline.setVisibleRange(0, 0.007);
    timeline.refresh();
    timeline.plot()->replot();

    const QPointF centre = timeline.positionOf(1, 0.006);
    const double laneTop = timeline.plot()->yAxis->coordToPixel(0.5);
    const QPoint marker(int(centre.x()), int(laneTop + 3));
    const auto block = timeline.blockAt(marker);
    QVERIFY(block.has_value());
    QCOMPARE(block->track, SpanTrack::Violation);
    QSignalSpy spy(&timeline, &GatherTimeline::paramsClicked);
    QTest::mouseClick(timeline.plot(), Qt::LeftButton, {}, marker);
    QCOMPARE(spy.count(), 1);
    QCOMPARE(spy.at(0).at(0).value<QList<quint32>>(), QList<quint32>{9});
}

void TestGatherTimeline::selectionMarksBlocks()
{
    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.setTimeOrigin(0);
    const auto events = twoRankRun();
    timeline.appendEvents(events);
    timeline.setVisibleRange(0, 0.007);
    timeline.setSelection({6});
    int selected = 0;
    for (const TimelineBlock &b : timeline.visibleBlocks()) {
        QCOMPARE(b.selected, b.rank == 1 && b.track == SpanTrack::Fetch);
        selected += b.selected;
    }
    QCOMPARE(selected, 1);
}

void TestGatherTimeline::subPixelSpansMergeWhenZoomedOut()
{
    // 10,000 fetches of 1 us, 1 us apart, over 20 ms on one rank.
    std::vector<telemetry::Event> events;
    const int n = 10000;
    for (int i = 0; i < n; ++i) {
        const std::uint64_t t = std::uint64_t(i) * 2 * us;
        const auto reason = i % 2 ? FetchReason::Backward : FetchReason::Forward;
        events.push_back(
            eventAt(t, 0, makeFetchBegin({.param = ParamId(i % 50), .reason = reason})));
        events.push_back(
            eventAt(t + us, 0, makeFetchEnd({.param = ParamId(i % 50), .reason = reason})));
    }
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    timeline.appendEvents(events);
    QCOMPARE(timeline.spanCount(), std::size_t(n));

    timeline.setVisibleRange(0, 0.020);
    timeline.plot()->replot();
    const int width = timeline.plot()->axisRect()->width();
    QVERIFY(width > 100);
    auto zoomedOut = timeline.visibleBlocks();
    QVERIFY(zoomedOut.size() < std::size_t(n));
    QVERIFY(zoomedOut.size() <= std::size_t(width) + 1);
    QCOMPARE(mergedCount(zoomedOut), std::size_t(n));
    // Clicking a merged block selects every parameter it holds.
    const QList<quint32> many = timeline.paramsAt(timeline.positionOf(0, 0.010));
    QCOMPARE(many.size(), 50);
    // The span under the mouse comes first (the tree makes it current, the detail shows
    // it), not the lowest id: at 10.0265 ms it is span 5013, parameter 13.
    const QList<quint32> here = timeline.paramsAt(timeline.positionOf(0, 0.0100265));
    QVERIFY(here.size() > 1);
    QCOMPARE(here.first(), 13u);

    // 20 us across the plot: 1 us is tens of pixels, every span is its own block.
    timeline.setVisibleRange(0.0100005, 0.0100205);
    timeline.plot()->replot();
    auto zoomedIn = timeline.visibleBlocks();
    QCOMPARE(zoomedIn.size(), std::size_t(11)); // starts at 10.000, 10.002 ... 10.020 ms
    for (const TimelineBlock &b : zoomedIn) {
        QCOMPARE(b.count, 1);
        const GatherSpan &s = timeline.spans().track(0, SpanTrack::Fetch).at(b.first);
        QCOMPARE(b.start, s.start);
        QCOMPARE(b.end, s.end);
        QCOMPARE(b.kind, s.kind);
    }
    const QList<quint32> one = timeline.paramsAt(timeline.positionOf(0, 0.0100205 - 1.5e-6));
    QCOMPARE(one.size(), 1);
}

void TestGatherTimeline::millionEvents()
{
    const int ranks = 4;
    const int perRank = 250000; // events: half FetchBegin, half FetchEnd
    std::vector<telemetry::Event> events;
    events.reserve(std::size_t(ranks) * perRank);
    for (int i = 0; i < perRank / 2; ++i) {
        for (int r = 0; r < ranks; ++r) {
            const std::uint64_t t = std::uint64_t(i) * 10 * us + std::uint64_t(r) * us;
            const auto param = ParamId(i % 1000);
            const auto reason = FetchReason(i % 5);
            events.push_back(eventAt(t, r, makeFetchBegin({.param = param, .reason = reason})));
            events.push_back(
                eventAt(t + 4 * us, r, makeFetchEnd({.param = param, .reason = reason})));
        }
    }
    QCOMPARE(events.size(), std::size_t(1000000));

    GatherTimeline timeline;
    timeline.resize(1200, 500);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setWorldSize(ranks);
    const std::size_t chunk = 65536;
    for (std::size_t i = 0; i < events.size(); i += chunk)
        timeline.appendEvents(std::span<const telemetry::Event>(events).subspan(
            i, std::min(chunk, events.size() - i)));
    QCOMPARE(timeline.spanCount(), std::size_t(500000));

    timeline.fitAll();
    timeline.refresh();
    timeline.plot()->replot();
    const auto blocks = timeline.visibleBlocks();
    const std::size_t width = std::size_t(timeline.plot()->axisRect()->width());
    QVERIFY(!blocks.empty());
    QVERIFY(blocks.size() <= ranks * (width + 1));
    QCOMPARE(mergedCount(blocks), std::size_t(500000));
    QVERIFY(!timeline.paramsAt(timeline.positionOf(2, 0.6)).isEmpty());

    // Zoomed into 100 us of rank 3 the spans are exact again.
    timeline.setVisibleRange(0.5, 0.5001);
    timeline.plot()->replot();
    for (const TimelineBlock &b : timeline.visibleBlocks())
        QCOMPARE(b.count, 1);
    QVERIFY(!timeline.plot()->toPixmap(400, 200).isNull());
}

void TestGatherTimeline::followLiveTracksTheNewestEvents()
{
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.setTimeOrigin(0);
    QVERIFY(timeline.followLive());
    QSignalSpy spy(&timeline, &GatherTimeline::followLiveChanged);
    std::vector<telemetry::Event> events;
    for (int i = 0; i < 100; ++i) {
        events.push_back(eventAt(std::uint64_t(i) * 1000 * ms, 0, makeFetchBegin({.param = 1})));
        events.push_back(eventAt(std::uint64_t(i) * 1000 * ms + ms, 0, makeFetchEnd({.param = 1})));
    }
    timeline.appendEvents(events);
    timeline.refresh();
    QVERIFY(timeline.visibleEnd() >= 99.001);
    QVERIFY(timeline.visibleStart() > 50.0);

    timeline.setVisibleRange(10, 20);
    QVERIFY(!timeline.followLive());
    QCOMPARE(spy.count(), 1);
    timeline.refresh();
    QCOMPARE(timeline.visibleStart(), 10.0);

    timeline.setFollowLive(true);
    QCOMPARE(spy.count(), 2);
    QVERIFY(timeline.visibleEnd() >= 99.001);
    QVERIFY(qAbs(timeline.visibleEnd() - timeline.visibleStart() - 10.0) < 1e-9);
}

namespace {

// Three steps of 10 ms on two ranks; a violation on rank 1 in step 1 and on rank 0 in step 3;
// parameter 7 gathered once a step on rank 0.
std::vector<telemetry::Event> threeSteps()
{
    std::vector<telemetry::Event> e;
    for (std::uint32_t step = 1; step <= 3; ++step) {
        const std::uint64_t t0 = (step - 1) * 10 * ms;
        for (int r = 0; r < 2; ++r)
            e.push_back(eventAt(t0 + std::uint64_t(r) * us, r, makeStepBegin(), step));
        e.push_back(eventAt(t0 + 2 * ms, 0, makeFetchBegin({.param = 7}), step));
        e.push_back(eventAt(t0 + 3 * ms, 0, makeFetchEnd({.param = 7}), step));
        e.push_back(eventAt(t0 + 4 * ms, 1, makeFetchBegin({.param = 8}), step));
        e.push_back(eventAt(t0 + 5 * ms, 1, makeFetchEnd({.param = 8}), step));
    }
    e.push_back(eventAt(6 * ms, 1, makeUnregisteredAccess({.accessor = 3, .param = 9}), 1));
    e.push_back(eventAt(26 * ms, 0, makeUnregisteredAccess({.accessor = 4, .param = 11}), 3));
    return e;
}

} // namespace

void TestGatherTimeline::stepNavigationShowsTheStep()
{
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.setTimeOrigin(0);
    timeline.appendEvents(threeSteps());
    QVERIFY(timeline.goToStep(2));
    QVERIFY(!timeline.followLive());
    // from step 2's first StepBegin (10 ms) to step 3's (20 ms), 1 % either side
    QVERIFY(qAbs(timeline.visibleStart() - 0.0099) < 1e-9);
    QVERIFY(qAbs(timeline.visibleEnd() - 0.0201) < 1e-9);
    QVERIFY(timeline.goToStep(3)); // the last: to the newest event
    QVERIFY(timeline.visibleStart() < 0.020 && timeline.visibleEnd() > 0.026);
    QVERIFY(!timeline.goToStep(9));
    QVERIFY(timeline.visibleStart() < 0.020); // unchanged
    // the toolbar's box does the same
    auto *box = timeline.findChild<QSpinBox *>(QStringLiteral("stepBox"));
    QVERIFY(box);
    box->setValue(1);
    Q_EMIT box->editingFinished();
    QVERIFY(timeline.visibleStart() < 0 && timeline.visibleEnd() > 0.0099 &&
            timeline.visibleEnd() < 0.0102);
}

void TestGatherTimeline::violationNavigationLandsOnEachInTurn()
{
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.setTimeOrigin(0);
    timeline.appendEvents(threeSteps());
    timeline.setVisibleRange(0, 0.002); // 2 ms wide, centred at 1 ms
    QSignalSpy shown(&timeline, &GatherTimeline::violationShown);
    auto v = timeline.goToViolation(true);
    QVERIFY(v);
    QCOMPARE(v->rank, 1);
    QCOMPARE(v->span.param, ParamId(9));
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.006) < 1e-9);
    QVERIFY(qAbs(timeline.visibleEnd() - timeline.visibleStart() - 0.002) < 1e-9); // zoom kept
    QCOMPARE(shown.count(), 1);
    QCOMPARE(shown.last().at(0).toInt(), 1);
    QCOMPARE(shown.last().at(1).toUInt(), 9u);
    QCOMPARE(shown.last().at(2).toUInt(), 3u);
    v = timeline.goToViolation(true);
    QVERIFY(v && v->rank == 0 && v->span.param == ParamId(11));
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.026) < 1e-9);
    QVERIFY(!timeline.goToViolation(true)); // none after the last: the view stays
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.026) < 1e-9);
    v = timeline.goToViolation(false);
    QVERIFY(v && v->span.param == ParamId(9));
    // on one rank only
    timeline.setVisibleRange(0, 0.002);
    v = timeline.goToViolation(true, 0);
    QVERIFY(v && v->rank == 0 && v->span.param == ParamId(11));
    // the toolbar's buttons
    timeline.setVisibleRange(0.03, 0.032);
    timeline.findChild<QToolButton *>(QStringLiteral("previousViolation"))->click();
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.026) < 1e-9);
}

void TestGatherTimeline::gatherNavigationFollowsOneParameter()
{
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.setTimeOrigin(0);
    timeline.appendEvents(threeSteps());
    timeline.setVisibleRange(0, 0.001);
    for (double at : {0.0025, 0.0125, 0.0225}) {
        const auto g = timeline.goToGather(7, true);
        QVERIFY(g && g->rank == 0 && g->span.param == ParamId(7));
        QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - at) < 1e-9);
    }
    QVERIFY(!timeline.goToGather(7, true));
    QCOMPARE(timeline.selection(), QList<quint32>{7});
    QVERIFY(timeline.goToGather(7, false));
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.0125) < 1e-9);
    QVERIFY(!timeline.goToGather(99, true));
}

void TestGatherTimeline::keysZoomPanAndFit()
{
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    timeline.appendEvents(threeSteps());
    timeline.setVisibleRange(0.010, 0.020);
    QWidget *plot = timeline.plot();
    QTest::keyClick(plot, Qt::Key_W);
    QVERIFY(qAbs(timeline.visibleEnd() - timeline.visibleStart() - 0.008) < 1e-9);
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.015) < 1e-9);
    QTest::keyClick(plot, Qt::Key_S);
    QVERIFY(qAbs(timeline.visibleEnd() - timeline.visibleStart() - 0.010) < 1e-9);
    QTest::keyClick(plot, Qt::Key_D);
    QVERIFY(qAbs(timeline.visibleStart() - 0.012) < 1e-9);
    QTest::keyClick(plot, Qt::Key_A);
    QVERIFY(qAbs(timeline.visibleStart() - 0.010) < 1e-9);
    QTest::keyClick(plot, Qt::Key_N);
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.026) < 1e-9);
    QTest::keyClick(plot, Qt::Key_N, Qt::ShiftModifier);
    QVERIFY(qAbs((timeline.visibleStart() + timeline.visibleEnd()) / 2 - 0.006) < 1e-9);
    QTest::keyClick(plot, Qt::Key_F);
    QVERIFY(timeline.visibleStart() <= 0 && timeline.visibleEnd() >= 0.026);
    QVERIFY(timeline.keyboardHelp().contains(QStringLiteral("N / Shift+N")));
}

void TestGatherTimeline::rangeSummaryEqualsTheEventsSums()
{
    // 2 ranks x 200 fetches: parameter i % 7, caused by module i % 3, i * 10 bytes, 1 + i % 4
    // us long, one every 10 us.
    std::vector<telemetry::Event> events;
    std::map<ParamId, GatherSpans::Totals> byParam;
    std::map<ModuleId, GatherSpans::Totals> byModule;
    for (int r = 0; r < 2; ++r)
        for (int i = 0; i < 200; ++i) {
            const std::uint64_t t = std::uint64_t(i) * 10 * us;
            const auto param = ParamId(i % 7);
            const auto cause = ModuleId(i % 3);
            const std::uint64_t bytes = std::uint64_t(i) * 10;
            const std::uint64_t d = (1 + std::uint64_t(i % 4)) * us;
            events.push_back(eventAt(t, r, makeFetchBegin({.param = param, .cause = cause})));
            events.push_back(
                eventAt(t + d, r, makeFetchEnd({.param = param, .cause = cause, .bytes = bytes})));
            if (i >= 50 && i < 150) { // [0.5 ms, 1.5 ms)
                for (GatherSpans::Totals *tot : {&byParam[param], &byModule[cause]}) {
                    ++tot->gathers;
                    tot->seconds += double(d) * 1e-9;
                    tot->bytes += bytes;
                }
            }
        }
    GatherTimeline timeline;
    timeline.setTimeOrigin(0);
    timeline.appendEvents(events);
    const auto rows = timeline.rangeSummary(0.0005, 0.0015);
    QCOMPARE(rows.size(), byParam.size() + byModule.size());
    for (const models::RangeRow &row : rows) {
        const GatherSpans::Totals &want = row.module ? byModule.at(row.id) : byParam.at(row.id);
        QCOMPARE(row.gathers, want.gathers);
        QCOMPARE(row.bytes, want.bytes);
        QVERIFY(qAbs(row.seconds - want.seconds) < 1e-12);
    }
    // one rank: half of it
    std::uint64_t all = 0, rank1 = 0;
    for (const auto &row : rows)
        if (!row.module) all += row.gathers;
    for (const auto &row : timeline.rangeSummary(0.0005, 0.0015, 1))
        if (!row.module) rank1 += row.gathers;
    QCOMPARE(all, std::uint64_t(200));
    QCOMPARE(rank1, std::uint64_t(100));
    QVERIFY(timeline.rangeSummary(5.0, 6.0).empty());
}

void TestGatherTimeline::shiftDragSelectsARange()
{
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    timeline.appendEvents(threeSteps());
    timeline.setVisibleRange(0, 0.030);
    timeline.plot()->replot();
    QSignalSpy selected(&timeline, &GatherTimeline::rangeSelected);
    QWidget *plot = timeline.plot();
    const double y = timeline.positionOf(0, 0.001).y();
    const QPointF a(timeline.plot()->xAxis->coordToPixel(0.010), y);
    const QPointF b(timeline.plot()->xAxis->coordToPixel(0.020), y);
    auto send = [plot](QEvent::Type type, QPointF at, Qt::MouseButton button,
                       Qt::MouseButtons buttons) {
        QMouseEvent e(type, at, plot->mapToGlobal(at), button, buttons, Qt::ShiftModifier);
        QApplication::sendEvent(plot, &e);
    };
    send(QEvent::MouseButtonPress, a, Qt::LeftButton, Qt::LeftButton);
    send(QEvent::MouseMove, (a + b) / 2, Qt::NoButton, Qt::LeftButton);
    send(QEvent::MouseMove, b, Qt::NoButton, Qt::LeftButton);
    send(QEvent::MouseButtonRelease, b, Qt::LeftButton, Qt::NoButton);
    QCOMPARE(selected.count(), 1);
    QVERIFY(qAbs(selected.last().at(0).toDouble() - 0.010) < 1e-4);
    QVERIFY(qAbs(selected.last().at(1).toDouble() - 0.020) < 1e-4);
    // a selection is not a pan: the view stayed
    QVERIFY(qAbs(timeline.visibleStart()) < 1e-12 && qAbs(timeline.visibleEnd() - 0.030) < 1e-12);
}

void TestGatherTimeline::foldedLaneCountsTheRanksGathering()
{
    // 8 ranks over [0, 1 ms]: 0-3 gather for forward, 4-5 for backward, 6 prefetches, 7 idles;
    // rank 0 prefetches too (it counts once, as forward).
    std::vector<telemetry::Event> events;
    auto fetch = [&](int rank, ParamId p, FetchReason reason) {
        events.push_back(eventAt(0, rank, makeFetchBegin({.param = p, .reason = reason})));
        events.push_back(eventAt(1 * ms, rank, makeFetchEnd({.param = p, .reason = reason})));
    };
    for (int r = 0; r < 4; ++r)
        fetch(r, 1, FetchReason::Forward);
    fetch(4, 2, FetchReason::Backward);
    fetch(5, 2, FetchReason::Backward);
    fetch(6, 3, FetchReason::Prefetch);
    fetch(0, 4, FetchReason::Prefetch);
    events.push_back(eventAt(2 * ms, 7, makeUnregisteredAccess({.accessor = 3, .param = 9})));
    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setWorldSize(8);
    timeline.setTimeOrigin(0);
    timeline.appendEvents(events);
    timeline.setVisibleRange(-0.001, 0.003);
    QCOMPARE(timeline.ranksGatheringAt(0.0005), (std::array<int, 3>{4, 2, 1}));
    QCOMPARE(timeline.ranksGatheringAt(0.0015), (std::array<int, 3>{0, 0, 0}));
    QCOMPARE(timeline.shownLanes(), 8);

    auto *fold = timeline.findChild<QToolButton *>(QStringLiteral("foldRanks"));
    QVERIFY(fold);
    fold->click();
    QVERIFY(timeline.folded());
    QCOMPARE(timeline.shownLanes(), 1);
    QCOMPARE(timeline.laneCount(), 8); // the ranks are still there
    timeline.plot()->replot();
    const auto ticker = timeline.plot()->yAxis->ticker().dynamicCast<QCPAxisTickerText>();
    QVERIFY(ticker);
    QCOMPARE(ticker->ticks().values(), QStringList{QStringLiteral("8 ranks")});
    const QPointF mid(timeline.plot()->xAxis->coordToPixel(0.0005),
                      timeline.plot()->yAxis->coordToPixel(0));
    const QString tip = timeline.toolTipAt(mid);
    QVERIFY2(tip.contains(QStringLiteral("7 of 8 ranks gathering")), qPrintable(tip));
    QVERIFY(tip.contains(QStringLiteral("forward 4 · backward 2 · other 1")));
    QVERIFY(timeline.paramsAt(mid).isEmpty()); // no one rank's span to pick
    QVERIFY(!timeline.plot()->toPixmap(600, 200).isNull());
    // deep in a zoom (a picosecond across 900 px) the spans' ends lie far beyond any int of
    // pixels: clamped before they are converted
    timeline.setVisibleRange(0.0005, 0.0005 + 1e-12);
    QVERIFY(!timeline.plot()->toPixmap(600, 200).isNull());
    QCOMPARE(timeline.ranksGatheringAt(0.0005), (std::array<int, 3>{4, 2, 1}));
    timeline.setVisibleRange(-0.001, 0.003);
    // navigation works folded
    QVERIFY(timeline.goToViolation(true));

    timeline.setFolded(false);
    QVERIFY(!fold->isChecked());
    QCOMPARE(timeline.shownLanes(), 8);
    timeline.setVisibleRange(-0.001, 0.003);
    QVERIFY(!timeline.paramsAt(timeline.positionOf(4, 0.0005)).isEmpty());
}

void TestGatherTimeline::sixtyFourLanesThinTheirLabels()
{
    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setWorldSize(64);
    timeline.refresh();
    timeline.plot()->replot();
    timeline.plot()->replot();
    QCOMPARE(timeline.laneCount(), 64);
    const auto ticker = timeline.plot()->yAxis->ticker().dynamicCast<QCPAxisTickerText>();
    QVERIFY(ticker);
    const auto ticks = ticker->ticks();
    QVERIFY(ticks.size() > 1 && ticks.size() < 64);
    QCOMPARE(ticks.value(0), QStringLiteral("rank 0"));
    // Labels never closer than a text line.
    const double spacing = timeline.plot()->yAxis->coordToPixel(ticks.keys().at(1)) -
                           timeline.plot()->yAxis->coordToPixel(ticks.keys().at(0));
    QVERIFY(spacing >= timeline.fontMetrics().height());
    QCOMPARE(timeline.plot()->yAxis->range().upper, 63.5);
}

// 800 steps over 2 s: zoomed out, every k-th step is labelled (k of 1, 2, 5, 10, ...) with
// room between labels; zoomed in, every step.
void TestGatherTimeline::stepLabelsShowAsManyAsFit()
{
    GatherTimeline timeline;
    timeline.resize(900, 300);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    timeline.setTimeOrigin(0);
    std::vector<telemetry::Event> events;
    for (std::uint32_t step = 1; step <= 800; ++step)
        events.push_back(eventAt(step * 2500 * us, 0, makeStepBegin(), step));
    timeline.appendEvents(events);
    timeline.setVisibleRange(0, 2.01);
    timeline.plot()->replot();

    const QFontMetricsF fm(timeline.plot()->xAxis2->tickLabelFont());
    // The labelled steps, left to right; problem says which label touches its neighbour.
    auto labelled = [&](QString &problem) {
        const QMap<double, QString> labels = timeline.stepLabels();
        double lastRight = -1e9;
        QList<int> steps;
        for (auto it = labels.cbegin(); it != labels.cend(); ++it) {
            const double px = timeline.plot()->xAxis->coordToPixel(it.key());
            const double half = fm.horizontalAdvance(it.value()) / 2;
            if (px - half <= lastRight) problem += it.value() + QStringLiteral(" overlaps; ");
            lastRight = px + half;
            steps << it.value().mid(5).toInt();
        }
        return steps;
    };
    QString problem;
    const QList<int> zoomedOut = labelled(problem);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QVERIFY2(zoomedOut.size() >= 8, qPrintable(QString::number(zoomedOut.size())));
    const int stride = zoomedOut.value(1) - zoomedOut.value(0);
    QVERIFY(QList<int>({2, 5, 10, 20, 50, 100}).contains(stride));
    for (int step : zoomedOut)
        QCOMPARE(step % stride, 0);

    timeline.setVisibleRange(0.001, 0.0201); // steps 1 .. 8
    timeline.plot()->replot();
    QCOMPARE(labelled(problem), (QList<int>{1, 2, 3, 4, 5, 6, 7, 8}));
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
}

// Gradient reduce-scatters pair into spans of their own track, drawn below the all-gathers in
// their own colour, hovered with the module whose gradients they reduce.
void TestGatherTimeline::reduceScattersHaveTheirOwnTrack()
{
    using telemetry::makeReduceScatterBegin;
    using telemetry::makeReduceScatterEnd;
    const telemetry::ReduceScatterFields group{.module = 2, .bytes = 4096, .params = 3};
    const telemetry::ReduceScatterFields one{.module = 3, .param = 6, .bytes = 64, .params = 1};
    const std::vector<telemetry::Event> events = {
        eventAt(0, 0, makeStepBegin(), 1),
        eventAt(1 * ms, 0, makeFetchBegin({.param = 5, .cause = 2})),
        eventAt(1 * ms, 0, makeReduceScatterBegin(group)),
        eventAt(2 * ms, 1, makeReduceScatterBegin(one)),
        eventAt(5 * ms, 0, makeFetchEnd({.param = 5, .cause = 2})),
        eventAt(5 * ms, 0, makeReduceScatterEnd(group)),
        eventAt(6 * ms, 1, makeReduceScatterEnd(one)),
        eventAt(7 * ms, 1, makeReduceScatterEnd(one)), // its begin was not seen: a point
    };
    GatherSpans spans;
    spans.setTimeOrigin(0);
    spans.append(events);
    QCOMPARE(spans.spanCount(), std::size_t(1)); // the fetch alone
    QCOMPARE(spans.reduceScatterCount(), std::size_t(3));
    const auto &r0 = spans.track(0, SpanTrack::ReduceScatter);
    QCOMPARE(r0.size(), std::size_t(1));
    QCOMPARE(r0[0].kind, SpanKind::ReduceScatter);
    QCOMPARE(r0[0].module, ModuleId(2));
    QCOMPARE(r0[0].param, kNoParam);
    QCOMPARE(r0[0].params, 3u);
    QCOMPARE(r0[0].start, 0.001);
    QCOMPARE(r0[0].end, 0.005);
    const auto &r1 = spans.track(1, SpanTrack::ReduceScatter);
    QCOMPARE(r1.size(), std::size_t(2));
    QCOMPARE(r1[0].param, ParamId(6));
    QCOMPARE(r1[0].start, 0.002);
    QCOMPARE(r1[1].start, r1[1].end);

    for (int k = 0; k < kSpanKindCount; ++k)
        if (SpanKind(k) != SpanKind::ReduceScatter)
            QVERIFY(GatherTimeline::kindColor(SpanKind(k)) !=
                    GatherTimeline::kindColor(SpanKind::ReduceScatter));
    QCOMPARE(GatherTimeline::kindName(SpanKind::ReduceScatter), QStringLiteral("reduce-scatter"));

    GatherTimeline timeline;
    timeline.resize(900, 400);
    timeline.show();
    QVERIFY(QTest::qWaitForWindowExposed(&timeline));
    state::EngineState st;
    st.worldSize = 2;
    st.modules = {{0, "", "Model", kNoModule},
                  {1, "embed", "Embedding", 0},
                  {2, "blocks.0", "Block", 0},
                  {3, "blocks.1", "Block", 0}};
    timeline.setState(st);
    timeline.setTimeOrigin(0);
    timeline.appendEvents(events);
    timeline.refresh();
    timeline.setVisibleRange(0, 0.008);
    timeline.plot()->replot();
    QCOMPARE(timeline.reduceScatterCount(), std::size_t(3));
    const QImage image = timeline.plot()->grab().toImage();
    const QPoint reduce = timeline.reduceScatterPositionOf(0, 0.003).toPoint();
    const QPoint fetch = timeline.positionOf(0, 0.003).toPoint();
    QVERIFY(reduce.y() > fetch.y()); // below the all-gathers
    QCOMPARE(image.pixelColor(reduce), GatherTimeline::kindColor(SpanKind::ReduceScatter));
    QCOMPARE(image.pixelColor(fetch), GatherTimeline::kindColor(SpanKind::Forward));
    const auto block = timeline.blockAt(reduce);
    QVERIFY(block);
    QCOMPARE(block->track, SpanTrack::ReduceScatter);
    const QString tip = timeline.toolTipAt(reduce);
    QVERIFY2(tip.contains(QStringLiteral("reduce-scatter")) &&
                 tip.contains(QStringLiteral("gradients of blocks.0 (3 parameters)")),
             qPrintable(tip));
    // A whole group has no parameter to select.
    QVERIFY(timeline.paramsAt(reduce).isEmpty());
    QVERIFY(timeline.toolTipAt(timeline.reduceScatterPositionOf(1, 0.004))
                .contains(QStringLiteral("module blocks.1")));
}

QTEST_MAIN(TestGatherTimeline)
#include "tst_gathertimeline.moc"

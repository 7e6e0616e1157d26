// The partition map puts each rank's shard at [r*p, (r+1)*p) of the padded length, marks
// the tail padding and colours by status, from 1 to 64 ranks.

#include <QImage>
#include <QTest>

#include "state/partition.h"
#include "views/partitionmap.h"

using namespace shardscope;
using shardscope::views::PartitionMap;
using shardscope::views::ShardRect;

namespace {

state::ParamRecord makeParam(ParamId id, const std::string &name, ModuleId owner,
                             std::int64_t numel, int world, std::vector<ParamStatus> status = {})
{
    const state::PartitionLayout l = state::PartitionLayout::make(numel, world);
    state::ParamRecord p;
    p.id = id;
    p.name = name;
    p.owner = owner;
    p.shape = {numel};
    p.numel = numel;
    p.paddedNumel = l.paddedNumel;
    p.partitionNumel = l.partitionNumel;
    p.partitioned = true;
    p.status = status.empty() ? std::vector<ParamStatus>(world, ParamStatus::NotAvailable) : status;
    return p;
}

state::EngineState makeState(int world, std::vector<state::ParamRecord> params)
{
    state::EngineState s;
    s.worldSize = world;
    s.modules = {state::ModuleRecord{0, "", "Model", kNoModule},
                 state::ModuleRecord{1, "fc", "Linear", 0}};
    s.params = std::move(params);
    return s;
}

// x of flat element e when the row spans the padded length.
double xAt(const ShardRect &r, std::int64_t e, std::int64_t padded)
{
    return r.row.left() + r.row.width() * double(e) / double(padded);
}

} // namespace

class TestPartitionMap : public QObject
{
    Q_OBJECT

  private slots:
    void unevenSizesPutPaddingOnTheTailRank();
    void everyRankColouredByItsStatus();
    void paddingIsHatched();
    void singleRankHoldsEverything();
    void sixtyFourRanksFitAndStayOrdered();
    void moduleStacksItsParameters();
    void persistentParameterIsWholeOnEveryRank();
    void inconsistentRecordIsRedrawnFromThePartitionMath();
    void fsdpAndHsdpShardsAsTheProducerLaidThemOut();
    void unknownSelectionShowsNothing();
    void recordsGivenDirectlyAreShownAsIs();
    void largeModuleShowsWhatFitsAndCountsTheRest();
    void toolTipSaysOffsetLengthPaddingAndStatus();
};

void TestPartitionMap::unevenSizesPutPaddingOnTheTailRank()
{
    PartitionMap map;
    map.resize(640, 300);
    map.setState(makeState(4, {makeParam(7, "embed.weight", 1, 10, 4)}));
    map.setParameter(7);
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 4);
    for (int r = 0; r < 4; ++r) {
        const ShardRect &s = rects[r];
        QCOMPARE(s.rank, r);
        QCOMPARE(s.param, ParamId(7));
        QCOMPARE(s.offset, std::int64_t(3 * r));
        QCOMPARE(s.length, std::int64_t(3));
        QCOMPARE(s.validNumel, r < 3 ? std::int64_t(3) : std::int64_t(1));
        QCOMPARE(s.paddingNumel, r < 3 ? std::int64_t(0) : std::int64_t(2));
        QCOMPARE(s.data.left(), xAt(s, 3 * r, 12));
        QCOMPARE(s.data.right(), xAt(s, 3 * r + s.validNumel, 12));
        QCOMPARE(s.padding.isEmpty(), r < 3);
        QVERIFY(s.row.top() >= 0 && s.row.bottom() <= map.height());
        if (r > 0) QVERIFY(s.row.top() >= rects[r - 1].row.bottom());
    }
    const ShardRect &tail = rects[3];
    QCOMPARE(tail.padding.left(), xAt(tail, 10, 12));
    QCOMPARE(tail.padding.right(), xAt(tail, 12, 12));
    QCOMPARE(tail.padding.right(), tail.row.right());
    QVERIFY(qAbs(tail.data.width() * 2 - tail.padding.width()) < 1e-9);
}

void TestPartitionMap::everyRankColouredByItsStatus()
{
    const std::vector<ParamStatus> status = {ParamStatus::Available, ParamStatus::Inflight,
                                             ParamStatus::NotAvailable, ParamStatus::Available};
    PartitionMap map;
    map.resize(640, 300);
    map.setState(makeState(4, {makeParam(7, "embed.weight", 1, 10, 4, status)}));
    map.setParameter(7);
    const QImage image = map.grab().toImage();
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 4);
    for (const ShardRect &s : rects) {
        QCOMPARE(s.status, status[s.rank]);
        const QPoint centre = s.data.center().toPoint();
        QCOMPARE(image.pixelColor(centre), PartitionMap::statusColor(s.status));
    }
    QVERIFY(PartitionMap::statusColor(ParamStatus::Available) !=
            PartitionMap::statusColor(ParamStatus::NotAvailable));
    QVERIFY(PartitionMap::statusColor(ParamStatus::Inflight) !=
            PartitionMap::statusColor(ParamStatus::NotAvailable));
}

void TestPartitionMap::paddingIsHatched()
{
    PartitionMap map;
    map.resize(640, 300);
    map.setState(makeState(4, {makeParam(7, "embed.weight", 1, 10, 4)}));
    map.setParameter(7);
    const QImage image = map.grab().toImage();
    const ShardRect tail = map.shardRects().at(3);
    QSet<QRgb> colours;
    const QRect inner = tail.padding.toRect().adjusted(3, 3, -3, -3);
    QVERIFY(inner.width() > 10 && inner.height() > 5);
    for (int y = inner.top(); y <= inner.bottom(); ++y)
        for (int x = inner.left(); x <= inner.right(); ++x)
            colours.insert(image.pixel(x, y));
    QVERIFY2(colours.size() >= 2, "padding should be hatched, not a flat fill");
}

void TestPartitionMap::singleRankHoldsEverything()
{
    PartitionMap map;
    map.resize(400, 200);
    map.setState(makeState(1, {makeParam(3, "fc.bias", 1, 10, 1, {ParamStatus::Available})}));
    map.setParameter(3);
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 1);
    QCOMPARE(rects[0].offset, std::int64_t(0));
    QCOMPARE(rects[0].validNumel, std::int64_t(10));
    QCOMPARE(rects[0].paddingNumel, std::int64_t(0));
    QVERIFY(rects[0].padding.isEmpty());
    QCOMPARE(rects[0].data, rects[0].row);
    QVERIFY(map.rowHeight() <= 24.0);
}

void TestPartitionMap::sixtyFourRanksFitAndStayOrdered()
{
    PartitionMap map;
    map.resize(800, 500);
    map.setState(makeState(64, {makeParam(9, "decoder.layers.0.mlp.fc1.weight", 1, 1000, 64)}));
    map.setParameter(9);
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 64);
    QVERIFY(map.rowHeight() >= 2.0);
    for (int r = 0; r < 64; ++r) {
        const ShardRect &s = rects[r];
        QCOMPARE(s.offset, std::int64_t(16 * r));
        QCOMPARE(s.length, std::int64_t(16));
        QVERIFY(s.row.bottom() <= map.height());
        if (r > 0) {
            QVERIFY(s.row.top() >= rects[r - 1].row.bottom());
            QVERIFY(s.data.isEmpty() || s.data.left() >= rects[r - 1].data.right() - 1e-9);
        }
    }
    // 1000 of 1024: rank 62 holds 8 real elements and 8 padding, rank 63 only padding.
    QCOMPARE(rects[62].validNumel, std::int64_t(8));
    QCOMPARE(rects[62].paddingNumel, std::int64_t(8));
    QVERIFY(rects[63].data.isEmpty());
    QCOMPARE(rects[63].paddingNumel, std::int64_t(16));
    QCOMPARE(rects[63].padding.left(), xAt(rects[63], 1008, 1024));
    for (int r = 0; r < 62; ++r)
        QVERIFY(rects[r].padding.isEmpty());
    const QImage image = map.grab().toImage();
    QVERIFY(!image.isNull());
}

void TestPartitionMap::moduleStacksItsParameters()
{
    PartitionMap map;
    map.resize(640, 400);
    map.setState(
        makeState(4, {makeParam(1, "fc.weight", 1, 12, 4), makeParam(2, "fc.bias", 1, 3, 4),
                      makeParam(3, "other.weight", 0, 8, 4)}));
    map.setModule(1);
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 8);
    for (int i = 0; i < 4; ++i) {
        QCOMPARE(rects[i].param, ParamId(1));
        QCOMPARE(rects[i].band, 0);
        QCOMPARE(rects[4 + i].param, ParamId(2));
        QCOMPARE(rects[4 + i].band, 1);
    }
    QVERIFY(rects[4].row.top() > rects[3].row.bottom());
    // fc.bias: 3 elements over 4 ranks, p = 1: rank 3 is all padding.
    QCOMPARE(rects[7].validNumel, std::int64_t(0));
    QCOMPARE(rects[7].paddingNumel, std::int64_t(1));
    QCOMPARE(map.selectedModule(), ModuleId(1));
    QCOMPARE(map.selectedParameter(), kNoParam);
}

void TestPartitionMap::persistentParameterIsWholeOnEveryRank()
{
    state::ParamRecord p = makeParam(5, "norm.weight", 1, 10, 4);
    p.persistent = true;
    p.partitioned = false;
    p.paddedNumel = 10;
    p.partitionNumel = 10;
    PartitionMap map;
    map.resize(640, 300);
    map.setState(makeState(4, {p}));
    map.setParameter(5);
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 4);
    for (const ShardRect &s : rects) {
        QVERIFY(!s.partitioned);
        QCOMPARE(s.offset, std::int64_t(0));
        QCOMPARE(s.validNumel, std::int64_t(10));
        QCOMPARE(s.data, s.row);
    }
}

void TestPartitionMap::inconsistentRecordIsRedrawnFromThePartitionMath()
{
    state::ParamRecord p = makeParam(4, "broken", 1, 10, 4, {ParamStatus::Available});
    p.paddedNumel = 5;
    p.partitionNumel = 7;
    PartitionMap map;
    map.resize(640, 300);
    map.setState(makeState(4, {p}));
    map.setParameter(4);
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 4);
    QCOMPARE(rects[3].offset, std::int64_t(9));
    QCOMPARE(rects[3].paddingNumel, std::int64_t(2));
    QCOMPARE(rects[0].status, ParamStatus::Available);
    QCOMPARE(rects[1].status, ParamStatus::NotAvailable); // no status reported for rank 1
    QVERIFY(!map.grab().isNull());
}

// FSDP2 pads dim 0: a 33 x 16 embedding on 2 ranks is 17 rows (272 elements) a rank, rank 1's
// last 16 padding. On HSDP's (replicate=2, shard=2) mesh ranks 2 and 3 hold shards 0 and 1.
void TestPartitionMap::fsdpAndHsdpShardsAsTheProducerLaidThemOut()
{
    state::ParamRecord p = makeParam(3, "embed.weight", 1, 528, 2);
    p.shape = {33, 16};
    p.paddedNumel = 544;
    p.partitionNumel = 272;
    p.placements = "Shard(0)";
    PartitionMap map;
    map.resize(640, 300);
    map.setState(makeState(2, {p}));
    map.setParameter(3);
    QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 2);
    QCOMPARE(rects[1].offset, std::int64_t(272));
    QCOMPARE(rects[1].validNumel, std::int64_t(256));
    QCOMPARE(rects[1].paddingNumel, std::int64_t(16));

    p.placements = "(Replicate(), Shard(0))";
    p.status.assign(4, ParamStatus::NotAvailable);
    map.setState(makeState(4, {p}));
    map.setParameter(3);
    rects = map.shardRects();
    QCOMPARE(rects.size(), 4);
    for (int r = 0; r < 4; ++r) {
        QCOMPARE(rects[r].offset, std::int64_t(272 * (r % 2)));
        QCOMPARE(rects[r].paddingNumel, std::int64_t(r % 2 ? 16 : 0));
    }
}

void TestPartitionMap::unknownSelectionShowsNothing()
{
    PartitionMap map;
    map.resize(400, 200);
    map.setState(makeState(4, {makeParam(7, "embed.weight", 1, 10, 4)}));
    map.setParameter(99);
    QVERIFY(map.shardRects().isEmpty());
    map.setParameter(7);
    QCOMPARE(map.shardRects().size(), 4);
    map.clear();
    QVERIFY(map.shardRects().isEmpty());
    QVERIFY(!map.grab().isNull());
}

void TestPartitionMap::recordsGivenDirectlyAreShownAsIs()
{
    PartitionMap map;
    map.resize(640, 400);
    map.setRecords(8, {makeParam(1, "fc.weight", 1, 20, 8), makeParam(2, "fc.bias", 1, 5, 8)});
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), 16);
    QCOMPARE(map.worldSize(), 8);
    // fc.weight: 20 over 8 ranks, p = 3, padded 24: rank 6 holds 2 + 1 padding, rank 7 only
    // padding.
    QCOMPARE(rects[6].validNumel, std::int64_t(2));
    QCOMPARE(rects[6].paddingNumel, std::int64_t(1));
    QCOMPARE(rects[7].validNumel, std::int64_t(0));
    QCOMPARE(rects[8].param, ParamId(2));
    map.setRecords(8, {});
    QVERIFY(map.shardRects().isEmpty());
}

void TestPartitionMap::largeModuleShowsWhatFitsAndCountsTheRest()
{
    std::vector<state::ParamRecord> params;
    for (ParamId i = 0; i < 40; ++i)
        params.push_back(makeParam(i, "layers." + std::to_string(i) + ".weight", 1, 1000 + i, 64));
    PartitionMap map;
    map.resize(640, 400);
    map.setState(makeState(64, params));
    map.setModule(1);
    QVERIFY(map.minimumSizeHint().height() < 400);
    const int hidden = map.hiddenParameters();
    QVERIFY(hidden > 0 && hidden < 40);
    const QVector<ShardRect> rects = map.shardRects();
    QCOMPARE(rects.size(), (40 - hidden) * 64);
    for (const ShardRect &s : rects)
        QVERIFY(s.row.bottom() <= map.height());
    QCOMPARE(rects.last().param, ParamId(40 - hidden - 1));
    QVERIFY(!map.grab().isNull());

    map.setParameter(39);
    QCOMPARE(map.hiddenParameters(), 0);
    QCOMPARE(map.shardRects().size(), 64);
}

void TestPartitionMap::toolTipSaysOffsetLengthPaddingAndStatus()
{
    PartitionMap map;
    map.resize(640, 300);
    map.setState(makeState(4, {makeParam(7, "embed.weight", 1, 10, 4,
                                         {ParamStatus::NotAvailable, ParamStatus::NotAvailable,
                                          ParamStatus::NotAvailable, ParamStatus::Inflight})}));
    map.setParameter(7);
    const ShardRect tail = map.shardRects().at(3);
    const ShardRect *hit = map.shardAt(tail.padding.center());
    QVERIFY(hit);
    QCOMPARE(hit->rank, 3);
    const QString tip = map.toolTipFor(*hit);
    QVERIFY2(tip.contains("rank 3 of embed.weight"), qPrintable(tip));
    QVERIFY2(tip.contains("offset 9, length 3: 1 real + 2 padding elements"), qPrintable(tip));
    QVERIFY2(tip.contains("INFLIGHT"), qPrintable(tip));
    QVERIFY(!map.shardAt(QPointF(1, 1)));
}

QTEST_MAIN(TestPartitionMap)
#include "tst_partitionmap.moc"

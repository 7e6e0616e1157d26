#include <QtTest>

#include <cstring>
#include <tuple>

#include "state/partition.h"
#include "testworld.h"

using namespace shardscope;

class TestPartition : public QObject
{
    Q_OBJECT
  private slots:
    void layoutMath_data();
    void layoutMath();
    void shardsTileWithoutGapOrOverlap();
    void reportedLayoutsOfFsdpAndHsdp();
    void roundTripIsBitExact_data();
    void roundTripIsBitExact();
    void persistenceThreshold();
    void rejectsBadWorld();
};

void TestPartition::layoutMath_data()
{
    QTest::addColumn<qint64>("numel");
    QTest::addColumn<int>("world");
    QTest::addColumn<qint64>("padded");
    QTest::addColumn<qint64>("part");
    QTest::addColumn<qint64>("tailValid");
    QTest::newRow("10/4") << qint64(10) << 4 << qint64(12) << qint64(3) << qint64(1);
    QTest::newRow("1/8") << qint64(1) << 8 << qint64(8) << qint64(1) << qint64(0);
    QTest::newRow("8/8") << qint64(8) << 8 << qint64(8) << qint64(1) << qint64(1);
    QTest::newRow("9/8") << qint64(9) << 8 << qint64(16) << qint64(2) << qint64(0);
    QTest::newRow("7/1") << qint64(7) << 1 << qint64(7) << qint64(7) << qint64(7);
    QTest::newRow("0/3") << qint64(0) << 3 << qint64(0) << qint64(0) << qint64(0);
}

void TestPartition::layoutMath()
{
    QFETCH(qint64, numel);
    QFETCH(int, world);
    QFETCH(qint64, padded);
    QFETCH(qint64, part);
    QFETCH(qint64, tailValid);
    const auto l = state::PartitionLayout::make(numel, world);
    QCOMPARE(l.paddedNumel, padded);
    QCOMPARE(l.partitionNumel, part);
    QCOMPARE(l.validNumel(world - 1), tailValid);
    QCOMPARE(l.paddingNumel(world - 1), part - tailValid);
}

// FSDP2 pads dim 0: 33 x 16 on 2 ranks is 17 rows a rank, 272 elements, the last 16 of
// rank 1's padding (describe()'s "shards"); make() would say 264 and no padding. HSDP on a
// (replicate=2, shard=2) mesh: 4 ranks, 2 shards, rank r holding shard r mod 2. Numbers that
// make no layout fall back to make().
void TestPartition::reportedLayoutsOfFsdpAndHsdp()
{
    const auto fsdp = state::PartitionLayout::reported(528, 544, 272, 2);
    QCOMPARE(fsdp.shards(), 2);
    QCOMPARE(fsdp.offset(1), std::int64_t(272));
    QCOMPARE(fsdp.validNumel(1), std::int64_t(256));
    QCOMPARE(fsdp.paddingNumel(1), std::int64_t(16));
    QCOMPARE(fsdp.totalPadding(), std::int64_t(16));

    const auto hsdp = state::PartitionLayout::reported(528, 544, 272, 4);
    QCOMPARE(hsdp.shards(), 2);
    QCOMPARE(hsdp.shardOf(3), 1);
    QCOMPARE(hsdp.shardOf(2), 0);
    QCOMPARE(hsdp.offset(hsdp.shardOf(3)), std::int64_t(272));

    const auto flat = state::PartitionLayout::make(528, 2);
    for (auto [padded, partition, world] : {std::tuple{std::int64_t(544), std::int64_t(0), 2},
                                            std::tuple{std::int64_t(544), std::int64_t(100), 2},
                                            std::tuple{std::int64_t(500), std::int64_t(250), 2},
                                            std::tuple{std::int64_t(816), std::int64_t(272), 2}}) {
        const auto l = state::PartitionLayout::reported(528, padded, partition, world);
        QCOMPARE(l.paddedNumel, flat.paddedNumel);
        QCOMPARE(l.partitionNumel, flat.partitionNumel);
    }
    // 3 shards do not divide 4 ranks.
    QCOMPARE(state::PartitionLayout::reported(528, 816, 272, 4).shards(), 4);
    QCOMPARE(state::PartitionLayout::reported(6, 8, 2, 4).shardOf(5), 1);
}

void TestPartition::shardsTileWithoutGapOrOverlap()
{
    for (int w = 1; w <= 8; ++w) {
        for (std::int64_t n : {std::int64_t(1), std::int64_t(w - 1), std::int64_t(w),
                               std::int64_t(w + 1), std::int64_t(1000003)}) {
            const auto l = state::PartitionLayout::make(n, w);
            QCOMPARE(l.paddedNumel % w, 0);
            QVERIFY(l.paddedNumel >= n && l.paddedNumel - n < w);
            std::int64_t next = 0, valid = 0;
            bool paddingStarted = false;
            for (int r = 0; r < w; ++r) {
                QCOMPARE(l.offset(r), next);
                next += l.partitionNumel;
                valid += l.validNumel(r);
                // padding lives only at the tail: once a shard has padding, every later one is all
                // padding
                if (paddingStarted) QCOMPARE(l.validNumel(r), 0);
                if (l.paddingNumel(r) > 0) paddingStarted = true;
            }
            QCOMPARE(next, l.paddedNumel);
            QCOMPARE(valid, n);
        }
    }
}

void TestPartition::roundTripIsBitExact_data()
{
    QTest::addColumn<int>("world");
    for (int w = 1; w <= 8; ++w)
        QTest::newRow(qPrintable(QString("world%1").arg(w))) << w;
}

// Partition a tensor in the engine, gather it on every rank, compare bits.
void TestPartition::roundTripIsBitExact()
{
    QFETCH(int, world);
    core::EngineConfig cfg;
    cfg.persistenceThreshold = 0;
    auto engine = test::makeEngine(world, cfg);
    std::vector<std::int64_t> sizes = {1, world - 1, world, world + 1, 1000003};
    std::vector<ParamId> ids;
    std::vector<std::vector<float>> values;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] == 0) continue;
        std::vector<float> v(static_cast<std::size_t>(sizes[i]));
        for (std::size_t k = 0; k < v.size(); ++k) // bit patterns that a lossy path would not keep
            v[k] = std::bit_cast<float>(
                static_cast<std::uint32_t>(0x3F000000u + k * 2654435761u % 0x00FFFFFFu));
        // Not "m" + to_string(i): GCC 12 at -O3 reports a false -Wrestrict inside operator+.
        const std::string name = std::string("m").append(std::to_string(i));
        const ModuleId m = engine->addModule(engine->root(), name, "Linear");
        ids.push_back(engine->addParameter(m, "weight", {sizes[i]}, DType::F32, v.data()));
        values.push_back(std::move(v));
    }
    engine->partition();
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const core::ParamInfo &info = engine->param(ids[i]);
        QVERIFY(info.partitioned);
        for (int r = 0; r < world; ++r) {
            auto shard = engine->shardData(r, ids[i]);
            QCOMPARE(static_cast<std::int64_t>(shard.size()), info.layout.partitionNumel);
            for (std::int64_t k = 0; k < info.layout.partitionNumel; ++k) {
                const std::int64_t g = info.layout.offset(r) + k;
                const float expect = g < info.numel ? values[i][g] : 0.0f;
                QCOMPARE(std::bit_cast<std::uint32_t>(shard[k]),
                         std::bit_cast<std::uint32_t>(expect));
            }
        }
    }
    std::vector<int> mismatches(world, 0);
    engine->forEachLocalRank([&](int r) {
        engine->beginStep(r);
        for (std::size_t i = 0; i < ids.size(); ++i) {
            core::GatheredParameters g(*engine, r, {ids[i]});
            const float *full = g[0].f32();
            if (std::memcmp(full, values[i].data(), values[i].size() * sizeof(float)) != 0)
                ++mismatches[r];
        }
        engine->endStep(r, 0.0);
    });
    for (int r = 0; r < world; ++r)
        QCOMPARE(mismatches[r], 0);
}

void TestPartition::persistenceThreshold()
{
    core::EngineConfig cfg;
    cfg.persistenceThreshold = 100;
    auto engine = test::makeEngine(4, cfg);
    const ModuleId m = engine->addModule(engine->root(), "lin", "Linear");
    auto small = test::iota(99);
    auto big = test::iota(100);
    const ParamId s = engine->addParameter(m, "bias", {99}, DType::F32, small.data());
    const ParamId b = engine->addParameter(m, "weight", {10, 10}, DType::F32, big.data());
    engine->partition();
    QVERIFY(engine->param(s).persistent);
    QVERIFY(!engine->param(s).partitioned);
    QVERIFY(!engine->param(b).persistent);
    QVERIFY(engine->param(b).partitioned);
    for (int r = 0; r < 4; ++r) {
        QCOMPARE(engine->status(r, s), ParamStatus::Available);
        QCOMPARE(engine->status(r, b), ParamStatus::NotAvailable);
    }
    QCOMPARE(core::EngineConfig{}.persistenceThreshold,
             std::int64_t(100000)); // DeepSpeed's default
}

void TestPartition::rejectsBadWorld()
{
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, state::PartitionLayout::make(10, 0));
}

QTEST_APPLESS_MAIN(TestPartition)
#include "tst_partition.moc"

// The training run on the engine, in process: the same loss curve for every world size,
// a loss that really falls, and the two user stories reported (or fixed) as they happen.

#include <QtTest>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/engine.h"
#include "nn/markov.h"
#include "nn/model.h"
#include "nn/trainer.h"
#include "telemetry/event.h"
#include "telemetry/eventfields.h"

using namespace shardscope;
using namespace shardscope::nn;

namespace {

// Sizes no world size from 2 to 4 divides (V*H = 558, V = 31, H = 18), a batch of 7
// sequences that leaves some ranks one short, and a threshold that partitions all but
// the smallest parameters.
TrainConfig smallConfig(int world)
{
    TrainConfig c;
    c.worldSize = world;
    c.steps = 20;
    c.layers = 2;
    c.hidden = 18;
    c.groups = 3;
    c.kernel = 5;
    c.vocab = 31;
    c.seq = 9;
    c.batch = 7;
    c.lr = 1e-2f;
    c.seed = 7;
    c.persistenceThreshold = 50;
    c.listen = false;
    return c;
}

struct Run
{
    std::unique_ptr<core::Engine> engine;
    TrainResult result;
};

Run train(const TrainConfig &c)
{
    Run run;
    run.engine = makeCpuEngine(c);
    run.result = runCpuTraining(c, *run.engine, {});
    return run;
}

double maxRelativeDifference(const std::vector<double> &a, const std::vector<double> &b)
{
    double worst = 0.0;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
    return worst;
}

std::vector<state::ViolationRecord> ofKind(const core::Engine &engine, ViolationKind kind)
{
    std::vector<state::ViolationRecord> out;
    for (const state::ViolationRecord &v : engine.violations())
        if (v.kind == kind) out.push_back(v);
    return out;
}

} // namespace

class TestTrainer : public QObject
{
    Q_OBJECT

  private slots:
    void worldSizesGiveTheSameLossCurve_data();
    void worldSizesGiveTheSameLossCurve();
    void fixesDoNotChangeTheMath();
    void defaultConfigurationLearns();
    void externalsNoneReportsBothStories();
    void externalsManualReportsNothing();
    void guardErrorStopsAtTheTiedHead();
    void guardAutoRegistersOnce();
    void dataIsTheSameForEveryRankSplit();
    void lossFloorIsTheDataEntropy();
    void defaultModelStaysAboveTheLossFloor();
    void stepReportsCountWhatTheEngineCounts();
    void overlappedCommunicationTrainsTheSame();
    void guardErrorWithOverlapStopsEveryRank();
    void everyGradientIsReduceScatteredOncePerStep();
};

void TestTrainer::worldSizesGiveTheSameLossCurve_data()
{
    QTest::addColumn<int>("externals");
    QTest::newRow("externals none") << int(Externals::None);
    QTest::newRow("externals manual") << int(Externals::Manual);
}

void TestTrainer::worldSizesGiveTheSameLossCurve()
{
    QFETCH(int, externals);
    std::vector<double> reference;
    for (int world = 1; world <= 4; ++world) {
        TrainConfig c = smallConfig(world);
        c.externals = static_cast<Externals>(externals);
        const Run run = train(c);
        QCOMPARE(run.result.losses.size(), std::size_t(20));
        if (world == 1) {
            reference = run.result.losses;
            // The curve is a real one: it falls, so equal curves mean equal training.
            QVERIFY2(
                reference.back() < 0.9 * reference.front(),
                qPrintable(
                    QStringLiteral("loss %1 -> %2").arg(reference.front()).arg(reference.back())));
            continue;
        }
        const double diff = maxRelativeDifference(run.result.losses, reference);
        qInfo("world size %d: largest relative difference from world size 1 over 20 steps: %.2e",
              world, diff);
        QVERIFY2(diff <= 1e-4,
                 qPrintable(QStringLiteral("world size %1: relative difference %2 from "
                                           "world size 1")
                                .arg(world)
                                .arg(diff)));
        // The parameters really were partitioned with padding: embed.weight (558) does not
        // divide by 4, and each rank holds only its shard.
        const core::ParamInfo &embed = run.engine->param(run.engine->findParam("embed.weight"));
        QVERIFY(embed.partitioned);
        QCOMPARE(embed.layout.paddedNumel % world, std::int64_t(0));
        QCOMPARE(run.engine->shardData(0, embed.id).size(),
                 std::size_t(embed.layout.partitionNumel));
        if (world == 4) QVERIFY(embed.layout.paddedNumel > embed.numel);
    }
}

// The stories' fixes change where parameters live, not what is computed.
void TestTrainer::fixesDoNotChangeTheMath()
{
    TrainConfig c = smallConfig(3);
    c.steps = 8;
    const Run none = train(c);
    c.externals = Externals::Manual;
    const Run manual = train(c);
    QVERIFY(maxRelativeDifference(manual.result.losses, none.result.losses) <= 1e-5);
}

void TestTrainer::defaultConfigurationLearns()
{
    TrainConfig c; // the command line's defaults: 4 ranks, 2 blocks, hidden 64, vocab 97
    c.steps = 40;
    c.listen = false;
    const Run run = train(c);
    const double first = run.result.firstLoss;
    const double last = run.result.lastLoss;
    // The first step sees an untrained model: about ln V.
    QVERIFY2(std::abs(first - std::log(double(c.vocab))) < 0.5, qPrintable(QString::number(first)));
    QVERIFY2(last <= 0.7 * first,
             qPrintable(QStringLiteral("loss fell only from %1 to %2 in %3 steps")
                            .arg(first)
                            .arg(last)
                            .arg(c.steps)));
}

void TestTrainer::externalsNoneReportsBothStories()
{
    TrainConfig c = smallConfig(2);
    c.steps = 3;
    const Run run = train(c);
    const core::Engine &e = *run.engine;

    // Story 1: lm_head reads embed.weight, owned by embed, unregistered: one record per
    // (accessor, param, rank), counted once per step.
    bool tied = false;
    for (const state::ViolationRecord &v : ofKind(e, ViolationKind::UnregisteredAccess)) {
        if (v.accessor == kNoModule) continue;
        QCOMPARE(e.modulePath(v.accessor), std::string("lm_head"));
        QCOMPARE(e.param(v.param).name, std::string("embed.weight"));
        QCOMPARE(e.modulePath(v.owner), std::string("embed"));
        QCOMPARE(v.fix, std::string("register_external_parameter(lm_head, embed.weight)"));
        QCOMPARE(v.action, GuardAction::Gathered);
        QCOMPARE(v.step, 1u);
        QCOMPARE(v.lastStep, 3u);
        QCOMPARE(v.count, std::uint64_t(3));
        tied = true;
    }
    QVERIFY(tied);

    // Story 2: weight_norm read pos_conv.weight outside any module (accessor none) ...
    const auto reads = ofKind(e, ViolationKind::UnregisteredAccess);
    QVERIFY(std::any_of(reads.begin(), reads.end(), [&](const state::ViolationRecord &v) {
        return v.accessor == kNoModule && v.owner == e.findModule("pos_conv") && v.step == 0;
    }));
    QCOMPARE(e.findParam("pos_conv.weight"), kNoParam);
    // ... and created weight_g and weight_v after partitioning: late, never partitioned.
    std::vector<std::string> late;
    for (const state::ViolationRecord &v : ofKind(e, ViolationKind::LateParameter)) {
        if (v.rank == 0) late.push_back(e.param(v.param).name);
        QCOMPARE(e.modulePath(v.owner), std::string("pos_conv"));
    }
    std::sort(late.begin(), late.end());
    QCOMPARE(late, (std::vector<std::string>{"pos_conv.weight_g", "pos_conv.weight_v"}));
    QCOMPARE(e.lateParameterCount(), std::uint64_t(2));
    QVERIFY(!e.param(e.findParam("pos_conv.weight_v")).partitioned);
    // 2 ranks: the build-time read, then lm_head's read in each of 3 steps.
    QCOMPARE(e.unregisteredAccessCount(), std::uint64_t(2 + 2 * 3));
    QCOMPARE(run.result.unregisteredAccesses, e.unregisteredAccessCount());
    QCOMPARE(run.result.lateParameters, std::uint64_t(2));
}

void TestTrainer::externalsManualReportsNothing()
{
    TrainConfig c = smallConfig(2);
    c.steps = 3;
    c.externals = Externals::Manual;
    c.guard = GuardPolicy::Error; // any unregistered read would stop the run
    const Run run = train(c);
    const core::Engine &e = *run.engine;
    QVERIFY(ofKind(e, ViolationKind::UnregisteredAccess).empty());
    QVERIFY(ofKind(e, ViolationKind::LateParameter).empty());
    QCOMPARE(e.unregisteredAccessCount(), std::uint64_t(0));
    QCOMPARE(e.lateParameterCount(), std::uint64_t(0));
    QCOMPARE(run.result.unregisteredAccesses, std::uint64_t(0));
    QCOMPARE(run.result.lateParameters, std::uint64_t(0));

    const ParamId v = e.findParam("pos_conv.weight_v");
    QVERIFY(e.param(v).partitioned); // adopted
    QVERIFY(e.isExternal(0, e.findModule("lm_head"), e.findParam("embed.weight")));
    QVERIFY(e.isExternal(1, e.findModule("pos_conv"), v));
    QCOMPARE(e.findParam("pos_conv.weight"), kNoParam);
}

// With the weight_norm fixed but not the tied head, --guard error stops at the head's first
// read with the engine's fix, and the run's threads do not hang.
void TestTrainer::guardErrorStopsAtTheTiedHead()
{
    TrainConfig c = smallConfig(3);
    c.externals = Externals::Manual;
    c.guard = GuardPolicy::Error;
    auto engine = makeCpuEngine(c);
    buildModel(*engine, c);
    engine->unregisterExternalParameter(engine->findModule("lm_head"),
                                        engine->findParam("embed.weight"));
    int steps = 0;
    try {
        trainModel(*engine, c, [&](const StepReport &) { ++steps; });
        QFAIL(
            "training went on although lm_head read embed.weight unregistered under --guard error");
    } catch (const core::UnregisteredAccessError &err) {
        QCOMPARE(err.fix(), std::string("register_external_parameter(lm_head, embed.weight)"));
        QVERIFY(std::string(err.what()).find("lm_head") != std::string::npos);
    }
    QCOMPARE(steps, 0);
}

void TestTrainer::guardAutoRegistersOnce()
{
    TrainConfig c = smallConfig(2);
    c.steps = 4;
    c.guard = GuardPolicy::Auto;
    const Run run = train(c);
    const core::Engine &e = *run.engine;
    int tied = 0;
    for (const state::ViolationRecord &v : ofKind(e, ViolationKind::UnregisteredAccess)) {
        if (v.accessor == kNoModule) continue;
        ++tied;
        QCOMPARE(v.action, GuardAction::AutoRegistered);
        QCOMPARE(v.count, std::uint64_t(1));
        QCOMPARE(v.lastStep, 1u);
    }
    QCOMPARE(tied, 2); // once per rank
    QVERIFY(e.isExternal(0, e.findModule("lm_head"), e.findParam("embed.weight")));
}

void TestTrainer::dataIsTheSameForEveryRankSplit()
{
    const MarkovStream a(3, 50);
    const MarkovStream b(3, 50);
    std::vector<std::int32_t> x(40), y(40), z(40);
    a.sequence(5, 11, 40, x.data());
    b.sequence(5, 11, 40, y.data());
    QCOMPARE(x, y);
    a.sequence(5, 12, 40, z.data());
    QVERIFY(x != z);
    // Order 2 and sparse: a context has at most four successors.
    for (std::int32_t p = 0; p < 50; p += 7)
        for (std::int32_t q = 0; q < 50; q += 5) {
            std::vector<std::int32_t> seen;
            for (int i = 0; i < 200; ++i)
                seen.push_back(a.next(p, q, i / 200.0));
            std::sort(seen.begin(), seen.end());
            seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
            QVERIFY(seen.size() <= 4);
            QVERIFY(!seen.empty());
        }
    QVERIFY(a.entropyFloor() < std::log(50.0) / 2);
}

// lossFloor is the mean of -log p(target | context) under the chain itself: estimated here
// from sampled sequences, with p read off next() on a grid of draws (the chain's
// probabilities are multiples of 0.1, so a grid of 1000 gives them exactly).
void TestTrainer::lossFloorIsTheDataEntropy()
{
    const int vocab = 31, seq = 9;
    const MarkovStream data(5, vocab);
    auto probability = [&](std::int32_t a, std::int32_t b, std::int32_t c) {
        int hits = 0;
        for (int i = 0; i < 1000; ++i)
            hits += data.next(a, b, (i + 0.5) / 1000.0) == c;
        return hits / 1000.0;
    };
    double sum = 0.0;
    int n = 0;
    std::vector<std::int32_t> x(seq + 1);
    for (int s = 0; s < 4000; ++s) {
        data.sequence(1, s, seq + 1, x.data());
        sum += std::log(double(vocab)); // target 0: token 1 is uniform
        for (int t = 1; t < seq; ++t)
            sum -= std::log(probability(x[t - 1], x[t], x[t + 1]));
        n += seq;
    }
    const double sampled = sum / n, floor = data.lossFloor(seq);
    qInfo("loss floor %.4f, sampled %.4f", floor, sampled);
    QVERIFY2(std::abs(sampled - floor) < 0.02 * floor,
             qPrintable(QStringLiteral("floor %1, sampled %2").arg(floor).arg(sampled)));
    // Between the chain's own transitions (successors merged) and the uniform first target.
    QVERIFY(floor < (std::log(double(vocab)) + (seq - 1) * data.entropyFloor()) / seq + 1e-9);
    QVERIFY(floor > (seq - 1) * 0.8 * data.entropyFloor() / seq);
    QCOMPARE(MarkovStream(1, MarkovStream::kMaxLossFloorVocab + 1).lossFloor(seq), 0.0);
}

// The demo's defaults train a proper next-token model: causal pos_conv, a loss that falls
// towards the data's floor but never below it (averaged over the last steps, as a batch of
// 960 tokens is noisy). The symmetric padding of wav2vec2 sees the targets and goes below.
void TestTrainer::defaultModelStaysAboveTheLossFloor()
{
    TrainConfig c; // the command line's defaults, 800 steps
    c.listen = false;
    QVERIFY(c.causalConv);
    const double floor = MarkovStream(c.seed, c.vocab).lossFloor(c.seq);
    auto tail = [](const TrainResult &r) {
        double sum = 0.0;
        for (std::size_t i = r.losses.size() - 50; i < r.losses.size(); ++i)
            sum += r.losses[i];
        return sum / 50.0;
    };
    const Run causal = train(c);
    const double causalTail = tail(causal.result);
    qInfo("floor %.4f; causal: first %.4f, mean of the last 50 steps %.4f", floor,
          causal.result.firstLoss, causalTail);
    QVERIFY2(causalTail > floor, qPrintable(QString::number(causalTail)));
    QVERIFY2(causalTail < floor + 0.5 * (causal.result.firstLoss - floor),
             qPrintable(QStringLiteral("the loss did not approach the floor: %1").arg(causalTail)));

    c.causalConv = false;
    c.steps = 300; // it is far below the floor by then
    const Run symmetric = train(c);
    qInfo("symmetric: mean of the last 50 steps %.4f", tail(symmetric.result));
    QVERIFY2(tail(symmetric.result) < floor, qPrintable(QString::number(tail(symmetric.result))));
}

void TestTrainer::stepReportsCountWhatTheEngineCounts()
{
    TrainConfig c = smallConfig(3);
    c.steps = 4;
    auto engine = makeCpuEngine(c);
    std::vector<StepReport> reports;
    const TrainResult result =
        runCpuTraining(c, *engine, [&](const StepReport &r) { reports.push_back(r); });
    QCOMPARE(reports.size(), std::size_t(4));
    for (std::size_t i = 0; i < reports.size(); ++i) {
        QCOMPARE(reports[i].step, int(i) + 1);
        QCOMPARE(reports[i].steps, 4);
        QCOMPARE(reports[i].loss, result.losses[i]);
        QCOMPARE(reports[i].lateParameters, std::uint64_t(2));
        // 3 ranks: the build-time read, then one lm_head record per rank and step.
        QCOMPARE(reports[i].unregisteredAccesses, std::uint64_t(3 + 3 * (i + 1)));
        QVERIFY(reports[i].tokensPerSecond > 0.0);
        if (i > 0) QVERIFY(reports[i].megabytesGathered > reports[i - 1].megabytesGathered);
    }
    QCOMPARE(result.tokens, std::int64_t(4 * 7 * 9));
}

namespace {

// Counts prefetch gathers that were still in flight when the rank entered another module:
// the overlap --overlap-comm exists for.
class OverlapSink : public telemetry::EventSink
{
  public:
    void write(const telemetry::Event &ev) noexcept override
    {
        std::lock_guard lock(m_mutex);
        auto &open = m_open[ev.rank];
        if (ev.type == EventType::FetchBegin &&
            telemetry::readFetch(ev).reason == FetchReason::Prefetch)
            open.push_back(telemetry::readFetch(ev).param);
        else if (ev.type == EventType::FetchEnd)
            open.erase(std::remove(open.begin(), open.end(), telemetry::readFetch(ev).param),
                       open.end());
        else if (ev.type == EventType::ModuleEnter && !open.empty())
            ++overlapped;
        if (ev.type == EventType::FetchBegin) ++fetches;
        if (ev.type == EventType::FetchEnd) ++fetchEnds;
    }
    std::mutex m_mutex;
    std::map<int, std::vector<std::uint32_t>> m_open;
    std::uint64_t overlapped = 0, fetches = 0, fetchEnds = 0;
};

} // namespace

// overlap_comm changes when collectives run, not what they compute: bit-identical losses.
void TestTrainer::overlappedCommunicationTrainsTheSame()
{
    for (int world : {1, 3}) {
        TrainConfig c = smallConfig(world);
        c.steps = 8;
        const Run sync = train(c);
        c.overlapComm = true;
        Run overlapped;
        overlapped.engine = makeCpuEngine(c);
        OverlapSink sink;
        overlapped.engine->setEventSink(&sink);
        overlapped.result = runCpuTraining(c, *overlapped.engine, {});
        QCOMPARE(overlapped.result.losses, sync.result.losses);
        QCOMPARE(overlapped.result.megabytesGathered, sync.result.megabytesGathered);
        QCOMPARE(overlapped.result.unregisteredAccesses, sync.result.unregisteredAccesses);
        QCOMPARE(sink.fetches, sink.fetchEnds); // every gather was seen complete
        // Nothing is left gathered or in flight after the run.
        for (const state::ParamRecord &p : overlapped.engine->state().params)
            for (ParamStatus st : p.status)
                QVERIFY(st != ParamStatus::Inflight);
        if (world > 1)
            qInfo("world %d: %llu module entries with a prefetch still in flight", world,
                  static_cast<unsigned long long>(sink.overlapped));
    }
}

// One failure aborts the world; every rank stops instead of waiting for the others.
void TestTrainer::guardErrorWithOverlapStopsEveryRank()
{
    TrainConfig c = smallConfig(3);
    c.externals = Externals::Manual;
    c.guard = GuardPolicy::Error;
    c.overlapComm = true;
    auto engine = makeCpuEngine(c);
    buildModel(*engine, c);
    engine->unregisterExternalParameter(engine->findModule("lm_head"),
                                        engine->findParam("embed.weight"));
    try {
        trainModel(*engine, c, {});
        QFAIL("training went on although lm_head read embed.weight unregistered");
    } catch (const core::UnregisteredAccessError &err) {
        QCOMPARE(err.fix(), std::string("register_external_parameter(lm_head, embed.weight)"));
    }
}

namespace {

// The reduce-scatter pairs of a run, by (rank, step, parameter).
class ReduceSink final : public telemetry::EventSink
{
  public:
    void write(const telemetry::Event &ev) noexcept override
    {
        if (ev.type != EventType::ReduceScatterBegin && ev.type != EventType::ReduceScatterEnd)
            return;
        std::lock_guard lock(m_mutex);
        Pair &p = pairs[{ev.rank, ev.step, telemetry::readReduceScatter(ev).param}];
        (ev.type == EventType::ReduceScatterBegin ? p.begins : p.ends) += 1;
        (ev.type == EventType::ReduceScatterBegin ? p.begin : p.end) = ev;
    }
    struct Pair
    {
        int begins = 0, ends = 0;
        telemetry::Event begin{}, end{};
    };
    std::mutex m_mutex;
    std::map<std::tuple<int, std::uint32_t, ParamId>, Pair> pairs;
};

} // namespace

// A training step reduce-scatters each gradient once on every rank: a begin/end pair naming the
// parameter and its owner, moving its padded fp32 gradient (State's padded_numel x 4).
void TestTrainer::everyGradientIsReduceScatteredOncePerStep()
{
    TrainConfig c = smallConfig(3);
    c.steps = 2;
    c.externals = Externals::Manual;
    Run run;
    run.engine = makeCpuEngine(c);
    ReduceSink sink;
    run.engine->setEventSink(&sink);
    run.result = runCpuTraining(c, *run.engine, {});
    const state::EngineState st = run.engine->state();
    std::size_t reduced = 0;
    for (const state::ParamRecord &p : st.params) {
        for (int rank = 0; rank < 3; ++rank)
            for (std::uint32_t step = 1; step <= 2; ++step) {
                const auto it = sink.pairs.find({rank, step, p.id});
                QVERIFY2(it != sink.pairs.end(),
                         qPrintable(QStringLiteral("%1 on rank %2 in step %3 was not reduced")
                                        .arg(QString::fromStdString(p.name))
                                        .arg(rank)
                                        .arg(step)));
                const ReduceSink::Pair &x = it->second;
                QCOMPARE(x.begins, 1);
                QCOMPARE(x.ends, 1);
                const telemetry::ReduceScatterFields f = telemetry::readReduceScatter(x.end);
                QCOMPARE(f.bytes, std::uint64_t(p.paddedNumel) * 4);
                QCOMPARE(f.module, p.owner);
                QCOMPARE(f.params, 1u);
                QCOMPARE(telemetry::readReduceScatter(x.begin).bytes, f.bytes);
                QVERIFY(x.begin.tsNs <= x.end.tsNs);
                ++reduced;
            }
    }
    QCOMPARE(sink.pairs.size(), reduced); // nothing else was reduced
    QVERIFY(reduced > 0);
}

QTEST_APPLESS_MAIN(TestTrainer)
#include "tst_trainer.moc"

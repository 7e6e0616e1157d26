// The whole model on the engine against finite differences: the gradient that one rank
// reduce-scatters for every parameter (embed.weight through the lookup and the tied head,
// pos_conv's weight_g / weight_v / bias, every block, ln_f, lm_head.bias) is the derivative
// of the loss it reports. Catches wiring mistakes the per-layer checks cannot see.

#include <QtTest>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/engine.h"
#include "nn/markov.h"
#include "nn/model.h"
#include "nn/trainer.h"

using namespace shardscope;
using namespace shardscope::nn;

class TestModel : public QObject
{
    Q_OBJECT

  private slots:
    void gradientsMatchFiniteDifferences_data();
    void gradientsMatchFiniteDifferences();
    void namesAndShapesAreThoseOfTheStories();
};

namespace {

TrainConfig tinyConfig(Externals externals)
{
    TrainConfig c;
    c.worldSize = 1;
    c.layers = 2;
    c.hidden = 12;
    c.groups = 3;
    c.kernel = 4;
    c.vocab = 11;
    c.seq = 6;
    c.batch = 3;
    c.seed = 5;
    c.externals = externals;
    c.persistenceThreshold = 40; // biases and norms persistent, matrices partitioned
    c.listen = false;
    return c;
}

} // namespace

void TestModel::gradientsMatchFiniteDifferences_data()
{
    QTest::addColumn<int>("externals");
    QTest::addColumn<bool>("causal");
    QTest::newRow("externals none") << int(Externals::None) << true;
    QTest::newRow("externals manual") << int(Externals::Manual) << true;
    QTest::newRow("symmetric pos_conv") << int(Externals::None) << false;
}

void TestModel::gradientsMatchFiniteDifferences()
{
    QFETCH(int, externals);
    QFETCH(bool, causal);
    TrainConfig c = tinyConfig(static_cast<Externals>(externals));
    c.causalConv = causal;
    auto engine = makeCpuEngine(c);
    buildModel(*engine, c);
    const ModelHandles handles = findModel(*engine, c.layers);

    const MarkovStream data(c.seed, c.vocab);
    std::vector<std::int32_t> tokens, targets, seq(c.seq + 1);
    for (int s = 0; s < c.batch; ++s) {
        data.sequence(1, s, c.seq + 1, seq.data());
        tokens.insert(tokens.end(), seq.begin(), seq.end() - 1);
        targets.insert(targets.end(), seq.begin() + 1, seq.end());
    }
    const double globalTokens = double(c.batch) * c.seq;

    // One forward and backward on rank 0; the loss is the mean over the batch.
    auto lossAndGrad = [&] {
        double sum = 0.0;
        engine->forEachLocalRank([&](int rank) {
            engine->beginStep(rank);
            engine->zeroGrads(rank);
            RankModel model(*engine, rank, c, handles);
            sum = model.forwardBackward(tokens.data(), targets.data(), c.batch, globalTokens);
            engine->endStep(rank, sum / globalTokens);
        });
        return sum / globalTokens;
    };
    auto refresh = [&] {
        engine->forEachLocalRank([&](int rank) { engine->refreshPersistent(rank); });
    };

    // Every gradient first: the finite differences below run more steps, which overwrite them.
    lossAndGrad();
    std::vector<std::vector<float>> grads;
    for (ParamId p : handles.params())
        grads.emplace_back(engine->shardGrad(0, p).begin(), engine->shardGrad(0, p).end());

    int checked = 0;
    for (std::size_t n = 0; n < grads.size(); ++n) {
        const ParamId p = handles.params()[n];
        const std::string name = engine->param(p).name;
        const std::vector<float> &grad = grads[n];
        QCOMPARE(grad.size(),
                 std::size_t(engine->param(p).numel)); // world size 1: the whole tensor
        // The two largest gradient entries: where a wrong backward shows most clearly.
        std::vector<std::size_t> order(grad.size());
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(
            order.begin(), order.begin() + std::min<std::size_t>(2, order.size()), order.end(),
            [&](std::size_t a, std::size_t b) { return std::abs(grad[a]) > std::abs(grad[b]); });
        for (std::size_t k = 0; k < std::min<std::size_t>(2, order.size()); ++k) {
            const std::size_t i = order[k];
            float &x = engine->shardData(0, p)[i];
            const float saved = x;
            const float h = 1e-2f * std::max(1.0f, std::abs(saved));
            x = saved + h;
            refresh();
            const double plus = lossAndGrad();
            x = saved - h;
            refresh();
            const double minus = lossAndGrad();
            x = saved;
            refresh();
            const double numeric = (plus - minus) / (2.0 * double(h));
            const double tolerance = 0.03 * std::abs(numeric) + 2e-4;
            QVERIFY2(std::abs(numeric - grad[i]) <= tolerance,
                     qPrintable(QStringLiteral("%1[%2]: backward %3, finite difference %4")
                                    .arg(QString::fromStdString(name))
                                    .arg(i)
                                    .arg(grad[i], 0, 'g', 6)
                                    .arg(numeric, 0, 'g', 6)));
            QVERIFY2(std::abs(grad[i]) > 1e-4,
                     qPrintable(QString::fromStdString(name) + " has no gradient"));
            ++checked;
        }
    }
    QCOMPARE(checked, 2 * int(handles.params().size()));
}

void TestModel::namesAndShapesAreThoseOfTheStories()
{
    const TrainConfig c = tinyConfig(Externals::Manual);
    auto engine = makeCpuEngine(c);
    buildModel(*engine, c);
    auto shape = [&](const char *name) {
        const ParamId p = engine->findParam(name);
        return p == kNoParam ? Shape{} : engine->param(p).shape;
    };
    QCOMPARE(shape("embed.weight"), (Shape{11, 12}));
    QCOMPARE(shape("pos_conv.weight_g"), (Shape{1, 1, 4}));
    QCOMPARE(shape("pos_conv.weight_v"), (Shape{12, 4, 4}));
    QCOMPARE(shape("pos_conv.bias"), (Shape{12}));
    QCOMPARE(shape("blocks.1.ln.weight"), (Shape{12}));
    QCOMPARE(shape("blocks.1.fc1.weight"), (Shape{48, 12}));
    QCOMPARE(shape("blocks.1.fc2.weight"), (Shape{12, 48}));
    QCOMPARE(shape("blocks.0.fc2.bias"), (Shape{12}));
    QCOMPARE(shape("ln_f.bias"), (Shape{12}));
    QCOMPARE(shape("lm_head.bias"), (Shape{11}));
    QCOMPARE(engine->findParam("lm_head.weight"), kNoParam); // tied: it reads embed.weight
    QCOMPARE(engine->module(engine->findModule("blocks.1.fc1")).type, std::string("Linear"));
    QCOMPARE(engine->module(engine->findModule("pos_conv")).type, std::string("Conv1d"));
}

QTEST_APPLESS_MAIN(TestModel)
#include "tst_model.moc"

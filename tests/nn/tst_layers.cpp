// Finite-difference gradient checks for every CPU layer of the demo model, in double
// precision (central differences, h = 1e-5): an analytic gradient that is wrong by more
// than about 1e-7 relative fails. Also checks that the float build agrees with double.

#include <QtTest>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "nn/layers.h"

using namespace shardscope::nn;

namespace {

using Vec = std::vector<double>;

Vec randomVec(std::mt19937 &rng, std::size_t n, double scale = 1.0)
{
    std::normal_distribution<double> dist(0.0, scale);
    Vec v(n);
    for (double &x : v)
        x = dist(rng);
    return v;
}

double dot(const Vec &a, const Vec &b)
{
    double s = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i)
        s += a[i] * b[i];
    return s;
}

// Compares analytic with central differences of loss() over every element of x.
// Returns a description of the worst mismatch, or an empty string.
QString checkGradient(const char *what, Vec &x, const Vec &analytic,
                      const std::function<double()> &loss)
{
    if (x.size() != analytic.size())
        return QStringLiteral("%1: gradient has %2 elements, parameter %3")
            .arg(what)
            .arg(analytic.size())
            .arg(x.size());
    const double h = 1e-5;
    double largest = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + h;
        const double plus = loss();
        x[i] = saved - h;
        const double minus = loss();
        x[i] = saved;
        const double numeric = (plus - minus) / (2.0 * h);
        const double tolerance = 1e-6 * std::max({1.0, std::abs(numeric), std::abs(analytic[i])});
        if (std::abs(numeric - analytic[i]) > tolerance)
            return QStringLiteral("%1[%2]: analytic %3, finite difference %4")
                .arg(what)
                .arg(i)
                .arg(analytic[i], 0, 'g', 10)
                .arg(numeric, 0, 'g', 10);
        largest = std::max(largest, std::abs(analytic[i]));
    }
    if (largest < 1e-3)
        return QStringLiteral("%1: gradient is (nearly) zero, the check proves nothing").arg(what);
    return {};
}

#define CHECK_GRADIENT(what, x, analytic, loss)                                                    \
    do {                                                                                           \
        const QString problem = checkGradient(what, x, analytic, loss);                            \
        QVERIFY2(problem.isEmpty(), qPrintable(problem));                                          \
    } while (false)

} // namespace

class TestLayers : public QObject
{
    Q_OBJECT

  private slots:
    void embedding();
    void linear();
    void gelu();
    void layerNorm();
    void conv1d_data();
    void conv1d();
    void convWithWeightNorm_data();
    void convWithWeightNorm();
    void weightNormDecomposeRestoresWeight();
    void tiedHead();
    void crossEntropy();
    void tiedEmbeddingEndToEnd();
    void floatAgreesWithDouble();
};

void TestLayers::embedding()
{
    std::mt19937 rng(1);
    const int vocab = 7, dim = 5, rows = 9;
    const std::vector<std::int32_t> tokens = {3, 0, 6, 3, 3, 1, 5, 0, 2};
    Vec weight = randomVec(rng, vocab * dim);
    const Vec r = randomVec(rng, rows * dim);
    auto loss = [&] {
        Vec out(rows * dim);
        embeddingForward(tokens.data(), rows, weight.data(), dim, out.data());
        return dot(out, r);
    };
    Vec dWeight(weight.size(), 0.0);
    embeddingBackward(tokens.data(), rows, r.data(), dim, dWeight.data());
    CHECK_GRADIENT("embed.weight", weight, dWeight, loss);
    // Token 4 never occurs: its row gets no gradient; token 3 occurs three times.
    for (int j = 0; j < dim; ++j)
        QCOMPARE(dWeight[4 * dim + j], 0.0);
}

void TestLayers::linear()
{
    std::mt19937 rng(2);
    const int rows = 6, in = 5, out = 4;
    Vec x = randomVec(rng, rows * in), w = randomVec(rng, out * in), b = randomVec(rng, out);
    const Vec r = randomVec(rng, rows * out);
    auto loss = [&] {
        Vec y(rows * out);
        linearForward(x.data(), rows, in, out, w.data(), b.data(), y.data());
        return dot(y, r);
    };
    Vec dx(x.size(), 99.0), dw(w.size(), 0.0), db(b.size(), 0.0);
    linearBackward(x.data(), rows, in, out, w.data(), r.data(), dx.data(), dw.data(), db.data());
    CHECK_GRADIENT("linear input", x, dx, loss);
    CHECK_GRADIENT("linear.weight", w, dw, loss);
    CHECK_GRADIENT("linear.bias", b, db, loss);

    // Parameter gradients accumulate over calls (two micro-batches), input gradients don't.
    const Vec dwOnce = dw;
    linearBackward(x.data(), rows, in, out, w.data(), r.data(), dx.data(), dw.data(), db.data());
    for (std::size_t i = 0; i < dw.size(); ++i)
        QCOMPARE(dw[i], 2.0 * dwOnce[i]);
}

void TestLayers::gelu()
{
    std::mt19937 rng(3);
    const int n = 40;
    Vec x = randomVec(rng, n, 2.0);
    const Vec r = randomVec(rng, n);
    auto loss = [&] {
        Vec y(n);
        geluForward(x.data(), n, y.data());
        return dot(y, r);
    };
    Vec dx(n);
    geluBackward(x.data(), n, r.data(), dx.data());
    CHECK_GRADIENT("gelu input", x, dx, loss);

    // The erf form: GELU(1) = 0.5 * (1 + erf(1/sqrt 2)) = 0.841344746...
    double one = 1.0, y = 0.0;
    geluForward(&one, 1, &y);
    QVERIFY(std::abs(y - 0.8413447460685429) < 1e-12);
}

void TestLayers::layerNorm()
{
    std::mt19937 rng(4);
    const int rows = 5, dim = 8;
    Vec x = randomVec(rng, rows * dim, 3.0), gamma = randomVec(rng, dim),
        beta = randomVec(rng, dim);
    const Vec r = randomVec(rng, rows * dim);
    const double eps = 1e-5;
    auto loss = [&] {
        Vec y(rows * dim), mean(rows), rstd(rows);
        layerNormForward(x.data(), rows, dim, gamma.data(), beta.data(), eps, y.data(), mean.data(),
                         rstd.data());
        return dot(y, r);
    };
    Vec y(rows * dim), mean(rows), rstd(rows);
    layerNormForward(x.data(), rows, dim, gamma.data(), beta.data(), eps, y.data(), mean.data(),
                     rstd.data());
    Vec dx(x.size()), dGamma(dim, 0.0), dBeta(dim, 0.0);
    layerNormBackward(x.data(), rows, dim, gamma.data(), mean.data(), rstd.data(), r.data(),
                      dx.data(), dGamma.data(), dBeta.data());
    CHECK_GRADIENT("ln input", x, dx, loss);
    CHECK_GRADIENT("ln.weight", gamma, dGamma, loss);
    CHECK_GRADIENT("ln.bias", beta, dBeta, loss);
}

void TestLayers::conv1d_data()
{
    QTest::addColumn<int>("kernel");
    QTest::addColumn<int>("groups");
    QTest::addColumn<bool>("causal");
    QTest::newRow("even kernel, groups") << 4 << 2 << false;
    QTest::newRow("odd kernel, groups") << 3 << 3 << false;
    QTest::newRow("kernel longer than sequence") << 8 << 1 << false;
    QTest::newRow("depthwise") << 2 << 6 << false;
    QTest::newRow("causal, even kernel") << 4 << 2 << true;
    QTest::newRow("causal, odd kernel") << 3 << 1 << true;
}

void TestLayers::conv1d()
{
    QFETCH(int, kernel);
    QFETCH(int, groups);
    QFETCH(bool, causal);
    std::mt19937 rng(5);
    ConvShape s{2, 5, 6, kernel, groups, causal};
    const int n = s.batch * s.seq * s.channels;
    Vec x = randomVec(rng, n), w = randomVec(rng, s.weightNumel()), b = randomVec(rng, s.channels);
    const Vec r = randomVec(rng, n);
    auto loss = [&] {
        Vec y(n);
        conv1dForward(s, x.data(), w.data(), b.data(), y.data());
        return dot(y, r);
    };
    Vec dx(n, 99.0), dw(w.size(), 0.0), db(b.size(), 0.0);
    conv1dBackward(s, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
    CHECK_GRADIENT("conv input", x, dx, loss);
    CHECK_GRADIENT("conv.weight", w, dw, loss);
    CHECK_GRADIENT("conv.bias", b, db, loss);

    // The forward against the definition: y[n,t,o] = b[o] + sum w[o,ci,k] x[n, t+k-pad, g*cin+ci]
    // with pad = K/2 (wav2vec2) or K-1 (causal: y[t] never depends on x[t+1...]).
    Vec y(n);
    conv1dForward(s, x.data(), w.data(), b.data(), y.data());
    const int cin = s.channelsPerGroup();
    for (int bi = 0; bi < s.batch; ++bi)
        for (int t = 0; t < s.seq; ++t)
            for (int o = 0; o < s.channels; ++o) {
                const int g = o / cin;
                double expect = b[o];
                for (int ci = 0; ci < cin; ++ci)
                    for (int k = 0; k < kernel; ++k) {
                        const int src = t + k - (causal ? kernel - 1 : kernel / 2);
                        if (src >= 0 && src < s.seq)
                            expect += w[(o * cin + ci) * kernel + k] *
                                      x[(bi * s.seq + src) * s.channels + g * cin + ci];
                    }
                QVERIFY(std::abs(y[(bi * s.seq + t) * s.channels + o] - expect) < 1e-12);
            }
}

void TestLayers::convWithWeightNorm_data()
{
    conv1d_data();
}

void TestLayers::convWithWeightNorm()
{
    QFETCH(int, kernel);
    QFETCH(int, groups);
    QFETCH(bool, causal);
    std::mt19937 rng(6);
    ConvShape s{2, 5, 6, kernel, groups, causal};
    const int n = s.batch * s.seq * s.channels;
    const int cin = s.channelsPerGroup();
    Vec x = randomVec(rng, n), v = randomVec(rng, s.weightNumel()), g = randomVec(rng, kernel),
        b = randomVec(rng, s.channels);
    const Vec r = randomVec(rng, n);
    auto loss = [&] {
        Vec w(v.size()), norms(kernel), y(n);
        weightNormForward(v.data(), g.data(), s.channels, cin, kernel, w.data(), norms.data());
        conv1dForward(s, x.data(), w.data(), b.data(), y.data());
        return dot(y, r);
    };
    Vec w(v.size()), norms(kernel);
    weightNormForward(v.data(), g.data(), s.channels, cin, kernel, w.data(), norms.data());
    Vec dx(n), dw(w.size(), 0.0), db(b.size(), 0.0), dv(v.size(), 0.0), dg(kernel, 0.0);
    conv1dBackward(s, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
    weightNormBackward(v.data(), g.data(), norms.data(), dw.data(), s.channels, cin, kernel,
                       dv.data(), dg.data());
    CHECK_GRADIENT("pos_conv input", x, dx, loss);
    CHECK_GRADIENT("pos_conv.weight_v", v, dv, loss);
    CHECK_GRADIENT("pos_conv.weight_g", g, dg, loss);
    CHECK_GRADIENT("pos_conv.bias", b, db, loss);

    // The norm is over every dim but 2: each kernel tap k of weight has norm |g[k]|.
    for (int k = 0; k < kernel; ++k) {
        double sq = 0.0;
        for (int p = 0; p < s.channels * cin; ++p)
            sq += w[p * kernel + k] * w[p * kernel + k];
        QVERIFY(std::abs(std::sqrt(sq) - std::abs(g[k])) < 1e-12);
    }
}

void TestLayers::weightNormDecomposeRestoresWeight()
{
    std::mt19937 rng(7);
    const int out = 4, in = 2, kernel = 3;
    const Vec weight = randomVec(rng, out * in * kernel);
    Vec v(weight.size()), g(kernel), back(weight.size()), norms(kernel);
    weightNormDecompose(weight.data(), out, in, kernel, v.data(), g.data());
    weightNormForward(v.data(), g.data(), out, in, kernel, back.data(), norms.data());
    for (std::size_t i = 0; i < weight.size(); ++i)
        QVERIFY(std::abs(back[i] - weight[i]) < 1e-12);
    double sq = 0.0;
    for (int p = 0; p < out * in; ++p)
        sq += weight[p * kernel + 1] * weight[p * kernel + 1];
    QVERIFY(std::abs(g[1] - std::sqrt(sq)) < 1e-12);
}

void TestLayers::tiedHead()
{
    std::mt19937 rng(8);
    const int rows = 6, hidden = 5, vocab = 7;
    Vec h = randomVec(rng, rows * hidden), embed = randomVec(rng, vocab * hidden),
        bias = randomVec(rng, vocab);
    const Vec r = randomVec(rng, rows * vocab);
    auto loss = [&] {
        Vec logits(rows * vocab);
        tiedHeadForward(h.data(), rows, hidden, vocab, embed.data(), bias.data(), logits.data());
        return dot(logits, r);
    };
    Vec dh(h.size()), dEmbed(embed.size(), 0.0), dBias(vocab, 0.0);
    tiedHeadBackward(h.data(), rows, hidden, vocab, embed.data(), r.data(), dh.data(),
                     dEmbed.data(), dBias.data());
    CHECK_GRADIENT("lm_head input", h, dh, loss);
    CHECK_GRADIENT("embed.weight (through lm_head)", embed, dEmbed, loss);
    CHECK_GRADIENT("lm_head.bias", bias, dBias, loss);
}

void TestLayers::crossEntropy()
{
    std::mt19937 rng(9);
    const int rows = 6, vocab = 5;
    Vec logits = randomVec(rng, rows * vocab, 2.0);
    const std::vector<std::int32_t> targets = {0, 4, 2, 2, 1, 3};
    Vec scratch(logits.size());
    auto loss = [&] {
        return shardscope::nn::crossEntropy(logits.data(), rows, vocab, targets.data(), rows,
                                            scratch.data()) /
               rows;
    };
    Vec dLogits(logits.size());
    const double sum = shardscope::nn::crossEntropy(logits.data(), rows, vocab, targets.data(),
                                                    rows, dLogits.data());
    CHECK_GRADIENT("cross-entropy logits", logits, dLogits, loss);

    // Uniform logits give ln V per row, whatever the offset.
    Vec flat(rows * vocab, 3.5);
    const double uniform = shardscope::nn::crossEntropy(flat.data(), rows, vocab, targets.data(),
                                                        rows, scratch.data());
    QVERIFY(std::abs(uniform - rows * std::log(double(vocab))) < 1e-12);
    QVERIFY(sum > 0.0);
}

// The model's tied embedding: embed.weight gets gradient from the embedding lookup and from
// the LM head; the sum of both is the gradient of the loss.
void TestLayers::tiedEmbeddingEndToEnd()
{
    std::mt19937 rng(10);
    const int rows = 8, hidden = 4, vocab = 6;
    const std::vector<std::int32_t> tokens = {1, 5, 2, 2, 0, 3, 4, 1};
    const std::vector<std::int32_t> targets = {5, 2, 2, 0, 3, 4, 1, 1};
    Vec embed = randomVec(rng, vocab * hidden), bias = randomVec(rng, vocab);
    auto forward = [&](Vec &h, Vec &logits, Vec &dLogits) {
        h.assign(rows * hidden, 0.0);
        logits.assign(rows * vocab, 0.0);
        dLogits.assign(rows * vocab, 0.0);
        embeddingForward(tokens.data(), rows, embed.data(), hidden, h.data());
        tiedHeadForward(h.data(), rows, hidden, vocab, embed.data(), bias.data(), logits.data());
        return shardscope::nn::crossEntropy(logits.data(), rows, vocab, targets.data(), rows,
                                            dLogits.data()) /
               rows;
    };
    auto loss = [&] {
        Vec h, logits, dLogits;
        return forward(h, logits, dLogits);
    };
    Vec h, logits, dLogits;
    forward(h, logits, dLogits);
    Vec dh(h.size()), dEmbed(embed.size(), 0.0), dBias(vocab, 0.0);
    tiedHeadBackward(h.data(), rows, hidden, vocab, embed.data(), dLogits.data(), dh.data(),
                     dEmbed.data(), dBias.data());
    embeddingBackward(tokens.data(), rows, dh.data(), hidden, dEmbed.data());
    CHECK_GRADIENT("embed.weight (lookup + head)", embed, dEmbed, loss);
    CHECK_GRADIENT("lm_head.bias", bias, dBias, loss);
}

// Training runs in float: the float instantiation computes the same values as double.
void TestLayers::floatAgreesWithDouble()
{
    std::mt19937 rng(11);
    ConvShape s{2, 7, 8, 4, 2};
    const int n = s.batch * s.seq * s.channels;
    const Vec x = randomVec(rng, n), w = randomVec(rng, s.weightNumel()),
              b = randomVec(rng, s.channels), r = randomVec(rng, n);
    auto toFloat = [](const Vec &v) { return std::vector<float>(v.begin(), v.end()); };
    const auto xf = toFloat(x), wf = toFloat(w), bf = toFloat(b), rf = toFloat(r);

    Vec y(n), dx(n), dw(w.size(), 0.0), db(b.size(), 0.0);
    conv1dForward(s, x.data(), w.data(), b.data(), y.data());
    conv1dBackward(s, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
    std::vector<float> yf(n), dxf(n), dwf(w.size(), 0.0f), dbf(b.size(), 0.0f);
    conv1dForward(s, xf.data(), wf.data(), bf.data(), yf.data());
    conv1dBackward(s, xf.data(), wf.data(), rf.data(), dxf.data(), dwf.data(), dbf.data());
    for (int i = 0; i < n; ++i) {
        QVERIFY(std::abs(yf[i] - y[i]) < 1e-4 * std::max(1.0, std::abs(y[i])));
        QVERIFY(std::abs(dxf[i] - dx[i]) < 1e-4 * std::max(1.0, std::abs(dx[i])));
    }
    for (std::size_t i = 0; i < dw.size(); ++i)
        QVERIFY(std::abs(dwf[i] - dw[i]) < 1e-4 * std::max(1.0, std::abs(dw[i])));

    std::vector<float> hf(12 * 8), logitsf(12 * 10), dLf(12 * 10);
    std::vector<std::int32_t> targets(12, 3);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (float &v : hf)
        v = dist(rng);
    std::vector<float> ef(10 * 8), biasf(10, 0.f);
    for (float &v : ef)
        v = dist(rng);
    tiedHeadForward(hf.data(), 12, 8, 10, ef.data(), biasf.data(), logitsf.data());
    const double lossF =
        shardscope::nn::crossEntropy(logitsf.data(), 12, 10, targets.data(), 12, dLf.data());
    Vec hd(hf.begin(), hf.end()), ed(ef.begin(), ef.end()), biasd(10, 0.0), logitsd(120), dLd(120);
    tiedHeadForward(hd.data(), 12, 8, 10, ed.data(), biasd.data(), logitsd.data());
    const double lossD =
        shardscope::nn::crossEntropy(logitsd.data(), 12, 10, targets.data(), 12, dLd.data());
    QVERIFY(std::abs(lossF - lossD) < 1e-4 * lossD);
}

QTEST_APPLESS_MAIN(TestLayers)
#include "tst_layers.moc"

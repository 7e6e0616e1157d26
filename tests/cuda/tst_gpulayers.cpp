// Every CUDA layer against the CPU layer of nn/layers.h with the same inputs: forward
// outputs, input gradients and (accumulated) parameter gradients agree to fp32
// rounding. Skips with the reason without CUDA or a GPU.

#include <QtTest>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpuavailable.h"
#include "nn/adam.h"
#include "nn/layers.h"

#if SHARDSCOPE_HAVE_CUDA
#include "cuda/blas.h"
#include "cuda/devicebuffer.h"
#include "cuda/layers.h"
#endif

using namespace shardscope;

#if SHARDSCOPE_HAVE_CUDA
namespace {

using Vec = std::vector<float>;

Vec randomVec(std::size_t n, unsigned seed, float scale = 1.0f)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    Vec v(n);
    for (float &x : v)
        x = d(rng);
    return v;
}

cuda::DeviceBuffer up(const Vec &v)
{
    cuda::DeviceBuffer b(v.size() * sizeof(float));
    b.upload(v.data(), v.size() * sizeof(float));
    return b;
}

cuda::DeviceBuffer upTokens(const std::vector<std::int32_t> &v)
{
    cuda::DeviceBuffer b(v.size() * sizeof(std::int32_t));
    b.upload(v.data(), v.size() * sizeof(std::int32_t));
    return b;
}

Vec down(const cuda::DeviceBuffer &b)
{
    return b.toHost<float>();
}

// max |got - want| relative to max |want|.
double relError(const Vec &got, const Vec &want)
{
    double diff = 0.0, scale = 1e-6;
    for (std::size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, double(std::fabs(got[i] - want[i])));
        scale = std::max(scale, double(std::fabs(want[i])));
    }
    return diff / scale;
}

#define COMPARE_VEC(got, want, tol)                                                                \
    do {                                                                                           \
        const Vec g_ = (got);                                                                      \
        const Vec w_ = (want);                                                                     \
        QCOMPARE(g_.size(), w_.size());                                                            \
        const double e_ = relError(g_, w_);                                                        \
        QVERIFY2(e_ <= (tol),                                                                      \
                 (std::string(#got) + " differs from the CPU by " + std::to_string(e_)).c_str());  \
    } while (false)

constexpr double kTol = 2e-5;

} // namespace
#endif

class TestGpuLayers : public QObject
{
    Q_OBJECT

#if SHARDSCOPE_HAVE_CUDA
    cuda::Stream *m_stream = nullptr;
    cudaStream_t s() const
    {
        return m_stream->get();
    }
    void sync() const
    {
        m_stream->synchronize();
    }
#endif

  private slots:
    void initTestCase()
    {
        SHARDSCOPE_REQUIRE_GPU();
#if SHARDSCOPE_HAVE_CUDA
        cuda::setDevice(0);
        m_stream = new cuda::Stream;
#endif
    }

#if SHARDSCOPE_HAVE_CUDA
    void cleanupTestCase()
    {
        delete m_stream;
    }

    void embedding()
    {
        const int V = 37, D = 24, R = 300;
        std::vector<std::int32_t> tokens(R);
        for (int i = 0; i < R; ++i)
            tokens[i] = (i * 7 + 3) % V; // repeats: the backward must add rows
        const Vec w = randomVec(V * D, 1), dOut = randomVec(R * D, 2);
        Vec out(R * D), dW = randomVec(V * D, 3);
        const Vec dW0 = dW;
        nn::embeddingForward(tokens.data(), R, w.data(), D, out.data());
        nn::embeddingBackward(tokens.data(), R, dOut.data(), D, dW.data());
        auto dTok = upTokens(tokens);
        auto dw = up(w), ddOut = up(dOut), ddW = up(dW0);
        cuda::DeviceBuffer dout(R * D * 4);
        cuda::embeddingForward(dTok.i32(), R, dw.f32(), V, D, dout.f32(), s());
        cuda::embeddingBackward(dTok.i32(), R, ddOut.f32(), V, D, ddW.f32(), s());
        sync();
        COMPARE_VEC(down(dout), out, 0.0);
        COMPARE_VEC(down(ddW), dW, kTol);
    }

    void linearAndTiedHead()
    {
        const int R = 70, In = 48, Out = 33;
        const Vec x = randomVec(R * In, 4), w = randomVec(Out * In, 5, 0.2f), b = randomVec(Out, 6);
        const Vec dy = randomVec(R * Out, 7), dW0 = randomVec(Out * In, 8), dB0 = randomVec(Out, 9);
        Vec y(R * Out), dx(R * In), dW = dW0, dB = dB0;
        nn::linearForward(x.data(), R, In, Out, w.data(), b.data(), y.data());
        nn::linearBackward(x.data(), R, In, Out, w.data(), dy.data(), dx.data(), dW.data(),
                           dB.data());
        cuda::Blas blas(0, s());
        auto gx = up(x), gw = up(w), gb = up(b), gdy = up(dy), gdW = up(dW0), gdB = up(dB0);
        cuda::DeviceBuffer gy(R * Out * 4), gdx(R * In * 4);
        blas.linearForward(gx.f32(), R, In, Out, gw.f32(), gb.f32(), gy.f32());
        blas.linearBackward(gx.f32(), R, In, Out, gw.f32(), gdy.f32(), gdx.f32(), gdW.f32(),
                            gdB.f32());
        sync();
        COMPARE_VEC(down(gy), y, kTol);
        COMPARE_VEC(down(gdx), dx, kTol);
        COMPARE_VEC(down(gdW), dW, kTol);
        COMPARE_VEC(down(gdB), dB, kTol);

        // The tied head is the same product with embed [V, H] as the weight.
        Vec logits(R * Out);
        nn::tiedHeadForward(x.data(), R, In, Out, w.data(), b.data(), logits.data());
        COMPARE_VEC(down(gy), logits, kTol);
    }

    void gemmTransposes()
    {
        const int m = 5, n = 7, k = 3;
        const Vec a = randomVec(k * m, 10), b = randomVec(n * k, 11);
        Vec c(m * n);
        nn::gemm<float>(true, true, m, n, k, 1.5f, a.data(), m, b.data(), k, 0.0f, c.data(), n);
        cuda::Blas blas(0, s());
        auto ga = up(a), gb = up(b);
        cuda::DeviceBuffer gc(m * n * 4);
        blas.gemm(true, true, m, n, k, 1.5f, ga.f32(), m, gb.f32(), k, 0.0f, gc.f32(), n);
        sync();
        COMPARE_VEC(down(gc), c, kTol);
    }

    void gelu()
    {
        const std::int64_t n = 5000;
        const Vec x = randomVec(n, 12, 3.0f), dy = randomVec(n, 13);
        Vec y(n), dx(n);
        nn::geluForward(x.data(), n, y.data());
        nn::geluBackward(x.data(), n, dy.data(), dx.data());
        auto gx = up(x), gdy = up(dy);
        cuda::DeviceBuffer gy(n * 4), gdx(n * 4);
        cuda::geluForward(gx.f32(), n, gy.f32(), s());
        cuda::geluBackward(gx.f32(), n, gdy.f32(), gdx.f32(), s());
        sync();
        COMPARE_VEC(down(gy), y, kTol);
        COMPARE_VEC(down(gdx), dx, kTol);
    }

    void layerNorm()
    {
        const int R = 45, D = 300; // D > one block of threads
        Vec x = randomVec(R * D, 14, 2.0f);
        for (float &v : x)
            v += 3.0f;
        const Vec g = randomVec(D, 15), b = randomVec(D, 16), dy = randomVec(R * D, 17);
        const Vec dG0 = randomVec(D, 18), dB0 = randomVec(D, 19);
        Vec y(R * D), mean(R), rstd(R), dx(R * D), dG = dG0, dB = dB0;
        nn::layerNormForward(x.data(), R, D, g.data(), b.data(), 1e-5f, y.data(), mean.data(),
                             rstd.data());
        nn::layerNormBackward(x.data(), R, D, g.data(), mean.data(), rstd.data(), dy.data(),
                              dx.data(), dG.data(), dB.data());
        auto gx = up(x), gg = up(g), gb = up(b), gdy = up(dy), gdG = up(dG0), gdB = up(dB0);
        cuda::DeviceBuffer gy(R * D * 4), gm(R * 4), gr(R * 4), gdx(R * D * 4);
        cuda::layerNormForward(gx.f32(), R, D, gg.f32(), gb.f32(), 1e-5f, gy.f32(), gm.f32(),
                               gr.f32(), s());
        cuda::layerNormBackward(gx.f32(), R, D, gg.f32(), gm.f32(), gr.f32(), gdy.f32(), gdx.f32(),
                                gdG.f32(), gdB.f32(), s());
        sync();
        COMPARE_VEC(down(gy), y, 1e-4);
        COMPARE_VEC(down(gm), mean, 1e-5);
        COMPARE_VEC(down(gr), rstd, 1e-4);
        COMPARE_VEC(down(gdx), dx, 1e-4);
        COMPARE_VEC(down(gdG), dG, 1e-4);
        COMPARE_VEC(down(gdB), dB, 1e-4);
    }

    void conv1dWithWeightNorm_data()
    {
        QTest::addColumn<int>("kernel");
        QTest::addColumn<int>("groups");
        QTest::addColumn<bool>("causal");
        QTest::newRow("even kernel, 4 groups") << 8 << 4 << false;
        QTest::newRow("odd kernel, 1 group") << 5 << 1 << false;
        QTest::newRow("causal, even kernel, 4 groups") << 8 << 4 << true;
        QTest::newRow("causal, odd kernel, 1 group") << 5 << 1 << true;
    }

    void conv1dWithWeightNorm()
    {
        QFETCH(int, kernel);
        QFETCH(int, groups);
        QFETCH(bool, causal);
        nn::ConvShape c;
        c.batch = 3;
        c.seq = 19;
        c.channels = 16;
        c.kernel = kernel;
        c.groups = groups;
        c.causal = causal;
        const cuda::ConvShape &gc = c; // one shape for both layers
        const int O = c.channels, I = c.channelsPerGroup(), K = c.kernel;
        const std::int64_t n = std::int64_t(c.batch) * c.seq * c.channels;
        const Vec x = randomVec(n, 20), v = randomVec(c.weightNumel(), 21), g = randomVec(K, 22);
        const Vec bias = randomVec(O, 23), dy = randomVec(n, 24);
        const Vec dv0 = randomVec(c.weightNumel(), 25), dg0 = randomVec(K, 26),
                  db0 = randomVec(O, 27);

        Vec w(c.weightNumel()), norms(K), y(n), dx(n), dW(c.weightNumel(), 0.0f),
            dB = db0, dv = dv0, dg = dg0;
        nn::weightNormForward(v.data(), g.data(), O, I, K, w.data(), norms.data());
        nn::conv1dForward(c, x.data(), w.data(), bias.data(), y.data());
        nn::conv1dBackward(c, x.data(), w.data(), dy.data(), dx.data(), dW.data(), dB.data());
        nn::weightNormBackward(v.data(), g.data(), norms.data(), dW.data(), O, I, K, dv.data(),
                               dg.data());

        auto gx = up(x), gv = up(v), gg = up(g), gbias = up(bias), gdy = up(dy), gdv = up(dv0),
             gdg = up(dg0), gdb = up(db0);
        cuda::DeviceBuffer gw(w.size() * 4), gn(K * 4), gy(n * 4), gdx(n * 4), gdW(w.size() * 4);
        cuda::weightNormForward(gv.f32(), gg.f32(), O, I, K, gw.f32(), gn.f32(), s());
        cuda::conv1dForward(gc, gx.f32(), gw.f32(), gbias.f32(), gy.f32(), s());
        cuda::conv1dBackward(gc, gx.f32(), gw.f32(), gdy.f32(), gdx.f32(), gdW.f32(), gdb.f32(),
                             s());
        cuda::weightNormBackward(gv.f32(), gg.f32(), gn.f32(), gdW.f32(), O, I, K, gdv.f32(),
                                 gdg.f32(), s());
        sync();
        COMPARE_VEC(down(gw), w, kTol);
        COMPARE_VEC(down(gn), norms, kTol);
        COMPARE_VEC(down(gy), y, 1e-4);
        COMPARE_VEC(down(gdx), dx, 1e-4);
        COMPARE_VEC(down(gdW), dW, 1e-4);
        COMPARE_VEC(down(gdb), dB, 1e-4);
        COMPARE_VEC(down(gdv), dv, 1e-4);
        COMPARE_VEC(down(gdg), dg, 1e-4);
    }

    void crossEntropy()
    {
        const int R = 77, V = 301;
        const Vec logits = randomVec(R * V, 28, 4.0f);
        std::vector<std::int32_t> targets(R);
        for (int i = 0; i < R; ++i)
            targets[i] = (i * 13) % V;
        Vec dLogits(R * V);
        const double loss =
            nn::crossEntropy(logits.data(), R, V, targets.data(), 1000.0, dLogits.data());
        auto gl = up(logits), gt = upTokens(targets);
        cuda::DeviceBuffer gd(R * V * 4), gloss(R * sizeof(double));
        cuda::crossEntropy(gl.f32(), R, V, gt.i32(), 1000.0, gd.f32(), gloss.f64(), s());
        sync();
        double sum = 0.0;
        for (double x : gloss.toHost<double>())
            sum += x;
        QVERIFY2(std::fabs(sum - loss) <= 1e-5 * std::fabs(loss),
                 (std::to_string(sum) + " vs CPU " + std::to_string(loss)).c_str());
        COMPARE_VEC(down(gd), dLogits, 1e-4);
    }

    void adamWOnAShard()
    {
        const std::int64_t n = 1000;
        Vec p = randomVec(n, 29);
        const Vec p0 = p;
        nn::AdamOptions o;
        o.lr = 1e-2f;
        o.weightDecay = 0.1f;
        nn::Adam adam(o);
        auto gp = up(p0);
        cuda::DeviceBuffer gm(n * 4), gv(n * 4);
        for (int step = 1; step <= 3; ++step) {
            const Vec grad = randomVec(n, 30 + step);
            adam.beginStep();
            adam.update(0, p, grad, true);
            auto gg = up(grad);
            cuda::adamStep(gp.f32(), gg.f32(), gm.f32(), gv.f32(), n, o, step, s());
            sync();
        }
        COMPARE_VEC(down(gp), p, 1e-5);
    }
#endif
};

QTEST_GUILESS_MAIN(TestGpuLayers)
#include "tst_gpulayers.moc"

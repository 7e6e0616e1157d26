// chooseBackend() on any machine: the CPU fallback with its reason, the NCCL refusal
// with what is missing, and rejection of unknown words. On a GPU machine, `auto`
// must pick NCCL instead.

#include <QtTest>

#include <stdexcept>
#include <string>

#include "cuda/backendselect.h"
#include "cuda/gputrainer.h"
#include "gpuavailable.h"

#if SHARDSCOPE_HAVE_CUDA
#include "comm/nccl/ncclapi.h"
#include "cuda/cublasapi.h"
#endif

using namespace shardscope;

class TestBackendSelect : public QObject
{
    Q_OBJECT

  private slots:
    void cpuIsAlwaysCpu()
    {
        const cuda::BackendChoice c = cuda::chooseBackend("cpu");
        QCOMPARE(c.backend, comm::Backend::Cpu);
        QVERIFY(c.reason.find("--backend cpu") != std::string::npos);
    }

    void autoFallsBackToCpuWithoutGpu()
    {
        if (test::gpuCount() > 0) QSKIP("this machine has a GPU: autoPicksNcclOnGpu covers it");
        const cuda::BackendChoice c = cuda::chooseBackend("auto");
        QCOMPARE(c.backend, comm::Backend::Cpu);
        QCOMPARE(c.deviceCount, 0);
        QVERIFY2(c.reason.rfind("CPU backend: ", 0) == 0, c.reason.c_str());
        QVERIFY2(c.reason.find('\n') == std::string::npos, "the reason is one line");
#if SHARDSCOPE_HAVE_CUDA
        QVERIFY2(c.reason.find("GPU") != std::string::npos ||
                     c.reason.find("driver") != std::string::npos,
                 c.reason.c_str());
#else
        QVERIFY2(c.reason.find("no CUDA/NCCL support") != std::string::npos, c.reason.c_str());
#endif
    }

    void ncclWithoutGpuSaysWhatIsMissing()
    {
        if (test::gpuCount() > 0) QSKIP("this machine has a GPU: autoPicksNcclOnGpu covers it");
        try {
            cuda::chooseBackend("nccl");
            QFAIL("chooseBackend(\"nccl\") must throw without a GPU");
        } catch (const comm::CommError &e) {
            const std::string msg = e.what();
            QVERIFY2(msg.find("--backend nccl cannot be used") != std::string::npos, e.what());
            QVERIFY2(msg.find("--backend cpu") != std::string::npos, e.what());
#if SHARDSCOPE_HAVE_CUDA
            QVERIFY2(msg.find("driver") != std::string::npos ||
                         msg.find("GPU") != std::string::npos,
                     e.what());
#else
            QVERIFY2(msg.find("no CUDA/NCCL support") != std::string::npos, e.what());
#endif
        }
    }

    void autoPicksNcclOnGpu()
    {
        SHARDSCOPE_REQUIRE_GPU();
        const cuda::BackendChoice c = cuda::chooseBackend("auto");
        QCOMPARE(c.backend, comm::Backend::Nccl);
        QCOMPARE(c.deviceCount, test::gpuCount());
        QVERIFY2(c.reason.rfind("NCCL backend: ", 0) == 0, c.reason.c_str());
        QCOMPARE(cuda::chooseBackend("nccl").backend, comm::Backend::Nccl);
    }

    void ncclAndCublasLoadWithoutAGpu()
    {
#if SHARDSCOPE_HAVE_CUDA
        // Built against NCCL and cuBLAS found on this machine: dlopen must find them and
        // every function the GPU path calls (no GPU is needed for that).
        const comm::NcclApi &nccl = comm::ncclApi();
        QVERIFY2(nccl.loaded, nccl.error.c_str());
        QVERIFY2(nccl.version.rfind("2.", 0) == 0, nccl.version.c_str());
        QCOMPARE(std::string(nccl.getErrorString(ncclInvalidArgument)).find("invalid argument"),
                 std::size_t(0));
        const cuda::CublasApi &blas = cuda::cublasApi();
        QVERIFY2(blas.loaded, blas.error.c_str());
        QVERIFY(std::string(blas.getStatusString(CUBLAS_STATUS_NOT_INITIALIZED))
                    .find("not initialized") != std::string::npos);
#else
        QSKIP("built without CUDA: NCCL and cuBLAS are not used");
#endif
    }

    void unknownWordsAreRejected_data()
    {
        QTest::addColumn<QString>("word");
        QTest::newRow("x") << "x";
        QTest::newRow("empty") << "";
        QTest::newRow("upper") << "CPU";
        QTest::newRow("cuda") << "cuda";
    }

    void unknownWordsAreRejected()
    {
        QFETCH(QString, word);
        const std::string w = word.toStdString();
        try {
            cuda::chooseBackend(w);
            QFAIL("an unknown backend must throw std::invalid_argument");
        } catch (const std::invalid_argument &e) {
            const std::string msg = e.what();
            QVERIFY2(msg.find("'" + w + "'") != std::string::npos, e.what());
            QVERIFY2(msg.find("cpu, nccl, gloo or auto") != std::string::npos, e.what());
        }
    }

    void gpuTrainingWithoutGpuSaysWhy()
    {
        if (test::gpuCount() > 0)
            QSKIP("this machine has a GPU: tst_gputraining covers runNcclTraining");
        nn::TrainConfig config;
        config.worldSize = 1;
        config.steps = 1;
        try {
            cuda::runNcclTraining(config, {});
            QFAIL("runNcclTraining must throw without a GPU");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find("--backend cpu") != std::string::npos, e.what());
        }
    }
};

QTEST_GUILESS_MAIN(TestBackendSelect)
#include "tst_backendselect.moc"

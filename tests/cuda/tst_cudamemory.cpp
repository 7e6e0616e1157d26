// CudaMemory, the GPU MemorySpace the engine keeps NCCL ranks' tensors in: copies both
// ways and within the device, zero, addF32, collective buffers, stream-ordered frees, and
// an allocation the device cannot hold failing with the size, the device and what is free.
// Skips with the reason without CUDA or a GPU.

#include <QtTest>

#include <cstdint>
#include <string>
#include <vector>

#include "gpuavailable.h"

#if SHARDSCOPE_HAVE_CUDA
#include "comm/nccl/cudamemory.h"
#include "comm/nccl/ncclcommunicator.h"
#include "cuda/devicebuffer.h"
#endif

using namespace shardscope;

class TestCudaMemory : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase() { SHARDSCOPE_REQUIRE_GPU(); }

#if SHARDSCOPE_HAVE_CUDA
    void copiesZeroAndAddOnTheComputeStream()
    {
        cuda::setDevice(0);
        cuda::Stream compute, comm;
        comm::CudaMemory mem(0, compute.get(), comm.get());
        QVERIFY(!mem.isHost());
        QCOMPARE(mem.name(), std::string("cuda:0"));
        QVERIFY(mem.allocate(0) == nullptr);

        const std::size_t n = 1000;
        std::vector<float> a(n), b(n);
        for (std::size_t i = 0; i < n; ++i) {
            a[i] = static_cast<float>(i);
            b[i] = 0.5f * static_cast<float>(i) + 1.0f;
        }
        comm::Buffer da(mem, n * sizeof(float)), db(mem, n * sizeof(float)),
            dc(mem, n * sizeof(float));
        mem.copy(da.data(), a.data(), n * sizeof(float), comm::CopyKind::HostToSpace);
        mem.copy(db.data(), b.data(), n * sizeof(float), comm::CopyKind::HostToSpace);
        mem.copy(dc.data(), da.data(), n * sizeof(float), comm::CopyKind::WithinSpace);
        mem.addF32(dc.f32(), db.f32(), n);
        mem.zero(da.data(), 16 * sizeof(float));

        std::vector<float> c(n), z(n);
        mem.copy(c.data(), dc.data(), n * sizeof(float), comm::CopyKind::SpaceToHost);
        mem.copy(z.data(), da.data(), n * sizeof(float), comm::CopyKind::SpaceToHost);
        for (std::size_t i = 0; i < n; ++i) {
            QCOMPARE(c[i], a[i] + b[i]);
            QCOMPARE(z[i], i < 16 ? 0.0f : a[i]);
        }
    }

    void collectiveBuffersAndFreesAreStreamOrdered()
    {
        cuda::setDevice(0);
        cuda::Stream compute, comm;
        comm::CudaMemory mem(0, compute.get(), comm.get());
        // Allocate, use and free many times: the pool reuses memory across the two
        // streams without a device-wide synchronisation.
        for (int round = 0; round < 50; ++round) {
            std::byte *p = mem.allocateForCollective(1 << 20);
            QVERIFY(p != nullptr);
            QCOMPARE(cudaMemsetAsync(p, round, 1 << 20, comm.get()), cudaSuccess);
            QCOMPARE(cudaStreamSynchronize(comm.get()), cudaSuccess);
            std::uint8_t first = 0;
            mem.copy(&first, p, 1, comm::CopyKind::SpaceToHost);
            QCOMPARE(int(first), round);
            mem.deallocate(p, 1 << 20);
        }
        compute.synchronize();
    }

    void anImpossibleAllocationSaysHowMuchAndWhere()
    {
        cuda::setDevice(0);
        cuda::Stream compute, comm;
        comm::CudaMemory mem(0, compute.get(), comm.get());
        try {
            mem.allocate(std::size_t(1) << 50); // 1 PiB
            QFAIL("a 1 PiB allocation must fail");
        } catch (const comm::CommError &e) {
            const std::string what = e.what();
            QVERIFY2(what.find("cuda:0") != std::string::npos, e.what());
            QVERIFY2(what.find("MiB") != std::string::npos, e.what());
            QVERIFY2(what.find("free") != std::string::npos, e.what());
        }
        // The device is still usable.
        comm::Buffer ok(mem, 64);
        QVERIFY(ok.data() != nullptr);
    }

    void ncclCommunicatorMemoryFollowsItsComputeStream()
    {
        comm::NcclLocalWorld world = comm::makeNcclLocalWorld({0});
        comm::NcclCommunicator &c = world[0];
        QVERIFY(c.computeStream() == nullptr); // standalone default: the legacy stream
        QVERIFY(c.orderAfterCompute());
        const cudaStream_t own = c.useOwnComputeStream();
        QVERIFY(own != nullptr);
        QVERIFY(c.computeStream() == own);
        auto &mem = dynamic_cast<comm::CudaMemory &>(c.memory());
        QVERIFY(mem.computeStream() == own);
        QVERIFY(mem.commStream() == c.commStream());
        QCOMPARE(mem.device(), c.device());
        c.bindThread();
        c.waitForCompute(); // recorded on the own stream; must not fail
    }
#endif
};

QTEST_GUILESS_MAIN(TestCudaMemory)
#include "tst_cudamemory.moc"

// NcclCommunicator against plain CPU references: all_gather, broadcast and
// reduce_scatter (f32, bf16) on device buffers for every world size the machine's GPUs
// allow (one rank per GPU: world 1 on one GPU), the one-process-per-GPU start through
// the rendezvous (world 1), and bad input. Skips with the reason without CUDA or a GPU.

#include <QtTest>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpuavailable.h"

#if SHARDSCOPE_HAVE_CUDA
#include "comm/nccl/ncclcommunicator.h"
#include "cuda/devicebuffer.h"
#include "cuda/layers.h"
#endif

#include <atomic>
#include <chrono>

using namespace shardscope;

#if SHARDSCOPE_HAVE_CUDA
namespace {

using World = comm::NcclLocalWorld;

World localWorld(int n)
{
    std::vector<int> devices;
    for (int d = 0; d < n; ++d)
        devices.push_back(d);
    return comm::makeNcclLocalWorld(devices);
}

// Runs fn(comm) on one thread per rank (each on its GPU); returns the first error.
std::string onEveryRank(World &world, const std::function<void(comm::NcclCommunicator &)> &fn)
{
    std::vector<std::string> errors(world.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < world.size(); ++r)
        threads.emplace_back([&, r] {
            try {
                cuda::setDevice(world[r].device());
                fn(world[r]);
            } catch (const std::exception &e) {
                errors[r] = e.what();
            }
        });
    for (auto &t : threads)
        t.join();
    for (const std::string &e : errors)
        if (!e.empty()) return e;
    return {};
}

std::uint16_t toBf16(float f)
{
    std::uint32_t u = 0;
    std::memcpy(&u, &f, 4);
    return static_cast<std::uint16_t>(u >> 16);
}

float fromBf16(std::uint16_t h)
{
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f = 0;
    std::memcpy(&f, &u, 4);
    return f;
}

std::vector<int> worldSizes()
{
    std::vector<int> sizes = {1};
    const int n = std::min(test::gpuCount(), 8);
    if (n >= 2) sizes.push_back(2);
    if (n > 2) sizes.push_back(n);
    return sizes;
}

} // namespace
#endif

class TestNcclCommunicator : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase() { SHARDSCOPE_REQUIRE_GPU(); }

#if SHARDSCOPE_HAVE_CUDA
    void allGatherMatchesReference()
    {
        for (int n : worldSizes()) {
            World world = localWorld(n);
            for (std::size_t bytes :
                 {std::size_t(1), std::size_t(3), std::size_t(1000), std::size_t((1 << 20) + 7)}) {
                const std::string err = onEveryRank(world, [&](comm::NcclCommunicator &c) {
                    std::vector<std::uint8_t> mine(bytes);
                    for (std::size_t i = 0; i < bytes; ++i)
                        mine[i] = static_cast<std::uint8_t>(c.rank() * 31 + i * 7);
                    cuda::DeviceBuffer send(bytes), recv(bytes * n);
                    send.upload(mine.data(), bytes);
                    comm::CommHandle h = c.allGather(send.data(), recv.data(), bytes);
                    h.wait();
                    if (!h.ready()) throw std::runtime_error("handle not ready after wait()");
                    const auto got = recv.toHost<std::uint8_t>();
                    for (int r = 0; r < n; ++r)
                        for (std::size_t i = 0; i < bytes; ++i)
                            if (got[r * bytes + i] != static_cast<std::uint8_t>(r * 31 + i * 7))
                                throw std::runtime_error("all_gather differs at rank block " +
                                                         std::to_string(r) + " byte " +
                                                         std::to_string(i));
                });
                QVERIFY2(err.empty(),
                         (std::to_string(n) + " ranks, " + std::to_string(bytes) + " bytes: " + err)
                             .c_str());
            }
        }
    }

    void broadcastFromEveryRoot()
    {
        for (int n : worldSizes()) {
            World world = localWorld(n);
            for (int root = 0; root < n; ++root) {
                const std::size_t bytes = 4099;
                const std::string err = onEveryRank(world, [&](comm::NcclCommunicator &c) {
                    std::vector<std::uint8_t> mine(bytes);
                    for (std::size_t i = 0; i < bytes; ++i)
                        mine[i] = static_cast<std::uint8_t>(c.rank() * 17 + i);
                    cuda::DeviceBuffer buf(bytes);
                    buf.upload(mine.data(), bytes);
                    c.broadcast(buf.data(), bytes, root).wait();
                    const auto got = buf.toHost<std::uint8_t>();
                    for (std::size_t i = 0; i < bytes; ++i)
                        if (got[i] != static_cast<std::uint8_t>(root * 17 + i))
                            throw std::runtime_error("broadcast differs at byte " +
                                                     std::to_string(i));
                });
                QVERIFY2(err.empty(), err.c_str());
            }
        }
    }

    void reduceScatterSumsF32AndBf16()
    {
        for (int n : worldSizes()) {
            World world = localWorld(n);
            for (std::size_t count : {std::size_t(1), std::size_t(5), std::size_t(4097)}) {
                for (DType dtype : {DType::F32, DType::BF16}) {
                    const std::string err = onEveryRank(world, [&](comm::NcclCommunicator &c) {
                        // Small integers whose sums over 8 ranks stay below 256: exact in bf16
                        // and in any summation order.
                        auto value = [](int rank, std::size_t i) {
                            return float((rank + 1) + (i % 5));
                        };
                        const std::size_t total = count * n;
                        cuda::DeviceBuffer send(total * dtypeSize(dtype)),
                            recv(count * dtypeSize(dtype));
                        if (dtype == DType::F32) {
                            std::vector<float> v(total);
                            for (std::size_t i = 0; i < total; ++i)
                                v[i] = value(c.rank(), i);
                            send.upload(v.data(), total * 4);
                        } else {
                            std::vector<std::uint16_t> v(total);
                            for (std::size_t i = 0; i < total; ++i)
                                v[i] = toBf16(value(c.rank(), i));
                            send.upload(v.data(), total * 2);
                        }
                        c.reduceScatter(send.data(), recv.data(), count, dtype).wait();
                        for (std::size_t j = 0; j < count; ++j) {
                            const std::size_t i = c.rank() * count + j;
                            float want = 0;
                            for (int r = 0; r < n; ++r)
                                want += value(r, i);
                            float got = 0;
                            if (dtype == DType::F32) {
                                recv.download(&got, 4, j * 4);
                            } else {
                                std::uint16_t h = 0;
                                recv.download(&h, 2, j * 2);
                                got = fromBf16(h);
                            }
                            if (got != want)
                                throw std::runtime_error(
                                    "reduce_scatter element " + std::to_string(j) + ": " +
                                    std::to_string(got) + " != " + std::to_string(want));
                        }
                    });
                    QVERIFY2(err.empty(), err.c_str());
                }
            }
        }
    }

    void collectivesRunOnTheCommStreamAndReportCompletion()
    {
        World world = localWorld(1);
        comm::NcclCommunicator &c = world.front();
        QVERIFY(c.deviceBuffers());
        QCOMPARE(c.backend(), comm::Backend::Nccl);
        QVERIFY(c.commStream() != nullptr);
        cuda::DeviceBuffer send(64 << 20), recv(64 << 20);
        comm::CommHandle h = c.allGather(send.data(), recv.data(), 64 << 20);
        h.wait();
        QVERIFY(h.ready());
        c.barrier();
        QCOMPARE(c.allReduceHost(2.5), 2.5);
    }

    // cudaEventQuery's "not ready" is recorded as the thread's last CUDA error; a handle
    // polled before its collective finished must not leave it for the next kernel's launch
    // check (the engine polls prefetches, then the trainer launches kernels).
    void aHandleNotYetReadyLeavesNoErrorForTheNextLaunch()
    {
        World world = localWorld(1);
        comm::NcclCommunicator &c = world.front();
        cuda::Stream compute;
        c.setComputeStream(compute.get()); // standalone: the collective waits for this stream
        // Allocated first: nothing below may wait for the held stream.
        cuda::DeviceBuffer send(1024), recv(1024), x(256 * sizeof(float));
        // Static: the stream's callback may still read it after an early return.
        static std::atomic<bool> go;
        go.store(false);
        // Holds the compute stream, and with it the collective, until the host says go
        // (bounded, so that a mistake here fails the test instead of hanging it).
        const auto hold = [](void *flag) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (!static_cast<std::atomic<bool> *>(flag)->load() &&
                   std::chrono::steady_clock::now() < until)
                std::this_thread::yield();
        };
        QCOMPARE(cudaLaunchHostFunc(compute.get(), hold, &go), cudaSuccess);
        struct Release
        {
            ~Release() { go.store(true); } // whatever happens below
        } release;
        comm::CommHandle h = c.allGather(send.data(), recv.data(), 1024);
        const bool readyBeforeGo = h.ready();
        std::string launchError;
        try {
            cuda::scale(x.f32(), 2.0f, 256, compute.get());
        } catch (const std::exception &e) {
            launchError = e.what();
        }
        go.store(true);
        h.wait();
        compute.synchronize();
        QVERIFY(!readyBeforeGo);
        QVERIFY2(launchError.empty(), launchError.c_str());
        c.setComputeStream(nullptr); // the stream goes before the communicator
    }

    void hostPointersAndBadRootsAreErrors()
    {
        World world = localWorld(1);
        comm::NcclCommunicator &c = world.front();
        std::vector<char> host(16);
        cuda::DeviceBuffer dev(16);
        try {
            c.allGather(host.data(), dev.data(), 16);
            QFAIL("a host pointer must be refused");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find("host pointer") != std::string::npos, e.what());
        }
        try {
            c.broadcast(dev.data(), 16, 1);
            QFAIL("root 1 of a world of 1 must be refused");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find("root 1") != std::string::npos, e.what());
        }
    }

    void oneProcessPerGpuStartThroughRendezvous()
    {
        comm::RendezvousConfig config;
        config.rank = 0;
        config.worldSize = 1;
        config.localRank = 0;
        config.masterPort = 0;
        auto comm = comm::makeNcclRank(config);
        QCOMPARE(comm->rank(), 0);
        QCOMPARE(comm->worldSize(), 1);
        cuda::DeviceBuffer send(8), recv(8);
        const char text[8] = {'s', 'h', 'a', 'r', 'd', '0', '0', '1'};
        send.upload(text, 8);
        comm->allGather(send.data(), recv.data(), 8).wait();
        char back[8] = {};
        recv.download(back, 8);
        QVERIFY(std::memcmp(back, text, 8) == 0);
    }

    void moreRanksThanGpusIsAClearError()
    {
        const int n = test::gpuCount();
        try {
            localWorld(n + 1);
            QFAIL("a rank without a GPU must be refused");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find("one GPU per rank") != std::string::npos, e.what());
        }
    }
#endif
};

QTEST_GUILESS_MAIN(TestNcclCommunicator)
#include "tst_ncclcommunicator.moc"

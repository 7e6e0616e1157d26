// The asynchronous wrapper against the synchronous CPU world it wraps: the same results
// for every collective, completion in issue order, calls that really return before the
// peers joined, errors from wait() on every rank, barrier and abort semantics, and a
// destructor that finishes what is queued. Every world runs under a watchdog, so a hang
// fails the test instead of stalling it.

#include <QtTest>

#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/asynccommunicator.h"
#include "comm/cpucommunicator.h"
#include "randomfloats.h"

using namespace shardscope;

namespace {

constexpr auto kWatchdog = std::chrono::seconds(60);
constexpr std::uint8_t kGuard = 0xA5;
constexpr std::size_t kGuardBytes = 64;

using World = std::vector<std::unique_ptr<comm::Communicator>>;

World asyncWorld(int n)
{
    return comm::makeAsyncCommunicators(comm::makeCpuWorld(n));
}

// Runs body on one thread per rank, as a training process would; what each rank threw
// is returned by rank ("" when nothing). Aborts the test process if the ranks are not
// done within kWatchdog, so a hang is reported as a failure.
std::vector<std::string> runRanks(World &comms,
                                  const std::function<void(comm::Communicator &)> &body)
{
    const std::size_t n = comms.size();
    std::vector<std::string> thrown(n);
    std::mutex mutex;
    std::condition_variable doneCv;
    std::size_t done = 0;
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
            try {
                body(*comms[r]);
            } catch (const comm::CommError &e) {
                thrown[r] = std::string("CommError: ") + e.what();
            } catch (const std::exception &e) {
                thrown[r] = std::string("unexpected exception: ") + e.what();
            }
            std::lock_guard lock(mutex);
            ++done;
            doneCv.notify_all();
        });
    }
    {
        std::unique_lock lock(mutex);
        if (!doneCv.wait_for(lock, kWatchdog, [&] { return done == n; }))
            qFatal("watchdog: the ranks did not finish within %lld s; a collective hangs",
                   static_cast<long long>(kWatchdog.count()));
    }
    for (auto &t : threads)
        t.join();
    return thrown;
}

// Runs fn on a thread of its own, bounded by the watchdog (for destructors).
void within(const char *what, const std::function<void()> &fn)
{
    std::mutex mutex;
    std::condition_variable doneCv;
    bool done = false;
    std::thread t([&] {
        fn();
        std::lock_guard lock(mutex);
        done = true;
        doneCv.notify_all();
    });
    std::unique_lock lock(mutex);
    if (!doneCv.wait_for(lock, kWatchdog, [&] { return done; }))
        qFatal("watchdog: %s did not finish within %lld s", what,
               static_cast<long long>(kWatchdog.count()));
    lock.unlock();
    t.join();
}

std::string firstThrown(const std::vector<std::string> &thrown)
{
    for (std::size_t r = 0; r < thrown.size(); ++r)
        if (!thrown[r].empty()) return "rank " + std::to_string(r) + ": " + thrown[r];
    return {};
}

std::uint8_t pattern(int rank, std::size_t i, int salt = 0)
{
    return static_cast<std::uint8_t>(rank * 131 + static_cast<int>(i % 251) * 7 + salt * 29 + 13);
}

using test::randomFloats;

// A receive buffer with guard bytes around it; the whole storage is compared, so a
// write outside the buffer shows as a difference from the synchronous world.
std::vector<std::uint8_t> guarded(std::size_t bytes)
{
    return std::vector<std::uint8_t>(bytes + 2 * kGuardBytes, kGuard);
}

// Each rank's output (what body returns) from the synchronous world and from the
// asynchronous one; they must be byte-identical.
using Collective = std::function<std::vector<std::uint8_t>(comm::Communicator &)>;

void compareWithSync(int worldSize, const Collective &body)
{
    const auto n = static_cast<std::size_t>(worldSize);
    std::vector<std::vector<std::uint8_t>> sync(n), async(n);
    World syncComms = comm::makeCpuWorld(worldSize);
    const auto syncThrown = runRanks(syncComms, [&](comm::Communicator &c) {
        sync[static_cast<std::size_t>(c.rank())] = body(c);
    });
    QVERIFY2(firstThrown(syncThrown).empty(), firstThrown(syncThrown).c_str());
    World asyncComms = asyncWorld(worldSize);
    const auto asyncThrown = runRanks(asyncComms, [&](comm::Communicator &c) {
        async[static_cast<std::size_t>(c.rank())] = body(c);
    });
    QVERIFY2(firstThrown(asyncThrown).empty(), firstThrown(asyncThrown).c_str());
    for (std::size_t r = 0; r < n; ++r) {
        QCOMPARE(async[r].size(), sync[r].size());
        QVERIFY2(async[r] == sync[r], ("rank " + std::to_string(r) + " differs").c_str());
    }
}

// A single-rank communicator that records on which threads it was bound and used.
class RecordingComm final : public comm::Communicator
{
  public:
    int rank() const override { return 0; }
    int worldSize() const override { return 1; }
    comm::Backend backend() const override { return comm::Backend::Cpu; }
    void bindThread() override
    {
        std::lock_guard lock(m_mutex);
        m_bound.push_back(std::this_thread::get_id());
    }
    comm::CommHandle allGather(const void *send, void *recv, std::size_t bytes) override
    {
        {
            std::lock_guard lock(m_mutex);
            m_used.push_back(std::this_thread::get_id());
        }
        std::memcpy(recv, send, bytes);
        return {};
    }
    comm::CommHandle broadcast(void *, std::size_t, int) override { return {}; }
    comm::CommHandle reduceScatter(const void *, void *, std::size_t, DType) override { return {}; }
    void barrier() override {}

    std::vector<std::thread::id> bound() const
    {
        std::lock_guard lock(m_mutex);
        return m_bound;
    }
    std::vector<std::thread::id> used() const
    {
        std::lock_guard lock(m_mutex);
        return m_used;
    }

  private:
    mutable std::mutex m_mutex;
    std::vector<std::thread::id> m_bound, m_used;
};

// Forwards to a real communicator; calls hook when an all_gather starts (on the thread
// that runs it), so a test can see that the progress thread has begun one, or hold it.
class Probe final : public comm::Communicator
{
  public:
    Probe(std::unique_ptr<comm::Communicator> inner, std::function<void()> hook)
        : m_inner(std::move(inner)), m_hook(std::move(hook))
    {
    }
    int rank() const override { return m_inner->rank(); }
    int worldSize() const override { return m_inner->worldSize(); }
    comm::Backend backend() const override { return m_inner->backend(); }
    void abort() noexcept override { m_inner->abort(); }
    comm::CommHandle allGather(const void *send, void *recv, std::size_t bytes) override
    {
        m_hook();
        return m_inner->allGather(send, recv, bytes);
    }
    comm::CommHandle broadcast(void *buf, std::size_t bytes, int root) override
    {
        return m_inner->broadcast(buf, bytes, root);
    }
    comm::CommHandle reduceScatter(const void *send, void *recv, std::size_t count,
                                   DType dtype) override
    {
        return m_inner->reduceScatter(send, recv, count, dtype);
    }
    void barrier() override { m_inner->barrier(); }

  private:
    std::unique_ptr<comm::Communicator> m_inner;
    std::function<void()> m_hook;
};

// A flag one thread sets and others wait for.
class Flag
{
  public:
    void set()
    {
        {
            std::lock_guard lock(m_mutex);
            m_set = true;
        }
        m_cv.notify_all();
    }
    void wait()
    {
        std::unique_lock lock(m_mutex);
        m_cv.wait(lock, [this] { return m_set; });
    }

  private:
    std::mutex m_mutex;
    std::condition_variable m_cv;
    bool m_set = false;
};

} // namespace

class TestAsyncCommunicator : public QObject
{
    Q_OBJECT

  private slots:
    void allGatherMatchesSync_data();
    void allGatherMatchesSync();
    void broadcastMatchesSync_data();
    void broadcastMatchesSync();
    void reduceScatterMatchesSync_data();
    void reduceScatterMatchesSync();
    void backToBackCompleteInOrder();
    void callsReturnBeforePeersJoin();
    void mismatchFailsEveryWaiter();
    void barrierOrdersAfterQueuedOps();
    void abortReleasesRankWhosePeerNeverJoins();
    void abortCancelsQueuedOps();
    void destructorRunsQueuedOps();
    void progressThreadIsBound();
};

static void addRows()
{
    QTest::addColumn<int>("world");
    QTest::addColumn<qint64>("size");
    for (int w = 1; w <= 4; ++w)
        for (qint64 size : {qint64(0), qint64(1), qint64(7), qint64(4099), qint64(70000)})
            QTest::addRow("w%d_n%lld", w, static_cast<long long>(size)) << w << size;
}

void TestAsyncCommunicator::allGatherMatchesSync_data()
{
    addRows();
}

void TestAsyncCommunicator::allGatherMatchesSync()
{
    QFETCH(int, world);
    QFETCH(qint64, size);
    const auto bytes = static_cast<std::size_t>(size);
    compareWithSync(world, [&](comm::Communicator &c) {
        std::vector<std::uint8_t> send(bytes);
        for (std::size_t i = 0; i < bytes; ++i)
            send[i] = pattern(c.rank(), i);
        auto recv = guarded(bytes * static_cast<std::size_t>(c.worldSize()));
        c.allGather(send.data(), recv.data() + kGuardBytes, bytes).wait();
        return recv;
    });
}

void TestAsyncCommunicator::broadcastMatchesSync_data()
{
    addRows();
}

void TestAsyncCommunicator::broadcastMatchesSync()
{
    QFETCH(int, world);
    QFETCH(qint64, size);
    const auto bytes = static_cast<std::size_t>(size);
    compareWithSync(world, [&](comm::Communicator &c) {
        std::vector<std::uint8_t> out;
        for (int root = 0; root < c.worldSize(); ++root) {
            auto buf = guarded(bytes);
            for (std::size_t i = 0; i < bytes; ++i)
                buf[kGuardBytes + i] = pattern(c.rank(), i, root);
            c.broadcast(buf.data() + kGuardBytes, bytes, root).wait();
            out.insert(out.end(), buf.begin(), buf.end());
        }
        return out;
    });
}

void TestAsyncCommunicator::reduceScatterMatchesSync_data()
{
    addRows();
}

void TestAsyncCommunicator::reduceScatterMatchesSync()
{
    QFETCH(int, world);
    QFETCH(qint64, size);
    const auto count = static_cast<std::size_t>(size);
    compareWithSync(world, [&](comm::Communicator &c) {
        const auto w = static_cast<std::size_t>(c.worldSize());
        const auto f = randomFloats(w * count, static_cast<unsigned>(17 + c.rank()));
        std::vector<std::uint16_t> bf(f.size());
        for (std::size_t i = 0; i < f.size(); ++i)
            bf[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f[i]) >> 16);
        auto recvF32 = guarded(count * sizeof(float));
        auto recvBf16 = guarded(count * 2);
        // Both issued before either is waited for.
        const comm::CommHandle a =
            c.reduceScatter(f.data(), recvF32.data() + kGuardBytes, count, DType::F32);
        const comm::CommHandle b =
            c.reduceScatter(bf.data(), recvBf16.data() + kGuardBytes, count, DType::BF16);
        b.wait();
        a.wait();
        recvF32.insert(recvF32.end(), recvBf16.begin(), recvBf16.end());
        return recvF32;
    });
}

void TestAsyncCommunicator::backToBackCompleteInOrder()
{
    // Each round issues four collectives into buffers of its own and waits for none of
    // them; the rank then waits for the last one of all and finds every earlier one done.
    constexpr int kWorld = 3;
    constexpr int kRounds = 300;
    constexpr std::size_t kBytes = 33;
    constexpr std::size_t kCount = 5;
    World comms = asyncWorld(kWorld);
    std::vector<std::string> mismatch(kWorld);
    const auto thrown = runRanks(comms, [&](comm::Communicator &c) {
        const int rank = c.rank();
        const auto r = static_cast<std::size_t>(rank);
        struct Round
        {
            std::vector<std::uint8_t> send, recv, bcast;
            std::vector<float> rsSend, rsRecv;
            comm::CommHandle handles[4];
        };
        std::vector<Round> rounds(kRounds);
        for (int k = 0; k < kRounds; ++k) {
            Round &rd = rounds[static_cast<std::size_t>(k)];
            rd.send.resize(kBytes);
            for (std::size_t i = 0; i < kBytes; ++i)
                rd.send[i] = pattern(rank, i, k);
            rd.recv.assign(kWorld * kBytes, 0);
            rd.bcast.assign(kBytes, rank == k % kWorld ? static_cast<std::uint8_t>(k) : 0xEE);
            rd.rsSend.resize(kWorld * kCount);
            for (std::size_t i = 0; i < rd.rsSend.size(); ++i)
                rd.rsSend[i] = static_cast<float>(k * 1000 + rank * 10 + static_cast<int>(i));
            rd.rsRecv.assign(kCount, -1.0f);
            rd.handles[0] = c.allGather(rd.send.data(), rd.recv.data(), kBytes);
            rd.handles[1] = c.broadcast(rd.bcast.data(), kBytes, k % kWorld);
            rd.handles[2] = c.reduceScatter(rd.rsSend.data(), rd.rsRecv.data(), kCount, DType::F32);
            rd.handles[3] = c.allGather(rd.send.data(), rd.recv.data(), kBytes);
        }
        rounds.back().handles[3].wait();
        for (int k = 0; k < kRounds && mismatch[r].empty(); ++k) {
            const Round &rd = rounds[static_cast<std::size_t>(k)];
            for (const comm::CommHandle &h : rd.handles)
                if (!h.ready()) mismatch[r] = "round " + std::to_string(k) + " not done";
            for (const comm::CommHandle &h : rd.handles)
                h.wait();
            for (std::size_t j = 0; j < kWorld; ++j)
                for (std::size_t i = 0; i < kBytes; ++i)
                    if (rd.recv[j * kBytes + i] != pattern(static_cast<int>(j), i, k))
                        mismatch[r] = "all_gather round " + std::to_string(k) + " wrong";
            for (std::uint8_t b : rd.bcast)
                if (b != static_cast<std::uint8_t>(k))
                    mismatch[r] = "broadcast round " + std::to_string(k) + " wrong";
            for (std::size_t i = 0; i < kCount; ++i) {
                // Sum over ranks q of (1000k + 10q + r*kCount + i): exact in fp32.
                const double want = kWorld * (1000.0 * k + static_cast<double>(r * kCount + i)) +
                                    10.0 * kWorld * (kWorld - 1) / 2;
                if (rd.rsRecv[i] != static_cast<float>(want))
                    mismatch[r] = "reduce_scatter round " + std::to_string(k) + " got " +
                                  std::to_string(rd.rsRecv[i]) + ", expected " +
                                  std::to_string(want);
            }
        }
    });
    QVERIFY2(firstThrown(thrown).empty(), firstThrown(thrown).c_str());
    for (std::size_t r = 0; r < kWorld; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestAsyncCommunicator::callsReturnBeforePeersJoin()
{
    // Rank 0 issues an all_gather while rank 1 has not: the call returns and the handle
    // cannot be ready, since rank 1's part is missing. Then rank 1 issues; both complete.
    World comms = asyncWorld(2);
    std::mutex mutex;
    std::condition_variable cv;
    bool rank0Issued = false;
    bool readyBeforePeer = true;
    std::vector<std::vector<std::uint8_t>> recv(2, std::vector<std::uint8_t>(8, 0));
    const auto thrown = runRanks(comms, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        const std::uint8_t send[4] = {std::uint8_t(10 * r + 1), std::uint8_t(10 * r + 2),
                                      std::uint8_t(10 * r + 3), std::uint8_t(10 * r + 4)};
        if (r == 0) {
            const comm::CommHandle h = c.allGather(send, recv[0].data(), 4);
            {
                std::lock_guard lock(mutex);
                readyBeforePeer = h.ready();
                rank0Issued = true;
            }
            cv.notify_all();
            h.wait();
        } else {
            {
                std::unique_lock lock(mutex);
                cv.wait(lock, [&] { return rank0Issued; });
            }
            c.allGather(send, recv[1].data(), 4).wait();
        }
    });
    QVERIFY2(firstThrown(thrown).empty(), firstThrown(thrown).c_str());
    QVERIFY2(!readyBeforePeer, "rank 0's all_gather was complete before rank 1 issued its own");
    const std::vector<std::uint8_t> want = {1, 2, 3, 4, 11, 12, 13, 14};
    QCOMPARE(recv[0], want);
    QCOMPARE(recv[1], want);
}

void TestAsyncCommunicator::mismatchFailsEveryWaiter()
{
    // Rank 2 gathers 512 bytes, the others 1024: every rank's wait() throws the inner
    // CommError, to every thread that waits, and the world stays usable.
    constexpr int kWorld = 4;
    World comms = asyncWorld(kWorld);
    std::vector<std::string> first(kWorld), second(kWorld), otherThread(kWorld);
    std::vector<char> readyAfter(kWorld, 0), recvUntouched(kWorld, 0), recovered(kWorld, 0);
    const auto thrown = runRanks(comms, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        std::vector<std::uint8_t> send(1024, static_cast<std::uint8_t>(r)), recv(4 * 1024, 0x77);
        const comm::CommHandle h = c.allGather(send.data(), recv.data(), r == 2 ? 512 : 1024);
        std::thread other([&] {
            try {
                h.wait();
            } catch (const comm::CommError &e) {
                otherThread[r] = e.what();
            }
        });
        try {
            h.wait();
        } catch (const comm::CommError &e) {
            first[r] = e.what();
        }
        try {
            h.wait();
        } catch (const comm::CommError &e) {
            second[r] = e.what();
        }
        other.join();
        readyAfter[r] = h.ready();
        recvUntouched[r] = std::all_of(recv.begin(), recv.end(), [](auto b) { return b == 0x77; });
        c.allGather(send.data(), recv.data(), 1024).wait();
        recovered[r] = recv[0] == 0 && recv[3 * 1024 + 1023] == 3;
    });
    QVERIFY2(firstThrown(thrown).empty(), firstThrown(thrown).c_str());
    for (std::size_t r = 0; r < kWorld; ++r) {
        const QString msg = QString::fromStdString(first[r]);
        QVERIFY2(msg.contains("all_gather"), qPrintable(msg));
        QVERIFY2(msg.contains("ranks 0, 1, 3: 1024 bytes"), qPrintable(msg));
        QVERIFY2(msg.contains("rank 2: 512 bytes"), qPrintable(msg));
        QCOMPARE(second[r], first[r]);
        QCOMPARE(otherThread[r], first[r]);
        QVERIFY(readyAfter[r]);
        QVERIFY(recvUntouched[r]);
        QVERIFY(recovered[r]);
    }
}

void TestAsyncCommunicator::barrierOrdersAfterQueuedOps()
{
    constexpr int kWorld = 3;
    World comms = asyncWorld(kWorld);
    std::vector<std::string> problem(kWorld);
    const auto thrown = runRanks(comms, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        for (int round = 0; round < 200 && problem[r].empty(); ++round) {
            std::vector<std::uint8_t> send(64, pattern(c.rank(), 0, round));
            std::vector<std::uint8_t> recv(kWorld * 64, 0);
            std::vector<float> rsSend(kWorld * 16, 1.0f), rsRecv(16, 0.0f);
            const comm::CommHandle a = c.allGather(send.data(), recv.data(), 64);
            const comm::CommHandle b =
                c.reduceScatter(rsSend.data(), rsRecv.data(), 16, DType::F32);
            c.barrier();
            // No wait(): barrier() alone must have let both finish.
            if (!a.ready() || !b.ready()) {
                problem[r] = "round " + std::to_string(round) +
                             ": barrier returned before the collectives issued before it ran";
                a.wait();
                b.wait();
            } else if (recv[63] != pattern(0, 0, round) ||
                       recv[kWorld * 64 - 1] != pattern(kWorld - 1, 0, round) ||
                       rsRecv[15] != static_cast<float>(kWorld)) {
                problem[r] = "round " + std::to_string(round) + ": wrong results";
            }
        }
    });
    QVERIFY2(firstThrown(thrown).empty(), firstThrown(thrown).c_str());
    for (std::size_t r = 0; r < kWorld; ++r)
        QVERIFY2(problem[r].empty(), ("rank " + std::to_string(r) + ": " + problem[r]).c_str());
}

void TestAsyncCommunicator::abortReleasesRankWhosePeerNeverJoins()
{
    // Rank 0 issues two collectives; rank 1 "fails" before joining and aborts every local
    // communicator, as the engine does. Rank 0's waits throw instead of hanging, its
    // buffers are untouched, later calls throw, and both communicators can be destroyed.
    Flag started;
    World inner = comm::makeCpuWorld(2);
    World comms;
    comms.push_back(comm::makeAsyncCommunicator(
        std::make_unique<Probe>(std::move(inner[0]), [&] { started.set(); })));
    comms.push_back(comm::makeAsyncCommunicator(std::move(inner[1])));
    std::mutex mutex;
    std::condition_variable cv;
    bool issued = false;
    bool readyBeforeAbort = true;
    std::string runningError, queuedError, laterError, barrierError;
    bool untouched = false;
    const auto thrown = runRanks(comms, [&](comm::Communicator &c) {
        if (c.rank() == 1) {
            std::unique_lock lock(mutex);
            cv.wait(lock, [&] { return issued; });
            lock.unlock();
            for (auto &comm : comms)
                comm->abort();
            return;
        }
        std::vector<std::uint8_t> send(8, 1), recv(16, 0x77), buf(4, 0x66);
        const comm::CommHandle running = c.allGather(send.data(), recv.data(), 8);
        const comm::CommHandle queued = c.broadcast(buf.data(), 4, 1);
        started.wait(); // the all_gather is inside the inner communicator, waiting for rank 1
        {
            std::lock_guard lock(mutex);
            readyBeforeAbort = running.ready() || queued.ready();
            issued = true;
        }
        cv.notify_all();
        try {
            running.wait();
        } catch (const comm::CommError &e) {
            runningError = e.what();
        }
        try {
            queued.wait();
        } catch (const comm::CommError &e) {
            queuedError = e.what();
        }
        try {
            c.allGather(send.data(), recv.data(), 8);
        } catch (const comm::CommError &e) {
            laterError = e.what();
        }
        try {
            c.barrier();
        } catch (const comm::CommError &e) {
            barrierError = e.what();
        }
        untouched = std::all_of(recv.begin(), recv.end(), [](auto b) { return b == 0x77; }) &&
                    std::all_of(buf.begin(), buf.end(), [](auto b) { return b == 0x66; });
    });
    QVERIFY2(firstThrown(thrown).empty(), firstThrown(thrown).c_str());
    QVERIFY(!readyBeforeAbort);
    for (const std::string *msg : {&runningError, &queuedError, &laterError, &barrierError})
        QVERIFY2(msg->find("abort") != std::string::npos, ("got: '" + *msg + "'").c_str());
    QVERIFY2(laterError.find("rank 0 was aborted") != std::string::npos, laterError.c_str());
    QVERIFY(untouched);
    within("destroying an aborted world", [&] { comms.clear(); });
}

void TestAsyncCommunicator::abortCancelsQueuedOps()
{
    // An inner collective that abort() cannot release: the ops queued behind it fail at
    // once with the wrapper's error, the running one finishes when the backend lets it.
    Flag started, release;
    auto comm = comm::makeAsyncCommunicator(
        std::make_unique<Probe>(std::move(comm::makeCpuWorld(1)[0]), [&] {
            started.set();
            release.wait();
        }));
    // Lets the held collective go before comm is destroyed, also when a check fails.
    struct Releaser
    {
        Flag &flag;
        ~Releaser() { flag.set(); }
    } releaser{release};
    std::uint8_t send = 7, recv = 0, other = 0;
    const comm::CommHandle running = comm->allGather(&send, &recv, 1);
    started.wait();
    const comm::CommHandle queued1 = comm->allGather(&send, &other, 1);
    const comm::CommHandle queued2 = comm->broadcast(&other, 1, 0);
    comm->abort();
    QVERIFY(queued1.ready());
    QVERIFY(queued2.ready());
    QVERIFY(!running.ready());
    for (const comm::CommHandle *h : {&queued1, &queued2}) {
        QString msg;
        try {
            h->wait();
        } catch (const comm::CommError &e) {
            msg = e.what();
        }
        QVERIFY2(msg.contains("rank 0 was aborted after a failure on another rank"),
                 qPrintable(msg));
    }
    QCOMPARE(other, std::uint8_t(0));
    release.set();
    try {
        running.wait(); // the CPU world of one saw the abort too: either outcome is fine
    } catch (const comm::CommError &) {
    }
    QVERIFY(running.ready());
    within("destroying an aborted communicator", [&] { comm.reset(); });
}

void TestAsyncCommunicator::destructorRunsQueuedOps()
{
    // The ranks issue and leave without waiting; destroying the communicators runs
    // everything still queued, so the buffers hold the results afterwards.
    constexpr int kWorld = 3;
    constexpr int kOps = 100;
    constexpr std::size_t kBytes = 16;
    World comms = asyncWorld(kWorld);
    std::vector<std::vector<std::uint8_t>> send(kWorld), recv(kWorld);
    std::vector<std::vector<comm::CommHandle>> handles(kWorld);
    for (std::size_t r = 0; r < kWorld; ++r) {
        send[r].resize(kOps * kBytes);
        for (std::size_t i = 0; i < send[r].size(); ++i)
            send[r][i] = pattern(static_cast<int>(r), i);
        recv[r].assign(kOps * kWorld * kBytes, 0);
    }
    const auto thrown = runRanks(comms, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        for (std::size_t k = 0; k < kOps; ++k)
            handles[r].push_back(c.allGather(send[r].data() + k * kBytes,
                                             recv[r].data() + k * kWorld * kBytes, kBytes));
    });
    QVERIFY2(firstThrown(thrown).empty(), firstThrown(thrown).c_str());
    within("destroying a world with queued collectives", [&] { comms.clear(); });
    for (std::size_t r = 0; r < kWorld; ++r) {
        for (const comm::CommHandle &h : handles[r]) {
            QVERIFY(h.ready());
            h.wait();
        }
        for (std::size_t k = 0; k < kOps; ++k)
            for (std::size_t j = 0; j < kWorld; ++j)
                for (std::size_t i = 0; i < kBytes; ++i)
                    QCOMPARE(recv[r][(k * kWorld + j) * kBytes + i], send[j][k * kBytes + i]);
    }
}

void TestAsyncCommunicator::progressThreadIsBound()
{
    auto owned = std::make_unique<RecordingComm>();
    RecordingComm *inner = owned.get();
    auto comm = comm::makeAsyncCommunicator(std::move(owned));
    comm->bindThread(); // the caller's own thread, forwarded
    const std::uint32_t in = 0xDEADBEEF;
    std::uint32_t out = 0;
    comm->allGather(&in, &out, sizeof in).wait();
    QCOMPARE(out, in);
    const auto bound = inner->bound();
    const auto used = inner->used();
    QCOMPARE(used.size(), std::size_t(1));
    QVERIFY(used[0] != std::this_thread::get_id());
    QVERIFY2(std::find(bound.begin(), bound.end(), used[0]) != bound.end(),
             "the progress thread ran a collective without binding itself first");
    QVERIFY(std::find(bound.begin(), bound.end(), std::this_thread::get_id()) != bound.end());
    QCOMPARE(&comm->memory(), &inner->memory());
}

QTEST_GUILESS_MAIN(TestAsyncCommunicator)
#include "tst_asynccommunicator.moc"

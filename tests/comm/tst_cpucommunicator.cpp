// The CPU communicator against plain single-threaded references: every collective for
// world sizes 1-8 (and 16) with uneven sizes, bf16 rounding, long runs of collectives,
// and ranks that disagree, which must make every rank throw instead of hanging.

#include <QtTest>

#include <bit>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/cpucommunicator.h"
#include "comm/streamingcopy.h"
#include "randomfloats.h"

using namespace shardscope;

namespace {

constexpr std::uint8_t kGuard = 0xA5;
constexpr std::size_t kGuardBytes = 64;

// What each rank's thread ended with: "" or the message of what it threw.
struct Outcome
{
    std::vector<std::string> thrown;   // CommError messages, per rank
    std::vector<std::string> failures; // anything else that went wrong, per rank
};

// Runs body on worldSize threads, one per rank, as a training process would.
Outcome runRanks(int worldSize, const std::function<void(comm::Communicator &)> &body)
{
    auto comms = comm::makeCpuWorld(worldSize);
    Outcome out;
    out.thrown.resize(static_cast<std::size_t>(worldSize));
    out.failures.resize(static_cast<std::size_t>(worldSize));
    std::vector<std::thread> threads;
    for (int r = 0; r < worldSize; ++r) {
        threads.emplace_back([&, r] {
            const auto i = static_cast<std::size_t>(r);
            try {
                body(*comms[i]);
            } catch (const comm::CommError &e) {
                out.thrown[i] = e.what();
            } catch (const std::exception &e) {
                out.failures[i] = std::string("unexpected exception: ") + e.what();
            }
        });
    }
    for (auto &t : threads)
        t.join();
    return out;
}

std::string firstFailure(const Outcome &o)
{
    for (std::size_t r = 0; r < o.failures.size(); ++r)
        if (!o.failures[r].empty()) return "rank " + std::to_string(r) + ": " + o.failures[r];
    for (std::size_t r = 0; r < o.thrown.size(); ++r)
        if (!o.thrown[r].empty()) return "rank " + std::to_string(r) + " threw: " + o.thrown[r];
    return {};
}

std::uint8_t pattern(int rank, std::size_t i, int salt = 0)
{
    return static_cast<std::uint8_t>(rank * 131 + static_cast<int>(i % 251) * 7 + salt * 29 + 13);
}

// A buffer with guard bytes on both sides, to see that nothing writes past its size.
class Guarded
{
  public:
    explicit Guarded(std::size_t bytes) : m_bytes(bytes), m_storage(bytes + 2 * kGuardBytes, kGuard)
    {
    }
    std::uint8_t *data() { return m_storage.data() + kGuardBytes; }
    const std::uint8_t *data() const { return m_storage.data() + kGuardBytes; }
    std::size_t size() const { return m_bytes; }
    bool guardsIntact() const
    {
        for (std::size_t i = 0; i < kGuardBytes; ++i)
            if (m_storage[i] != kGuard || m_storage[kGuardBytes + m_bytes + i] != kGuard)
                return false;
        return true;
    }

  private:
    std::size_t m_bytes;
    std::vector<std::uint8_t> m_storage;
};

// "" when got equals expected, else where they first differ.
std::string compareBytes(const std::uint8_t *got, const std::uint8_t *expected, std::size_t n)
{
    if (n == 0 || std::memcmp(got, expected, n) == 0) return {};
    std::size_t i = 0;
    while (got[i] == expected[i])
        ++i;
    return "byte " + std::to_string(i) + " of " + std::to_string(n) + " is " +
           std::to_string(got[i]) + ", expected " + std::to_string(expected[i]);
}

// Round-to-nearest-even from fp32 to bf16, written independently of the library.
std::uint16_t referenceBf16(float f)
{
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
    if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
    std::uint32_t upper = bits >> 16;
    const std::uint32_t lower = bits & 0xFFFFu;
    if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) ++upper;
    return static_cast<std::uint16_t>(upper);
}

float fromBf16(std::uint16_t h)
{
    return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

using test::randomFloats;

void addSizeRows(const std::vector<int> &worlds)
{
    QTest::addColumn<int>("world");
    QTest::addColumn<qint64>("size");
    for (int w : worlds) {
        const std::vector<qint64> sizes = {0, 1, w - 1, w, w + 1, 1000003};
        std::vector<qint64> seen;
        for (qint64 s : sizes) {
            if (s < 0 || std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
            seen.push_back(s);
            QTest::addRow("w%d/n%lld", w, static_cast<long long>(s)) << w << s;
        }
    }
}

} // namespace

class TestCpuCommunicator : public QObject
{
    Q_OBJECT

  private slots:
    void worldBasics();
    void rejectsEmptyWorld();
    void allGather_data();
    void allGather();
    void allGatherInPlace();
    void streamingCopyMatchesMemcpy();
    void allGatherAboveStreamingThreshold();
    void broadcastFromEveryRoot_data();
    void broadcastFromEveryRoot();
    void reduceScatterF32_data();
    void reduceScatterF32();
    void reduceScatterBf16_data();
    void reduceScatterBf16();
    void reduceScatterBf16RoundsToNearestEven();
    void reduceScatterInPlace();
    void manyBackToBackCollectives_data();
    void manyBackToBackCollectives();
    void mismatchedAllGatherSizes();
    void mismatchedReduceScatter();
    void mismatchedBroadcastRoot();
    void broadcastRootOutOfRange();
    void mismatchedCollectives();
    void nullBuffer();
};

void TestCpuCommunicator::worldBasics()
{
    auto comms = comm::makeCpuWorld(3);
    QCOMPARE(comms.size(), std::size_t(3));
    for (int r = 0; r < 3; ++r) {
        QCOMPARE(comms[static_cast<std::size_t>(r)]->rank(), r);
        QCOMPARE(comms[static_cast<std::size_t>(r)]->worldSize(), 3);
        QCOMPARE(comms[static_cast<std::size_t>(r)]->backend(), comm::Backend::Cpu);
        QVERIFY(!comms[static_cast<std::size_t>(r)]->deviceBuffers());
    }
    QCOMPARE(comm::backendName(comm::Backend::Cpu), std::string_view("cpu"));
    QCOMPARE(comm::backendName(comm::Backend::Nccl), std::string_view("nccl"));
    const comm::CommHandle h;
    QVERIFY(h.ready());
    h.wait();
}

void TestCpuCommunicator::rejectsEmptyWorld()
{
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, comm::makeCpuWorld(0));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, comm::makeCpuWorld(-3));
}

void TestCpuCommunicator::allGather_data()
{
    addSizeRows({1, 2, 3, 4, 5, 6, 7, 8, 16});
}

void TestCpuCommunicator::allGather()
{
    QFETCH(int, world);
    QFETCH(qint64, size);
    const auto bytes = static_cast<std::size_t>(size);
    const auto w = static_cast<std::size_t>(world);

    std::vector<std::uint8_t> expected(w * bytes);
    for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < bytes; ++i)
            expected[static_cast<std::size_t>(j) * bytes + i] = pattern(j, i);

    std::vector<std::string> mismatch(w);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        Guarded send(bytes);
        for (std::size_t i = 0; i < bytes; ++i)
            send.data()[i] = pattern(c.rank(), i);
        Guarded recv(w * bytes);
        c.allGather(send.data(), recv.data(), bytes).wait();
        mismatch[r] = compareBytes(recv.data(), expected.data(), w * bytes);
        if (!recv.guardsIntact() || !send.guardsIntact())
            mismatch[r] += " and wrote outside its buffers";
        for (std::size_t i = 0; i < bytes && mismatch[r].empty(); ++i)
            if (send.data()[i] != pattern(c.rank(), i)) mismatch[r] = "changed its send buffer";
    });
    QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
    for (std::size_t r = 0; r < w; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestCpuCommunicator::allGatherInPlace()
{
    // As with NCCL, send may be this rank's own block of recv.
    for (int world : {1, 3, 8}) {
        const std::size_t bytes = 1001;
        const auto w = static_cast<std::size_t>(world);
        std::vector<std::string> mismatch(w);
        std::vector<std::uint8_t> expected(w * bytes);
        for (int j = 0; j < world; ++j)
            for (std::size_t i = 0; i < bytes; ++i)
                expected[static_cast<std::size_t>(j) * bytes + i] = pattern(j, i, 5);
        const Outcome o = runRanks(world, [&](comm::Communicator &c) {
            const auto r = static_cast<std::size_t>(c.rank());
            std::vector<std::uint8_t> recv(w * bytes, 0);
            std::uint8_t *own = recv.data() + r * bytes;
            for (std::size_t i = 0; i < bytes; ++i)
                own[i] = pattern(c.rank(), i, 5);
            c.allGather(own, recv.data(), bytes);
            mismatch[r] = compareBytes(recv.data(), expected.data(), w * bytes);
        });
        QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
        for (std::size_t r = 0; r < w; ++r)
            QVERIFY2(mismatch[r].empty(), ("world " + std::to_string(world) + " rank " +
                                           std::to_string(r) + ": " + mismatch[r])
                                              .c_str());
    }
}

void TestCpuCommunicator::streamingCopyMatchesMemcpy()
{
    // Large all_gathers copy with non-temporal stores: every length and alignment must
    // give exactly memcpy's result and write nothing outside the destination.
    const std::vector<std::size_t> lengths = {
        0, 1, 15, 63, 64, 65, 4095, 3 * 16384 + 77, (1 << 20) + 13};
    const std::vector<std::size_t> offsets = {0, 1, 7, 16, 33, 63};
    for (std::size_t n : lengths) {
        std::vector<std::uint8_t> src(n + 64);
        for (std::size_t i = 0; i < src.size(); ++i)
            src[i] = pattern(3, i, static_cast<int>(i / 251));
        for (std::size_t so : offsets)
            for (std::size_t dOff : offsets) {
                Guarded dst(n + 64);
                comm::detail::streamingCopy(dst.data() + dOff, src.data() + so, n);
                const std::string diff = compareBytes(dst.data() + dOff, src.data() + so, n);
                QVERIFY2(diff.empty(),
                         (std::to_string(n) + " bytes, offsets " + std::to_string(so) + "/" +
                          std::to_string(dOff) + ": " + diff)
                             .c_str());
                for (std::size_t i = 0; i < dOff; ++i)
                    QCOMPARE(dst.data()[i], kGuard);
                for (std::size_t i = dOff + n; i < n + 64; ++i)
                    QCOMPARE(dst.data()[i], kGuard);
                QVERIFY(dst.guardsIntact());
            }
    }
}

void TestCpuCommunicator::allGatherAboveStreamingThreshold()
{
    const std::size_t threshold = comm::detail::streamingThreshold();
    if (threshold > (std::size_t(256) << 20))
        QSKIP("the streaming threshold of this machine's cache needs too much memory to test");
    const int world = 2;
    const std::size_t bytes = threshold / 2 + 4097; // odd, and above the threshold in total
    std::vector<std::string> mismatch(2);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        std::vector<std::uint8_t> send(bytes), recv(2 * bytes + 1, kGuard);
        for (std::size_t i = 0; i < bytes; ++i)
            send[i] = pattern(c.rank(), i);
        c.allGather(send.data(), recv.data() + 1, bytes);
        for (std::size_t i = 0; i < 2 * bytes && mismatch[r].empty(); ++i)
            if (recv[1 + i] != pattern(static_cast<int>(i / bytes), i % bytes))
                mismatch[r] = "byte " + std::to_string(i) + " is wrong";
        if (recv[0] != kGuard) mismatch[r] += " and the byte before recv was written";
    });
    QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
    for (std::size_t r = 0; r < 2; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestCpuCommunicator::broadcastFromEveryRoot_data()
{
    addSizeRows({1, 2, 3, 4, 5, 6, 7, 8});
}

void TestCpuCommunicator::broadcastFromEveryRoot()
{
    QFETCH(int, world);
    QFETCH(qint64, size);
    const auto bytes = static_cast<std::size_t>(size);
    const auto w = static_cast<std::size_t>(world);
    std::vector<std::string> mismatch(w);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        Guarded buf(bytes);
        std::vector<std::uint8_t> expected(bytes);
        for (int root = 0; root < world && mismatch[r].empty(); ++root) {
            for (std::size_t i = 0; i < bytes; ++i) {
                buf.data()[i] = pattern(c.rank(), i, root);
                expected[i] = pattern(root, i, root);
            }
            c.broadcast(buf.data(), bytes, root);
            mismatch[r] = compareBytes(buf.data(), expected.data(), bytes);
            if (!mismatch[r].empty())
                mismatch[r] = "root " + std::to_string(root) + ": " + mismatch[r];
            if (!buf.guardsIntact()) mismatch[r] += " wrote outside the buffer";
        }
    });
    QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
    for (std::size_t r = 0; r < w; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestCpuCommunicator::reduceScatterF32_data()
{
    addSizeRows({1, 2, 3, 4, 5, 6, 7, 8, 16});
}

void TestCpuCommunicator::reduceScatterF32()
{
    QFETCH(int, world);
    QFETCH(qint64, size);
    const auto count = static_cast<std::size_t>(size);
    const auto w = static_cast<std::size_t>(world);
    if (w == 16 && count > 100000)
        QSKIP("16 ranks x 1000003 elements is covered by smaller worlds");

    std::vector<std::vector<float>> send(w);
    for (std::size_t r = 0; r < w; ++r)
        send[r] = randomFloats(w * count, static_cast<unsigned>(r + 1));
    // The reference: each element summed in fp32 in rank order, single-threaded.
    std::vector<std::vector<float>> expected(w, std::vector<float>(count));
    for (std::size_t r = 0; r < w; ++r)
        for (std::size_t i = 0; i < count; ++i) {
            float acc = send[0][r * count + i];
            for (std::size_t k = 1; k < w; ++k)
                acc += send[k][r * count + i];
            expected[r][i] = acc;
        }

    std::vector<std::string> mismatch(w);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        Guarded recv(count * sizeof(float));
        c.reduceScatter(send[r].data(), recv.data(), count, DType::F32);
        mismatch[r] =
            compareBytes(recv.data(), reinterpret_cast<const std::uint8_t *>(expected[r].data()),
                         count * sizeof(float));
        if (!recv.guardsIntact()) mismatch[r] += " and wrote outside recv";
    });
    QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
    for (std::size_t r = 0; r < w; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestCpuCommunicator::reduceScatterBf16_data()
{
    addSizeRows({1, 2, 3, 5, 8});
}

void TestCpuCommunicator::reduceScatterBf16()
{
    QFETCH(int, world);
    QFETCH(qint64, size);
    const auto count = static_cast<std::size_t>(size);
    const auto w = static_cast<std::size_t>(world);

    std::vector<std::vector<std::uint16_t>> send(w);
    for (std::size_t r = 0; r < w; ++r) {
        const auto f = randomFloats(w * count, static_cast<unsigned>(100 + r));
        send[r].resize(f.size());
        for (std::size_t i = 0; i < f.size(); ++i)
            send[r][i] = referenceBf16(f[i]);
    }
    std::vector<std::vector<std::uint16_t>> expected(w, std::vector<std::uint16_t>(count));
    for (std::size_t r = 0; r < w; ++r)
        for (std::size_t i = 0; i < count; ++i) {
            float acc = fromBf16(send[0][r * count + i]);
            for (std::size_t k = 1; k < w; ++k)
                acc += fromBf16(send[k][r * count + i]);
            expected[r][i] = referenceBf16(acc);
        }

    std::vector<std::string> mismatch(w);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        Guarded recv(count * 2);
        c.reduceScatter(send[r].data(), recv.data(), count, DType::BF16);
        mismatch[r] = compareBytes(
            recv.data(), reinterpret_cast<const std::uint8_t *>(expected[r].data()), count * 2);
        if (!recv.guardsIntact()) mismatch[r] += " and wrote outside recv";
    });
    QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
    for (std::size_t r = 0; r < w; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestCpuCommunicator::reduceScatterBf16RoundsToNearestEven()
{
    // Five ranks, one element each: 1.0 + 4 * 2^-9. Accumulated in bf16 every partial
    // sum would round back to 1.0; in fp32 the sum is exactly 1 + 2^-7 (0x3F81).
    // Ties go to even: 1 + 2^-8 -> 1.0 (0x3F80), 1 + 3 * 2^-8 -> 0x3F82.
    struct Case
    {
        std::vector<float> perRank;
        std::uint16_t expected;
    };
    const std::vector<Case> cases = {
        {{1.0f, 0x1p-9f, 0x1p-9f, 0x1p-9f, 0x1p-9f}, 0x3F81},
        {{1.0f, 0x1p-8f}, 0x3F80},
        {{1.0f, 0x3p-8f}, 0x3F82},
        {{-1.0f, -0x3p-8f}, 0xBF82},
        {{0x1p-8f, -0x1p-8f}, 0x0000},
    };
    for (const Case &tc : cases) {
        const int world = static_cast<int>(tc.perRank.size());
        std::vector<std::uint16_t> got(tc.perRank.size(), 0xFFFF);
        const Outcome o = runRanks(world, [&](comm::Communicator &c) {
            const auto r = static_cast<std::size_t>(c.rank());
            // Each rank holds one element per rank; only slice 0 is checked here.
            std::vector<std::uint16_t> send(tc.perRank.size(), referenceBf16(tc.perRank[r]));
            std::uint16_t recv = 0xFFFF;
            c.reduceScatter(send.data(), &recv, 1, DType::BF16);
            got[r] = recv;
        });
        QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
        for (std::uint16_t g : got)
            QCOMPARE(g, tc.expected);
    }
}

void TestCpuCommunicator::reduceScatterInPlace()
{
    // recv may be this rank's own slice of send, as with NCCL.
    const int world = 4;
    const std::size_t count = 3000;
    const auto w = static_cast<std::size_t>(world);
    std::vector<std::vector<float>> send(w);
    for (std::size_t r = 0; r < w; ++r)
        send[r] = randomFloats(w * count, static_cast<unsigned>(40 + r));
    std::vector<std::vector<float>> expected(w, std::vector<float>(count));
    for (std::size_t r = 0; r < w; ++r)
        for (std::size_t i = 0; i < count; ++i) {
            float acc = send[0][r * count + i];
            for (std::size_t k = 1; k < w; ++k)
                acc += send[k][r * count + i];
            expected[r][i] = acc;
        }
    std::vector<std::string> mismatch(w);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        float *own = send[r].data() + r * count;
        c.reduceScatter(send[r].data(), own, count, DType::F32);
        mismatch[r] = compareBytes(reinterpret_cast<const std::uint8_t *>(own),
                                   reinterpret_cast<const std::uint8_t *>(expected[r].data()),
                                   count * sizeof(float));
    });
    QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
    for (std::size_t r = 0; r < w; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestCpuCommunicator::manyBackToBackCollectives_data()
{
    QTest::addColumn<int>("world");
    QTest::addColumn<int>("rounds");
    QTest::newRow("w2") << 2 << 2000;
    QTest::newRow("w5") << 5 << 2000;
    QTest::newRow("w8") << 8 << 2000;
    QTest::newRow("w16") << 16 << 500;
}

void TestCpuCommunicator::manyBackToBackCollectives()
{
    // Every round reuses the same buffers with new values, so a rank that leaves a
    // collective early, or reads a peer's buffer after it was refilled, is caught.
    QFETCH(int, world);
    QFETCH(int, rounds);
    const auto w = static_cast<std::size_t>(world);
    std::vector<std::string> mismatch(w);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const int rank = c.rank();
        const auto r = static_cast<std::size_t>(rank);
        const std::size_t bytes = 7;
        std::vector<std::uint8_t> send(bytes), recv(w * bytes), buf(bytes);
        std::vector<float> rsSend(w * 2), rsRecv(2);
        for (int round = 0; round < rounds && mismatch[r].empty(); ++round) {
            for (std::size_t i = 0; i < bytes; ++i)
                send[i] = pattern(rank, i, round);
            c.allGather(send.data(), recv.data(), bytes);
            std::fill(send.begin(), send.end(), std::uint8_t(0xEE)); // peers must be done with it
            for (std::size_t j = 0; j < w && mismatch[r].empty(); ++j)
                for (std::size_t i = 0; i < bytes; ++i)
                    if (recv[j * bytes + i] != pattern(static_cast<int>(j), i, round)) {
                        mismatch[r] = "all_gather round " + std::to_string(round) + " block " +
                                      std::to_string(j) + " is stale or wrong";
                        break;
                    }

            const int root = round % world;
            std::fill(buf.begin(), buf.end(),
                      static_cast<std::uint8_t>(rank == root ? round : 0xEE));
            c.broadcast(buf.data(), bytes, root);
            if (buf[0] != static_cast<std::uint8_t>(round) || buf[bytes - 1] != buf[0])
                mismatch[r] =
                    "broadcast round " + std::to_string(round) + " got " + std::to_string(buf[0]);

            // Integers small enough that every partial sum is exact in fp32.
            const int base = (round % 997) * 1000;
            for (std::size_t i = 0; i < rsSend.size(); ++i)
                rsSend[i] = static_cast<float>(base + rank * 10 + static_cast<int>(i));
            c.reduceScatter(rsSend.data(), rsRecv.data(), 2, DType::F32);
            std::fill(rsSend.begin(), rsSend.end(), -1.0e6f);
            for (std::size_t i = 0; i < 2; ++i) {
                // The sum over ranks k of (base + 10k + 2r + i).
                const double k = static_cast<double>(w);
                const double want =
                    k * (base + static_cast<double>(r * 2 + i)) + 10.0 * k * (k - 1) / 2;
                if (rsRecv[i] != static_cast<float>(want))
                    mismatch[r] = "reduce_scatter round " + std::to_string(round) + " got " +
                                  std::to_string(rsRecv[i]) + ", expected " + std::to_string(want);
            }
            if (round % 7 == 0) c.barrier();
        }
    });
    QVERIFY2(firstFailure(o).empty(), firstFailure(o).c_str());
    for (std::size_t r = 0; r < w; ++r)
        QVERIFY2(mismatch[r].empty(), ("rank " + std::to_string(r) + ": " + mismatch[r]).c_str());
}

void TestCpuCommunicator::mismatchedAllGatherSizes()
{
    const int world = 4;
    // Not vector<bool>: the ranks write their entries concurrently.
    std::vector<char> recvUntouched(4, 0), recoveredOk(4, 0);
    const Outcome o = runRanks(world, [&](comm::Communicator &c) {
        const auto r = static_cast<std::size_t>(c.rank());
        const std::size_t bytes = c.rank() == 2 ? 512 : 1024;
        std::vector<std::uint8_t> send(1024, 1), recv(4 * 1024, 0x77);
        try {
            c.allGather(send.data(), recv.data(), bytes);
        } catch (const comm::CommError &) {
            recvUntouched[r] =
                std::all_of(recv.begin(), recv.end(), [](auto b) { return b == 0x77; });
            // The world stays usable after the error.
            std::fill(send.begin(), send.end(), static_cast<std::uint8_t>(c.rank()));
            c.allGather(send.data(), recv.data(), 1024);
            recoveredOk[r] = recv[0] == 0 && recv[3 * 1024 + 1023] == 3;
            throw;
        }
    });
    for (int r = 0; r < world; ++r) {
        const auto i = static_cast<std::size_t>(r);
        QVERIFY2(o.failures[i].empty(), o.failures[i].c_str());
        const QString msg = QString::fromStdString(o.thrown[i]);
        QVERIFY2(msg.contains("all_gather"), qPrintable(msg));
        QVERIFY2(msg.contains("ranks 0, 1, 3: 1024 bytes"), qPrintable(msg));
        QVERIFY2(msg.contains("rank 2: 512 bytes"), qPrintable(msg));
        QVERIFY(recvUntouched[i]);
        QVERIFY(recoveredOk[i]);
    }
}

void TestCpuCommunicator::mismatchedReduceScatter()
{
    {
        const Outcome o = runRanks(3, [&](comm::Communicator &c) {
            std::vector<float> send(3 * 10, 1.0f), recv(10, -1.0f);
            c.reduceScatter(send.data(), recv.data(), c.rank() == 0 ? 9 : 10, DType::F32);
        });
        for (const auto &msg : o.thrown) {
            QVERIFY2(msg.find("reduce_scatter") != std::string::npos, msg.c_str());
            QVERIFY2(msg.find("rank 0: 9 elements; ranks 1, 2: 10 elements") != std::string::npos,
                     msg.c_str());
        }
    }
    {
        const Outcome o = runRanks(3, [&](comm::Communicator &c) {
            std::vector<float> send(3 * 10, 1.0f), recv(10, -1.0f);
            c.reduceScatter(send.data(), recv.data(), 10, c.rank() == 1 ? DType::BF16 : DType::F32);
        });
        for (const auto &msg : o.thrown) {
            QVERIFY2(msg.find("reduce_scatter") != std::string::npos, msg.c_str());
            QVERIFY2(msg.find("ranks 0, 2: float32; rank 1: bfloat16") != std::string::npos,
                     msg.c_str());
        }
    }
}

void TestCpuCommunicator::mismatchedBroadcastRoot()
{
    const Outcome o = runRanks(5, [&](comm::Communicator &c) {
        std::vector<std::uint8_t> buf(100, static_cast<std::uint8_t>(c.rank()));
        try {
            c.broadcast(buf.data(), buf.size(), c.rank() == 4 ? 1 : 0);
        } catch (const comm::CommError &) {
            if (buf[0] != static_cast<std::uint8_t>(c.rank()))
                throw std::runtime_error("buffer changed although the broadcast failed");
            throw;
        }
    });
    for (std::size_t r = 0; r < 5; ++r) {
        QVERIFY2(o.failures[r].empty(), o.failures[r].c_str());
        const std::string &msg = o.thrown[r];
        QVERIFY2(msg.find("broadcast") != std::string::npos, msg.c_str());
        QVERIFY2(msg.find("ranks 0, 1, 2, 3: root 0; rank 4: root 1") != std::string::npos,
                 msg.c_str());
    }
}

void TestCpuCommunicator::broadcastRootOutOfRange()
{
    for (int badRoot : {-1, 3, 100}) {
        const Outcome o = runRanks(3, [&](comm::Communicator &c) {
            std::uint8_t b = 0;
            c.broadcast(&b, 1, badRoot);
        });
        for (std::size_t r = 0; r < 3; ++r) {
            QVERIFY2(o.failures[r].empty(), o.failures[r].c_str());
            const std::string &msg = o.thrown[r];
            QVERIFY2(msg.find("broadcast: root " + std::to_string(badRoot)) != std::string::npos,
                     msg.c_str());
            QVERIFY2(msg.find("between 0 and 2") != std::string::npos, msg.c_str());
        }
    }
}

void TestCpuCommunicator::mismatchedCollectives()
{
    // Rank 1 calls barrier() while the others all_gather: all four throw, nobody hangs,
    // and the world is still usable.
    std::vector<int> after(4, -1);
    const Outcome o = runRanks(4, [&](comm::Communicator &c) {
        std::uint8_t send = static_cast<std::uint8_t>(c.rank()), recv[4] = {};
        try {
            if (c.rank() == 1)
                c.barrier();
            else
                c.allGather(&send, recv, 1);
        } catch (const comm::CommError &) {
            c.allGather(&send, recv, 1);
            after[static_cast<std::size_t>(c.rank())] =
                recv[0] + recv[1] * 10 + recv[2] * 100 + recv[3] * 1000;
            throw;
        }
    });
    for (std::size_t r = 0; r < 4; ++r) {
        QVERIFY2(o.failures[r].empty(), o.failures[r].c_str());
        const std::string &msg = o.thrown[r];
        QVERIFY2(msg.find("different collectives") != std::string::npos, msg.c_str());
        QVERIFY2(msg.find("rank 1: barrier") != std::string::npos, msg.c_str());
        QVERIFY2(msg.find("ranks 0, 2, 3: all_gather") != std::string::npos, msg.c_str());
        QCOMPARE(after[r], 3210);
    }
}

void TestCpuCommunicator::nullBuffer()
{
    const Outcome o = runRanks(3, [&](comm::Communicator &c) {
        std::vector<std::uint8_t> send(8), recv(24);
        c.allGather(c.rank() == 2 ? nullptr : send.data(), recv.data(), 8);
    });
    for (std::size_t r = 0; r < 3; ++r) {
        QVERIFY2(o.failures[r].empty(), o.failures[r].c_str());
        QVERIFY2(o.thrown[r].find("all_gather: rank 2 passed a null buffer") != std::string::npos,
                 o.thrown[r].c_str());
    }
    // Zero bytes need no buffer at all.
    const Outcome empty = runRanks(3, [&](comm::Communicator &c) {
        c.allGather(nullptr, nullptr, 0);
        c.broadcast(nullptr, 0, 2);
        c.reduceScatter(nullptr, nullptr, 0, DType::BF16);
        c.barrier();
    });
    QVERIFY2(firstFailure(empty).empty(), firstFailure(empty).c_str());
}

QTEST_APPLESS_MAIN(TestCpuCommunicator)
#include "tst_cpucommunicator.moc"

#include "comm/cpucommunicator.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "base/names.h"
#include "comm/rankordersum.h"
#include "comm/rendezvous.h"
#include "comm/streamingcopy.h"

namespace shardscope::comm {

namespace {

enum class Op : std::uint8_t
{
    Barrier,
    AllGather,
    Broadcast,
    ReduceScatter
};

std::string_view opName(Op op)
{
    switch (op) {
    case Op::Barrier:
        return "barrier";
    case Op::AllGather:
        return "all_gather";
    case Op::Broadcast:
        return "broadcast";
    case Op::ReduceScatter:
        return "reduce_scatter";
    }
    return "unknown";
}

// What one rank passed to the collective it is in.
struct alignas(64) Slot
{
    Op op = Op::Barrier;
    DType dtype = DType::F32;
    int root = 0;
    std::size_t size = 0; // bytes (all_gather, broadcast) or elements (reduce_scatter)
    const void *src = nullptr;
    void *dst = nullptr;
};

// "rank 0, 2: 1024 bytes; rank 1: 512 bytes", grouped by value in order of first rank.
template <typename Label> std::string describeByRank(int worldSize, Label label)
{
    std::vector<std::string> values;
    std::vector<std::vector<int>> ranks;
    for (int r = 0; r < worldSize; ++r) {
        std::string v = label(r);
        auto it = std::find(values.begin(), values.end(), v);
        if (it == values.end()) {
            values.push_back(std::move(v));
            ranks.push_back({r});
        } else {
            ranks[static_cast<std::size_t>(it - values.begin())].push_back(r);
        }
    }
    std::string out;
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out += "; ";
        out += ranks[i].size() == 1 ? "rank " : "ranks ";
        for (std::size_t j = 0; j < ranks[i].size(); ++j) {
            if (j) out += ", ";
            out += std::to_string(ranks[i][j]);
        }
        out += ": ";
        out += values[i];
    }
    return out;
}

} // namespace

class CpuWorld
{
  public:
    explicit CpuWorld(int worldSize)
        : m_size(worldSize), m_entry(worldSize, spinsFor(worldSize)),
          m_exit(worldSize, spinsFor(worldSize)), m_slots(2 * static_cast<std::size_t>(worldSize))
    {
    }

    int size() const { return m_size; }
    // The slots of one round are contiguous, in rank order.
    Slot &slot(std::uint64_t seq, int rank)
    {
        return m_slots[(seq & 1u) * static_cast<std::size_t>(m_size) +
                       static_cast<std::size_t>(rank)];
    }
    // Where the ranks meet before reading each other's slots; false once aborted.
    bool enter() { return m_entry.arriveAndWait(); }
    // Where they meet before reusing their buffers. Every rank that entered the round
    // gets here without waiting for anything else, so abort() need not release it (and
    // must not: a peer may still be copying from this rank's buffers).
    void leave() { m_exit.arriveAndWait(); }
    void abort() noexcept { m_entry.abort(); }

  private:
    // Spinning only pays while every rank has a core of its own; with more ranks than
    // cores a spinning waiter burns the time slice the rank it waits for needs.
    static int spinsFor(int worldSize)
    {
        const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
        return static_cast<unsigned>(worldSize) <= cores ? 256 : 0;
    }

    int m_size;
    detail::Rendezvous m_entry;
    detail::Rendezvous m_exit;
    std::vector<Slot> m_slots;
};

namespace {

class CpuCommunicator final : public Communicator
{
  public:
    CpuCommunicator(std::shared_ptr<CpuWorld> world, int rank)
        : m_world(std::move(world)), m_rank(rank),
          m_inputs(static_cast<std::size_t>(m_world->size()))
    {
    }

    int rank() const override { return m_rank; }
    int worldSize() const override { return m_world->size(); }
    Backend backend() const override { return Backend::Cpu; }
    // Every rank of a CPU world is local, so the whole world is released.
    void abort() noexcept override { m_world->abort(); }

    CommHandle allGather(const void *send, void *recv, std::size_t bytes) override
    {
        Slot s;
        s.op = Op::AllGather;
        s.size = bytes;
        s.src = send;
        s.dst = recv;
        run(s, [&](const Slot *peers) {
            if (bytes == 0) return; // the buffers may be null
            const int n = worldSize();
            auto *out = static_cast<std::byte *>(recv);
            const bool streaming =
                bytes * static_cast<std::size_t>(n) >= detail::streamingThreshold();
            // Start at our own block so the ranks spread over different sources.
            for (int k = 0; k < n; ++k) {
                const int j = (m_rank + k) % n;
                std::byte *dst = out + static_cast<std::size_t>(j) * bytes;
                if (peers[j].src == dst) continue;
                if (streaming)
                    detail::streamingCopy(dst, peers[j].src, bytes);
                else
                    std::memcpy(dst, peers[j].src, bytes);
            }
        });
        return {};
    }

    CommHandle broadcast(void *buf, std::size_t bytes, int root) override
    {
        Slot s;
        s.op = Op::Broadcast;
        s.size = bytes;
        s.root = root;
        s.src = buf;
        s.dst = buf;
        run(s, [&](const Slot *peers) {
            if (bytes > 0 && m_rank != root && peers[root].src != buf)
                std::memcpy(buf, peers[root].src, bytes);
        });
        return {};
    }

    CommHandle reduceScatter(const void *send, void *recv, std::size_t count, DType dtype) override
    {
        Slot s;
        s.op = Op::ReduceScatter;
        s.size = count;
        s.dtype = dtype;
        s.src = send;
        s.dst = recv;
        run(s, [&](const Slot *peers) { reduceSlice(peers, recv, count, dtype); });
        return {};
    }

    void barrier() override
    {
        const std::uint64_t seq = m_seq++;
        Slot &mine = m_world->slot(seq, m_rank);
        mine = Slot{};
        if (!m_world->enter()) throw CommError(abortedMessage(Op::Barrier));
        // Slots alternate between two sets: this round's set is rewritten only by the
        // round after next, which no rank can enter before this rank enters the next one.
        std::string error = validate(seq, Op::Barrier);
        if (!error.empty()) {
            m_world->leave(); // the ranks in a collective wait here for their copy
            throw CommError(error);
        }
    }

  private:
    template <typename Copy> void run(const Slot &s, Copy copy)
    {
        const std::uint64_t seq = m_seq++;
        m_world->slot(seq, m_rank) = s;
        if (!m_world->enter()) throw CommError(abortedMessage(s.op));
        std::string error = validate(seq, s.op);
        if (error.empty()) copy(&m_world->slot(seq, 0));
        // No rank reuses its buffers, or its slot, while a peer may still read them.
        m_world->leave();
        if (!error.empty()) throw CommError(error);
    }

    static std::string abortedMessage(Op op)
    {
        return std::string(opName(op)) +
               ": the CPU world was aborted after a failure on one of its ranks; this "
               "collective did not run. See the error that rank reported first.";
    }

    // Every rank reads the same slots and reaches the same verdict, so either all ranks
    // copy or all throw the same message. Returns "" when the call is consistent.
    std::string validate(std::uint64_t seq, Op myOp) const
    {
        const int n = worldSize();
        auto slot = [&](int r) -> const Slot & { return m_world->slot(seq, r); };
        const Slot &first = slot(0);
        bool sameOp = true;
        for (int r = 1; r < n; ++r)
            sameOp = sameOp && slot(r).op == first.op;
        if (!sameOp) {
            return std::string(opName(myOp)) +
                   ": ranks called different collectives at the same point (" +
                   describeByRank(n, [&](int r) { return std::string(opName(slot(r).op)); }) +
                   "). Every rank must issue the same collectives in the same order.";
        }
        const Op op = first.op;
        const std::string name(opName(op));
        if (op == Op::Barrier) return {};

        auto differs = [&](auto field) {
            for (int r = 1; r < n; ++r)
                if (field(slot(r)) != field(first)) return true;
            return false;
        };
        const char *sizeWord = op == Op::ReduceScatter ? "element count" : "byte count";
        const char *unit = op == Op::ReduceScatter ? " elements" : " bytes";
        if (differs([](const Slot &x) { return x.size; })) {
            return name + ": ranks passed different " + sizeWord + "s (" +
                   describeByRank(n, [&](int r) { return std::to_string(slot(r).size) + unit; }) +
                   "). Every rank must call " + name + " with the same size.";
        }
        if (op == Op::ReduceScatter && differs([](const Slot &x) { return x.dtype; })) {
            return name + ": ranks passed different dtypes (" +
                   describeByRank(n, [&](int r) { return std::string(dtypeName(slot(r).dtype)); }) +
                   "). Every rank must reduce the same dtype.";
        }
        if (op == Op::Broadcast) {
            if (differs([](const Slot &x) { return x.root; })) {
                return name + ": ranks passed different roots (" +
                       describeByRank(
                           n, [&](int r) { return "root " + std::to_string(slot(r).root); }) +
                       "). Every rank must broadcast from the same root.";
            }
            if (first.root < 0 || first.root >= n) {
                return name + ": root " + std::to_string(first.root) +
                       " is not a rank of this world of " + std::to_string(n) +
                       " ranks; pass a root between 0 and " + std::to_string(n - 1) + ".";
            }
        }
        const std::size_t elem = op == Op::ReduceScatter ? dtypeSize(first.dtype) : 1;
        const std::size_t blocks = op == Op::Broadcast ? 1 : static_cast<std::size_t>(n);
        if (first.size > std::numeric_limits<std::size_t>::max() / elem / blocks) {
            return name + ": " + std::to_string(first.size) + unit +
                   " per rank overflows the size of a buffer.";
        }
        if (first.size > 0) {
            for (int r = 0; r < n; ++r) {
                const Slot &x = slot(r);
                const bool needsSrc = op != Op::Broadcast || r == first.root;
                if ((needsSrc && !x.src) || !x.dst) {
                    return name + ": rank " + std::to_string(r) + " passed a null buffer for " +
                           std::to_string(first.size) + unit + ". Pass a buffer of that size.";
                }
            }
        }
        return {};
    }

    // Sums this rank's slice over every rank's send buffer, in rank order, in fp32.
    void reduceSlice(const Slot *peers, void *recv, std::size_t count, DType dtype)
    {
        const std::size_t offset = static_cast<std::size_t>(m_rank) * count * dtypeSize(dtype);
        for (std::size_t r = 0; r < m_inputs.size(); ++r)
            m_inputs[r] = static_cast<const char *>(peers[r].src) + offset;
        detail::sumInRankOrder(m_inputs.data(), worldSize(), recv, count, dtype);
    }

    std::shared_ptr<CpuWorld> m_world;
    int m_rank;
    std::vector<const void *> m_inputs; // reduceSlice's per-rank slices, sized once
    std::uint64_t m_seq = 0;
};

} // namespace

std::vector<std::unique_ptr<Communicator>> makeCpuWorld(int worldSize)
{
    if (worldSize < 1) {
        throw std::invalid_argument("makeCpuWorld: a world needs at least 1 rank, got " +
                                    std::to_string(worldSize));
    }
    auto world = std::make_shared<CpuWorld>(worldSize);
    std::vector<std::unique_ptr<Communicator>> comms;
    comms.reserve(static_cast<std::size_t>(worldSize));
    for (int r = 0; r < worldSize; ++r)
        comms.push_back(std::make_unique<CpuCommunicator>(world, r));
    return comms;
}

} // namespace shardscope::comm

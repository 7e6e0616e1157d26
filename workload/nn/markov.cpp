#include "nn/markov.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

namespace shardscope::nn {

namespace {

constexpr double kFirst = 0.5;  // P(first successor of b)
constexpr double kSecond = 0.2; // P(second successor of b)
constexpr double kPairA = 0.2;  // P(first successor of (a, b)); the rest: second of (a, b)

std::uint64_t splitmix(std::uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

double unit(std::uint64_t x)
{
    return static_cast<double>(x >> 11) * 0x1.0p-53;
}

} // namespace

MarkovStream::MarkovStream(std::uint64_t seed, int vocab)
    : m_seed(splitmix(seed ^ 0x5EEDull)), m_vocab(vocab), m_first(vocab), m_second(vocab)
{
    for (int b = 0; b < vocab; ++b) {
        m_first[b] = static_cast<std::int32_t>(splitmix(m_seed + 2 * b) % vocab);
        m_second[b] = static_cast<std::int32_t>(splitmix(m_seed + 2 * b + 1) % vocab);
    }
}

std::int32_t MarkovStream::next(std::int32_t a, std::int32_t b, double u) const
{
    if (u < kFirst) return m_first[b];
    if (u < kFirst + kSecond) return m_second[b];
    const std::uint64_t pair = pairSeed(a, b);
    if (u < kFirst + kSecond + kPairA) return static_cast<std::int32_t>(pair % m_vocab);
    return static_cast<std::int32_t>(splitmix(pair) % m_vocab);
}

std::uint64_t MarkovStream::pairSeed(std::int32_t a, std::int32_t b) const
{
    return splitmix(m_seed ^
                    (static_cast<std::uint64_t>(a) * m_vocab + b + 1) * 0xD6E8FEB86659FD93ull);
}

void MarkovStream::sequence(std::uint32_t step, std::int64_t index, int length,
                            std::int32_t *out) const
{
    std::uint64_t state = splitmix(m_seed ^ splitmix((static_cast<std::uint64_t>(step) << 40) ^
                                                     static_cast<std::uint64_t>(index)));
    auto draw = [&state] {
        state = splitmix(state);
        return state;
    };
    for (int i = 0; i < length; ++i) {
        if (i < 2)
            out[i] = static_cast<std::int32_t>(draw() % m_vocab);
        else
            out[i] = next(out[i - 2], out[i - 1], unit(draw()));
    }
}

double MarkovStream::entropyFloor() const
{
    const double rest = 1.0 - kFirst - kSecond - kPairA;
    double h = 0.0;
    for (double p : {kFirst, kSecond, kPairA, rest})
        h -= p * std::log(p);
    return h;
}

double MarkovStream::lossFloor(int seq) const
{
    if (seq < 1 || m_vocab > kMaxLossFloorVocab) return 0.0;
    const std::size_t V = static_cast<std::size_t>(m_vocab);
    const double rest = 1.0 - kFirst - kSecond - kPairA;
    // Each context (a, b): its successors with their probabilities, and their entropy.
    struct Successors
    {
        std::array<std::pair<std::int32_t, double>, 4> next;
        double entropy = 0.0;
    };
    std::vector<Successors> contexts(V * V);
    for (std::size_t a = 0; a < V; ++a)
        for (std::size_t b = 0; b < V; ++b) {
            const auto ia = static_cast<std::int32_t>(a), ib = static_cast<std::int32_t>(b);
            const std::uint64_t pair = pairSeed(ia, ib);
            Successors &s = contexts[a * V + b];
            s.next = {{{m_first[b], kFirst},
                       {m_second[b], kSecond},
                       {static_cast<std::int32_t>(pair % V), kPairA},
                       {static_cast<std::int32_t>(splitmix(pair) % V), rest}}};
            for (std::size_t i = 0; i < 4; ++i) {
                double p = s.next[i].second;
                bool seen = false;
                for (std::size_t j = 0; j < i; ++j)
                    seen = seen || s.next[j].first == s.next[i].first;
                if (seen) continue;
                for (std::size_t j = i + 1; j < 4; ++j)
                    if (s.next[j].first == s.next[i].first) p += s.next[j].second;
                s.entropy -= p * std::log(p);
            }
        }
    // Target 0 (token 1) is uniform; target t >= 1 (token t+1) follows context
    // (token t-1, token t), whose distribution starts uniform and moves with the chain.
    double total = std::log(static_cast<double>(V));
    std::vector<double> context(V * V, 1.0 / static_cast<double>(V * V)), moved(V * V);
    for (int t = 1; t < seq; ++t) {
        std::fill(moved.begin(), moved.end(), 0.0);
        for (std::size_t ab = 0; ab < V * V; ++ab) {
            const double w = context[ab];
            if (w == 0.0) continue;
            total += w * contexts[ab].entropy;
            const std::size_t b = ab % V;
            for (const auto &[c, p] : contexts[ab].next)
                moved[b * V + static_cast<std::size_t>(c)] += w * p;
        }
        context.swap(moved);
    }
    return total / seq;
}

} // namespace shardscope::nn

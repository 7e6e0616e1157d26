#include "nn/markov.h"

#include <cmath>

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
    const std::uint64_t pair = splitmix(m_seed ^ (static_cast<std::uint64_t>(a) * m_vocab + b + 1) *
                                                     0xD6E8FEB86659FD93ull);
    if (u < kFirst + kSecond + kPairA) return static_cast<std::int32_t>(pair % m_vocab);
    return static_cast<std::int32_t>(splitmix(pair) % m_vocab);
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

} // namespace shardscope::nn

#pragma once
// The synthetic training data: a sparse random order-2 Markov chain over the vocabulary,
// made from a seed. Every sequence is a pure function of (seed, step, index), so the
// global batch is the same whatever the world size and whichever rank reads it.

#include <cstdint>
#include <vector>

namespace shardscope::nn {

class MarkovStream
{
  public:
    MarkovStream(std::uint64_t seed, int vocab);

    int vocab() const { return m_vocab; }
    // Writes length tokens of sequence `index` of step `step` into out.
    void sequence(std::uint32_t step, std::int64_t index, int length, std::int32_t *out) const;
    // The next token after (a, b) for a uniform draw u in [0, 1): each context has at most
    // four successors, two that depend only on b and two that depend on (a, b).
    std::int32_t next(std::int32_t a, std::int32_t b, double u) const;
    // The entropy of one transition when its four successors differ (nats): about the
    // lowest mean loss a perfect model reaches.
    double entropyFloor() const;

  private:
    std::uint64_t m_seed;
    int m_vocab;
    std::vector<std::int32_t> m_first;  // by previous token
    std::vector<std::int32_t> m_second; // by previous token
};

} // namespace shardscope::nn

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
    // The entropy of one transition when its four successors differ (nats).
    double entropyFloor() const;
    // The lowest mean next-token loss (nats) any model reaches on sequences of `seq` inputs
    // whose targets are the next tokens (the trainer's batches): the first target is uniform
    // (log V), every later one has the exact entropy of its context's successors, coinciding
    // successors merged, weighted by how likely each context is at that position. A model
    // whose loss falls below it sees its targets. Exact and O(V^2 * seq): vocabularies up
    // to kMaxLossFloorVocab; larger ones return 0 (no bound known).
    double lossFloor(int seq) const;
    static constexpr int kMaxLossFloorVocab = 1024;

  private:
    std::uint64_t pairSeed(std::int32_t a, std::int32_t b) const;

    std::uint64_t m_seed;
    int m_vocab;
    std::vector<std::int32_t> m_first;  // by previous token
    std::vector<std::int32_t> m_second; // by previous token
};

} // namespace shardscope::nn

#pragma once
// A generation barrier for the ranks of one CPU world. Ranks usually outnumber the
// cores, so a waiter spins only briefly and then sleeps on the futex (atomic::wait).

#include <atomic>
#include <cstdint>

namespace shardscope::comm::detail {

class Rendezvous
{
  public:
    // spins: how many times a waiter polls before it sleeps on the futex.
    Rendezvous(int parties, int spins);

    // Returns true once all parties have arrived. Everything a party wrote before
    // arriving is visible to every party after it returns. Returns false, for every
    // party of the round alike, when abort() came before the round completed.
    bool arriveAndWait();
    // Releases the parties waiting now and every later arrival (they get false). A round
    // that already completed stays complete. The rendezvous is unusable afterwards.
    void abort() noexcept;

  private:
    // The low 31 bits of m_generation count rounds; the top bit marks an abort. Both
    // change the same word, so a round is either completed or aborted for all parties.
    static constexpr std::uint32_t kAborted = 0x80000000u;
    static constexpr std::uint32_t kRoundMask = ~kAborted;

    alignas(64) std::atomic<std::uint32_t> m_arrived{0};
    alignas(64) std::atomic<std::uint32_t> m_generation{0};
    std::uint32_t m_parties;
    int m_spins;
};

} // namespace shardscope::comm::detail

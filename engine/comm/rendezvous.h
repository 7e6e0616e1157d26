#pragma once
// A generation barrier for the ranks of one CPU world. Ranks usually outnumber the
// cores, so a waiter spins only briefly and then sleeps on the futex (atomic::wait).

#include <atomic>
#include <cstdint>

namespace shardscope::detail {

class Rendezvous
{
public:
    // spins: how many times a waiter polls before it sleeps on the futex.
    Rendezvous(int parties, int spins);

    // Returns once all parties have arrived. Everything a party wrote before arriving
    // is visible to every party after it returns.
    void arriveAndWait();

private:
    alignas(64) std::atomic<std::uint32_t> m_arrived{0};
    alignas(64) std::atomic<std::uint32_t> m_generation{0};
    std::uint32_t m_parties;
    int m_spins;
};

} // namespace shardscope::detail

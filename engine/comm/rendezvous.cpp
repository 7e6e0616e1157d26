#include "comm/rendezvous.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shardscope::comm::detail {

namespace {

inline void cpuRelax()
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

} // namespace

Rendezvous::Rendezvous(int parties, int spins)
    : m_parties(static_cast<std::uint32_t>(parties)), m_spins(spins)
{
}

bool Rendezvous::arriveAndWait()
{
    const std::uint32_t seen = m_generation.load(std::memory_order_acquire);
    if (seen & kAborted) return false;
    if (m_parties <= 1) return true;
    const std::uint32_t gen = seen & kRoundMask;
    if (m_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == m_parties) {
        // Nobody can arrive for the next round before seeing the new generation.
        m_arrived.store(0, std::memory_order_relaxed);
        std::uint32_t expected = gen;
        if (!m_generation.compare_exchange_strong(expected, (gen + 1) & kRoundMask,
                                                  std::memory_order_acq_rel,
                                                  std::memory_order_acquire))
            return false; // only abort() changes the word mid-round
        m_generation.notify_all();
        return true;
    }
    std::uint32_t now = gen;
    for (int i = 0; i < m_spins && now == gen; ++i) {
        now = m_generation.load(std::memory_order_acquire);
        if (now == gen) cpuRelax();
    }
    while (now == gen) {
        m_generation.wait(gen, std::memory_order_acquire);
        now = m_generation.load(std::memory_order_acquire);
    }
    return (now & kRoundMask) != gen;
}

void Rendezvous::abort() noexcept
{
    m_generation.fetch_or(kAborted, std::memory_order_acq_rel);
    m_generation.notify_all();
}

} // namespace shardscope::comm::detail

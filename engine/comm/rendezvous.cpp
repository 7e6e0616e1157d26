#include "comm/rendezvous.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shardscope::detail {

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

void Rendezvous::arriveAndWait()
{
    if (m_parties <= 1) return;
    const std::uint32_t gen = m_generation.load(std::memory_order_acquire);
    if (m_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == m_parties) {
        // Nobody can arrive for the next round before seeing the new generation.
        m_arrived.store(0, std::memory_order_relaxed);
        m_generation.store(gen + 1, std::memory_order_release);
        m_generation.notify_all();
        return;
    }
    for (int i = 0; i < m_spins; ++i) {
        if (m_generation.load(std::memory_order_acquire) != gen) return;
        cpuRelax();
    }
    while (m_generation.load(std::memory_order_acquire) == gen)
        m_generation.wait(gen, std::memory_order_acquire);
}

} // namespace shardscope::detail

#pragma once
// A single-producer single-consumer ring of Event records: preallocated and pre-faulted,
// power-of-two sized, no lock and no allocation on push. A full ring drops the event and
// counts it; the producer never waits for the consumer.
//
// What a push costs (bench_telemetry): the record was just written field by field on the
// producer's stack, so copying it with 16-byte loads (what `slot = ev` compiles to) makes
// every load wait for those narrower stores to retire instead of forwarding from them,
// ≈ 4 ns per event on the AMD EPYC VM; copyEvent loads each field at its own width, which
// forwards, and stores whole 8-byte words.

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "telemetry/event.h"

namespace shardscope::telemetry {

inline void copyEvent(Event &dst, const Event &src) noexcept
{
    // The 8-byte fields load as they were stored; the narrower ones that share a word are
    // loaded one by one and kept opaque, or the optimiser merges them back into a wide load.
    std::uint32_t step = src.step, a = src.a, b = src.b;
    std::uint16_t rank = src.rank;
    std::uint8_t type = static_cast<std::uint8_t>(src.type), flags = src.flags;
    asm("" : "+r"(step), "+r"(rank), "+r"(type), "+r"(flags));
    asm("" : "+r"(a), "+r"(b));
    static_assert(sizeof(Event) == 6 * sizeof(std::uint64_t));
    static_assert(std::endian::native == std::endian::little, "Event words are little-endian");
    // One 8-byte store each, straight from a register (volatile: not gathered into vectors).
    using Word [[gnu::may_alias]] = std::uint64_t;
    volatile Word *out = reinterpret_cast<volatile Word *>(&dst);
    out[0] = src.tsNs;
    out[1] = std::uint64_t(step) | std::uint64_t(rank) << 32 | std::uint64_t(type) << 48 |
             std::uint64_t(flags) << 56;
    out[2] = std::uint64_t(a) | std::uint64_t(b) << 32;
    out[3] = src.u0;
    out[4] = src.u1;
    out[5] = src.u2;
}

class EventRing
{
  public:
    // capacity is rounded up to a power of two (at least 2).
    explicit EventRing(std::size_t capacity)
    {
        std::size_t cap = 2;
        while (cap < capacity)
            cap <<= 1;
        m_capacity = cap;
        m_mask = cap - 1;
        m_slots = std::make_unique<Event[]>(cap);
        // Touch every page now so the first pushes do not pay for page faults.
        std::memset(static_cast<void *>(m_slots.get()), 0, cap * sizeof(Event));
    }

    std::size_t capacity() const { return m_capacity; }

    // Producer thread only.
    bool push(const Event &ev) noexcept
    {
        const std::uint64_t head = m_head.load(std::memory_order_relaxed);
        if (head - m_cachedTail >= m_capacity) {
            m_cachedTail = m_tail.load(std::memory_order_acquire);
            if (head - m_cachedTail >= m_capacity) {
                m_dropped.store(m_dropped.load(std::memory_order_relaxed) + 1,
                                std::memory_order_relaxed);
                return false;
            }
        }
        copyEvent(m_slots[head & m_mask], ev);
        m_head.store(head + 1, std::memory_order_release);
        return true;
    }

    // Consumer thread only: copies up to max waiting events into out, oldest first.
    std::size_t pop(Event *out, std::size_t max) noexcept
    {
        const std::uint64_t tail = m_tail.load(std::memory_order_relaxed);
        const std::uint64_t head = m_head.load(std::memory_order_acquire);
        std::size_t n = static_cast<std::size_t>(head - tail);
        if (n > max) n = max;
        for (std::size_t i = 0; i < n; ++i)
            out[i] = m_slots[(tail + i) & m_mask];
        m_tail.store(tail + n, std::memory_order_release);
        return n;
    }

    // Any thread: events pushed so far, and events dropped because the ring was full.
    std::uint64_t pushed() const noexcept { return m_head.load(std::memory_order_relaxed); }
    std::uint64_t dropped() const noexcept { return m_dropped.load(std::memory_order_relaxed); }

  private:
    // Producer-owned and consumer-owned indices live on separate cache lines.
    alignas(64) std::atomic<std::uint64_t> m_head{0};
    std::uint64_t m_cachedTail = 0;
    std::atomic<std::uint64_t> m_dropped{0};
    alignas(64) std::atomic<std::uint64_t> m_tail{0};
    alignas(64) std::size_t m_capacity = 0;
    std::size_t m_mask = 0;
    std::unique_ptr<Event[]> m_slots;
};

} // namespace shardscope::telemetry

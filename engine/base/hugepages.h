#pragma once
// Transparent huge pages for the few buffers of many megabytes that an attach writes once:
// the State's record arrays, its encoded bytes and the frame they arrive in. A first write
// to fresh memory costs a page fault per 4 KiB page; a 2 MiB page costs one. In a fresh
// process's first attach of 100,000 parameters this took the faults from 43k to 26k; the
// zeroing of the memory remains, and on the VM we measure on it is most of the cost
// (docs/performance.md, section 6). Linux only; elsewhere, and where THP is off, these do
// nothing.

#include <cstddef>

namespace shardscope {

// Buffers smaller than this are left alone: they hold fewer than two whole huge pages.
inline constexpr std::size_t kHugePageAdviceMin = std::size_t{4} << 20;

// Asks the kernel to back the whole 2 MiB pages inside [p, p + bytes) with transparent
// huge pages (madvise MADV_HUGEPAGE) when the memory is first touched. Best effort: an
// error (THP compiled out, an old kernel) is ignored. Pages already touched stay as they are.
void adviseHugePages(const void *p, std::size_t bytes) noexcept;

// c.reserve(n), then the advice over the reserved storage. What a reallocation has already
// copied stays in small pages; the rest is written into huge ones.
template <class Container> void reserveHuge(Container &c, std::size_t n)
{
    c.reserve(n);
    adviseHugePages(c.data(), c.capacity() * sizeof(typename Container::value_type));
}

} // namespace shardscope

#include "comm/streamingcopy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace shardscope::comm::detail {

std::size_t streamingThreshold()
{
    static const std::size_t threshold = [] {
        long l3 = -1;
#if defined(_SC_LEVEL3_CACHE_SIZE)
        l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
        const std::size_t fallback = std::size_t(32) << 20;
        return l3 > 0 ? static_cast<std::size_t>(l3) / 8 * 3 : fallback;
    }();
    return threshold;
}

#if defined(__SSE2__)
namespace {

// Streams one 64-byte line; dst is 16-byte aligned.
inline void streamLine(std::byte *d, const std::byte *s)
{
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i *>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + 48), e);
}

} // namespace
#endif

void streamingCopy(void *dst, const void *src, std::size_t bytes)
{
#if defined(__SSE2__)
    constexpr std::size_t kLine = 64;
    constexpr std::size_t kPage = 4096;
    constexpr std::size_t kStreams = 4;
    auto *d = static_cast<std::byte *>(dst);
    const auto *s = static_cast<const std::byte *>(src);
    const std::size_t head = std::min<std::size_t>(
        bytes, (kLine - (reinterpret_cast<std::uintptr_t>(d) & (kLine - 1))) & (kLine - 1));
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    // Four pages at a time, a line of each in turn, as glibc's large memcpy does: the
    // loads of four pages are in flight together.
    const std::size_t blocks = bytes / (kStreams * kPage) * (kStreams * kPage);
    for (std::size_t base = 0; base < blocks; base += kStreams * kPage)
        for (std::size_t i = 0; i < kPage; i += kLine)
            for (std::size_t p = 0; p < kStreams; ++p)
                streamLine(d + base + p * kPage + i, s + base + p * kPage + i);
    const std::size_t lines = bytes / kLine * kLine;
    for (std::size_t i = blocks; i < lines; i += kLine)
        streamLine(d + i, s + i);
    std::memcpy(d + lines, s + lines, bytes - lines);
    // Non-temporal stores are weakly ordered: make them visible before the rendezvous.
    _mm_sfence();
#else
    std::memcpy(dst, src, bytes);
#endif
}

} // namespace shardscope::comm::detail

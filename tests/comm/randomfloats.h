#pragma once
// Test data for reductions: values whose fp32 sum depends on the order of summation
// (random sign, mantissa and an exponent within 2^+-12), from a cheap xorshift generator.

#include <bit>
#include <cstdint>
#include <vector>

namespace shardscope::test {

inline std::vector<float> randomFloats(std::size_t n, unsigned seed)
{
    std::uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    std::vector<float> v(n);
    for (auto &f : v) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const auto bits = static_cast<std::uint32_t>(x >> 32);
        const std::uint32_t exponent = 127 - 12 + (bits >> 8) % 25;
        f = std::bit_cast<float>((bits & 0x80000000u) | (exponent << 23) |
                                 (static_cast<std::uint32_t>(x) & 0x7FFFFFu));
    }
    return v;
}

} // namespace shardscope::test

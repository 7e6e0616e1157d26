#include "comm/rankordersum.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

namespace shardscope::comm::detail {

namespace {

std::uint16_t floatToBf16(float f)
{
    const auto bits = std::bit_cast<std::uint32_t>(f);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
        return static_cast<std::uint16_t>((bits >> 16) | 0x0040u); // quiet NaN, keep sign
    const std::uint32_t roundingBias = 0x7FFFu + ((bits >> 16) & 1u);
    return static_cast<std::uint16_t>((bits + roundingBias) >> 16);
}

float load(float x)
{
    return x;
}
float load(std::uint16_t x)
{
    return std::bit_cast<float>(static_cast<std::uint32_t>(x) << 16);
}
template <typename T> T store(float x)
{
    if constexpr (std::is_same_v<T, float>)
        return x;
    else
        return floatToBf16(x);
}

template <typename T> void sum(const void *const *inputs, int ranks, void *out, std::size_t count)
{
    constexpr std::size_t kBlock = 1024;
    auto *o = static_cast<T *>(out);
    float acc[kBlock];
    for (std::size_t base = 0; base < count; base += kBlock) {
        const std::size_t len = std::min(kBlock, count - base);
        for (int r = 0; r < ranks; ++r) {
            const T *in = static_cast<const T *>(inputs[r]) + base;
            if (r == 0) {
                for (std::size_t i = 0; i < len; ++i)
                    acc[i] = load(in[i]);
            } else {
                for (std::size_t i = 0; i < len; ++i)
                    acc[i] += load(in[i]);
            }
        }
        for (std::size_t i = 0; i < len; ++i)
            o[base + i] = store<T>(acc[i]);
    }
}

} // namespace

void sumInRankOrder(const void *const *inputs, int ranks, void *out, std::size_t count, DType dtype)
{
    if (dtype == DType::BF16)
        sum<std::uint16_t>(inputs, ranks, out, count);
    else
        sum<float>(inputs, ranks, out, count);
}

} // namespace shardscope::comm::detail

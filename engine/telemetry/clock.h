#pragma once
// The telemetry clock: monotonic nanoseconds, comparable across threads.

#include <chrono>
#include <cstdint>

namespace shardscope {

inline std::uint64_t nowNs() noexcept
{
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
}

} // namespace shardscope

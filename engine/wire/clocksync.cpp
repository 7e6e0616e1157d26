#include "wire/clocksync.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace shardscope::wire {

ClockEstimate estimateClockOffset(std::span<const ClockSample> samples)
{
    ClockEstimate best;
    std::uint64_t bestRtt = std::numeric_limits<std::uint64_t>::max();
    for (const ClockSample &s : samples) {
        if (s.recvNs < s.sendNs) continue;
        ++best.samples;
        const std::uint64_t rtt = s.recvNs - s.sendNs;
        if (rtt >= bestRtt) continue;
        bestRtt = rtt;
        // midpoint without overflow; the offset is a difference of two u64 readings
        const std::uint64_t mid = s.sendNs + rtt / 2;
        best.offsetNs = static_cast<std::int64_t>(s.serverNs - mid);
        best.uncertaintyNs = rtt / 2 + rtt % 2;
        best.valid = true;
    }
    return best;
}

ClockShift clockShift(const ClockEstimate &process, const ClockEstimate &reference, bool sameHost)
{
    ClockShift s;
    if (!process.valid || !reference.valid) {
        s.known = false;
        s.sharedClock = sameHost;
        return s;
    }
    const std::int64_t diff = process.offsetNs - reference.offsetNs;
    const std::uint64_t bound = process.uncertaintyNs + reference.uncertaintyNs;
    const std::uint64_t magnitude = diff < 0 ? std::uint64_t(0) - static_cast<std::uint64_t>(diff)
                                             : static_cast<std::uint64_t>(diff);
    if (sameHost && magnitude <= bound) {
        s.sharedClock = true;
        return s;
    }
    s.shiftNs = diff;
    s.uncertaintyNs = bound;
    return s;
}

namespace {

std::string duration(double ns)
{
    char buf[64];
    const double a = std::fabs(ns);
    if (a >= 1e9)
        std::snprintf(buf, sizeof buf, "%.3f s", ns / 1e9);
    else if (a >= 1e6)
        std::snprintf(buf, sizeof buf, "%.3f ms", ns / 1e6);
    else if (a >= 1e3)
        std::snprintf(buf, sizeof buf, "%.0f µs", ns / 1e3);
    else
        std::snprintf(buf, sizeof buf, "%.0f ns", ns);
    return buf;
}

} // namespace

std::string describeClockShift(const ClockShift &shift)
{
    if (!shift.known)
        return shift.sharedClock ? "clock not probed (an older engine): assumed shared, same host"
                                 : "clock not probed (an older engine): assumed aligned, "
                                   "timestamps may be offset";
    if (shift.sharedClock) return "shared clock (same host)";
    return std::string(shift.shiftNs >= 0 ? "+" : "") +
           duration(static_cast<double>(shift.shiftNs)) + " ± " +
           duration(static_cast<double>(shift.uncertaintyNs));
}

} // namespace shardscope::wire

#pragma once
// Mapping another process's telemetry clock onto ours from round trips, as NTP and
// profilers do: a probe sent at t_send (our clock), answered with the server's clock s,
// received at t_recv, says offset = s - (t_send + t_recv) / 2 within +- RTT / 2. The sample
// with the smallest round trip is the tightest bound, so it is the estimate.

#include <cstdint>
#include <span>
#include <string>

namespace shardscope::wire {

struct ClockSample
{
    std::uint64_t sendNs = 0;   // our clock when the probe left
    std::uint64_t serverNs = 0; // the server's clock when it answered
    std::uint64_t recvNs = 0;   // our clock when the answer arrived
};

struct ClockEstimate
{
    bool valid = false;
    std::int64_t offsetNs = 0;       // server clock - our clock
    std::uint64_t uncertaintyNs = 0; // half the round trip of the sample used
    int samples = 0;                 // usable samples seen
};

// The estimate from the sample with the smallest round trip; samples whose answer came
// back before they left (recvNs < sendNs) are ignored. Not valid without a usable sample.
ClockEstimate estimateClockOffset(std::span<const ClockSample> samples);

// How far to shift a process's timestamps to put them on a reference process's timeline:
// ts_on_reference = ts - shiftNs.
struct ClockShift
{
    std::int64_t shiftNs = 0;
    std::uint64_t uncertaintyNs = 0; // 0: exact (the same clock)
    bool sharedClock = false;        // the same host and the estimates agree: no shift at all
    bool known = true;               // false: no estimate (an old server), assumed shared
};

// sameHost: both processes run on one host, where the telemetry clock is the host's
// monotonic clock: they share it unless the estimates disagree by more than their
// uncertainties (then the measured difference is used).
ClockShift clockShift(const ClockEstimate &process, const ClockEstimate &reference, bool sameHost);

// "+1.250 ms ± 40 µs", "shared clock", "unknown (assumed shared)" for tooltips and status.
std::string describeClockShift(const ClockShift &shift);

} // namespace shardscope::wire

#pragma once
// The telemetry clock: monotonic nanoseconds, comparable across threads and across the
// processes of one host, in the time base of std::chrono::steady_clock.
//
// The timestamp dominates an event's cost, so on x86-64 whose CPUID says the TSC is
// invariant (leaf 0x80000007, EDX bit 8: constant rate in every P-, C- and T-state) nowNs()
// is rdtsc mapped onto steady_clock, as Tracy does, whatever the kernel's clocksource is:
// a KVM guest reports constant_tsc nonstop_tsc yet the kernel keeps kvm-clock, whose
// steady_clock costs 2-3 rdtsc. Elsewhere, or with SHARDSCOPE_CLOCK=steady in the
// environment, it is steady_clock.
//
// What the TSC path relies on, and what it does about the rest:
// - the TSCs of all (v)CPUs tick in step: the hypervisor's promise when it exposes the
//   invariant bit (KVM does so only with a stable host TSC); not checked per read;
// - the rate is calibrated against steady_clock at start (≈ 1 ms, the best of a few
//   bracketed samples) and then refined every 100 ms by whichever thread reads the clock
//   then, against steady_clock over the whole run so far: the mapping slews (at most
//   ±500 ppm) to stay on steady_clock, so two processes agree to about a microsecond, and a
//   host that changed the TSC's rate or offset under us (live migration) is caught within
//   100 ms; a mapping that fell more than 1 ms behind steady_clock steps forward, never back;
// - a refinement keeps the mapping continuous, so readers stay monotonic (to within a
//   nanosecond around the instant of a refinement);
// - the TSC is read after every earlier load (lfence; rdtsc), so a time read after seeing
//   another thread's time is never earlier than it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <x86intrin.h>
#define SHARDSCOPE_HAVE_TSC 1
#else
#define SHARDSCOPE_HAVE_TSC 0
#endif

namespace shardscope::telemetry {

inline std::uint64_t steadyNs() noexcept
{
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
}

enum class ClockSource : std::uint8_t
{
    Tsc,    // rdtsc mapped onto steady_clock
    Steady, // std::chrono::steady_clock
};

namespace detail {

// The TSC's mapping onto steady_clock, read under a sequence lock (odd: being rewritten).
struct TscClock
{
    std::atomic<bool> use{false}; // false (also before start-up calibration): steady_clock
    std::atomic<std::uint32_t> seq{0};
    std::atomic<std::uint64_t> tsc0{0};         // a TSC reading ...
    std::atomic<std::uint64_t> ns0{0};          // ... and the nanoseconds it maps to
    std::atomic<std::uint64_t> nsPerTickQ32{0}; // nanoseconds per tick, 32.32 fixed point
    std::atomic<std::uint64_t> refineAtTsc{~std::uint64_t(0)}; // next refinement
    std::atomic_flag refining = ATOMIC_FLAG_INIT;
    // Refinement state, written only by the thread that holds `refining`.
    std::uint64_t startTsc = 0, startNs = 0; // the first sample of the current rate
    std::uint64_t intervalTicks = 0;
    bool invariant = false; // CPUID's invariant-TSC bit
    bool forcedSteady = false;
    std::string envError;
};

inline constinit TscClock g_tsc;

constexpr std::uint64_t kRefineIntervalNs = 100'000'000;
constexpr std::int64_t kStepForwardNs = 1'000'000;
constexpr double kMaxSlew = 500e-6;

#if SHARDSCOPE_HAVE_TSC
inline bool cpuHasInvariantTsc() noexcept
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1u, &a, &b, &c, &d) || !(d & (1u << 4))) return false; // no TSC at all
    return __get_cpuid(0x80000007u, &a, &b, &c, &d) && (d & (1u << 8));
}

// A (tsc, steady ns) pair taken as close together as the machine allows: the steady_clock
// read bracketed by two rdtsc, the narrowest bracket of a few tries, at its middle.
struct ClockPair
{
    std::uint64_t tsc = 0;
    std::uint64_t ns = 0;
};

// rdtsc ordered after every earlier load, as the kernel's rdtsc_ordered(): a bare rdtsc may
// execute while an earlier load (another thread's time, a cache line still on its way from
// the other core) is in flight, and so return a time earlier than one this thread has already
// seen (measured: up to 326 ns on an AMD EPYC VM, in 20 of 40 runs of tst_clock). The fence
// costs: a clock read there is 21-22 ns instead of 9.8 (rdtscp costs the same).
inline std::uint64_t readTsc() noexcept
{
    _mm_lfence();
    return __rdtsc();
}

inline ClockPair samplePair() noexcept
{
    ClockPair best;
    std::uint64_t bestWidth = ~std::uint64_t(0);
    for (int i = 0; i < 5; ++i) {
        const std::uint64_t before = readTsc();
        const std::uint64_t ns = steadyNs();
        const std::uint64_t after = readTsc();
        if (after >= before && after - before < bestWidth) {
            bestWidth = after - before;
            best = {before + (after - before) / 2, ns};
        }
    }
    return best;
}

inline std::uint64_t toQ32(double nsPerTick) noexcept
{
    return static_cast<std::uint64_t>(nsPerTick * 4294967296.0);
}

inline std::uint64_t mapTsc(std::uint64_t tsc, std::uint64_t tsc0, std::uint64_t ns0,
                            std::uint64_t q32) noexcept
{
    // Signed: a reading a few ticks before tsc0 (another core, a stale read) stays sane.
    const auto dt = static_cast<std::int64_t>(tsc - tsc0);
    __extension__ using I128 = __int128;
    return ns0 + static_cast<std::uint64_t>(
                     static_cast<std::int64_t>((static_cast<I128>(dt) * q32) >> 32));
}

inline void publish(std::uint64_t tsc0, std::uint64_t ns0, std::uint64_t q32) noexcept
{
    TscClock &c = g_tsc;
    const std::uint32_t s = c.seq.load(std::memory_order_relaxed);
    c.seq.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    c.tsc0.store(tsc0, std::memory_order_relaxed);
    c.ns0.store(ns0, std::memory_order_relaxed);
    c.nsPerTickQ32.store(q32, std::memory_order_relaxed);
    c.seq.store(s + 2, std::memory_order_release);
}

// Start-up: ≈ 1 ms of rate measurement. False when the TSC did not advance sanely.
inline bool calibrateTsc() noexcept
{
    TscClock &c = g_tsc;
    const ClockPair first = samplePair();
    ClockPair last = first;
    while (last.ns - first.ns < 1'000'000)
        last = samplePair();
    if (last.tsc <= first.tsc) return false;
    const double nsPerTick = double(last.ns - first.ns) / double(last.tsc - first.tsc);
    if (!(nsPerTick > 0.05 && nsPerTick < 20.0)) // 50 MHz .. 20 GHz, else not a clock
        return false;
    c.startTsc = first.tsc;
    c.startNs = first.ns;
    c.intervalTicks = static_cast<std::uint64_t>(double(kRefineIntervalNs) / nsPerTick);
    publish(last.tsc, last.ns, toQ32(nsPerTick));
    c.refineAtTsc.store(last.tsc + c.intervalTicks, std::memory_order_relaxed);
    return true;
}

// Re-measures the rate over the whole run so far and slews the mapping back onto
// steady_clock over the next interval. One thread at a time; the others go on reading.
[[gnu::noinline, gnu::cold]] inline void refineTsc() noexcept
{
    TscClock &c = g_tsc;
    if (c.refining.test_and_set(std::memory_order_acquire)) return;
    const ClockPair now = samplePair();
    const std::uint64_t q32 = c.nsPerTickQ32.load(std::memory_order_relaxed);
    const std::uint64_t mapped = mapTsc(now.tsc, c.tsc0.load(std::memory_order_relaxed),
                                        c.ns0.load(std::memory_order_relaxed), q32);
    const auto offset = static_cast<std::int64_t>(now.ns - mapped); // > 0: we run behind
    std::uint64_t ns0 = mapped;
    double rate = double(q32) / 4294967296.0;
    if (offset > kStepForwardNs || offset < -kStepForwardNs || now.tsc <= c.startTsc) {
        // The TSC's rate or offset changed under us (or the clock was stopped): measure
        // the rate afresh from here; never step backwards.
        if (offset > 0) ns0 = now.ns;
        c.startTsc = now.tsc;
        c.startNs = now.ns;
    } else {
        rate = double(now.ns - c.startNs) / double(now.tsc - c.startTsc);
    }
    double slew = double(offset) / double(c.intervalTicks ? c.intervalTicks : 1) / rate;
    if (slew > kMaxSlew) slew = kMaxSlew;
    if (slew < -kMaxSlew) slew = -kMaxSlew;
    publish(now.tsc, ns0, toQ32(rate * (1.0 + slew)));
    c.refineAtTsc.store(now.tsc + c.intervalTicks, std::memory_order_relaxed);
    c.refining.clear(std::memory_order_release);
}
#endif

// SHARDSCOPE_CLOCK: unset, "" or "auto": the TSC where CPUID says it is invariant;
// "steady": steady_clock. Anything else is reported (clockDescription) and means auto.
inline bool parseClockChoice(const char *value, bool &forceSteady, std::string &error)
{
    const std::string_view v = value ? value : "";
    error.clear();
    forceSteady = v == "steady";
    if (v.empty() || v == "auto" || v == "steady") return true;
    error =
        "SHARDSCOPE_CLOCK=" + std::string(v) + " is not a clock; use auto or steady (using auto)";
    return false;
}

inline bool initClock()
{
    TscClock &c = g_tsc;
    bool forceSteady = false;
    if (!parseClockChoice(std::getenv("SHARDSCOPE_CLOCK"), forceSteady, c.envError))
        std::fprintf(stderr, "shardscope: %s\n", c.envError.c_str());
    c.forcedSteady = forceSteady;
#if SHARDSCOPE_HAVE_TSC
    c.invariant = cpuHasInvariantTsc();
    if (c.invariant && calibrateTsc()) c.use.store(!forceSteady, std::memory_order_release);
#endif
    return true;
}

// Until this dynamic initialiser ran, g_tsc.use is false: a clock read from another static
// initialiser gets steady_clock instead of garbage.
inline const bool g_clockReady = initClock();

} // namespace detail

inline std::uint64_t nowNs() noexcept
{
#if SHARDSCOPE_HAVE_TSC
    detail::TscClock &c = detail::g_tsc;
    if (c.use.load(std::memory_order_relaxed)) [[likely]] {
        for (;;) {
            const std::uint32_t s = c.seq.load(std::memory_order_acquire);
            const std::uint64_t t = detail::readTsc();
            const std::uint64_t tsc0 = c.tsc0.load(std::memory_order_relaxed);
            const std::uint64_t ns0 = c.ns0.load(std::memory_order_relaxed);
            const std::uint64_t q32 = c.nsPerTickQ32.load(std::memory_order_relaxed);
            const std::uint64_t refineAt = c.refineAtTsc.load(std::memory_order_relaxed);
            std::atomic_thread_fence(std::memory_order_acquire);
            if ((s & 1u) || c.seq.load(std::memory_order_relaxed) != s) [[unlikely]]
                continue;
            if (static_cast<std::int64_t>(t - refineAt) >= 0) [[unlikely]]
                detail::refineTsc();
            return detail::mapTsc(t, tsc0, ns0, q32);
        }
    }
#endif
    return steadyNs();
}

inline ClockSource clockSource() noexcept
{
    return detail::g_tsc.use.load(std::memory_order_relaxed) ? ClockSource::Tsc
                                                             : ClockSource::Steady;
}

// Whether the TSC path can be used here (CPUID's invariant bit, a sane calibration),
// whatever SHARDSCOPE_CLOCK chose.
inline bool tscUsable() noexcept
{
    return detail::g_tsc.nsPerTickQ32.load(std::memory_order_relaxed) != 0;
}

// Benchmarks and tests: switch between the TSC path (when usable) and steady_clock at run
// time, to measure both on one machine. Returns the source now in use. Timestamps taken
// under the two differ by the mapping's error (about a microsecond), so a running
// training process should not switch.
inline ClockSource useClock(ClockSource source) noexcept
{
    detail::g_tsc.use.store(source == ClockSource::Tsc && tscUsable(), std::memory_order_release);
    return clockSource();
}

// TSC ticks per second as calibrated, 0 when not usable.
inline double tscHz() noexcept
{
    const std::uint64_t q32 = detail::g_tsc.nsPerTickQ32.load(std::memory_order_relaxed);
    return q32 ? 1e9 * 4294967296.0 / double(q32) : 0.0;
}

// One line for benchmarks and logs: which clock nowNs() reads, and why.
inline std::string clockDescription()
{
    const detail::TscClock &c = detail::g_tsc;
    std::string why;
    if (clockSource() == ClockSource::Tsc) {
        char buf[160];
        std::snprintf(
            buf, sizeof buf,
            "rdtsc mapped onto steady_clock (CPUID invariant TSC, %.3f MHz as calibrated)",
            tscHz() / 1e6);
        why = buf;
    } else if (c.forcedSteady) {
        why = "steady_clock (forced: SHARDSCOPE_CLOCK=steady)";
    } else if (tscUsable()) {
        why = "steady_clock (chosen at run time; the TSC is usable)";
    } else if (!c.invariant) {
        why = "steady_clock (CPUID does not report an invariant TSC)";
    } else {
        why = "steady_clock (the TSC did not calibrate)";
    }
    if (!c.envError.empty()) why += "; " + c.envError;
    return why;
}

} // namespace shardscope::telemetry

#pragma once
// What every benchmark shares: repetition statistics (median and min-max), a compiler
// barrier that keeps measured work alive, the machine line, the --reps option, and the
// benchmark's own path (for the child processes some of them start).

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <stdexcept>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace shardscope::bench {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t0)
{
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of the calling thread (or the whole process). On a shared machine the wall
// clock also counts the time other processes held the core; CPU time does not.
inline double threadCpuSeconds()
{
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

inline double processCpuSeconds()
{
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Wall and thread-CPU time of one measured pass.
class PassTimer
{
  public:
    PassTimer() : m_wall(Clock::now()), m_cpu(threadCpuSeconds()) {}
    double wallSeconds() const { return secondsSince(m_wall); }
    double cpuSeconds() const { return threadCpuSeconds() - m_cpu; }

  private:
    Clock::time_point m_wall;
    double m_cpu;
};

struct Stats
{
    double median = 0.0;
    double min = 0.0;
    double max = 0.0;
};

inline Stats stats(std::vector<double> v)
{
    Stats s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    s.min = v.front();
    s.max = v.back();
    return s;
}

// "12.3 (11.9-13.0)": median (min-max), as bench_allgather prints it.
inline std::string format(const Stats &s, int decimals)
{
    char buf[128];
    std::snprintf(buf, sizeof buf, "%.*f (%.*f-%.*f)", decimals, s.median, decimals, s.min,
                  decimals, s.max);
    return buf;
}

// Keeps a value (and everything it depends on) from being optimised away.
template <typename T> inline void keep(const T &value)
{
    asm volatile("" : : "r,m"(value) : "memory");
}

// "Intel(R) Xeon(R) Processor, 2 hardware threads"
inline std::string machine()
{
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    std::string model = "unknown CPU";
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) model = line.substr(colon + 2);
            break;
        }
    }
    return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
}

// The kernel's clocksource ("tsc", "kvm-clock"), and the TSC flags /proc/cpuinfo lists
// ("constant_tsc nonstop_tsc tsc_reliable"), for the line saying what a figure ran on.
inline std::string clocksource()
{
    std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string source;
    return f >> source ? source : std::string("unknown");
}

inline std::string tscFlags()
{
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("flags", 0) != 0) continue;
        std::string out;
        std::size_t pos = line.find(':');
        while (pos != std::string::npos && pos < line.size()) {
            const std::size_t start = line.find_first_not_of(" :", pos);
            if (start == std::string::npos) break;
            const std::size_t end = line.find(' ', start);
            const std::string flag =
                line.substr(start, end == std::string::npos ? end : end - start);
            if (flag.find("tsc") != std::string::npos) out += (out.empty() ? "" : " ") + flag;
            pos = end;
        }
        return out.empty() ? std::string("none") : out;
    }
    return "unknown";
}

// Reads "--reps N" (at least 5 unless the caller allows fewer) from the command line;
// anything else is a usage error that names the benchmark.
inline int parseReps(int argc, char **argv, std::string_view name, int fallback, int least = 5)
{
    int reps = fallback;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc) {
            reps = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "%.*s: unknown argument '%s'\nusage: %.*s [--reps N]\n",
                         static_cast<int>(name.size()), name.data(), a.c_str(),
                         static_cast<int>(name.size()), name.data());
            std::exit(2);
        }
    }
    if (reps < least) {
        std::fprintf(stderr, "%.*s: --reps must be at least %d, to show the spread\n",
                     static_cast<int>(name.size()), name.data(), least);
        std::exit(2);
    }
    return reps;
}

// This executable, to start a child process of the same benchmark.
inline std::string selfPath()
{
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) throw std::runtime_error("cannot find this executable through /proc/self/exe");
    return std::string(buf, static_cast<std::size_t>(n));
}

// Minor page faults of the whole process so far (getrusage).
inline long minorFaults()
{
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

inline const char *verdict(bool met)
{
    return met ? "met" : "**missed**";
}

} // namespace shardscope::bench

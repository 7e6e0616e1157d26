#pragma once
// Writes a Chrome / Perfetto trace (the JSON object format: "traceEvents" and a few
// top-level members): metadata, complete ("X") spans, instants and counters, on the microsecond
// timeline that starts at t0, with nlohmann-json (objects with sorted keys, compact).
// Knows nothing of the store; traceexport.cpp maps a store onto it. The document is written
// in one place, document().

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardscope::sessioncore {

// The pid of each rank and the tid of each of its threads. Rank r's threads are its pid +
// offset, offset 0 being the pid itself (a process's main thread, as on Linux). No id is 0
// and no tid belongs to two processes: Perfetto takes pid 0 and tid 0 for the kernel's idle
// task (google/perfetto#394) and has named or merged threads wrongly where one tid appeared
// in several processes (google/perfetto#363, thoren-d/tracing-chrome#32). Rank r's pid is
// r * stride + 1, the stride being the smallest power of ten, at least 100, above every
// rank's thread count, so that rank 2's ids read 201, 202, ...; where that would pass
// 2^31 - 1 (Perfetto reads ids as 32 bits), the ranks' blocks are packed one after the
// other from 1 instead, and stride() is 0.
class TraceIds
{
  public:
    // threads[r]: how many threads rank r has (offsets 0 .. threads[r] - 1, at least 1).
    explicit TraceIds(const std::vector<int> &threads);

    int pid(int rank) const { return m_pids.at(static_cast<std::size_t>(rank)); }
    int tid(int rank, int offset) const { return pid(rank) + offset; }
    std::int64_t stride() const { return m_stride; }

  private:
    std::vector<int> m_pids;
    std::int64_t m_stride = 0;
};

class TraceBuilder
{
  public:
    explicit TraceBuilder(std::uint64_t t0Ns) : m_t0(t0Ns) {}

    // Microseconds since t0, rounded (0 before it). Both ends of a span are rounded, not its
    // duration: rounding is monotonic, so spans nested or disjoint in nanoseconds stay so.
    std::int64_t us(std::uint64_t tsNs) const;
    std::int64_t dur(std::uint64_t beginNs, std::uint64_t endNs) const;

    void meta(const char *name, int pid, int tid, nlohmann::json args);
    void spanUs(const std::string &name, const std::string &cat, int pid, int tid, std::int64_t ts,
                std::int64_t duration, nlohmann::json args);
    void span(const std::string &name, const std::string &cat, int pid, int tid,
              std::uint64_t beginNs, std::uint64_t endNs, nlohmann::json args);
    void instant(const std::string &name, const std::string &cat, int pid, int tid,
                 std::uint64_t tsNs, nlohmann::json args);
    // A counter sample ("C") of process pid: one track per member of args (numbers), which
    // Perfetto names "NAME MEMBER" and Chrome draws stacked under NAME. tid is the pid.
    void counter(const std::string &name, int pid, std::uint64_t tsNs, nlohmann::json args);

    // The whole trace as compact JSON: the events, displayTimeUnit "ms" and the given
    // top-level members (distributedInfo, otherData, ...).
    std::string document(nlohmann::json members) const;

    // A double as a trace writes it: an integral value as an integer ("2", not "2.0"),
    // as the QJson writer of earlier releases did; others in shortest round-trip form.
    static nlohmann::json number(double v);

  private:
    void add(const nlohmann::json &event);

    std::uint64_t m_t0;
    std::string m_events; // the events, each compact, comma-separated (no brackets)
};

} // namespace shardscope::sessioncore

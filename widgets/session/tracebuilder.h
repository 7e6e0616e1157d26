#pragma once
// Writes a Chrome / Perfetto trace (the JSON object format: "traceEvents" and a few
// top-level members): metadata, complete ("X") spans and instants, on the microsecond
// timeline that starts at t0. Knows nothing of the store; traceexport.cpp maps a store
// onto it. The document is written in one place, document().

#include <QByteArray>
#include <QJsonArray>
#include <QJsonObject>
#include <QString>

#include <cstdint>
#include <vector>

namespace shardscope::session {

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
    qint64 stride() const { return m_stride; }

  private:
    std::vector<int> m_pids;
    qint64 m_stride = 0;
};

class TraceBuilder
{
  public:
    explicit TraceBuilder(std::uint64_t t0Ns) : m_t0(t0Ns) {}

    // Microseconds since t0, rounded (0 before it). Both ends of a span are rounded, not its
    // duration: rounding is monotonic, so spans nested or disjoint in nanoseconds stay so.
    qint64 us(std::uint64_t tsNs) const;
    qint64 dur(std::uint64_t beginNs, std::uint64_t endNs) const;

    void meta(const char *name, int pid, int tid, const QJsonObject &args);
    void spanUs(const QString &name, const QString &cat, int pid, int tid, qint64 ts,
                qint64 duration, const QJsonObject &args);
    void span(const QString &name, const QString &cat, int pid, int tid, std::uint64_t beginNs,
              std::uint64_t endNs, const QJsonObject &args);
    void instant(const QString &name, const QString &cat, int pid, int tid, std::uint64_t tsNs,
                 const QJsonObject &args);

    // The whole trace as compact JSON: the events, displayTimeUnit "ms" and the given
    // top-level members (distributedInfo, otherData, ...).
    QByteArray document(const QJsonObject &members) const;

  private:
    std::uint64_t m_t0;
    QJsonArray m_events;
};

} // namespace shardscope::session

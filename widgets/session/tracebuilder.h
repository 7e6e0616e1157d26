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

namespace shardscope::session {

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

#include "session/tracebuilder.h"

#include <QJsonDocument>

#include <algorithm>
#include <limits>

namespace shardscope::session {

TraceIds::TraceIds(const std::vector<int> &threads)
{
    constexpr qint64 kMaxId = std::numeric_limits<std::int32_t>::max();
    qint64 most = 1;
    for (int n : threads)
        most = std::max<qint64>(most, n);
    qint64 stride = 100;
    while (stride <= most && stride <= kMaxId)
        stride *= 10;
    const auto ranks = static_cast<qint64>(threads.size());
    m_pids.reserve(threads.size());
    if (ranks == 0 || (ranks - 1) * stride + most <= kMaxId) {
        m_stride = stride;
        for (qint64 r = 0; r < ranks; ++r)
            m_pids.push_back(static_cast<int>(r * stride + 1));
        return;
    }
    // Packed: at most 2^16 ranks (the decoders' bound) of 3 fixed threads, and each gather
    // thread holds a gather, so the ids pass 2^31 only past 2^31 stored events.
    qint64 next = 1;
    for (int n : threads) {
        m_pids.push_back(static_cast<int>(std::min(next, kMaxId)));
        next += std::max(n, 1);
    }
}

qint64 TraceBuilder::us(std::uint64_t ts) const
{
    return static_cast<qint64>(ts >= m_t0 ? (ts - m_t0 + 500) / 1000 : 0);
}

qint64 TraceBuilder::dur(std::uint64_t begin, std::uint64_t end) const
{
    return end > begin ? us(end) - us(begin) : qint64(0);
}

void TraceBuilder::meta(const char *name, int pid, int tid, const QJsonObject &args)
{
    m_events.append(QJsonObject{{QStringLiteral("name"), QLatin1String(name)},
                                {QStringLiteral("ph"), QStringLiteral("M")},
                                {QStringLiteral("pid"), pid},
                                {QStringLiteral("tid"), tid},
                                {QStringLiteral("args"), args}});
}

void TraceBuilder::spanUs(const QString &name, const QString &cat, int pid, int tid, qint64 ts,
                          qint64 duration, const QJsonObject &args)
{
    m_events.append(QJsonObject{{QStringLiteral("name"), name},
                                {QStringLiteral("cat"), cat},
                                {QStringLiteral("ph"), QStringLiteral("X")},
                                {QStringLiteral("pid"), pid},
                                {QStringLiteral("tid"), tid},
                                {QStringLiteral("ts"), ts},
                                {QStringLiteral("dur"), duration},
                                {QStringLiteral("args"), args}});
}

void TraceBuilder::span(const QString &name, const QString &cat, int pid, int tid,
                        std::uint64_t begin, std::uint64_t end, const QJsonObject &args)
{
    spanUs(name, cat, pid, tid, us(begin), dur(begin, end), args);
}

void TraceBuilder::instant(const QString &name, const QString &cat, int pid, int tid,
                           std::uint64_t ts, const QJsonObject &args)
{
    m_events.append(QJsonObject{{QStringLiteral("name"), name},
                                {QStringLiteral("cat"), cat},
                                {QStringLiteral("ph"), QStringLiteral("i")},
                                {QStringLiteral("s"), QStringLiteral("p")},
                                {QStringLiteral("pid"), pid},
                                {QStringLiteral("tid"), tid},
                                {QStringLiteral("ts"), us(ts)},
                                {QStringLiteral("args"), args}});
}

QByteArray TraceBuilder::document(const QJsonObject &members) const
{
    QJsonObject root = members;
    root.insert(QStringLiteral("traceEvents"), m_events);
    root.insert(QStringLiteral("displayTimeUnit"), QStringLiteral("ms"));
    return QJsonDocument(root).toJson(QJsonDocument::Compact);
}

} // namespace shardscope::session

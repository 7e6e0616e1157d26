#include "session/labels.h"

#include <QStringList>

namespace shardscope::labels {

QString status(ParamStatus s)
{
    switch (s) {
    case ParamStatus::NotAvailable:
        return QStringLiteral("NOT_AVAILABLE");
    case ParamStatus::Inflight:
        return QStringLiteral("INFLIGHT");
    case ParamStatus::Available:
        return QStringLiteral("AVAILABLE");
    }
    return QStringLiteral("UNKNOWN");
}

QString action(GuardAction a)
{
    switch (a) {
    case GuardAction::Raised:
        return QStringLiteral("error");
    case GuardAction::Gathered:
        return QStringLiteral("gathered");
    case GuardAction::AutoRegistered:
        return QStringLiteral("auto_registered");
    case GuardAction::Recorded:
        return QStringLiteral("recorded");
    }
    return QStringLiteral("unknown");
}

QString kind(ViolationKind k)
{
    switch (k) {
    case ViolationKind::UnregisteredAccess:
        return QStringLiteral("unregistered_access");
    case ViolationKind::LateParameter:
        return QStringLiteral("late_parameter");
    case ViolationKind::TraceInvalidated:
        return QStringLiteral("trace_invalidated");
    case ViolationKind::GatheredWriteWithoutModifier:
        return QStringLiteral("gathered_write_without_modifier");
    }
    return QStringLiteral("unknown");
}

QString dtype(DType t)
{
    return t == DType::BF16 ? QStringLiteral("bfloat16") : QStringLiteral("float32");
}

QString reason(FetchReason r)
{
    switch (r) {
    case FetchReason::Forward:
        return QStringLiteral("forward");
    case FetchReason::Backward:
        return QStringLiteral("backward");
    case FetchReason::Prefetch:
        return QStringLiteral("prefetch");
    case FetchReason::GatheredParameters:
        return QStringLiteral("gathered_parameters");
    case FetchReason::Guard:
        return QStringLiteral("guard");
    }
    return QStringLiteral("unknown");
}

QString phase(Phase p)
{
    return p == Phase::Backward ? QStringLiteral("backward") : QStringLiteral("forward");
}

QString shape(const Shape &s)
{
    QStringList parts;
    for (std::int64_t d : s)
        parts << QString::number(d);
    return QLatin1Char('[') + parts.join(QStringLiteral(", ")) + QLatin1Char(']');
}

QString count(std::uint64_t n)
{
    QString s = QString::number(n);
    for (qsizetype i = s.size() - 3; i > 0; i -= 3)
        s.insert(i, QLatin1Char(','));
    return s;
}

QString bytes(std::uint64_t n)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    return u == 0 ? QStringLiteral("%1 B").arg(n)
                  : QStringLiteral("%1 %2").arg(v, 0, 'f', 1).arg(QLatin1String(units[u]));
}

QString ranks(std::uint64_t rankMask)
{
    QStringList parts;
    int r = 0;
    while (r < 64) {
        if (!(rankMask >> r & 1u)) {
            ++r;
            continue;
        }
        int end = r;
        while (end + 1 < 64 && (rankMask >> (end + 1) & 1u))
            ++end;
        parts << (end == r ? QString::number(r) : QStringLiteral("%1-%2").arg(r).arg(end));
        r = end + 1;
    }
    return parts.join(QStringLiteral(", "));
}

QString duration(std::uint64_t ns)
{
    const double v = static_cast<double>(ns);
    if (ns < 1000) return QStringLiteral("%1 ns").arg(ns);
    if (v < 1e6) return QStringLiteral("%1 µs").arg(v / 1e3, 0, 'f', v < 1e4 ? 2 : 1);
    if (v < 1e9) return QStringLiteral("%1 ms").arg(v / 1e6, 0, 'f', v < 1e7 ? 2 : 1);
    if (v < 60e9) return QStringLiteral("%1 s").arg(v / 1e9, 0, 'f', 2);
    const std::uint64_t s = ns / 1000000000ull;
    if (s < 3600) return QStringLiteral("%1 min %2 s").arg(s / 60).arg(s % 60);
    return QStringLiteral("%1 h %2 min").arg(s / 3600).arg(s / 60 % 60);
}

QString breakable(const QString &text)
{
    QString out;
    out.reserve(text.size() + text.size() / 4);
    for (QChar c : text) {
        out += c;
        if (c == QLatin1Char('.') || c == QLatin1Char('_') || c == QLatin1Char('(') ||
            c == QLatin1Char(',') || c == QLatin1Char('/'))
            out += QChar(0x200B);
    }
    return out;
}

} // namespace shardscope::labels

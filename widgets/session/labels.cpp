#include "session/labels.h"

#include <QStringList>

namespace shardscope::session::labels {

namespace {

QString name(std::string_view n)
{
    return QString::fromLatin1(n.data(), static_cast<qsizetype>(n.size()));
}

} // namespace

QString status(ParamStatus s)
{
    return name(statusName(s));
}
QString action(GuardAction a)
{
    return name(guardActionName(a));
}
QString kind(ViolationKind k)
{
    return name(violationKindName(k));
}
QString severity(Severity s)
{
    return name(severityName(s));
}
QString dtype(DType t)
{
    return name(dtypeName(t));
}
QString reason(FetchReason r)
{
    return name(fetchReasonName(r));
}
QString phase(Phase p)
{
    return name(phaseName(p));
}
QString shape(const Shape &s)
{
    return QString::fromStdString(state::shapeString(s));
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

QString fsdpUnit(const state::ModuleRecord &m, const QString &groupPath)
{
    if (!m.fsdpUnit()) return {};
    QString text = QStringLiteral("reshard_after_forward=%1")
                       .arg(QString::fromStdString(m.reshardAfterForward));
    if (!m.mesh.empty()) text += QStringLiteral("; mesh %1").arg(QString::fromStdString(m.mesh));
    if (m.unitGroup != m.id)
        text += QStringLiteral("; grouped with %1")
                    .arg(groupPath.isEmpty() ? QStringLiteral("<root>") : groupPath);
    return text;
}

QString moduleType(const state::ModuleRecord &m, const QString &groupPath)
{
    const QString type = QString::fromStdString(m.type);
    return m.fsdpUnit() ? QStringLiteral("%1 [FSDP unit: %2]").arg(type, fsdpUnit(m, groupPath))
                        : type;
}

} // namespace shardscope::session::labels

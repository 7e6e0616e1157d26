#include "models/violationsmodel.h"

#include <QColor>
#include <QFileInfo>

#include "models/severitycolor.h"
#include "session/labels.h"
#include "state/violationtext.h"

namespace shardscope::models {

ViolationsModel::ViolationsModel(session::SessionStore *store, QObject *parent)
    : QAbstractTableModel(parent), m_store(store),
      m_rows(static_cast<int>(store->violationGroups().size()))
{
    connect(m_store, &session::SessionStore::updated, this, &ViolationsModel::onStoreUpdated);
}

int ViolationsModel::rowCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : m_rows;
}

int ViolationsModel::columnCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

const state::ViolationRow *ViolationsModel::group(int row) const
{
    const auto &groups = m_store->violationGroups();
    return row >= 0 && row < m_rows && static_cast<std::size_t>(row) < groups.size()
               ? &groups[static_cast<std::size_t>(row)]
               : nullptr;
}

QVariant ViolationsModel::displayValue(const state::ViolationRow &g, int column) const
{
    switch (column) {
    case Time: {
        const std::uint64_t t0 = m_store->timeOrigin();
        if (!g.firstTsNs) return {};
        const double s =
            g.firstTsNs >= t0 && t0 ? static_cast<double>(g.firstTsNs - t0) / 1e9 : 0.0;
        return QStringLiteral("%1 s").arg(s, 0, 'f', 3);
    }
    case Step:
        return g.firstStep == g.lastStep ? QString::number(g.firstStep)
                                         : QStringLiteral("%1-%2").arg(g.firstStep).arg(g.lastStep);
    case Rank:
        return g.rankMask() ? session::labels::ranks(g.rankMask()) : QString::number(g.firstRank);
    case Kind:
        return session::labels::kind(g.kind);
    case Severity:
        return session::labels::severity(g.severity);
    case Accessor:
        return m_store->modulePath(g.accessor);
    case Parameter:
        return g.param == kNoParam ? QString() : m_store->paramName(g.param);
    case Owner:
        return m_store->modulePath(g.owner);
    case Status:
        return session::labels::status(g.status);
    case Action:
        return session::labels::action(g.action);
    case Count:
        return QString::number(g.count);
    case Location:
        if (!g.location.known()) return {};
        return QStringLiteral("%1:%2")
            .arg(QFileInfo(QString::fromStdString(g.location.file)).fileName())
            .arg(g.location.line);
    default:
        return {};
    }
}

QVariant ViolationsModel::data(const QModelIndex &index, int role) const
{
    if (!index.isValid() || index.parent().isValid()) return {};
    const state::ViolationRow *g = group(index.row());
    if (!g) return {};
    switch (role) {
    case Qt::DisplayRole:
        return displayValue(*g, index.column());
    case Qt::ToolTipRole: {
        QString tip;
        // a name column's whole name first: the cell elides it in the middle
        if (index.column() == Accessor || index.column() == Parameter || index.column() == Owner) {
            const QString name = displayValue(*g, index.column()).toString();
            if (!name.isEmpty()) tip = name + QStringLiteral("\n\n");
        }
        tip += QString::fromStdString(g->message) + QLatin1Char('\n') +
               QString::fromLatin1(state::severityMeaning(g->severity));
        if (!g->fix.empty()) tip += QStringLiteral("\nfix: ") + QString::fromStdString(g->fix);
        if (g->location.known()) {
            tip += QStringLiteral("\nat ") + QString::fromStdString(g->location.fileLine()) +
                   QStringLiteral(" in ") + QString::fromStdString(g->location.function);
            for (const std::string &frame : g->location.chain)
                tip += QStringLiteral("\n  from ") + QString::fromStdString(frame);
        }
        if (!g->building.empty())
            tip += QStringLiteral("\nwhile building: ") + QString::fromStdString(g->building);
        return tip;
    }
    case Qt::ForegroundRole:
        return index.column() == Kind || index.column() == Severity
                   ? QVariant(severityColor(g->severity))
                   : QVariant();
    case Qt::TextAlignmentRole:
        return index.column() == Count ? QVariant(Qt::AlignRight | Qt::AlignVCenter) : QVariant();
    case ParamIdRole:
        return g->param == kNoParam ? QVariant() : QVariant(g->param);
    case AccessorIdRole:
        return g->accessor == kNoModule ? QVariant() : QVariant(g->accessor);
    case FixRole:
        return QString::fromStdString(g->fix);
    case MessageRole:
        return QString::fromStdString(g->message);
    case LocationRole:
        return QString::fromStdString(g->location.fileLine());
    case SeverityRole:
        return int(g->severity);
    case SortRole:
        switch (index.column()) {
        case Time:
            return qulonglong(g->firstTsNs);
        case Step:
            return g->firstStep;
        case Rank:
            return g->firstRank;
        case Count:
            return qulonglong(g->count);
        case Severity: // errors first in ascending order
            return int(g->severity);
        default:
            return displayValue(*g, index.column());
        }
    default:
        return {};
    }
}

QVariant ViolationsModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    static const char *names[] = {"Time",      "Step",  "Rank",   "Kind",   "Severity", "Accessor",
                                  "Parameter", "Owner", "Status", "Action", "Count",    "Location"};
    static_assert(std::size(names) == ColumnCount);
    return section >= 0 && section < ColumnCount ? QString::fromLatin1(names[section]) : QVariant();
}

void ViolationsModel::onStoreUpdated(const session::StoreChanges &changes)
{
    if (!changes.reset && !changes.violations) return;
    const int now = static_cast<int>(m_store->violationGroups().size());
    if (changes.reset || now < m_rows) {
        beginResetModel();
        m_rows = now;
        endResetModel();
        return;
    }
    if (m_rows > 0) Q_EMIT dataChanged(index(0, 0), index(m_rows - 1, ColumnCount - 1));
    if (now > m_rows) {
        beginInsertRows({}, m_rows, now - 1);
        m_rows = now;
        endInsertRows();
    }
}

QByteArray ViolationsModel::toCsv() const
{
    auto quote = [](const QString &s) {
        if (!s.contains(QLatin1Char(',')) && !s.contains(QLatin1Char('"')) &&
            !s.contains(QLatin1Char('\n')))
            return s;
        QString q = s;
        q.replace(QLatin1Char('"'), QStringLiteral("\"\""));
        return QLatin1Char('"') + q + QLatin1Char('"');
    };
    QStringList lines;
    lines << QStringLiteral(
        "time_ns,step,last_step,ranks,kind,severity,accessor,parameter,owner,status,action,count,"
        "fix,location,function");
    for (int r = 0; r < m_rows; ++r) {
        const state::ViolationRow &g = *group(r);
        QStringList f;
        f << QString::number(g.firstTsNs) << QString::number(g.firstStep)
          << QString::number(g.lastStep) << quote(displayValue(g, Rank).toString())
          << session::labels::kind(g.kind) << session::labels::severity(g.severity)
          << quote(m_store->modulePath(g.accessor))
          << quote(g.param == kNoParam ? QString() : m_store->paramName(g.param))
          << quote(m_store->modulePath(g.owner)) << session::labels::status(g.status)
          << session::labels::action(g.action) << QString::number(g.count)
          << quote(QString::fromStdString(g.fix))
          << quote(QString::fromStdString(g.location.fileLine()))
          << quote(QString::fromStdString(g.location.function));
        lines << f.join(QLatin1Char(','));
    }
    return (lines.join(QLatin1Char('\n')) + QLatin1Char('\n')).toUtf8();
}

} // namespace shardscope::models

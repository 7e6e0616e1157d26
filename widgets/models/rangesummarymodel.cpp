#include "models/rangesummarymodel.h"

#include <algorithm>

#include <QLocale>
#include <QStringList>

#include "session/labels.h"

namespace shardscope::models {

void RangeSummaryModel::setRows(std::vector<RangeRow> rows, double t0Seconds, double t1Seconds)
{
    beginResetModel();
    std::stable_sort(rows.begin(), rows.end(), [](const RangeRow &a, const RangeRow &b) {
        if (a.seconds != b.seconds) return a.seconds > b.seconds;
        if (a.bytes != b.bytes) return a.bytes > b.bytes;
        return a.module > b.module; // modules before parameters, at equal cost
    });
    m_rows = std::move(rows);
    m_t0 = t0Seconds;
    m_t1 = t1Seconds;
    endResetModel();
}

int RangeSummaryModel::rowCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : int(m_rows.size());
}

int RangeSummaryModel::columnCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant RangeSummaryModel::data(const QModelIndex &index, int role) const
{
    if (!index.isValid() || index.parent().isValid() || index.row() >= int(m_rows.size()))
        return {};
    const RangeRow &r = m_rows[std::size_t(index.row())];
    switch (role) {
    case Qt::DisplayRole:
        switch (index.column()) {
        case What:
            return r.module ? tr("module") : tr("parameter");
        case Name:
            return r.name;
        case Gathers:
            return QString::number(r.gathers);
        case Time:
            return QString::number(r.seconds * 1e3, 'f', 3);
        case Bytes:
            return session::labels::bytes(r.bytes);
        default:
            return {};
        }
    case Qt::ToolTipRole:
        return index.column() == Name ? r.name : QVariant();
    case Qt::TextAlignmentRole:
        return index.column() >= Gathers ? QVariant(Qt::AlignRight | Qt::AlignVCenter) : QVariant();
    case SortRole:
        switch (index.column()) {
        case Gathers:
            return QVariant::fromValue<qulonglong>(r.gathers);
        case Time:
            return r.seconds;
        case Bytes:
            return QVariant::fromValue<qulonglong>(r.bytes);
        default:
            return data(index, Qt::DisplayRole);
        }
    case IdRole:
        return r.id;
    case IsModuleRole:
        return r.module;
    default:
        return {};
    }
}

QVariant RangeSummaryModel::headerData(int section, Qt::Orientation o, int role) const
{
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
    case What:
        return tr("What");
    case Name:
        return tr("Name");
    case Gathers:
        return tr("Gathers");
    case Time:
        return tr("Time (ms)");
    case Bytes:
        return tr("Bytes");
    default:
        return {};
    }
}

QString RangeSummaryModel::toTsv() const
{
    QStringList lines{QStringLiteral("what\tname\tgathers\ttime_ms\tbytes")};
    for (const RangeRow &r : m_rows)
        lines << QStringLiteral("%1\t%2\t%3\t%4\t%5")
                     .arg(r.module ? QStringLiteral("module") : QStringLiteral("parameter"), r.name)
                     .arg(r.gathers)
                     .arg(r.seconds * 1e3, 0, 'f', 3)
                     .arg(r.bytes);
    return lines.join(QLatin1Char('\n'));
}

} // namespace shardscope::models

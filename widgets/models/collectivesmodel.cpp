#include "models/collectivesmodel.h"

#include <algorithm>

#include "base/names.h"
#include "models/severitycolor.h"
#include "session/labels.h"

namespace shardscope::models {

namespace {

QString fromView(std::string_view s)
{
    return QString::fromUtf8(s.data(), qsizetype(s.size()));
}

QString collectiveText(const sessioncore::RankProgress &p)
{
    if (p.seq == 0) return {};
    const QString seq = QStringLiteral("#%1").arg(p.seq);
    return p.group == 0 ? seq : QStringLiteral("g%1 %2").arg(p.group).arg(seq);
}

} // namespace

// ---------------------------------------------------------------- RankProgressModel

void RankProgressModel::setProgress(std::vector<sessioncore::RankProgress> progress,
                                    std::uint64_t nowNs)
{
    const bool sameRows = progress.size() == m_rows.size() &&
                          std::equal(progress.begin(), progress.end(), m_rows.begin(),
                                     [](const auto &a, const auto &b) { return a.rank == b.rank; });
    if (!sameRows) {
        beginResetModel();
        m_rows = std::move(progress);
        m_now = nowNs;
        endResetModel();
        return;
    }
    m_rows = std::move(progress);
    m_now = nowNs;
    if (!m_rows.empty())
        Q_EMIT dataChanged(index(0, 0), index(int(m_rows.size()) - 1, ColumnCount - 1));
}

QString RankProgressModel::whereText(const sessioncore::RankProgress &p)
{
    if (!p.present) return tr("not seen");
    if (p.diverged) return tr("diverged");
    if (p.stalled) return tr("stalled");
    if (p.noSequence) return tr("no sequence numbers");
    if (p.finished) return tr("ended");
    if (p.inFlight) return tr("waiting");
    return tr("running");
}

int RankProgressModel::rowCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : int(m_rows.size());
}

int RankProgressModel::columnCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant RankProgressModel::data(const QModelIndex &index, int role) const
{
    if (!index.isValid() || index.parent().isValid() || index.row() >= int(m_rows.size()))
        return {};
    const sessioncore::RankProgress &p = m_rows[std::size_t(index.row())];
    const bool problem = p.stalled || p.diverged;
    const bool has = p.seq != 0;
    const std::uint64_t waited = p.inFlight && m_now > p.sinceNs ? m_now - p.sinceNs : 0;
    switch (role) {
    case Qt::DisplayRole:
        switch (index.column()) {
        case Rank:
            return QString::number(p.rank);
        case Where:
            return whereText(p);
        case Collective:
            return collectiveText(p);
        case Kind:
            return has ? fromView(collectiveKindName(p.kind)) : QString();
        case Module:
            return has && p.hasModule
                       ? (p.modulePath.empty() ? tr("(root)")
                                               : QString::fromStdString(p.modulePath))
                       : QString();
        case Reason:
            return has ? session::labels::reason(p.reason) : QString();
        case Since:
            return waited ? session::labels::duration(waited) : QString();
        case Line:
            return QString::fromStdString(p.where.fileLine());
        default:
            return {};
        }
    case SortRole:
        switch (index.column()) {
        case Rank:
            return p.rank;
        case Collective:
            return qulonglong(p.seq);
        case Since:
            return qulonglong(waited);
        default:
            return data(index, Qt::DisplayRole);
        }
    case ProblemRole:
        return problem;
    case Qt::ForegroundRole:
        if (problem && (index.column() == Where || index.column() == Rank))
            return severityColor(Severity::Error);
        return {};
    case Qt::ToolTipRole:
        if (index.column() == Line && !p.where.chain.empty()) {
            QString chain = QString::fromStdString(p.where.fileLine());
            for (const std::string &frame : p.where.chain)
                chain += QStringLiteral("\n  ") + QString::fromStdString(frame);
            return chain;
        }
        if (index.column() == Module) return data(index, Qt::DisplayRole);
        return {};
    case Qt::TextAlignmentRole:
        return index.column() == Rank || index.column() == Since
                   ? QVariant(Qt::AlignRight | Qt::AlignVCenter)
                   : QVariant();
    default:
        return {};
    }
}

QVariant RankProgressModel::headerData(int section, Qt::Orientation o, int role) const
{
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
    case Rank:
        return tr("Rank");
    case Where:
        return tr("State");
    case Collective:
        return tr("Collective");
    case Kind:
        return tr("Kind");
    case Module:
        return tr("Module");
    case Reason:
        return tr("Reason");
    case Since:
        return tr("Waiting");
    case Line:
        return tr("Line");
    default:
        return {};
    }
}

// ---------------------------------------------------------------- StragglerModel

void StragglerModel::setSummary(sessioncore::StragglerSummary summary)
{
    const bool sameRows = summary.ranks.size() == m_summary.ranks.size();
    if (!sameRows) beginResetModel();
    m_summary = std::move(summary);
    if (!sameRows) {
        endResetModel();
    } else if (!m_summary.ranks.empty()) {
        Q_EMIT dataChanged(index(0, 0), index(int(m_summary.ranks.size()) - 1, ColumnCount - 1));
    }
}

QString StragglerModel::summaryText() const
{
    const sessioncore::StragglerSummary &s = m_summary;
    if (s.collectives == 0) return tr("No collective completed by every rank yet.");
    QString text = tr("%1 collectives completed by every rank; arrival spread mean %2, max %3")
                       .arg(session::labels::count(s.collectives),
                            session::labels::duration(s.totalSpreadNs / s.collectives),
                            session::labels::duration(s.maxSpreadNs));
    if (const sessioncore::StragglerFigures *last = sessioncore::latestRank(s))
        text += tr("; the latest: rank %1 (last %2 times, %3 late in all)")
                    .arg(last->rank)
                    .arg(session::labels::count(last->timesLast),
                         session::labels::duration(last->totalLateNs));
    return text;
}

int StragglerModel::rowCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : int(m_summary.ranks.size());
}

int StragglerModel::columnCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant StragglerModel::data(const QModelIndex &index, int role) const
{
    if (!index.isValid() || index.parent().isValid() || index.row() >= int(m_summary.ranks.size()))
        return {};
    const sessioncore::StragglerFigures &r = m_summary.ranks[std::size_t(index.row())];
    const std::uint64_t mean = r.collectives ? r.totalLateNs / r.collectives : 0;
    switch (role) {
    case Qt::DisplayRole:
        switch (index.column()) {
        case Rank:
            return QString::number(r.rank);
        case Collectives:
            return session::labels::count(r.collectives);
        case TimesLast:
            return session::labels::count(r.timesLast);
        case MeanLate:
            return session::labels::duration(mean);
        case MaxLate:
            return session::labels::duration(r.maxLateNs);
        default:
            return {};
        }
    case SortRole:
        switch (index.column()) {
        case Rank:
            return r.rank;
        case Collectives:
            return qulonglong(r.collectives);
        case TimesLast:
            return qulonglong(r.timesLast);
        case MeanLate:
            return qulonglong(mean);
        case MaxLate:
            return qulonglong(r.maxLateNs);
        default:
            return {};
        }
    case Qt::TextAlignmentRole:
        return QVariant(Qt::AlignRight | Qt::AlignVCenter);
    default:
        return {};
    }
}

QVariant StragglerModel::headerData(int section, Qt::Orientation o, int role) const
{
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
    case Rank:
        return tr("Rank");
    case Collectives:
        return tr("Collectives");
    case TimesLast:
        return tr("Last");
    case MeanLate:
        return tr("Mean late");
    case MaxLate:
        return tr("Max late");
    default:
        return {};
    }
}

} // namespace shardscope::models

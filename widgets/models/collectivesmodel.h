#pragma once
// The job's collectives as the inspector shows them (issue 51): where each rank is in its
// sequence of all-gathers, reduce-scatters and broadcasts (RankProgressModel: one row per
// rank, the diverged and stalled ranks marked), and who arrives last (StragglerModel: one row
// per rank, from the arrival spread of every collective all ranks completed). Both read
// sessioncore::CollectiveAligner's figures (sessioncore/collectivealigner.h), which the
// session store feeds with every event; the models only format them.

#include <cstdint>
#include <vector>

#include <QAbstractTableModel>
#include <QString>

#include "sessioncore/collectivealigner.h"

namespace shardscope::models {

class RankProgressModel : public QAbstractTableModel
{
    Q_OBJECT
  public:
    enum Column
    {
        Rank,
        Where,      // running, waiting, stalled, diverged, ended, no sequence numbers
        Collective, // "#412" (group 0) or "g1 #37"
        Kind,
        Module,
        Reason,
        Since, // how long it has waited in it (in flight), else empty
        Line,  // its watchdog's file:line
        ColumnCount
    };
    enum Role
    {
        SortRole = Qt::UserRole + 1, // numbers as numbers
        ProblemRole,                 // bool: the rank is stalled or diverged
    };

    using QAbstractTableModel::QAbstractTableModel;

    // Replaces the rows; nowNs: the events' clock now (how long in-flight ranks have waited;
    // 0: not shown). Rows change in place when the ranks are the same ones.
    void setProgress(std::vector<sessioncore::RankProgress> progress, std::uint64_t nowNs);
    const std::vector<sessioncore::RankProgress> &progress() const { return m_rows; }
    // "stalled", "diverged", "waiting", "running", "ended", "no sequence numbers", "not seen".
    static QString whereText(const sessioncore::RankProgress &p);

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

  private:
    std::vector<sessioncore::RankProgress> m_rows;
    std::uint64_t m_now = 0;
};

class StragglerModel : public QAbstractTableModel
{
    Q_OBJECT
  public:
    enum Column
    {
        Rank,
        Collectives, // completed by every rank, with this one
        TimesLast,   // how often it arrived last
        MeanLate,    // its mean lateness behind the first rank to arrive
        MaxLate,
        ColumnCount
    };
    enum Role
    {
        SortRole = Qt::UserRole + 1,
    };

    using QAbstractTableModel::QAbstractTableModel;

    void setSummary(sessioncore::StragglerSummary summary);
    const sessioncore::StragglerSummary &summary() const { return m_summary; }
    // "1,234 collectives by every rank; spread mean 1.2 ms, max 40 ms; the latest: rank 3
    // (last 40 times, 2.1 s late in all)": the straggler by sessioncore::latestRank"
    QString summaryText() const;

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

  private:
    sessioncore::StragglerSummary m_summary;
};

} // namespace shardscope::models

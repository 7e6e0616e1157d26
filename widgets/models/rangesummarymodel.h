#pragma once
// What a selected time range of the gather timeline holds, per module and per parameter: the
// gathers, their time and bytes, heaviest first (issue #52: "which module gathered most
// between steps 200 and 300"). The rows are made by views::GatherTimeline::rangeSummary.

#include <cstdint>
#include <vector>

#include <QAbstractTableModel>
#include <QString>

namespace shardscope::models {

struct RangeRow
{
    bool module = false; // a module (the gathers it caused) or a parameter (its gathers)
    quint32 id = 0;
    QString name;
    std::uint64_t gathers = 0;
    double seconds = 0; // the gathers' durations, summed
    std::uint64_t bytes = 0;
};

class RangeSummaryModel : public QAbstractTableModel
{
    Q_OBJECT
  public:
    enum Column
    {
        What,
        Name,
        Gathers,
        Time,
        Bytes,
        ColumnCount
    };
    enum Role
    {
        IdRole = Qt::UserRole + 1, // the module's or parameter's id
        IsModuleRole,
        SortRole, // numbers as numbers
    };

    using QAbstractTableModel::QAbstractTableModel;

    // Replaces the rows (sorted here: the longest gather time first) and the range they sum.
    void setRows(std::vector<RangeRow> rows, double t0Seconds, double t1Seconds);
    const std::vector<RangeRow> &rows() const { return m_rows; }
    double rangeStart() const { return m_t0; }
    double rangeEnd() const { return m_t1; }

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

    // The whole table with its header, tab-separated, names and numbers whole: what Copy takes.
    QString toTsv() const;

  private:
    std::vector<RangeRow> m_rows;
    double m_t0 = 0, m_t1 = 0;
};

} // namespace shardscope::models

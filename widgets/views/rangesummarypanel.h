#pragma once
// The Selection panel: a time range selected on the gather timeline (Shift+drag) as a question
// answered, the gathers per module and per parameter with their time and bytes, heaviest first;
// sortable, copied whole with Ctrl+C, a click on a row selects it in the tree.

#include <vector>

#include <QWidget>

#include "models/rangesummarymodel.h"

class QComboBox;
class QLabel;
class QSortFilterProxyModel;
class QTableView;

namespace shardscope::views {

class RangeSummaryPanel : public QWidget
{
    Q_OBJECT
  public:
    explicit RangeSummaryPanel(QWidget *parent = nullptr);

    void setRange(std::vector<models::RangeRow> rows, double t0Seconds, double t1Seconds);
    // The ranks the rank box offers (all, or one of 0..worldSize-1); -1 while all are chosen.
    void setWorldSize(int worldSize);
    int rank() const;
    void setRank(int rank);
    models::RangeSummaryModel *model() const { return m_model; }
    QTableView *tableView() const { return m_table; }
    QString headline() const;

  Q_SIGNALS:
    void paramSelected(quint32 paramId);
    void moduleSelected(quint32 moduleId);
    // The rank box changed: the same range is to be summed again on `rank` (-1: all).
    void rankChanged(int rank);

  private:
    models::RangeSummaryModel *m_model;
    QSortFilterProxyModel *m_proxy;
    QTableView *m_table;
    QLabel *m_headline;
    QComboBox *m_rank;
};

} // namespace shardscope::views

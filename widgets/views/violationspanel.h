#pragma once
// The violations panel: the grouped violations table (sortable), the selected row's
// message and fix line with a Copy button; selecting a row asks for its parameter.

#include <QWidget>

class QLabel;
class QPushButton;
class QSortFilterProxyModel;
class QTableView;

namespace shardscope::session {
class SessionStore;
} // namespace shardscope::session
namespace shardscope::models {
class ViolationsModel;
} // namespace shardscope::models

namespace shardscope::views {

class ViolationsPanel : public QWidget
{
    Q_OBJECT
  public:
    explicit ViolationsPanel(session::SessionStore *store, QWidget *parent = nullptr);

    models::ViolationsModel *model() const { return m_model; }
    QTableView *tableView() const { return m_table; }
    // The fix line of the selected row (empty when none or no fix exists).
    QString currentFix() const;
    // The selected row's cells, whole (names not elided), tab-separated: what Ctrl+C copies.
    QString currentRowText() const;
    void selectRow(int sourceRow);
    // Selects the row of a violation the timeline showed (its rank, parameter and accessor:
    // the row whose ranks include rank first); false when no row matches.
    bool selectViolation(int rank, quint32 paramId, quint32 accessorId);

  Q_SIGNALS:
    void paramSelected(quint32 paramId);
    void moduleSelected(quint32 moduleId);
    void fixCopied(const QString &fix);

  private:
    void onCurrentChanged();

    models::ViolationsModel *m_model;
    QSortFilterProxyModel *m_proxy;
    QTableView *m_table;
    QLabel *m_message;
    QLabel *m_fix;
    QPushButton *m_copy;
};

} // namespace shardscope::views

#pragma once
// The module / parameter tree with its filter box: a QTreeView (uniform row heights,
// sortable) over a ModuleTreeModel, keeping expansion and selection across the
// model's resets, and selecting parameters on request (from the violations or timeline).

#include <QList>
#include <QSet>
#include <QString>
#include <QWidget>

#include "state/shape.h"

class QLineEdit;
class QTimer;
class QTreeView;

namespace shardscope::session {
class SessionStore;
} // namespace shardscope::session
namespace shardscope::models {
class ModuleTreeModel;
} // namespace shardscope::models

namespace shardscope::views {

class ModuleTreeView : public QWidget
{
    Q_OBJECT
  public:
    explicit ModuleTreeView(session::SessionStore *store, QWidget *parent = nullptr);

    models::ModuleTreeModel *model() const { return m_model; }
    QTreeView *treeView() const { return m_tree; }
    QLineEdit *filterEdit() const { return m_filter; }

    // Applies the filter now (typing applies it after a short pause).
    void setFilterText(const QString &text);
    // Selects the parameters' rows (the first becomes current), expanding their modules.
    void selectParams(const QList<quint32> &ids);
    void selectModule(ModuleId id);
    QList<quint32> selectedParams() const;

  Q_SIGNALS:
    void paramSelected(quint32 paramId);
    void moduleSelected(quint32 moduleId);
    void selectionChangedParams(const QList<quint32> &paramIds);

  private:
    void onCurrentChanged();
    void saveViewState();
    void restoreViewState();

    session::SessionStore *m_store;
    models::ModuleTreeModel *m_model;
    QTreeView *m_tree;
    QLineEdit *m_filter;
    QTimer *m_filterTimer;
    QSet<QString> m_expanded;
    QString m_current;
    bool m_firstFill = true;
};

} // namespace shardscope::views

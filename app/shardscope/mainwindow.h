#pragma once
// The inspector's main window: composes the tree, detail, violations, timeline,
// partition map and memory plot around one SessionStore, and offers attach, open and
// the exports. It owns no data of its own; the store is the single source.

#include <QMainWindow>
#include <QString>

#include <vector>

#include "session/connection.h"
#include "session/sessionstore.h"

class QLabel;

namespace shardscope::views {
class AttachDialog;
class GatherTimeline;
class InspectorStatusBar;
class MemoryPlot;
class ModuleTreeView;
class ParamDetail;
class PartitionMap;
class ViolationsPanel;
} // namespace shardscope::views

namespace shardscope::app {

class MainWindow : public QMainWindow
{
    Q_OBJECT
  public:
    explicit MainWindow(QWidget *parent = nullptr);
    ~MainWindow() override;

    SessionStore *store() { return &m_store; }
    Connection *connection() { return m_connection; }
    views::ModuleTreeView *tree() const { return m_tree; }
    views::ViolationsPanel *violations() const { return m_violations; }
    views::ParamDetail *detail() const { return m_detail; }

    void attach(const QString &endpoint, const QString &token);
    // Each returns an empty string on success, else what went wrong.
    QString openSnapshot(const QString &path);
    QString exportSnapshot(const QString &path);
    QString exportTrace(const QString &path);
    QString exportCsv(const QString &path);
    QString saveScreenshot(const QString &path);

  private:
    void buildMenus();
    void onStoreUpdated(const StoreChanges &changes);
    void onConnectionState(Connection::State state, const QString &message);
    void feedPlots(bool reset);
    void showParam(quint32 id);
    void showModule(quint32 id);
    void updateTitle();
    void runExport(const QString &title, const QString &filter,
                   QString (MainWindow::*fn)(const QString &));

    SessionStore m_store;
    Connection *m_connection;
    views::ModuleTreeView *m_tree;
    views::ParamDetail *m_detail;
    views::ViolationsPanel *m_violations;
    views::GatherTimeline *m_timeline;
    views::PartitionMap *m_partition;
    views::MemoryPlot *m_memory;
    views::InspectorStatusBar *m_status;
    QLabel *m_banner;
    std::vector<std::uint64_t> m_fed; // events per lane already given to the plots (absolute)
    bool m_originSet = false;
    bool m_partitionStale = false;
};

} // namespace shardscope::app

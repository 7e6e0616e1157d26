#pragma once
// The inspector's main window: composes the tree, detail, violations, timeline,
// partition map and memory plot around one SessionStore, and offers attach, open and
// the exports. It owns no data of its own; the store is the single source.

#include <QMainWindow>
#include <QString>
#include <QStringList>

#include <memory>

#include <vector>

#include "session/connection.h"
#include "session/jobsession.h"
#include "session/sessionstore.h"

class QAction;
class QLabel;
class QMenu;
class QSettings;

namespace shardscope::views {
class AttachDialog;
class CollectivesPanel;
class GatherTimeline;
class InspectorStatusBar;
class MemoryPlot;
class RangeSummaryPanel;
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

    session::SessionStore *store() { return &m_store; }
    session::Connection *connection() { return m_connection; } // the single-endpoint connection
    session::JobSession *jobSession() { return m_job; }        // the processes of a job
    bool attachedToJob() const { return m_attachedToJob; }
    views::ModuleTreeView *tree() const { return m_tree; }
    views::ViolationsPanel *violations() const { return m_violations; }
    views::ParamDetail *detail() const { return m_detail; }
    views::CollectivesPanel *collectives() const { return m_collectives; }
    // The banner of a job whose ranks diverged or stalled in their collectives (issue 51):
    // hidden while they are in order.
    QLabel *collectiveBanner() const { return m_collectiveBanner; }

    // spec: an endpoint; "job:NAME" (every live process of the job); or endpoints separated
    // by commas (the processes of one job). Returns what is wrong, or "".
    QString attach(const QString &spec, const QString &token, const QString &discoveryDir = {});
    // Each returns an empty string on success, else what went wrong.
    QString openSnapshot(const QString &path);
    // One file as openSnapshot; several: one job's rank snapshots, merged as a live job's
    // (wire::mergeSnapshotFiles).
    QString openSnapshots(const QStringList &paths);
    QString exportSnapshot(const QString &path);
    QString exportTrace(const QString &path);
    QString exportCsv(const QString &path);
    QString saveScreenshot(const QString &path);

    // Desktop habits. Settings live in the user's QSettings, or in this INI file when set
    // (tests); set it before constructing windows.
    static void setSettingsFile(const QString &path);
    // Restores the window's geometry and dock layout from the settings, and saves them when
    // the window closes (the app does this unless automated: screenshots keep the default
    // size). The recent lists are kept either way.
    void restoreLayout();
    void saveLayout() const;
    QStringList recentSnapshots() const;
    QStringList recentEndpoints() const;
    static constexpr int kMaxRecent = 8;
    // Opens the attach dialog, non-modally, when live runs are found (in the default runtime
    // directory, or discoveryDir); returns it, or nullptr when there are none.
    views::AttachDialog *offerLiveRuns(const QString &discoveryDir = {});

  protected:
    void showEvent(QShowEvent *e) override;
    void closeEvent(QCloseEvent *e) override;
    void dragEnterEvent(QDragEnterEvent *e) override;
    void dropEvent(QDropEvent *e) override;

  private:
    std::unique_ptr<QSettings> settings() const;
    void remember(const char *key, const QString &value);
    void fillRecentMenus();
    void buildMenus();
    void onStoreUpdated(const session::StoreChanges &changes);
    void onConnectionState(session::Connection::State state, const QString &message);
    void onJobChanged();
    void setLiveViews(bool live);
    void feedPlots(bool reset);
    void showCollectives(); // the Collectives dock and the banner, from the store's aligner
    void showParam(quint32 id);
    void showModule(quint32 id);
    void updateTitle();
    void runExport(const QString &title, const QString &filter,
                   QString (MainWindow::*fn)(const QString &));

    session::SessionStore m_store;
    session::Connection *m_connection;
    session::JobSession *m_job;
    bool m_attachedToJob = false;
    QAction *m_followAction = nullptr; // View > Follow live
    views::ModuleTreeView *m_tree;
    views::ParamDetail *m_detail;
    views::ViolationsPanel *m_violations;
    views::GatherTimeline *m_timeline;
    views::PartitionMap *m_partition;
    views::MemoryPlot *m_memory;
    views::RangeSummaryPanel *m_selection;
    views::InspectorStatusBar *m_status;
    QLabel *m_banner;
    views::CollectivesPanel *m_collectives;
    QLabel *m_collectiveBanner;
    QString m_collectiveShown;        // the diagnosis the banner shows ("" none)
    std::vector<std::uint64_t> m_fed; // events per lane already given to the plots (absolute)
    bool m_originSet = false;
    bool m_partitionStale = false;
    bool m_layoutRestored = false;
    bool m_stateRestored = false;
    bool m_docksSized = false;
    QMenu *m_recentSnapshots = nullptr;
    QMenu *m_recentEndpoints = nullptr;
};

} // namespace shardscope::app

#include "mainwindow.h"

#include <QAction>
#include <QBuffer>
#include <QCloseEvent>
#include <QDockWidget>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QSettings>
#include <QSignalBlocker>
#include <QSplitter>
#include <QTimer>
#include <QVBoxLayout>

#include <algorithm>

#include "models/violationsmodel.h"
#include "session/snapshotio.h"
#include "session/traceexport.h"
#include "telemetry/clock.h"
#include "views/attachdialog.h"
#include "views/collectivespanel.h"
#include "views/gathertimeline.h"
#include "views/memoryplot.h"
#include "views/moduletreeview.h"
#include "views/paramdetail.h"
#include "views/partitionmap.h"
#include "views/rangesummarypanel.h"
#include "views/statusbar.h"
#include "views/violationspanel.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"

namespace shardscope::app {

namespace {

QString &settingsFile()
{
    static QString path;
    return path;
}

} // namespace

void MainWindow::setSettingsFile(const QString &path)
{
    settingsFile() = path;
}

std::unique_ptr<QSettings> MainWindow::settings() const
{
    if (!settingsFile().isEmpty())
        return std::make_unique<QSettings>(settingsFile(), QSettings::IniFormat);
    return std::make_unique<QSettings>();
}

MainWindow::MainWindow(QWidget *parent)
    : QMainWindow(parent), m_connection(new session::Connection(&m_store, this)),
      m_job(new session::JobSession(&m_store, this)), m_tree(new views::ModuleTreeView(&m_store)),
      m_detail(new views::ParamDetail(&m_store)),
      m_violations(new views::ViolationsPanel(&m_store)), m_timeline(new views::GatherTimeline),
      m_partition(new views::PartitionMap), m_memory(new views::MemoryPlot),
      m_selection(new views::RangeSummaryPanel),
      m_status(new views::InspectorStatusBar(&m_store, this)), m_banner(new QLabel),
      m_collectives(new views::CollectivesPanel(&m_store)), m_collectiveBanner(new QLabel)
{
    setWindowIcon(QIcon(QStringLiteral(":/shardscope/shardscope.svg")));
    setStatusBar(m_status);
    setAcceptDrops(true);
    setDockNestingEnabled(true);

    m_banner->setObjectName(QStringLiteral("banner"));
    m_banner->setWordWrap(true);
    m_banner->setVisible(false);
    m_banner->setStyleSheet(QStringLiteral("background: #fff0c0; color: #603000; padding: 4px"));
    // A job whose ranks diverged or stalled in their collectives: what will hang it, and each
    // rank's line, as soon as the aligner records it (the Collectives dock has the details).
    m_collectiveBanner->setObjectName(QStringLiteral("collectiveBanner"));
    m_collectiveBanner->setWordWrap(true);
    m_collectiveBanner->setVisible(false);
    m_collectiveBanner->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_collectiveBanner->setStyleSheet(
        QStringLiteral("background: #ffe0e0; color: #800000; padding: 4px"));

    auto *lower = new QSplitter(Qt::Horizontal);
    lower->addWidget(m_partition);
    lower->addWidget(m_memory);
    lower->setStretchFactor(0, 2);
    lower->setStretchFactor(1, 3);
    lower->setSizes({400, 600}); // the memory plot's strips and legend need the width more
    auto *plots = new QSplitter(Qt::Vertical);
    plots->addWidget(m_timeline);
    plots->addWidget(lower);
    plots->setStretchFactor(0, 3);
    plots->setStretchFactor(1, 2);
    auto *central = new QWidget;
    auto *layout = new QVBoxLayout(central);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_banner);
    layout->addWidget(m_collectiveBanner);
    layout->addWidget(plots, 1);
    setCentralWidget(central);

    auto dock = [this](const QString &title, QWidget *w, Qt::DockWidgetArea area,
                       const char *name) {
        auto *d = new QDockWidget(title, this);
        d->setObjectName(QLatin1String(name));
        d->setWidget(w);
        addDockWidget(area, d);
        return d;
    };
    dock(tr("Modules and parameters"), m_tree, Qt::LeftDockWidgetArea, "treeDock");
    QDockWidget *detailDock =
        dock(tr("Parameter"), m_detail, Qt::RightDockWidgetArea, "detailDock");
    // Beside the gather timeline: where each rank is in its collectives, and the stragglers.
    QDockWidget *collectivesDock =
        dock(tr("Collectives"), m_collectives, Qt::RightDockWidgetArea, "collectivesDock");
    tabifyDockWidget(detailDock, collectivesDock);
    detailDock->raise();
    QDockWidget *violationsDock =
        dock(tr("Violations"), m_violations, Qt::BottomDockWidgetArea, "violationsDock");
    QDockWidget *selectionDock =
        dock(tr("Selection"), m_selection, Qt::BottomDockWidgetArea, "selectionDock");
    tabifyDockWidget(violationsDock, selectionDock);
    violationsDock->raise();
    // A Shift+drag over the timeline is a question: the Selection tab answers it.
    connect(m_timeline, &views::GatherTimeline::rangeSelected, this,
            [this, selectionDock](double t0, double t1) {
                m_selection->setWorldSize(m_timeline->laneCount());
                m_selection->setRange(m_timeline->rangeSummary(t0, t1, m_selection->rank()), t0,
                                      t1);
                selectionDock->show();
                selectionDock->raise();
            });
    connect(m_selection, &views::RangeSummaryPanel::rankChanged, this, [this](int rank) {
        const double t0 = m_selection->model()->rangeStart(), t1 = m_selection->model()->rangeEnd();
        if (t1 > t0) m_selection->setRange(m_timeline->rangeSummary(t0, t1, rank), t0, t1);
    });
    connect(m_selection, &views::RangeSummaryPanel::paramSelected, this,
            [this](quint32 id) { m_tree->selectParams({id}); });
    connect(m_selection, &views::RangeSummaryPanel::moduleSelected, this,
            [this](quint32 id) { m_tree->selectModule(ModuleId(id)); });
    resize(1500, 950);

    buildMenus();
    connect(&m_store, &session::SessionStore::updated, this, &MainWindow::onStoreUpdated);
    // How long the ranks in flight have waited moves on while a hung job sends nothing.
    auto *waiting = new QTimer(this);
    connect(waiting, &QTimer::timeout, this, [this] {
        if (!m_store.readOnly() && m_store.hasState()) showCollectives();
    });
    waiting->start(1000);
    connect(m_connection, &session::Connection::stateChanged, this, &MainWindow::onConnectionState);
    connect(m_job, &session::JobSession::changed, this, &MainWindow::onJobChanged);
    connect(m_tree, &views::ModuleTreeView::paramSelected, this, &MainWindow::showParam);
    connect(m_tree, &views::ModuleTreeView::moduleSelected, this, &MainWindow::showModule);
    connect(m_tree, &views::ModuleTreeView::selectionChangedParams, this,
            [this](const QList<quint32> &ids) { m_timeline->setSelection(ids); });
    connect(m_violations, &views::ViolationsPanel::paramSelected, this,
            [this](quint32 id) { m_tree->selectParams({id}); });
    connect(m_violations, &views::ViolationsPanel::moduleSelected, this,
            [this](quint32 id) { m_tree->selectModule(id); });
    connect(m_timeline, &views::GatherTimeline::paramsClicked, this,
            [this](const QList<quint32> &ids) { m_tree->selectParams(ids); });
    auto *partitionTimer = new QTimer(this);
    partitionTimer->setInterval(200);
    connect(partitionTimer, &QTimer::timeout, this, [this] {
        if (!m_partitionStale) return;
        m_partitionStale = false;
        const ParamId p = m_partition->selectedParameter();
        const ModuleId m = m_partition->selectedModule();
        m_partition->setState(m_store.state());
        if (p != kNoParam)
            m_partition->setParameter(p);
        else if (m != kNoModule)
            m_partition->setModule(m);
    });
    partitionTimer->start();
    updateTitle();
}

MainWindow::~MainWindow() = default;

void MainWindow::buildMenus()
{
    QMenu *file = menuBar()->addMenu(tr("&File"));
    QAction *attachAction = file->addAction(tr("&Attach to a run..."), this, [this] {
        views::AttachDialog dialog({}, this);
        if (dialog.exec() == QDialog::Accepted) attach(dialog.endpoint(), dialog.token());
    });
    attachAction->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_T));
    m_recentEndpoints = file->addMenu(tr("Attach to a &recent endpoint"));
    file->addAction(tr("&Detach"), this, [this] {
        m_connection->detach();
        m_job->detach();
    });
    QAction *openAction = file->addAction(tr("&Open snapshot..."), this, [this] {
        // Several files selected: one job's rank snapshots (run.rank0.json, run.rank1.json)
        const QStringList paths = QFileDialog::getOpenFileNames(
            this, tr("Open snapshot"), {}, tr("Snapshots (*.json *.json.gz *.gz);;All files (*)"));
        if (paths.isEmpty()) return;
        const QString err = openSnapshots(paths);
        if (!err.isEmpty()) QMessageBox::warning(this, tr("Open snapshot"), err);
    });
    openAction->setShortcut(QKeySequence::Open);
    m_recentSnapshots = file->addMenu(tr("Open re&cent snapshot"));
    connect(file, &QMenu::aboutToShow, this, &MainWindow::fillRecentMenus);
    fillRecentMenus();
    file->addSeparator();
    QMenu *exp = file->addMenu(tr("&Export"));
    exp->addAction(tr("Diagnostic &snapshot..."), this, [this] {
        runExport(tr("Export snapshot"), tr("Snapshots, gzip'd (*.json.gz);;Snapshots (*.json)"),
                  &MainWindow::exportSnapshot);
    });
    exp->addAction(tr("Chrome/Perfetto &trace..."), this, [this] {
        runExport(tr("Export trace"), tr("Trace, gzip'd (*.json.gz);;Trace (*.json)"),
                  &MainWindow::exportTrace);
    });
    exp->addAction(tr("Violations as &CSV..."), this, [this] {
        runExport(tr("Export violations"), tr("CSV (*.csv)"), &MainWindow::exportCsv);
    });
    exp->addAction(tr("Window as &PNG..."), this, [this] {
        runExport(tr("Save screenshot"), tr("PNG (*.png)"), &MainWindow::saveScreenshot);
    });
    file->addSeparator();
    QAction *quitAction = file->addAction(tr("&Quit"), this, &QWidget::close);
    quitAction->setShortcut(QKeySequence::Quit);
    QMenu *view = menuBar()->addMenu(tr("&View"));
    for (QDockWidget *d : findChildren<QDockWidget *>())
        view->addAction(d->toggleViewAction());
    m_followAction = view->addAction(tr("&Follow live"));
    m_followAction->setCheckable(true);
    m_followAction->setChecked(true);
    connect(m_followAction, &QAction::toggled, this, [this](bool on) {
        m_timeline->setFollowLive(on);
        m_memory->setFollowLive(on);
    });
    view->addSeparator();
    QAction *next = view->addAction(tr("&Next violation"), this, [this] {
        m_store.flush();
        m_timeline->goToViolation(true);
    });
    next->setShortcut(QKeySequence::FindNext);
    QAction *previous = view->addAction(tr("&Previous violation"), this, [this] {
        m_store.flush();
        m_timeline->goToViolation(false);
    });
    previous->setShortcut(QKeySequence::FindPrevious);
    QAction *step = view->addAction(tr("&Go to step..."), this, [this] {
        if (auto *box = m_timeline->findChild<QWidget *>(QStringLiteral("stepBox")))
            box->setFocus();
    });
    step->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_G));
    QMenu *help = menuBar()->addMenu(tr("&Help"));
    help->addAction(tr("&Keyboard shortcuts"), this, [this] {
        QMessageBox::information(
            this, tr("Keyboard shortcuts"),
            tr("In the gather timeline and the memory plot (click it first):\n%1\n\n"
               "Anywhere: F3 / Shift+F3 next / previous violation, Ctrl+G go to a step")
                .arg(views::GatherTimeline::keyboardHelp()));
    });
    // A violation the timeline went to is the current row of the table, and so the detail's.
    connect(m_timeline, &views::GatherTimeline::violationShown, this,
            [this](int rank, quint32 param, quint32 accessor, double) {
                m_violations->selectViolation(rank, param, accessor);
            });
    // The timeline's own button, a drag or a zoom there: the menu says what the views do.
    connect(m_timeline, &views::TimePlot::followLiveChanged, m_followAction, [this](bool on) {
        const QSignalBlocker block(m_followAction);
        m_followAction->setChecked(on);
    });
}

// A snapshot, or a run that has ended, opens with its whole time range in view; following
// is for runs that still grow.
void MainWindow::setLiveViews(bool live)
{
    m_timeline->setLive(live);
    m_memory->setLive(live);
    m_followAction->setEnabled(live);
    const QSignalBlocker block(m_followAction);
    m_followAction->setChecked(m_timeline->followLive());
}

void MainWindow::runExport(const QString &title, const QString &filter,
                           QString (MainWindow::*fn)(const QString &))
{
    const QString path = QFileDialog::getSaveFileName(this, title, {}, filter);
    if (path.isEmpty()) return;
    const QString err = (this->*fn)(path);
    if (!err.isEmpty())
        QMessageBox::warning(this, title, err);
    else
        statusBar()->showMessage(tr("wrote %1").arg(path), 5000);
}

QString MainWindow::attach(const QString &spec, const QString &token, const QString &discoveryDir)
{
    std::vector<session::JobTarget> targets;
    QString jobName;
    const QString err = session::JobSession::resolve(spec, targets, jobName, discoveryDir);
    if (!err.isEmpty()) {
        m_status->setConnection(err, false);
        m_banner->setText(err);
        m_banner->setVisible(true);
        return err;
    }
    m_connection->detach();
    m_job->detach();
    setLiveViews(true);
    if (targets.size() == 1 && jobName.isEmpty()) {
        m_attachedToJob = false;
        m_connection->attach(targets.front().endpoint, token);
    } else {
        m_attachedToJob = true;
        m_job->attach(targets, token, jobName);
    }
    remember("recent/endpoints", spec.trimmed());
    updateTitle();
    return {};
}

void MainWindow::onJobChanged()
{
    if (!m_attachedToJob) return;
    const bool problem = m_job->anyProblem();
    m_status->setConnection(m_job->summary(), !problem);
    m_status->setToolTip(m_job->details());
    if (m_job->processCount() > 0 && m_job->allDone()) setLiveViews(false);
    m_banner->setText(m_job->summary() +
                      tr(" (the other ranks go on; everything received is kept)"));
    m_banner->setVisible(problem);
    updateTitle();
}

void MainWindow::remember(const char *key, const QString &value)
{
    if (value.isEmpty()) return;
    auto s = settings();
    QStringList list = s->value(QLatin1String(key)).toStringList();
    list.removeAll(value);
    list.prepend(value);
    while (list.size() > kMaxRecent)
        list.removeLast();
    s->setValue(QLatin1String(key), list);
}

QStringList MainWindow::recentSnapshots() const
{
    return settings()->value(QStringLiteral("recent/snapshots")).toStringList();
}

QStringList MainWindow::recentEndpoints() const
{
    return settings()->value(QStringLiteral("recent/endpoints")).toStringList();
}

void MainWindow::fillRecentMenus()
{
    m_recentSnapshots->clear();
    for (const QString &path : recentSnapshots())
        m_recentSnapshots->addAction(path, this, [this, path] {
            const QString err = openSnapshot(path);
            if (!err.isEmpty()) QMessageBox::warning(this, tr("Open snapshot"), err);
        });
    m_recentSnapshots->setEnabled(!m_recentSnapshots->isEmpty());
    m_recentEndpoints->clear();
    for (const QString &endpoint : recentEndpoints())
        m_recentEndpoints->addAction(endpoint, this, [this, endpoint] { attach(endpoint, {}); });
    m_recentEndpoints->setEnabled(!m_recentEndpoints->isEmpty());
}

void MainWindow::restoreLayout()
{
    auto s = settings();
    const QByteArray geometry = s->value(QStringLiteral("window/geometry")).toByteArray();
    if (!geometry.isEmpty()) restoreGeometry(geometry);
    const QByteArray state = s->value(QStringLiteral("window/state")).toByteArray();
    if (!state.isEmpty()) m_stateRestored = restoreState(state);
    m_layoutRestored = true;
}

void MainWindow::saveLayout() const
{
    auto s = settings();
    s->setValue(QStringLiteral("window/geometry"), saveGeometry());
    s->setValue(QStringLiteral("window/state"), saveState());
}

// The docks' default sizes, applied once the window has its size (before, the layout
// ignores them), unless the user's own layout was restored.
void MainWindow::showEvent(QShowEvent *e)
{
    QMainWindow::showEvent(e);
    if (m_docksSized) return;
    m_docksSized = true;
    if (m_stateRestored) return;
    auto dock = [this](const char *name) { return findChild<QDockWidget *>(QLatin1String(name)); };
    resizeDocks({dock("treeDock"), dock("detailDock")}, {400, 380}, Qt::Horizontal);
    resizeDocks({dock("violationsDock")}, {190}, Qt::Vertical);
}

void MainWindow::closeEvent(QCloseEvent *e)
{
    if (m_layoutRestored) saveLayout();
    QMainWindow::closeEvent(e);
}

void MainWindow::dragEnterEvent(QDragEnterEvent *e)
{
    const QList<QUrl> urls = e->mimeData()->urls();
    if (!urls.isEmpty() && urls.first().isLocalFile()) e->acceptProposedAction();
}

// A snapshot dropped on the window opens as File → Open would.
void MainWindow::dropEvent(QDropEvent *e)
{
    const QList<QUrl> urls = e->mimeData()->urls();
    if (urls.isEmpty() || !urls.first().isLocalFile()) return;
    e->acceptProposedAction();
    QStringList paths; // several: one job's rank snapshots
    for (const QUrl &url : urls)
        if (url.isLocalFile()) paths << url.toLocalFile();
    // Not from inside the drop: a message box would run its loop under the drag.
    QTimer::singleShot(0, this, [this, paths] {
        const QString err = openSnapshots(paths);
        if (!err.isEmpty()) {
            m_banner->setText(tr("Cannot open the dropped file: %1").arg(err));
            m_banner->setVisible(true);
        }
    });
}

views::AttachDialog *MainWindow::offerLiveRuns(const QString &discoveryDir)
{
    const std::string dir =
        discoveryDir.isEmpty() ? wire::defaultRuntimeDir() : discoveryDir.toStdString();
    if (wire::listLiveEngines(dir).empty()) {
        m_banner->setText(tr("Not attached. File → Attach to a run (Ctrl+T) lists the live runs "
                             "on this machine; File → Open snapshot (Ctrl+O) or dropping a "
                             "snapshot here shows one read-only."));
        m_banner->setVisible(true);
        return nullptr;
    }
    auto *dialog = new views::AttachDialog(discoveryDir, this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    connect(dialog, &QDialog::accepted, this,
            [this, dialog] { attach(dialog->endpoint(), dialog->token()); });
    dialog->open();
    return dialog;
}

QString MainWindow::openSnapshot(const QString &path)
{
    m_connection->detach();
    m_job->detach();
    m_attachedToJob = false;
    const QString err = session::openSnapshotFile(path, m_store);
    if (err.isEmpty()) {
        remember("recent/snapshots", QFileInfo(path).absoluteFilePath());
        m_status->setConnection(tr("snapshot %1 (read-only)").arg(path), true);
        m_banner->setVisible(false);
        m_store.flush();
        setLiveViews(false);
    }
    updateTitle();
    return err;
}

QString MainWindow::openSnapshots(const QStringList &paths)
{
    if (paths.size() == 1) return openSnapshot(paths.front());
    m_connection->detach();
    m_job->detach();
    m_attachedToJob = false;
    const QString err = session::openJobSnapshotFiles(paths, m_store);
    if (err.isEmpty()) {
        m_status->setConnection(
            tr("%n rank snapshot(s) of one job (read-only)", "", int(paths.size())), true);
        m_banner->setVisible(false);
        m_store.flush();
        setLiveViews(false);
    }
    updateTitle();
    return err;
}

QString MainWindow::exportSnapshot(const QString &path)
{
    m_store.flush();
    return session::exportSnapshotFile(path, m_store);
}

QString MainWindow::exportTrace(const QString &path)
{
    if (!m_store.hasState())
        return tr("nothing to export: attach to an engine or open a snapshot first");
    return session::writeExportFile(path, session::chromeTrace(m_store));
}

QString MainWindow::exportCsv(const QString &path)
{
    m_store.flush();
    return session::writeFileAtomically(path, m_violations->model()->toCsv());
}

QString MainWindow::saveScreenshot(const QString &path)
{
    const QPixmap pixmap = grab();
    if (pixmap.isNull()) return tr("cannot grab the window");
    QByteArray png;
    {
        QBuffer buffer(&png);
        buffer.open(QIODevice::WriteOnly);
        if (!pixmap.save(&buffer, "PNG")) return tr("cannot encode the screenshot as PNG");
    }
    return session::writeFileAtomically(path, png);
}

void MainWindow::onConnectionState(session::Connection::State state, const QString &message)
{
    const bool ok = state == session::Connection::State::Connected ||
                    state == session::Connection::State::Finished ||
                    state == session::Connection::State::Idle;
    m_status->setConnection(message, ok);
    const bool warn =
        state == session::Connection::State::Lost || state == session::Connection::State::Failed;
    m_banner->setText(message);
    m_banner->setVisible(warn);
    if (state == session::Connection::State::Finished && !m_attachedToJob) {
        m_store.flush();
        setLiveViews(false);
    }
    updateTitle();
}

void MainWindow::onStoreUpdated(const session::StoreChanges &changes)
{
    if (changes.reset || changes.structure) {
        if (changes.reset) {
            m_timeline->clear();
            m_memory->clear();
            m_partition->clear();
            m_fed.clear();
            m_originSet = false;
        }
        m_timeline->setState(m_store.state());
        m_memory->setState(m_store.state());
        m_partitionStale = true;
        updateTitle();
    } else if (m_partition->selectedModule() != kNoModule) {
        m_partitionStale = m_partitionStale || !changes.params.empty();
    } else if (const ParamId p = m_partition->selectedParameter(); p != kNoParam) {
        m_partitionStale =
            m_partitionStale ||
            std::find(changes.params.begin(), changes.params.end(), p) != changes.params.end();
    }
    if (changes.events || changes.reset) feedPlots(changes.reset);
    if (changes.events || changes.violations || changes.reset) showCollectives();
    // The first violation is what the user came for: show it when nothing else is shown.
    if (changes.violations && m_detail->shownParam() == kNoParam) {
        const auto &groups = m_store.violationGroups();
        for (std::size_t i = 0; i < groups.size(); ++i) {
            if (groups[i].kind == ViolationKind::UnregisteredAccess &&
                m_store.param(groups[i].param)) {
                m_violations->selectRow(static_cast<int>(i));
                break;
            }
        }
    }
}

void MainWindow::showCollectives()
{
    m_collectives->refresh(m_store.readOnly() ? 0 : telemetry::nowNs());
    const QString text = views::CollectivesPanel::diagnosisText(m_store);
    if (text == m_collectiveShown) return;
    m_collectiveShown = text;
    m_collectiveBanner->setText(text);
    m_collectiveBanner->setVisible(!text.isEmpty());
    if (text.isEmpty()) return;
    if (auto *d = findChild<QDockWidget *>(QStringLiteral("collectivesDock"))) {
        d->show();
        d->raise();
    }
}

void MainWindow::feedPlots(bool)
{
    if (!m_originSet && m_store.totalEvents() > 0) {
        const std::uint64_t origin = m_store.timeOrigin();
        m_timeline->setTimeOrigin(origin);
        m_memory->setTimeOrigin(origin);
        m_originSet = true;
    }
    m_fed.resize(static_cast<std::size_t>(m_store.laneCount()), 0);
    std::vector<telemetry::Event> batch;
    for (int r = 0; r < m_store.laneCount(); ++r) {
        const session::EventLane &lane = m_store.lane(r);
        std::uint64_t &fed = m_fed[static_cast<std::size_t>(r)]; // absolute: evicted + index
        const std::uint64_t end = lane.evicted() + lane.size();
        if (fed >= end) continue;
        const std::size_t from =
            static_cast<std::size_t>(std::max(fed, lane.evicted()) - lane.evicted());
        batch.clear();
        batch.reserve(lane.size() - from);
        for (std::size_t i = from; i < lane.size(); ++i)
            batch.push_back(lane.at(i));
        fed = end;
        m_timeline->appendEvents(batch);
        m_memory->appendEvents(batch);
    }
}

void MainWindow::showParam(quint32 id)
{
    m_detail->showParam(id);
    m_partition->setParameter(id);
}

void MainWindow::showModule(quint32 id)
{
    m_partition->setModule(id);
}

void MainWindow::updateTitle()
{
    QString title = QStringLiteral("ShardScope");
    if (m_store.hasState())
        title += QStringLiteral(" — ") + QString::fromStdString(m_store.state().modelName);
    if (m_store.readOnly())
        title += tr(" — %1 (read-only)").arg(m_store.source());
    else if (m_attachedToJob)
        title += QStringLiteral(" — ") + (m_job->jobName().isEmpty()
                                              ? tr("%1 processes").arg(m_job->processCount())
                                              : QStringLiteral("job:") + m_job->jobName());
    else if (!m_connection->endpoint().isEmpty())
        title += QStringLiteral(" — ") + m_connection->endpoint();
    setWindowTitle(title);
}

} // namespace shardscope::app

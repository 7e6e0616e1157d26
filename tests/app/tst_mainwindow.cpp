// The main window's wiring, offscreen: a snapshot fills the tree and the title; a
// timeline click, a violation row and a tree selection reach the other views; a lost
// connection keeps the data and says so.

#include <QDockWidget>
#include <QFile>
#include <QLabel>
#include <QMenu>
#include <QMenuBar>
#include <QMimeData>
#include <QSettings>
#include <QTableView>
#include <QTemporaryDir>
#include <QTest>
#include <QTreeView>
#include <QUrl>

#include "divergedjob.h"
#include "fakeengine.h"
#include "mainwindow.h"
#include "models/collectivesmodel.h"
#include "models/moduletreemodel.h"
#include "models/violationsmodel.h"
#include "session/snapshotio.h"
#include "syntheticstate.h"
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

using namespace shardscope;
using namespace shardscope::test;

class TestMainWindow : public QObject
{
    Q_OBJECT
  private slots:
    void init();
    void snapshotFillsTheViews();
    void divergedJobShowsItsBanner();
    void snapshotOpensWithItsWholeTimeRangeInView();
    void nextViolationLandsOnItsTimeAndRow();
    void aSelectedRangeIsSummedAndSelectsInTheTree();
    void timelineClickSelectsInTree();
    void lostConnectionKeepsDataAndSaysSo();
    void timelineClickShowsTheSpanUnderTheMouse();
    void layoutAndRecentsSurviveARestart();
    void droppedSnapshotOpens();
    void liveRunsAreOfferedAtOnce();

  private:
    QTemporaryDir m_settingsDir;
};

// Every case has its own settings file: nothing reaches the user's, nothing leaks between cases.
void TestMainWindow::init()
{
    QVERIFY(m_settingsDir.isValid());
    app::MainWindow::setSettingsFile(
        m_settingsDir.filePath(QLatin1String(QTest::currentTestFunction()) + ".ini"));
}

static QString writeSnapshot(QTemporaryDir &dir)
{
    session::SessionStore store;
    store.applyState(smallState());
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(1000, 0, telemetry::makeFetchBegin({.param = 0, .cause = 7})),
            eventAt(5000, 0, telemetry::makeFetchEnd({.param = 0, .cause = 7, .bytes = 6464})),
            lmHeadViolation(6000, 0)},
        false);
    const QString path = dir.filePath(QStringLiteral("s.json"));
    session::exportSnapshotFile(path, store);
    return path;
}

void TestMainWindow::snapshotFillsTheViews()
{
    QTemporaryDir dir;
    app::MainWindow w;
    w.show();
    QCOMPARE(w.openSnapshot(writeSnapshot(dir)), QString());
    QVERIFY(w.windowTitle().contains(QStringLiteral("tiny-lm")));
    QVERIFY(w.windowTitle().contains(QStringLiteral("read-only")));
    QCOMPARE(w.tree()->model()->index(0, 0).data().toString(), QStringLiteral("tiny-lm"));
    // The first unregistered access is shown on its own: detail and partition map follow.
    QTRY_COMPARE(w.detail()->shownParam(), ParamId(0));
    QCOMPARE(w.detail()->fixLines(),
             QStringList{"register_external_parameter(lm_head, embed.weight)"});
    auto *map = w.findChild<views::PartitionMap *>();
    QVERIFY(map);
    QTRY_COMPARE(map->selectedParameter(), ParamId(0));
    QTRY_COMPARE(map->shardRects().size(), qsizetype(4));

    QCOMPARE(w.openSnapshot(dir.filePath(QStringLiteral("missing.json")))
                 .contains(QStringLiteral("does not exist")),
             true);
    QCOMPARE(w.tree()->model()->index(0, 0).data().toString(),
             QStringLiteral("tiny-lm")); // unchanged
}

// Issue 51: a recorded job whose rank 0 waits in a collective rank 1 never issued opens with
// the diagnosis above the plots (each rank's line, the fix) and the Collectives dock in front;
// a healthy snapshot afterwards takes the banner away.
void TestMainWindow::divergedJobShowsItsBanner()
{
    qputenv("SHARDSCOPE_STALL_SECONDS", "5");
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("job.json"));
    QVERIFY(wire::writeSnapshotFile(path.toStdString(), test::divergedJob()));
    app::MainWindow w;
    w.show();
    QCOMPARE(w.openSnapshot(path), QString());
    QTRY_VERIFY(w.collectiveBanner()->isVisible());
    const QString banner = w.collectiveBanner()->text();
    QVERIFY2(banner.contains(QStringLiteral("stalled")) &&
                 banner.contains(QStringLiteral("train.py:%1").arg(test::kDivergedLine)) &&
                 banner.contains(QStringLiteral("rank 1 had ended")) &&
                 banner.contains(QStringLiteral("Fix: ")),
             qPrintable(banner));
    auto *dock = w.findChild<QDockWidget *>(QStringLiteral("collectivesDock"));
    QVERIFY(dock);
    QTRY_VERIFY(dock->isVisible() && !dock->visibleRegion().isEmpty());
    QCOMPARE(w.collectives()->progressModel()->rowCount(), 2);

    QCOMPARE(w.openSnapshot(writeSnapshot(dir)), QString());
    QTRY_VERIFY(!w.collectiveBanner()->isVisible());
    qunsetenv("SHARDSCOPE_STALL_SECONDS");
}

// A snapshot is not a live run: its events (here 5 us of them) are in view at once, not
// after the user finds "Show all" in a 5 s window; Follow live is off and disabled there, and
// attaching to a run makes it live again.
void TestMainWindow::snapshotOpensWithItsWholeTimeRangeInView()
{
    QTemporaryDir dir;
    app::MainWindow w;
    w.show();
    auto *timeline = w.findChild<views::GatherTimeline *>();
    auto *memory = w.findChild<views::MemoryPlot *>();
    QVERIFY(timeline && memory);
    QVERIFY(timeline->followLive() && timeline->isLive());
    QCOMPARE(w.openSnapshot(writeSnapshot(dir)), QString());
    QVERIFY(!timeline->isLive() && !timeline->followLive());
    QVERIFY(!memory->isLive() && !memory->followLive());
    // every event inside the visible range, and the range fitted to them (2 % either side,
    // at least a microsecond), not the 5 s live window
    QTRY_VERIFY(timeline->visibleEnd() - timeline->visibleStart() < 1e-4);
    const double span = timeline->visibleEnd() - timeline->visibleStart();
    QVERIFY2(span >= 5e-6, qPrintable(QString::number(span)));
    QAction *follow = nullptr;
    for (QAction *a : w.menuBar()->actions())
        if (a->menu())
            for (QAction *b : a->menu()->actions())
                if (b->text() == QStringLiteral("&Follow live")) follow = b;
    QVERIFY(follow);
    QVERIFY(!follow->isEnabled() && !follow->isChecked());
    // a zoom by the user stays: no fit is pending any more
    timeline->setVisibleRange(0, 10);
    QCOMPARE(timeline->visibleEnd(), 10.0);

    w.attach(QStringLiteral("tcp:127.0.0.1:1"), {}); // a run that still grows: live again
    QVERIFY(timeline->isLive() && timeline->followLive() && memory->followLive());
    QVERIFY(follow->isEnabled() && follow->isChecked());
}

static QAction *menuAction(QMainWindow &w, const QString &text)
{
    for (QAction *a : w.menuBar()->actions())
        if (a->menu())
            for (QAction *b : a->menu()->actions())
                if (b->text() == text) return b;
    return nullptr;
}

void TestMainWindow::nextViolationLandsOnItsTimeAndRow()
{
    QTemporaryDir dir;
    app::MainWindow w;
    w.show();
    QCOMPARE(w.openSnapshot(writeSnapshot(dir)), QString());
    auto *timeline = w.findChild<views::GatherTimeline *>();
    QVERIFY(timeline);
    QTRY_VERIFY(timeline->visibleEnd() - timeline->visibleStart() < 1e-4);
    timeline->setVisibleRange(-1e-6, 1e-6); // before the violation, 2 us wide
    w.violations()->tableView()->clearSelection();
    w.violations()->tableView()->setCurrentIndex({});
    QAction *next = menuAction(w, QStringLiteral("&Next violation"));
    QVERIFY(next);
    QCOMPARE(next->shortcut(), QKeySequence(QKeySequence::FindNext));
    next->trigger();
    // the violation at 6 us (5 us after the first event, the time origin at 1 us)
    const double centre = (timeline->visibleStart() + timeline->visibleEnd()) / 2;
    QVERIFY2(qAbs(centre - 5e-6) < 1e-9, qPrintable(QString::number(centre)));
    const QModelIndex current = w.violations()->tableView()->currentIndex();
    QVERIFY(current.isValid());
    QCOMPARE(current.data(models::ViolationsModel::ParamIdRole).toUInt(), 0u);
    QTRY_COMPARE(w.detail()->shownParam(), ParamId(0));
    QVERIFY(menuAction(w, QStringLiteral("&Keyboard shortcuts")));
}

void TestMainWindow::aSelectedRangeIsSummedAndSelectsInTheTree()
{
    QTemporaryDir dir;
    app::MainWindow w;
    w.show();
    QCOMPARE(w.openSnapshot(writeSnapshot(dir)), QString());
    auto *timeline = w.findChild<views::GatherTimeline *>();
    auto *panel = w.findChild<views::RangeSummaryPanel *>();
    auto *dock = w.findChild<QDockWidget *>(QStringLiteral("selectionDock"));
    QVERIFY(timeline && panel && dock);
    Q_EMIT timeline->rangeSelected(-1.0, 1.0); // the whole snapshot: one gather of embed.weight
    QVERIFY(dock->isVisible());
    const auto &rows = panel->model()->rows();
    auto param = std::find_if(rows.begin(), rows.end(), [](const auto &r) { return !r.module; });
    QVERIFY(param != rows.end());
    QCOMPARE(param->id, 0u);
    QCOMPARE(param->gathers, std::uint64_t(1));
    QCOMPARE(param->bytes, std::uint64_t(6464));
    QVERIFY(qAbs(param->seconds - 4e-6) < 1e-12);
    QVERIFY(panel->headline().contains(QStringLiteral("1 gathers")));
    const std::size_t allRanks = rows.size();
    // a click on the parameter's row selects it in the tree
    QTableView *table = panel->tableView();
    for (int r = 0; r < table->model()->rowCount(); ++r) {
        const QModelIndex i = table->model()->index(r, models::RangeSummaryModel::Name);
        if (!i.data(models::RangeSummaryModel::IsModuleRole).toBool()) {
            Q_EMIT table->clicked(i);
            break;
        }
    }
    QCOMPARE(w.tree()->selectedParams(), QList<quint32>{0});
    // one rank: the gather was rank 0's; rank 2 gathered nothing then
    panel->setRank(2);
    QCOMPARE(panel->rank(), 2);
    QVERIFY(panel->model()->rows().empty());
    panel->setRank(0);
    QCOMPARE(panel->model()->rows().size(), allRanks);
    panel->setRank(-1);
    QCOMPARE(panel->rank(), -1);
}

void TestMainWindow::timelineClickSelectsInTree()
{
    QTemporaryDir dir;
    app::MainWindow w;
    w.show();
    QCOMPARE(w.openSnapshot(writeSnapshot(dir)), QString());
    auto *timeline = w.findChild<views::GatherTimeline *>();
    QVERIFY(timeline);
    Q_EMIT timeline->paramsClicked({3, 4});
    QCOMPARE(w.tree()->selectedParams(), (QList<quint32>{3, 4}));
    QTRY_COMPARE(w.detail()->shownParam(), ParamId(3));
    QCOMPARE(timeline->selection(), (QList<quint32>{3, 4}));
}

void TestMainWindow::lostConnectionKeepsDataAndSaysSo()
{
    FakeEngine engine;
    engine.state = smallState();
    engine.history = {lmHeadViolation(100, 0)};
    app::MainWindow w;
    w.show();
    w.connection()->setReconnectIntervalMs(100);
    w.attach(engine.endpoint(), {});
    QTRY_VERIFY(engine.clientReady());
    QTRY_VERIFY(w.store()->hasState());
    engine.sendLive({lmHeadViolation(200, 1)});
    QTRY_COMPARE(w.violations()->model()->rowCount(), 1);
    engine.stopListening();
    engine.dropClient();
    QTRY_COMPARE(w.connection()->state(), session::Connection::State::Lost);
    auto *banner = w.findChild<QLabel *>(QStringLiteral("banner"));
    QVERIFY(banner && banner->isVisible());
    QVERIFY(banner->text().contains(QStringLiteral("everything collected so far is kept")));
    QVERIFY(w.findChild<views::InspectorStatusBar *>()->connectionText().contains(
        QStringLiteral("reconnecting")));
    QCOMPARE(w.violations()->model()->rowCount(), 1);
    QCOMPARE(w.tree()->model()->index(0, 0).data().toString(), QStringLiteral("tiny-lm"));
}

// A click on a merged block lists the span under the mouse first: that parameter becomes
// current in the tree and fills the detail panel, replacing the violation's parameter
// shown at first (before, the lowest id of the block won, often the one already shown).
void TestMainWindow::timelineClickShowsTheSpanUnderTheMouse()
{
    QTemporaryDir dir;
    app::MainWindow w;
    w.show();
    QCOMPARE(w.openSnapshot(writeSnapshot(dir)), QString());
    QTRY_COMPARE(w.detail()->shownParam(), ParamId(0));
    auto *timeline = w.findChild<views::GatherTimeline *>();
    QVERIFY(timeline);
    Q_EMIT timeline->paramsClicked({5, 0, 3});
    QTRY_COMPARE(w.detail()->shownParam(), ParamId(5));
    QCOMPARE(w.tree()->selectedParams().size(), 3);
}

void TestMainWindow::layoutAndRecentsSurviveARestart()
{
    QVERIFY(m_settingsDir.isValid());
    QTemporaryDir dir;
    const QString snapshot = writeSnapshot(dir);
    {
        app::MainWindow w;
        w.restoreLayout();
        w.show();
        QVERIFY(QTest::qWaitForWindowExposed(&w));
        w.resize(1234, 777);
        auto *violations = w.findChild<QDockWidget *>(QStringLiteral("violationsDock"));
        QVERIFY(violations);
        violations->hide();
        QCOMPARE(w.openSnapshot(snapshot), QString());
        w.attach(QStringLiteral("tcp:127.0.0.1:1"), {});
        w.close();
    }
    {
        app::MainWindow w;
        w.restoreLayout();
        w.show();
        QVERIFY(QTest::qWaitForWindowExposed(&w));
        QCOMPARE(w.size(), QSize(1234, 777));
        QVERIFY(!w.findChild<QDockWidget *>(QStringLiteral("violationsDock"))->isVisible());
        QVERIFY(w.findChild<QDockWidget *>(QStringLiteral("treeDock"))->isVisible());
        QCOMPARE(w.recentSnapshots(), QStringList{snapshot});
        QCOMPARE(w.recentEndpoints(), QStringList{QStringLiteral("tcp:127.0.0.1:1")});
        // The File menu offers them.
        QMenu *file = w.menuBar()->findChildren<QMenu *>().value(0);
        QVERIFY(file);
        Q_EMIT file->aboutToShow();
        QStringList texts;
        for (QMenu *m : file->findChildren<QMenu *>())
            for (QAction *a : m->actions())
                texts << a->text();
        QVERIFY2(texts.contains(snapshot), qPrintable(texts.join(", ")));
        QVERIFY2(texts.contains(QStringLiteral("tcp:127.0.0.1:1")), qPrintable(texts.join(", ")));
        w.close();
    }
    // At most kMaxRecent, newest first, no duplicates.
    {
        app::MainWindow w;
        for (int i = 0; i < app::MainWindow::kMaxRecent + 3; ++i)
            w.attach(QStringLiteral("tcp:127.0.0.1:%1").arg(i + 2), {});
        w.attach(QStringLiteral("tcp:127.0.0.1:5"), {});
        const QStringList recent = w.recentEndpoints();
        QCOMPARE(recent.size(), app::MainWindow::kMaxRecent);
        QCOMPARE(recent.first(), QStringLiteral("tcp:127.0.0.1:5"));
        QCOMPARE(recent.count(QStringLiteral("tcp:127.0.0.1:5")), 1);
    }
}

void TestMainWindow::droppedSnapshotOpens()
{
    QTemporaryDir dir;
    const QString snapshot = writeSnapshot(dir);
    app::MainWindow w;
    w.show();
    QVERIFY(w.acceptDrops());
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(snapshot)});
    QDragEnterEvent enter(QPoint(100, 100), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(&w, &enter);
    QVERIFY(enter.isAccepted());
    QDropEvent drop(QPointF(100, 100), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(&w, &drop);
    QTRY_VERIFY(w.windowTitle().contains(QStringLiteral("tiny-lm")));
    QVERIFY(w.windowTitle().contains(QStringLiteral("read-only")));
}

// Started with no arguments while a run is live: the attach dialog opens at once with the
// run picked; accepting it attaches. With no run, the window says how to get one.
void TestMainWindow::liveRunsAreOfferedAtOnce()
{
    QTemporaryDir dir;
    {
        app::MainWindow w;
        w.show();
        QVERIFY(!w.offerLiveRuns(dir.path()));
        auto *banner = w.findChild<QLabel *>(QStringLiteral("banner"));
        QVERIFY(banner && banner->isVisible());
        QVERIFY(banner->text().contains(QStringLiteral("Attach to a run")));
    }
    FakeEngine engine;
    engine.state = smallState();
    wire::DiscoveryEntry e;
    e.pid = QCoreApplication::applicationPid();
    e.endpoint = engine.endpoint().toStdString();
    e.model = "tiny-lm";
    e.worldSize = 4;
    e.backend = "cpu";
    {
        QFile f(QString::fromStdString(wire::discoveryFilePath(dir.path().toStdString(), e.pid)));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QByteArray::fromStdString(wire::encodeDiscovery(e)));
    }
    app::MainWindow w;
    w.show();
    views::AttachDialog *dialog = w.offerLiveRuns(dir.path());
    QVERIFY(dialog);
    QTRY_VERIFY(dialog->isVisible());
    QCOMPARE(dialog->endpoint(), engine.endpoint());
    dialog->accept();
    QTRY_VERIFY(w.store()->hasState());
    QCOMPARE(w.connection()->endpoint(), engine.endpoint());
}

QTEST_MAIN(TestMainWindow)
#include "tst_mainwindow.moc"

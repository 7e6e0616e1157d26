// The main window's wiring, offscreen: a snapshot fills the tree and the title; a
// timeline click, a violation row and a tree selection reach the other views; a lost
// connection keeps the data and says so.

#include <QLabel>
#include <QTemporaryDir>
#include <QTest>
#include <QTreeView>

#include "fakeengine.h"
#include "mainwindow.h"
#include "models/moduletreemodel.h"
#include "models/violationsmodel.h"
#include "session/snapshotio.h"
#include "syntheticstate.h"
#include "views/gathertimeline.h"
#include "views/moduletreeview.h"
#include "views/paramdetail.h"
#include "views/partitionmap.h"
#include "views/statusbar.h"
#include "views/violationspanel.h"

using namespace shardscope;
using namespace shardscope::testing;

class tst_MainWindow : public QObject
{
    Q_OBJECT
  private slots:
    void snapshotFillsTheViews();
    void timelineClickSelectsInTree();
    void lostConnectionKeepsDataAndSaysSo();
};

static QString writeSnapshot(QTemporaryDir &dir)
{
    SessionStore store;
    store.applyState(smallState());
    store.appendEvents(std::vector<Event>{makeEvent(1000, 0, EventType::FetchBegin, 0, 7),
                                          makeEvent(5000, 0, EventType::FetchEnd, 0, 7, 6464),
                                          lmHeadViolation(6000, 0)},
                       false);
    const QString path = dir.filePath(QStringLiteral("s.json"));
    exportSnapshotFile(path, store);
    return path;
}

void tst_MainWindow::snapshotFillsTheViews()
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

void tst_MainWindow::timelineClickSelectsInTree()
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

void tst_MainWindow::lostConnectionKeepsDataAndSaysSo()
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
    QTRY_COMPARE(w.connection()->state(), Connection::State::Lost);
    auto *banner = w.findChild<QLabel *>(QStringLiteral("banner"));
    QVERIFY(banner && banner->isVisible());
    QVERIFY(banner->text().contains(QStringLiteral("everything collected so far is kept")));
    QVERIFY(w.findChild<views::InspectorStatusBar *>()->connectionText().contains(
        QStringLiteral("reconnecting")));
    QCOMPARE(w.violations()->model()->rowCount(), 1);
    QCOMPARE(w.tree()->model()->index(0, 0).data().toString(), QStringLiteral("tiny-lm"));
}

QTEST_MAIN(tst_MainWindow)
#include "tst_mainwindow.moc"

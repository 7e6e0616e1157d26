// Snapshot files in the inspector: export and re-open give the same tree data; a
// corrupt, foreign or missing file gives a clear error and changes nothing.

#include <QFile>
#include <QTemporaryDir>
#include <QTest>

#include "session/snapshotio.h"
#include "syntheticstate.h"

using namespace shardscope;
using namespace shardscope::testing;

class tst_SnapshotIo : public QObject
{
    Q_OBJECT
  private slots:
    void exportThenOpenRoundTrips();
    void badFilesChangeNothing_data();
    void badFilesChangeNothing();
    void exportWithoutStateIsRefused();

  private:
    QTemporaryDir m_dir;
};

static void fill(SessionStore &store)
{
    store.applyState(smallState());
    store.appendEvents(std::vector<Event>{makeEvent(100, 0, EventType::FetchBegin, 1),
                                          makeEvent(900, 0, EventType::FetchEnd, 1, 0, 1024),
                                          lmHeadViolation(950, 2),
                                          makeEvent(960, 1, EventType::LateParameter, 8, 6)},
                       false);
}

void tst_SnapshotIo::exportThenOpenRoundTrips()
{
    SessionStore live;
    fill(live);
    const QString path = m_dir.filePath(QStringLiteral("run.json"));
    QCOMPARE(exportSnapshotFile(path, live), QString());
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray json = f.readAll();
    QVERIFY(json.contains("\"shardscope-snapshot\""));
    QVERIFY(json.contains("register_external_parameter(lm_head, embed.weight)"));

    SessionStore opened;
    QCOMPARE(openSnapshotFile(path, opened), QString());
    QVERIFY(opened.readOnly());
    QCOMPARE(opened.source(), path);
    QCOMPARE(opened.state().params.size(), live.state().params.size());
    for (std::size_t i = 0; i < live.state().params.size(); ++i) {
        QCOMPARE(opened.state().params[i].name, live.state().params[i].name);
        QCOMPARE(opened.state().params[i].status, live.state().params[i].status);
        QCOMPARE(opened.state().params[i].gatherCount, live.state().params[i].gatherCount);
    }
    QCOMPARE(opened.param(1)->status[0], ParamStatus::Available);
    QCOMPARE(opened.violationGroups().size(), std::size_t(2));
    QCOMPARE(opened.violationGroups()[0].accessor, ModuleId(7));
    QCOMPARE(opened.violationGroups()[0].param, ParamId(0));
    QCOMPARE(opened.totalEvents(), std::uint64_t(4));
    QCOMPARE(opened.lane(0).at(1).tsNs, std::uint64_t(900));
}

void tst_SnapshotIo::badFilesChangeNothing_data()
{
    QTest::addColumn<QByteArray>("contents");
    QTest::addColumn<QString>("expected");
    QTest::newRow("truncated")
        << QByteArray("{\"format\": \"shardscope-snapshot\", \"version\": 1, \"engine\": {")
        << QStringLiteral("as a ShardScope snapshot");
    QTest::newRow("foreign") << QByteArray("{\"traceEvents\": []}")
                             << QStringLiteral("as a ShardScope snapshot");
    QTest::newRow("binary") << QByteArray("\x89PNG\r\n\x1a\n\0\0\0", 11)
                            << QStringLiteral("as a ShardScope snapshot");
    QTest::newRow("missing") << QByteArray() << QStringLiteral("does not exist");
}

void tst_SnapshotIo::badFilesChangeNothing()
{
    QFETCH(QByteArray, contents);
    QFETCH(QString, expected);
    const QString path = m_dir.filePath(QStringLiteral("bad-%1.json").arg(QTest::currentDataTag()));
    if (!contents.isEmpty()) {
        QFile f(path);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(contents);
    }
    SessionStore store;
    fill(store);
    const auto before = store.totalEvents();
    const QString err = openSnapshotFile(path, store);
    QVERIFY2(err.contains(expected), qPrintable(err));
    QVERIFY(err.contains(path));
    QVERIFY(!store.readOnly());
    QCOMPARE(store.totalEvents(), before);
    QCOMPARE(store.state().modelName, std::string("tiny-lm"));
    QCOMPARE(store.violationGroups().size(), std::size_t(2));
}

void tst_SnapshotIo::exportWithoutStateIsRefused()
{
    SessionStore empty;
    const QString path = m_dir.filePath(QStringLiteral("empty.json"));
    QVERIFY(exportSnapshotFile(path, empty).contains(QStringLiteral("nothing to export")));
    QVERIFY(!QFile::exists(path));
}

QTEST_GUILESS_MAIN(tst_SnapshotIo)
#include "tst_snapshotio.moc"

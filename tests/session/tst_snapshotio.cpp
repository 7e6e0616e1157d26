// Snapshot files in the inspector: export and re-open give the same tree data; a
// corrupt, foreign or missing file gives a clear error and changes nothing.

#include <QFile>
#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include "session/snapshotio.h"
#include "session/traceexport.h"
#include "syntheticstate.h"
#include "wire/compress.h"

using namespace shardscope;
using namespace shardscope::test;

class TestSnapshotIo : public QObject
{
    Q_OBJECT
  private slots:
    void exportThenOpenRoundTrips();
    void badFilesChangeNothing_data();
    void badFilesChangeNothing();
    void exportWithoutStateIsRefused();
    void compressedAndPlainExportsHoldTheSameContent();

  private:
    QTemporaryDir m_dir;
};

static void fill(session::SessionStore &store)
{
    store.applyState(smallState());
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(100, 0, telemetry::makeFetchBegin({.param = 1, .cause = 0})),
            eventAt(900, 0, telemetry::makeFetchEnd({.param = 1, .cause = 0, .bytes = 1024})),
            lmHeadViolation(950, 2),
            eventAt(960, 1, telemetry::makeLateParameter({.module = 8, .param = 6}))},
        false);
    // The late parameter's violation is the producer's record, which its next State brings.
    state::EngineState st = smallState();
    st.params[1].status[0] = ParamStatus::Available; // gathered above
    state::ViolationRecord late;
    late.kind = ViolationKind::LateParameter;
    late.accessor = 8;
    late.param = 6;
    late.paramName = "pos_conv.weight_g";
    late.owner = 8;
    late.rank = 1;
    late.status = ParamStatus::Available;
    late.count = 1;
    late.tsNs = 970;
    st.violations.push_back(late);
    store.applyState(std::move(st));
}

void TestSnapshotIo::exportThenOpenRoundTrips()
{
    session::SessionStore live;
    fill(live);
    const QString path = m_dir.filePath(QStringLiteral("run.json"));
    QCOMPARE(session::exportSnapshotFile(path, live), QString());
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray json = f.readAll();
    QVERIFY(json.contains("\"shardscope-snapshot\""));
    QVERIFY(json.contains("register_external_parameter(lm_head, embed.weight)"));

    session::SessionStore opened;
    QCOMPARE(session::openSnapshotFile(path, opened), QString());
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

void TestSnapshotIo::badFilesChangeNothing_data()
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

void TestSnapshotIo::badFilesChangeNothing()
{
    QFETCH(QByteArray, contents);
    QFETCH(QString, expected);
    const QString path = m_dir.filePath(QStringLiteral("bad-%1.json").arg(QTest::currentDataTag()));
    if (!contents.isEmpty()) {
        QFile f(path);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(contents);
    }
    session::SessionStore store;
    fill(store);
    const auto before = store.totalEvents();
    const QString err = session::openSnapshotFile(path, store);
    QVERIFY2(err.contains(expected), qPrintable(err));
    QVERIFY(err.contains(path));
    QVERIFY(!store.readOnly());
    QCOMPARE(store.totalEvents(), before);
    QCOMPARE(store.state().modelName, std::string("tiny-lm"));
    QCOMPARE(store.violationGroups().size(), std::size_t(2));
}

void TestSnapshotIo::exportWithoutStateIsRefused()
{
    session::SessionStore empty;
    const QString path = m_dir.filePath(QStringLiteral("empty.json"));
    QVERIFY(session::exportSnapshotFile(path, empty).contains(QStringLiteral("nothing to export")));
    QVERIFY(!QFile::exists(path));
}

static QByteArray readFile(const QString &path)
{
    QFile f(path);
    return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

// What the demo and a bug report use: snapshot.json.gz and trace.json.gz. Nothing is lost
// to the compression: both exports decode to the same document, and the gzip'd trace is
// the plain trace's bytes, as gzip itself (what Perfetto and Chrome rely on) unpacks it.
void TestSnapshotIo::compressedAndPlainExportsHoldTheSameContent()
{
    session::SessionStore live;
    fill(live);
    std::vector<telemetry::Event> many;
    for (std::uint32_t i = 0; i < 5000; ++i) {
        const auto rank = static_cast<std::uint16_t>(i % 2);
        const std::uint64_t ts = 1000 + 10ull * i;
        const telemetry::FetchFields fetch{.param = i % 9, .cause = i % 8, .bytes = 64ull * i};
        many.push_back(eventAt(ts, rank,
                               i % 3 == 0   ? telemetry::makeModuleEnter({.module = i % 8})
                               : i % 3 == 1 ? telemetry::makeFetchBegin(fetch)
                                            : telemetry::makeFetchEnd(fetch)));
    }
    live.appendEvents(many, false);
    const QString plain = m_dir.filePath(QStringLiteral("both.json"));
    const QString gz = m_dir.filePath(QStringLiteral("both.json.gz"));
    QCOMPARE(session::exportSnapshotFile(plain, live), QString());
    QCOMPARE(session::exportSnapshotFile(gz, live), QString());
    const QByteArray plainBytes = readFile(plain), gzBytes = readFile(gz);
    QVERIFY(wire::isGzip(gzBytes.toStdString()));
    QVERIFY(!wire::isGzip(plainBytes.toStdString()));
    QVERIFY2(gzBytes.size() * 5 < plainBytes.size(), qPrintable(QString::number(gzBytes.size())));

    auto a = wire::readSnapshotFile(plain.toStdString());
    auto b = wire::readSnapshotFile(gz.toStdString());
    QVERIFY2(a.ok(), a.error().c_str());
    QVERIFY2(b.ok(), b.error().c_str());
    QCOMPARE(a->events.size(), std::size_t(5004));
    b->meta.createdUnixMs = a->meta.createdUnixMs; // written a moment apart
    QCOMPARE(wire::encodeSnapshot(*b), wire::encodeSnapshot(*a));

    session::SessionStore opened;
    QCOMPARE(session::openSnapshotFile(gz, opened), QString());
    QCOMPARE(opened.totalEvents(), live.totalEvents());
    QCOMPARE(session::chromeTrace(opened), session::chromeTrace(live));

    const QString trace = m_dir.filePath(QStringLiteral("trace.json.gz"));
    QCOMPARE(session::writeExportFile(trace, session::chromeTrace(live)), QString());
    QProcess gunzip;
    gunzip.start(QStringLiteral("gzip"), {QStringLiteral("-dc"), trace});
    QVERIFY(gunzip.waitForFinished(30000));
    QCOMPARE(gunzip.exitCode(), 0);
    QCOMPARE(gunzip.readAllStandardOutput(), session::chromeTrace(live));
    const QString plainTrace = m_dir.filePath(QStringLiteral("trace.json"));
    QCOMPARE(session::writeExportFile(plainTrace, session::chromeTrace(live)), QString());
    QCOMPARE(readFile(plainTrace), session::chromeTrace(live));
}

QTEST_GUILESS_MAIN(TestSnapshotIo)
#include "tst_snapshotio.moc"

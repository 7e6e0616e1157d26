// The shardscope executable's command line, offscreen: bad flags exit 2 with a clear
// message, a corrupt snapshot exits 1 with the reason, and --open with the exports
// and --screenshot writes valid files and exits 0.

#include <QFile>
#include <QProcess>
#include <QProcessEnvironment>
#include <QImage>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>
#include <QTest>

#include <sys/stat.h>

#include "runprocess.h"
#include "session/snapshotio.h"
#include "syntheticstate.h"

using namespace shardscope;
using namespace shardscope::test;

class TestAppCli : public QObject
{
    Q_OBJECT
  private slots:
    void initTestCase();
    void badFlagsExitTwo_data();
    void badFlagsExitTwo();
    void helpAndBadFlagsNeedNoDisplay();
    void corruptSnapshotExitsOne();
    void fifoIsRefusedNotWaitedOn();
    void openExportsAndScreenshot();

  private:
    QTemporaryDir m_dir;
};

void TestAppCli::initTestCase()
{
    QVERIFY2(QFile::exists(binPath(QStringLiteral("shardscope"))),
             "shardscope not built (SHARDSCOPE_BIN_DIR)");
}

void TestAppCli::badFlagsExitTwo_data()
{
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("message");
    QTest::newRow("unknown") << QStringList{"--bogus"}
                             << QStringLiteral("unknown option `--bogus`");
    QTest::newRow("no value") << QStringList{"--attach"}
                              << QStringLiteral("--attach needs a value");
    QTest::newRow("bad step") << QStringList{"--attach", "tcp:127.0.0.1:1", "--after-step", "three"}
                              << QStringLiteral(
                                     "--after-step needs a non-negative whole number, not `three`");
    QTest::newRow("both waits") << QStringList{"--attach", "tcp:127.0.0.1:1", "--after-step",
                                               "3",        "--after-seconds", "2"}
                                << QStringLiteral(
                                       "--after-step and --after-seconds exclude each other");
    QTest::newRow("export nothing")
        << QStringList{"--export-trace", "t.json"} << QStringLiteral("exports need --attach");
    QTest::newRow("step of a file") << QStringList{"--open", "x.json", "--after-step", "2"}
                                    << QStringLiteral("--after-step needs --attach");
}

void TestAppCli::badFlagsExitTwo()
{
    QFETCH(QStringList, args);
    QFETCH(QString, message);
    const ProcessResult r = runApp(args, 30000);
    QVERIFY(r.finished);
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains(message), qPrintable(r.err));
}

// Over ssh without a display: --help and a bad flag are answered, not Qt's "could not
// connect to display" abort (which they were, since QApplication came first).
void TestAppCli::helpAndBadFlagsNeedNoDisplay()
{
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    for (const char *name : {"QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"})
        env.remove(QString::fromLatin1(name));
    const auto run = [&](const QStringList &args, int expected, const QString &text) {
        QProcess p;
        p.setProcessEnvironment(env);
        p.start(binPath(QStringLiteral("shardscope")), args);
        QVERIFY(p.waitForFinished(30000));
        const QString out = QString::fromUtf8(p.readAllStandardOutput() + p.readAllStandardError());
        QVERIFY2(p.exitStatus() == QProcess::NormalExit && p.exitCode() == expected,
                 qPrintable(out));
        QVERIFY2(out.contains(text), qPrintable(out));
    };
    run({QStringLiteral("--help")}, 0, QStringLiteral("Usage: shardscope"));
    run({QStringLiteral("--bogus")}, 2, QStringLiteral("unknown option `--bogus`"));
}

void TestAppCli::corruptSnapshotExitsOne()
{
    const QString path = m_dir.filePath(QStringLiteral("corrupt.json"));
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("{\"format\": \"shardscope-snapshot\", \"version\": 1, \"engine\": [");
    f.close();
    const ProcessResult r =
        runApp({QStringLiteral("--open"), path, QStringLiteral("--quit")}, 30000);
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains(QStringLiteral("cannot open `%1` as a ShardScope snapshot").arg(path)),
             qPrintable(r.err));
}

// Issue #14, defect 11: --open of a FIFO waited forever for a writer.
void TestAppCli::fifoIsRefusedNotWaitedOn()
{
    const QString path = m_dir.filePath(QStringLiteral("fifo.json"));
    QCOMPARE(::mkfifo(QFile::encodeName(path).constData(), 0600), 0);
    const ProcessResult r =
        runApp({QStringLiteral("--open"), path, QStringLiteral("--quit")}, 30000);
    QVERIFY(r.finished);
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains(QStringLiteral("not a regular file")), qPrintable(r.err));
}

void TestAppCli::openExportsAndScreenshot()
{
    session::SessionStore store;
    store.applyState(smallState());
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(1000, 0, telemetry::makeStepBegin()),
            eventAt(2000, 0, telemetry::makeFetchBegin({.param = 0, .cause = 7})),
            eventAt(9000, 0, telemetry::makeFetchEnd({.param = 0, .cause = 7, .bytes = 6464})),
            lmHeadViolation(9500, 0), eventAt(20000, 0, telemetry::makeStepEnd(4.0))},
        false);
    const QString snap = m_dir.filePath(QStringLiteral("in.json"));
    QCOMPARE(session::exportSnapshotFile(snap, store), QString());
    const QString trace = m_dir.filePath(QStringLiteral("trace.json"));
    const QString csv = m_dir.filePath(QStringLiteral("violations.csv"));
    const QString png = m_dir.filePath(QStringLiteral("shot.png"));
    const ProcessResult r =
        runApp({QStringLiteral("--open"), snap, QStringLiteral("--export-trace"), trace,
                QStringLiteral("--export-csv"), csv, QStringLiteral("--screenshot"), png,
                QStringLiteral("--quit")});
    QVERIFY2(r.exitCode == 0, qPrintable(r.err));
    QVERIFY(r.out.contains(QStringLiteral("wrote trace")));

    QFile t(trace);
    QVERIFY(t.open(QIODevice::ReadOnly));
    const QJsonDocument doc = QJsonDocument::fromJson(t.readAll());
    QVERIFY(doc.isObject());
    QVERIFY(doc.object().value(QStringLiteral("traceEvents")).toArray().size() > 4);
    QCOMPARE(doc.object()
                 .value(QStringLiteral("distributedInfo"))
                 .toObject()
                 .value(QStringLiteral("world_size"))
                 .toInt(),
             4);

    QFile c(csv);
    QVERIFY(c.open(QIODevice::ReadOnly));
    const QByteArray rows = c.readAll();
    QVERIFY2(rows.contains("unregistered_access,cost,lm_head,embed.weight,embed"), rows.constData());

    QImage image(png);
    QVERIFY(!image.isNull());
    QVERIFY(image.width() >= 800 && image.height() >= 600);
    QVERIFY2(distinctColours(image) > 20, "the screenshot is blank");
}

QTEST_MAIN(TestAppCli)
#include "tst_appcli.moc"

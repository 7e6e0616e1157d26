// The shardscope executable's command line, offscreen: bad flags exit 2 with a clear
// message, a corrupt snapshot exits 1 with the reason, and --open with the exports
// and --screenshot writes valid files and exits 0. An --attach argument gets the answer,
// exit status and words shardscope-capture gives it (one parser, one reachability check).

#include <QFile>
#include <QImage>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QProcessEnvironment>
#include <QTemporaryDir>
#include <QTest>

#include <QElapsedTimer>

#include <sys/stat.h>

#include "runprocess.h"
#include "session/snapshotio.h"
#include "syntheticstate.h"
#include "wire/snapshot.h"

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
    void sameAttachArgumentSameAnswerAsCapture_data();
    void sameAttachArgumentSameAnswerAsCapture();
    void aListOfEndpointsIsTakenByBoth();

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
    const ProcessRun r = runApp(args, 30000);
    QVERIFY(r.finished());
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
        const ProcessRun r = runBinary(QStringLiteral("shardscope"), args, 30000, env);
        QVERIFY(r.finished());
        const QString out = r.out + r.err;
        QVERIFY2(r.exitCode == expected, qPrintable(out));
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
    const ProcessRun r = runApp({QStringLiteral("--open"), path, QStringLiteral("--quit")}, 30000);
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains(QStringLiteral("cannot open `%1` as a ShardScope snapshot").arg(path)),
             qPrintable(r.err));
}

// Issue #14, defect 11: --open of a FIFO waited forever for a writer.
void TestAppCli::fifoIsRefusedNotWaitedOn()
{
    const QString path = m_dir.filePath(QStringLiteral("fifo.json"));
    QCOMPARE(::mkfifo(QFile::encodeName(path).constData(), 0600), 0);
    const ProcessRun r = runApp({QStringLiteral("--open"), path, QStringLiteral("--quit")}, 30000);
    QVERIFY(r.finished());
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
    const ProcessRun r = runApp({QStringLiteral("--open"), snap, QStringLiteral("--export-trace"),
                                 trace, QStringLiteral("--export-csv"), csv,
                                 QStringLiteral("--screenshot"), png, QStringLiteral("--quit")});
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
    QVERIFY2(rows.contains("unregistered_access,cost,lm_head,embed.weight,embed"),
             rows.constData());

    QImage image(png);
    QVERIFY(!image.isNull());
    QVERIFY(image.width() >= 800 && image.height() >= 600);
    QVERIFY2(distinctColours(image) > 20, "the screenshot is blank");
}

namespace {

ProcessRun runCapture(const QStringList &args, int timeoutMs = 60000)
{
    return runBinary(QStringLiteral("shardscope-capture"), args, timeoutMs);
}

// What a program said about its --attach argument: its lines on stderr without the program's
// name, and without the pointer to --help (which names the program).
QStringList said(const QString &err, const QString &program)
{
    QStringList out;
    for (const QString &line : err.split(QLatin1Char('\n'), Qt::SkipEmptyParts))
        if (line.startsWith(program + QStringLiteral(": "))) out << line.mid(program.size() + 2);
    return out;
}

} // namespace

// Issue #49, defect 12: the inspector waited 120 s on an endpoint where nothing listens and
// then said "Invalid name", and refused nothing that capture refused; capture refused a list
// of endpoints the inspector takes. Now both answer at once, with the same status and words.
void TestAppCli::sameAttachArgumentSameAnswerAsCapture_data()
{
    QTest::addColumn<QString>("attach");
    QTest::addColumn<int>("status");
    QTest::addColumn<QString>("words");
    const QString nobody = m_dir.filePath(QStringLiteral("nobody-listens.sock"));
    QTest::newRow("no socket") << "unix:" + nobody << 1
                               << "cannot connect to unix:" + nobody +
                                      ": No such file or directory; is the engine running?";
    QTest::newRow("refused") << QStringLiteral("tcp:127.0.0.1:1") << 1
                             << QStringLiteral("cannot connect to tcp:127.0.0.1:1: Connection "
                                               "refused; is the engine running?");
    QTest::newRow("list, none answers")
        << QStringLiteral("tcp:127.0.0.1:1,tcp:127.0.0.1:2") << 1
        << QStringLiteral("cannot connect to tcp:127.0.0.1:2: Connection refused");
    QTest::newRow("IPv6 unbracketed")
        << QStringLiteral("tcp:::1:7000") << 2 << QStringLiteral("write an IPv6 host in brackets");
    QTest::newRow("list with garbage") << QStringLiteral("tcp:127.0.0.1:1,garbage") << 2
                                       << QStringLiteral("unknown endpoint \"garbage\"");
    QTest::newRow("job without a name")
        << QStringLiteral("job:") << 2 << QStringLiteral("job:NAME needs the job's name");
}

void TestAppCli::sameAttachArgumentSameAnswerAsCapture()
{
    QFETCH(QString, attach);
    QFETCH(int, status);
    QFETCH(QString, words);
    QVERIFY2(QFile::exists(binPath(QStringLiteral("shardscope-capture"))),
             "shardscope-capture not built");
    const QString out = m_dir.filePath(QStringLiteral("never.json"));
    const ProcessRun capture =
        runCapture({QStringLiteral("--attach"), attach, QStringLiteral("--out"), out});
    QElapsedTimer t;
    t.start();
    // The default --timeout (120 s) stands: the answer must not wait for it.
    const ProcessRun app =
        runApp({QStringLiteral("--attach"), attach, QStringLiteral("--export-snapshot"), out,
                QStringLiteral("--quit")},
               60000);
    QVERIFY2(app.finished() && t.elapsed() < 30000, qPrintable(app.err));
    QCOMPARE(capture.exitCode, status);
    QCOMPARE(app.exitCode, status);
    const QStringList fromCapture = said(capture.err, QStringLiteral("shardscope-capture"));
    const QStringList fromApp = said(app.err, QStringLiteral("shardscope"));
    QVERIFY2(fromCapture.join(QLatin1Char('\n')).contains(words), qPrintable(capture.err));
    QVERIFY2(
        fromApp == fromCapture,
        qPrintable(QStringLiteral("shardscope said:\n%1\nshardscope-capture said:\n%2")
                       .arg(fromApp.join(QLatin1Char('\n')), fromCapture.join(QLatin1Char('\n')))));
    QVERIFY(!QFile::exists(out));
}

// Endpoints separated by commas are the processes of one job for both programs: the one that
// answers is attached and written, the one where nothing listens is named.
void TestAppCli::aListOfEndpointsIsTakenByBoth()
{
    Trainer trainer({QStringLiteral("--steps"), QStringLiteral("100000")});
    QVERIFY2(!trainer.endpoint().isEmpty(), qPrintable(trainer.output()));
    const QString nobody = "unix:" + m_dir.filePath(QStringLiteral("gone.sock"));
    const QString list = trainer.endpoint() + "," + nobody;
    const QString fromCapture = m_dir.filePath(QStringLiteral("list-capture.json"));
    const ProcessRun capture =
        runCapture({QStringLiteral("--attach"), list, QStringLiteral("--seconds"),
                    QStringLiteral("1"), QStringLiteral("--out"), fromCapture});
    QVERIFY2(capture.exitCode == 0, qPrintable(capture.out + capture.err));
    QVERIFY2(capture.err.contains("cannot connect to " + nobody), qPrintable(capture.err));
    const QString fromApp = m_dir.filePath(QStringLiteral("list-app.json"));
    const ProcessRun app =
        runApp({QStringLiteral("--attach"), list, QStringLiteral("--after-seconds"),
                QStringLiteral("1"), QStringLiteral("--export-snapshot"), fromApp,
                QStringLiteral("--timeout"), QStringLiteral("60"), QStringLiteral("--quit")});
    QVERIFY2(app.exitCode == 0, qPrintable(app.out + app.err));
    for (const QString &file : {fromCapture, fromApp}) {
        auto snap = wire::readSnapshotFile(file.toStdString());
        QVERIFY2(snap, snap ? "" : snap.error().c_str());
        QCOMPARE(snap->state.worldSize, 4);
        QVERIFY(!snap->state.params.empty());
    }
}

QTEST_MAIN(TestAppCli)
#include "tst_appcli.moc"

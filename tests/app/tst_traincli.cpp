// The real shardscope-train process (found through $SHARDSCOPE_BIN_DIR): its per-step and
// final lines, the stories it reports, --guard error's stop, and its command-line errors.

#include <QtTest>

#include <QFile>
#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>

#include "client/inspectorclient.h"
#include "nn/markov.h"
#include "nn/trainconfig.h"
#include "processrun.h"

class TestTrainCli : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase();
    void demoPrintsStepsAndTheStories();
    void manualExternalsReportNothing();
    void guardErrorStopsWithTheFix();
    void badFlagsExitWithTwo_data();
    void badFlagsExitWithTwo();
    void helpDocumentsEveryFlag();
    void snapshotIsWritten();
    void tokenComesFromAPrivateFileOrTheEnvironment();
    void sigtermFinishesTheInspector();
    void waitForClientHoldsTheFirstStep();
    void lingerHandsTheEndToALateClient();

  private:
    using Result = shardscope::test::ProcessRun;
    Result run(const QStringList &args,
               const QProcessEnvironment &env = QProcessEnvironment::systemEnvironment());

    QString m_program;
};

TestTrainCli::Result TestTrainCli::run(const QStringList &args, const QProcessEnvironment &env)
{
    shardscope::test::RunOptions options;
    options.environment = env;
    options.timeoutMs = 120000;
    return shardscope::test::runProcess(m_program, args, options);
}

void TestTrainCli::initTestCase()
{
    const QString dir = qEnvironmentVariable("SHARDSCOPE_BIN_DIR");
    QVERIFY2(!dir.isEmpty(), "SHARDSCOPE_BIN_DIR is not set; run the test through ctest");
    m_program = dir + "/shardscope-train";
    QVERIFY2(QFile::exists(m_program),
             qPrintable(m_program + " does not exist; build shardscope-train"));
}

void TestTrainCli::demoPrintsStepsAndTheStories()
{
    const Result r = run({"--steps", "12", "--no-listen", "--backend", "cpu"});
    QCOMPARE(r.exitCode, 0);
    const QStringList lines = r.out.split('\n');
    const QRegularExpression step(
        R"(^step (\d+)/12 .*loss (\d+\.\d+) .*tokens/s \d+ .*gathered (\d+\.\d) MB .*unregistered (\d+) .*late (\d+)$)");
    QList<double> losses;
    QList<int> unregistered;
    for (const QString &line : lines) {
        const auto m = step.match(line);
        if (!m.hasMatch()) continue;
        QCOMPARE(m.captured(1).toInt(), losses.size() + 1);
        losses << m.captured(2).toDouble();
        unregistered << m.captured(4).toInt();
        QCOMPARE(m.captured(5).toInt(), 2); // pos_conv.weight_g and weight_v
    }
    QCOMPARE(losses.size(), 12);
    QVERIFY2(losses.last() < 0.8 * losses.first(),
             qPrintable(QStringLiteral("loss %1 -> %2").arg(losses.first()).arg(losses.last())));
    // 4 ranks: lm_head's read of embed.weight is recorded once per rank and step.
    for (int i = 1; i < unregistered.size(); ++i)
        QCOMPARE(unregistered[i] - unregistered[i - 1], 4);

    const QRegularExpression final(R"(^final loss (\d+\.\d+) .*unregistered (\d+) .*late 2$)",
                                   QRegularExpression::MultilineOption);
    const auto f = final.match(r.out);
    QVERIFY2(f.hasMatch(), qPrintable(r.out));
    QCOMPARE(f.captured(1).toDouble(), losses.last());
    QCOMPARE(f.captured(2).toInt(), unregistered.last());
    // Each problem is printed once, when it first happens, with its fix.
    QCOMPARE(r.out.count("read `embed.weight` owned by `embed`"), 1);
    QVERIFY(r.out.contains("unregistered_access at step 1: module `lm_head` read `embed.weight`"));
    QVERIFY(r.out.contains("fix: register_external_parameter(lm_head, embed.weight)"));
    QVERIFY(r.out.contains("unregistered_access while building the model: `pos_conv.weight`"));
    // The late parameters' text names the parameter weight_norm replaced: it is known.
    QVERIFY2(r.out.contains("`pos_conv.weight_g` was created in `pos_conv` after the model was "
                            "partitioned (it replaces `pos_conv.weight`)"),
             qPrintable(r.out));
    QVERIFY(r.out.contains("`pos_conv.weight_v` was created in `pos_conv` after the model was "
                           "partitioned (it replaces `pos_conv.weight`)"));
    QVERIFY(
        r.out.contains("fix: with GatheredParameters(pos_conv.weight, modifier_rank=0): <create "
                       "pos_conv.weight_g>; then register_external_parameter(pos_conv, "
                       "pos_conv.weight_g)"));
}

void TestTrainCli::manualExternalsReportNothing()
{
    const Result r =
        run({"--steps", "3", "--no-listen", "--externals", "manual", "--guard", "error"});
    QCOMPARE(r.exitCode, 0);
    QVERIFY(r.out.contains(QRegularExpression(R"(^final .*unregistered 0  late 0$)",
                                              QRegularExpression::MultilineOption)));
    QVERIFY(!r.out.contains("unregistered_access"));
    QVERIFY(!r.out.contains("late_parameter"));
}

// The users' first code stops at its first unregistered read: weight_norm reading the
// partitioned pos_conv.weight while the model is built. The message names the fix.
void TestTrainCli::guardErrorStopsWithTheFix()
{
    const Result r = run({"--steps", "3", "--no-listen", "--guard", "error"});
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("with GatheredParameters(pos_conv.weight): <read it here>"),
             qPrintable(r.err));
    QVERIFY(!r.out.contains("\nstep 1/3"));
}

void TestTrainCli::badFlagsExitWithTwo_data()
{
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("message");
    QTest::newRow("unknown flag") << QStringList{"--bogus"} << "unknown option '--bogus'";
    QTest::newRow("not a number") << QStringList{"--steps", "ten"} << "--steps expects a number";
    QTest::newRow("missing value") << QStringList{"--world-size"} << "--world-size needs a value";
    QTest::newRow("zero ranks") << QStringList{"--world-size", "0"}
                                << "--world-size 0 is out of range";
    QTest::newRow("groups") << QStringList{"--hidden", "30", "--groups", "4"}
                            << "--groups 4 does not divide --hidden 30";
    QTest::newRow("externals") << QStringList{"--externals", "auto"}
                               << "--externals 'auto' is not one of none, manual";
    QTest::newRow("guard") << QStringList{"--guard", "loud"}
                           << "--guard 'loud' is not one of error, warn, auto";
    QTest::newRow("backend") << QStringList{"--backend", "tpu"}
                             << "--backend 'tpu' is not one of cpu, nccl, gloo, auto";
    QTest::newRow("negative lr") << QStringList{"--lr", "-1"} << "--lr must be a positive number";
    QTest::newRow("bad endpoint") << QStringList{"--steps", "1", "--listen", "nowhere"}
                                  << "--listen";
    QTest::newRow("linger") << QStringList{"--linger", "soon"} << "--linger expects a number";
    QTest::newRow("negative linger")
        << QStringList{"--linger", "-1"} << "--linger must be a number of seconds";
    QTest::newRow("wait without endpoint") << QStringList{"--wait-for-client", "--no-listen"}
                                           << "--wait-for-client waits for a client";
}

void TestTrainCli::badFlagsExitWithTwo()
{
    QFETCH(QStringList, args);
    QFETCH(QString, message);
    const Result r = run(args);
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains(message), qPrintable(r.err));
    QVERIFY(!r.out.contains("step 1/"));
}

void TestTrainCli::helpDocumentsEveryFlag()
{
    const Result r = run({"--help"});
    QCOMPARE(r.exitCode, 0);
    for (const char *flag : {"--world-size",
                             "--steps",
                             "--layers",
                             "--hidden",
                             "--vocab",
                             "--seq",
                             "--batch",
                             "--lr",
                             "--weight-decay",
                             "--seed",
                             "--kernel",
                             "--groups",
                             "--externals",
                             "--guard",
                             "--persistence-threshold",
                             "--backend",
                             "--listen",
                             "--token",
                             "--token-file",
                             "--no-listen",
                             "--snapshot-out",
                             "--history",
                             "--no-telemetry",
                             "--causal-conv",
                             "--symmetric-conv",
                             "--wait-for-client",
                             "--linger",
                             "--help"})
        QVERIFY2(r.out.contains(QLatin1String(flag)), flag);
    // What the loss can reach, from the data itself (see tst_trainer for the runs).
    const shardscope::nn::TrainConfig d;
    const double floor = shardscope::nn::MarkovStream(d.seed, d.vocab).lossFloor(d.seq);
    const QString stated = QStringLiteral("loss floor is %1 nats").arg(floor, 0, 'f', 4);
    QVERIFY2(r.out.contains(stated), qPrintable(stated + " not in\n" + r.out));
}

void TestTrainCli::snapshotIsWritten()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString file = dir.filePath("run.json");
    const Result r = run({"--steps", "2", "--no-listen", "--snapshot-out", file});
    QCOMPARE(r.exitCode, 0);
    QVERIFY(r.out.contains("snapshot: " + file));
    QVERIFY2(r.out.trimmed().split('\n').last().startsWith("final loss "), qPrintable(r.out));
    QFile f(file);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray json = f.readAll();
    QVERIFY(json.contains("\"embed.weight\""));
    QVERIFY(json.contains("\"pos_conv.weight_v\""));
    QVERIFY(json.contains("unregistered_access"));
}

// Issue #14, defect 7: a token on the command line is visible in /proc/PID/cmdline; it can
// come from a file only its owner reads, or from SHARDSCOPE_TOKEN. A non-loopback address
// needs a token, so the run only starts if the token was found.
void TestTrainCli::tokenComesFromAPrivateFileOrTheEnvironment()
{
    QTemporaryDir dir;
    const QString file = dir.filePath("token");
    QFile f(file);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("s3cret\n");
    f.close();
    const QStringList args = {"--steps", "1", "--listen", "tcp:0.0.0.0:0"};
    QFile::setPermissions(file, QFile::ReadOwner | QFile::WriteOwner | QFile::ReadGroup |
                                    QFile::ReadOther);
    Result r = run(args + QStringList{"--token-file", file});
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains("chmod 600"), qPrintable(r.err));
    QFile::setPermissions(file, QFile::ReadOwner | QFile::WriteOwner);
    r = run(args + QStringList{"--token-file", file});
    QVERIFY2(r.exitCode == 0, qPrintable(r.err));
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("SHARDSCOPE_TOKEN", "s3cret");
    r = run(args, env);
    QVERIFY2(r.exitCode == 0, qPrintable(r.err));
    env.remove("SHARDSCOPE_TOKEN");
    env.remove("SHARDSCOPE_TOKEN_FILE");
    r = run(args, env);
    QCOMPARE(r.exitCode, 2); // no token from anywhere: refused
}

// Issue #14, defect 13: SIGTERM left the discovery file behind and skipped --snapshot-out.
void TestTrainCli::sigtermFinishesTheInspector()
{
    QTemporaryDir dir;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("XDG_RUNTIME_DIR", dir.path());
    const QString snapshot = dir.filePath("run.json");
    QProcess p;
    p.setProcessEnvironment(env);
    p.start(m_program, {"--steps", "100000", "--snapshot-out", snapshot});
    QVERIFY(p.waitForStarted(10000));
    QString out;
    while (!out.contains("step 2/") && p.waitForReadyRead(60000))
        out += QString::fromUtf8(p.readAllStandardOutput());
    QVERIFY2(out.contains("step 2/"), qPrintable(out));
    const QString discovery = dir.filePath(QStringLiteral("shardscope/%1.json").arg(p.processId()));
    const QString socket = dir.filePath(QStringLiteral("shardscope/%1.sock").arg(p.processId()));
    QVERIFY(QFile::exists(discovery));
    QVERIFY(QFile::exists(socket));
    p.terminate();
    QVERIFY(p.waitForFinished(30000));
    QVERIFY2(!QFile::exists(discovery), "the discovery file was left behind");
    QVERIFY(!QFile::exists(socket));
    QFile f(snapshot);
    QVERIFY2(f.open(QIODevice::ReadOnly), "--snapshot-out was not written");
    QVERIFY(f.readAll().contains("\"shardscope-snapshot\""));
    QVERIFY(QDir(dir.path()).entryList({"*.tmp.*"}).isEmpty());
}

QTEST_GUILESS_MAIN(TestTrainCli)
namespace {

// Starts the trainer and waits (at most 60 s, not a measurement) for a line of its output.
bool waitForLine(QProcess &p, const QString &line, QString &out)
{
    for (int i = 0; i < 600 && !out.contains(line); ++i) {
        p.waitForReadyRead(100);
        out += QString::fromUtf8(p.readAllStandardOutput());
    }
    return out.contains(line);
}

// Reads frames until the engine's goodbye; false if the connection ended without one.
bool readUntilGoodbye(shardscope::client::InspectorClient &client)
{
    for (;;) {
        auto frame = client.next(60000);
        if (!frame || !frame->has_value()) return false;
        if ((*frame)->type == shardscope::wire::MessageType::Goodbye) return true;
    }
}

} // namespace

// --wait-for-client: no step runs before an inspector is attached; then the run goes on.
void TestTrainCli::waitForClientHoldsTheFirstStep()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString endpoint = "unix:" + dir.filePath("train.sock");
    QProcess p;
    p.start(m_program,
            {"--steps", "3", "--backend", "cpu", "--listen", endpoint, "--wait-for-client"});
    QString out;
    QVERIFY2(waitForLine(p, "waiting for an inspector to attach", out), qPrintable(out));
    QVERIFY(!out.contains("step 1/"));
    auto client = shardscope::client::InspectorClient::connect(endpoint.toStdString(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    QVERIFY(readUntilGoodbye(**client));
    QVERIFY(p.waitForFinished(60000));
    out += QString::fromUtf8(p.readAllStandardOutput());
    QCOMPARE(p.exitCode(), 0);
    QVERIFY2(out.contains("inspector attached; training"), qPrintable(out));
    QVERIFY(out.indexOf("inspector attached") < out.indexOf("step 1/3"));

    // With a limit and nobody attaching, the run goes on alone.
    const Result alone = run({"--steps", "1", "--backend", "cpu", "--listen",
                              "unix:" + dir.filePath("alone.sock"), "--wait-for-client=0.01"});
    QCOMPARE(alone.exitCode, 0);
    QVERIFY2(alone.out.contains("no inspector attached in time; training anyway"),
             qPrintable(alone.out));
}

// --linger: a client that attaches after the last step still receives the end (the final
// state and the goodbye), and the run then exits without waiting out its linger.
void TestTrainCli::lingerHandsTheEndToALateClient()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString endpoint = "unix:" + dir.filePath("train.sock");
    QProcess p;
    p.start(m_program,
            {"--steps", "2", "--backend", "cpu", "--listen", endpoint, "--linger", "600"});
    QString out;
    QVERIFY2(waitForLine(p, "lingering up to 600.0 s", out), qPrintable(out));
    QVERIFY(out.contains("step 2/2"));
    auto client = shardscope::client::InspectorClient::connect(endpoint.toStdString(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    QVERIFY(readUntilGoodbye(**client));
    QVERIFY(p.waitForFinished(60000));
    QCOMPARE(p.exitCode(), 0);
}

#include "tst_traincli.moc"

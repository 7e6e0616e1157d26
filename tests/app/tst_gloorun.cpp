// shardscope-train --backend gloo as real processes on 127.0.0.1: started by scripts/launch
// it trains with the same losses as the threads backend (world 2, 3 and 4, with padded
// partitions); a rank killed with SIGKILL or stopped with SIGSTOP makes every other rank
// exit non-zero, naming it, within --comm-timeout (never a hang); and the launcher stops the
// other ranks when one fails and exits with its status. A rank that takes another path
// (--diverge, issue 51) is named by the job's aligner as shardscope-capture attaches to every
// rank: the rank waiting in a collective the others never issue, with its C++ line (the
// engine's stall watchdog), and a slow rank is a straggler, no fault.

#include <QtTest>

#include <QFile>
#include <QProcess>
#include <QRegularExpression>
#include <QTcpServer>
#include <QTemporaryDir>
#include <QThread>

#include <csignal>
#include <memory>
#include <vector>

#include "processrun.h"
#include "processtree.h"

namespace {

// A tiny model: hidden 35 and vocab 97 make embed (3395 elements) and fc1 (4900) partitions
// that need padding for 2, 3 and 4 ranks.
const QStringList kModel = {"--layers", "1",     "--hidden", "35",      "--groups",
                            "5",        "--seq", "16",       "--batch", "12",
                            "--kernel", "4",     "--vocab",  "97",      "--no-listen"};

using Result = shardscope::test::ProcessRun;

// A started launch to its end (its ranks ended with it past ms).
Result finish(QProcess &p, int ms)
{
    return shardscope::test::finishProcess(p, ms, true);
}

// The losses of "step N/M  loss X" lines, in order (prefix: "[rank 0] " under the launcher).
QList<double> losses(const QString &out, const QString &prefix)
{
    const QRegularExpression step("^" + QRegularExpression::escape(prefix) +
                                  R"(step \d+/\d+  loss (\d+\.\d+))");
    QList<double> found;
    for (const QString &line : out.split('\n')) {
        const auto m = step.match(line);
        if (m.hasMatch()) found << m.captured(1).toDouble();
    }
    return found;
}

QProcessEnvironment cleanEnvironment()
{
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    for (const char *v : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "TORCHELASTIC_RUN_ID"})
        env.remove(v);
    return env;
}

} // namespace

class TestGlooRun : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase();
    void glooLossesEqualTheThreadsBackend_data();
    void glooLossesEqualTheThreadsBackend();
    void aKilledRankIsNamedByTheOthers();
    void aStoppedRankIsNamedByTheOthers();
    void glooWithoutALauncherSaysHowToStart();
    void theLauncherStopsTheRestAndKeepsTheFailingStatus();
    void aRankOnAnotherPathIsNamedWithItsLine_data();
    void aRankOnAnotherPathIsNamedWithItsLine();

  private:
    // Starts the 4 ranks of a long gloo run directly (so each pid is known), waits until
    // rank 0 has trained a few steps, sends `signal` to `victim`, and returns what the
    // other ranks ended with.
    std::vector<Result> faultRun(int victim, int signal);

    QString m_program;
    QString m_launch;
    QString m_capture;
};

void TestGlooRun::initTestCase()
{
    const QString bin = qEnvironmentVariable("SHARDSCOPE_BIN_DIR");
    const QString src = qEnvironmentVariable("SHARDSCOPE_SOURCE_DIR");
    QVERIFY2(!bin.isEmpty() && !src.isEmpty(),
             "SHARDSCOPE_BIN_DIR/SHARDSCOPE_SOURCE_DIR are not set; run the test through ctest");
    m_program = bin + "/shardscope-train";
    m_launch = src + "/scripts/launch";
    m_capture = bin + "/shardscope-capture";
    QVERIFY2(QFile::exists(m_capture), qPrintable(m_capture + " does not exist"));
    QVERIFY2(QFile::exists(m_program), qPrintable(m_program + " does not exist"));
    QVERIFY2(QFile::exists(m_launch), qPrintable(m_launch + " does not exist"));
}

void TestGlooRun::glooLossesEqualTheThreadsBackend_data()
{
    QTest::addColumn<int>("world");
    QTest::addColumn<bool>("overlap");
    QTest::newRow("2 ranks") << 2 << false;
    QTest::newRow("3 ranks, overlap_comm") << 3 << true;
    QTest::newRow("4 ranks") << 4 << false;
}

void TestGlooRun::glooLossesEqualTheThreadsBackend()
{
    QFETCH(int, world);
    QFETCH(bool, overlap);
    const QStringList common = kModel + QStringList{"--steps", "4"};

    QProcess threads;
    threads.setProcessEnvironment(cleanEnvironment());
    threads.start(m_program,
                  common + QStringList{"--backend", "cpu", "--world-size", QString::number(world)});
    const Result cpu = finish(threads, 120000);
    QCOMPARE(cpu.exitCode, 0);

    QProcess launched;
    launched.setProcessEnvironment(cleanEnvironment());
    QStringList args{"-n",   QString::number(world), m_program, "--backend",
                     "gloo", "--comm-timeout",       "30"};
    if (overlap) args << "--overlap-comm";
    // Every rank serves its own inspector endpoint: rank N > 0 on PATH.rank<N>.
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString socket = dir.filePath("engine.sock");
    launched.start(m_launch, args + common + QStringList{"--listen", "unix:" + socket});
    const Result gloo = finish(launched, 120000);
    QVERIFY2(gloo.exitCode == 0, qPrintable(gloo.err));

    const QList<double> expected = losses(cpu.out, "");
    const QList<double> got = losses(gloo.out, "[rank 0] ");
    QCOMPARE(expected.size(), 4);
    QCOMPARE(got.size(), 4);
    for (int i = 0; i < 4; ++i)
        QVERIFY2(std::abs(got[i] - expected[i]) <= 1e-6 * std::abs(expected[i]),
                 qPrintable(QString("step %1: gloo %2, threads %3")
                                .arg(i + 1)
                                .arg(got[i], 0, 'f', 6)
                                .arg(expected[i], 0, 'f', 6)));
    // Only rank 0 prints the steps; every rank prints its final line, with the same loss.
    QVERIFY(losses(gloo.out, "[rank 1] ").isEmpty());
    const QRegularExpression final(R"(^\[rank (\d+)\] final loss (\d+\.\d+))",
                                   QRegularExpression::MultilineOption);
    int finals = 0;
    for (auto it = final.globalMatch(gloo.out); it.hasNext(); ++finals)
        QCOMPARE(it.next().captured(2).toDouble(), got.last());
    QCOMPARE(finals, world);
    for (int r = 0; r < world; ++r) {
        const QString at = r == 0 ? socket : socket + ".rank" + QString::number(r);
        QVERIFY2(
            gloo.out.contains(
                QString("[rank %1] inspector (rank %1): listening on unix:%2\n").arg(r).arg(at)),
            qPrintable(gloo.out));
    }
}

std::vector<Result> TestGlooRun::faultRun(int victim, int signal)
{
    constexpr int kWorld = 4;
    // A port for rank 0's rendezvous: the kernel's pick, released just before use.
    QTcpServer probe;
    probe.listen(QHostAddress::LocalHost);
    const QString port = QString::number(probe.serverPort());
    probe.close();

    std::vector<std::unique_ptr<QProcess>> ranks;
    for (int r = 0; r < kWorld; ++r) {
        auto p = std::make_unique<QProcess>();
        QProcessEnvironment env = cleanEnvironment();
        env.insert("RANK", QString::number(r));
        env.insert("LOCAL_RANK", QString::number(r));
        env.insert("WORLD_SIZE", QString::number(kWorld));
        env.insert("MASTER_ADDR", "127.0.0.1");
        env.insert("MASTER_PORT", port);
        p->setProcessEnvironment(env);
        p->start(m_program, kModel + QStringList{"--backend", "gloo", "--steps", "1000000",
                                                 "--comm-timeout", "5"});
        ranks.push_back(std::move(p));
    }
    // Rank 0 prints a line per step: wait (bounded) until training is under way.
    QByteArray rank0;
    for (int i = 0; i < 600 && !rank0.contains("step 3/"); ++i) {
        ranks[0]->waitForReadyRead(100);
        rank0 += ranks[0]->readAllStandardOutput();
    }
    std::vector<Result> results(kWorld);
    if (!rank0.contains("step 3/")) {
        for (auto &p : ranks)
            p->kill();
        for (auto &p : ranks)
            p->waitForFinished();
        results[0].err = "training never started: " + QString::fromUtf8(rank0) +
                         QString::fromUtf8(ranks[0]->readAllStandardError());
        return results;
    }
    ::kill(static_cast<pid_t>(ranks[static_cast<std::size_t>(victim)]->processId()), signal);
    // --comm-timeout 5: a failure is reported within about 1.5 x 5 s; 60 s only bounds a hang.
    for (int r = 0; r < kWorld; ++r)
        if (r != victim) results[static_cast<std::size_t>(r)] = finish(*ranks[r], 60000);
    ranks[static_cast<std::size_t>(victim)]->kill(); // SIGKILL ends a stopped process too
    ranks[static_cast<std::size_t>(victim)]->waitForFinished();
    return results;
}

void TestGlooRun::aKilledRankIsNamedByTheOthers()
{
    const std::vector<Result> results = faultRun(2, SIGKILL);
    for (int r : {0, 1, 3}) {
        const Result &res = results[static_cast<std::size_t>(r)];
        QVERIFY2(res.exitCode == 1,
                 qPrintable(
                     QString("rank %1 exited with %2: %3").arg(r).arg(res.exitCode).arg(res.err)));
        QVERIFY2(res.err.contains("rank 2 is gone"), qPrintable(res.err));
    }
}

void TestGlooRun::aStoppedRankIsNamedByTheOthers()
{
    const std::vector<Result> results = faultRun(1, SIGSTOP);
    for (int r : {0, 2, 3}) {
        const Result &res = results[static_cast<std::size_t>(r)];
        QVERIFY2(res.exitCode == 1,
                 qPrintable(
                     QString("rank %1 exited with %2: %3").arg(r).arg(res.exitCode).arg(res.err)));
        QVERIFY2(res.err.contains("rank 1 stopped answering"), qPrintable(res.err));
    }
}

void TestGlooRun::glooWithoutALauncherSaysHowToStart()
{
    QProcess p;
    p.setProcessEnvironment(cleanEnvironment());
    p.start(m_program, kModel + QStringList{"--backend", "gloo", "--steps", "1"});
    const Result r = finish(p, 60000);
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains("scripts/launch -n N"), qPrintable(r.err));
}

void TestGlooRun::theLauncherStopsTheRestAndKeepsTheFailingStatus()
{
    QProcess p;
    p.setProcessEnvironment(cleanEnvironment());
    // Rank 1 fails; the others would sleep far longer than the wait below allows.
    p.start(m_launch,
            {"-n", "3", "sh", "-c",
             "echo \"up $RANK of $WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT local $LOCAL_RANK/"
             "$LOCAL_WORLD_SIZE job $TORCHELASTIC_RUN_ID\"; "
             "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 600"});
    const Result r = finish(p, 60000);
    QCOMPARE(r.exitCode, 3);
    for (int rank = 0; rank < 3; ++rank)
        QVERIFY2(QRegularExpression(QString(R"(\[rank %1\] up %1 of 3 at 127\.0\.0\.1:\d+ local )"
                                            R"(%1/3 job \S+)")
                                        .arg(rank))
                     .match(r.out)
                     .hasMatch(),
                 qPrintable(r.out));
    QVERIFY2(r.err.contains("rank 1 exited with status 3"), qPrintable(r.err));
}

void TestGlooRun::aRankOnAnotherPathIsNamedWithItsLine_data()
{
    QTest::addColumn<QString>("how");
    QTest::addColumn<int>("world");
    QTest::addColumn<int>("rank");
    QTest::addColumn<int>("step");
    // The records the capture prints ("" none: a healthy job) and a line that must be there.
    QTest::addColumn<QString>("record");
    QTest::addColumn<QString>("line");
    // After the last step, while the others wait in the final barrier. (Earlier, the gloo
    // collectives of ranks on different paths pair up; where their sizes differ gloo aborts
    // the process, docs/gloo.md.)
    QTest::newRow("extra-batch, 2 ranks") << "extra-batch" << 2 << 1 << 3 << "rank_stalled"
                                          << R"(    rank 1: \S*model\.cpp:\d+ in )";
    QTest::newRow("gathered, 3 ranks") << "gathered" << 3 << 0 << 3 << "rank_stalled"
                                       << R"(    rank 0: \S*trainer\.cpp:\d+ in )";
    QTest::newRow("slow, 3 ranks: a straggler") << "slow" << 3 << 2 << 2 << ""
                                                << "";
}

void TestGlooRun::aRankOnAnotherPathIsNamedWithItsLine()
{
    QFETCH(QString, how);
    QFETCH(int, world);
    QFETCH(int, rank);
    QFETCH(int, step);
    QFETCH(QString, record);
    QFETCH(QString, line);
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString socket = dir.filePath("engine.sock");
    QProcessEnvironment env = cleanEnvironment();
    env.insert("SHARDSCOPE_STALL_SECONDS", "1.5"); // the watchdogs' and the aligner's
    // Every rank waits for its capture before it builds the model; --comm-timeout ends the hang.
    QStringList model = kModel;
    model.removeAll("--no-listen");
    QProcess launched;
    launched.setProcessEnvironment(env);
    launched.start(m_launch, QStringList{"-n",
                                         QString::number(world),
                                         m_program,
                                         "--backend",
                                         "gloo",
                                         "--comm-timeout",
                                         "5",
                                         "--steps",
                                         "3",
                                         "--diverge",
                                         how,
                                         "--diverge-rank",
                                         QString::number(rank),

                                         "--diverge-step",
                                         QString::number(step),
                                         "--diverge-seconds",
                                         "0.5",
                                         "--listen",
                                         "unix:" + socket,
                                         "--wait-for-client=60"} +
                                 model);
    QStringList endpoints{"unix:" + socket};
    for (int r = 1; r < world; ++r)
        endpoints << "unix:" + socket + ".rank" + QString::number(r);
    for (int i = 0; i < 300; ++i) { // every rank listening (bounded: 30 s)
        bool all = true;
        for (int r = 0; r < world; ++r)
            all = all && QFile::exists(r == 0 ? socket : socket + ".rank" + QString::number(r));
        if (all) break;
        QThread::msleep(100);
    }
    QProcess capture;
    capture.setProcessEnvironment(env);
    capture.start(m_capture, {"--attach", endpoints.join(','), "--out", dir.filePath("job.json")});
    const Result captured = finish(capture, 90000);
    const Result job = finish(launched, 60000);
    const QString said = captured.out + captured.err;
    if (record.isEmpty()) {
        QVERIFY2(job.exitCode == 0, qPrintable(job.out + job.err));
        QVERIFY2(captured.exitCode == 0, qPrintable(said));
        QVERIFY2(!said.contains("rank_stalled") && !said.contains("collective_mismatch"),
                 qPrintable(said));
        // The rank that slept before its step's first gather: the latest, by about its sleep.
        const auto m =
            QRegularExpression(R"(^stragglers: \d+ collectives .* the latest: rank (\d+), )"
                               R"(last in \d+ of them, ([\d.]+) ms late in all$)",
                               QRegularExpression::MultilineOption)
                .match(said);
        QVERIFY2(m.hasMatch(), qPrintable(said));
        QCOMPARE(m.captured(1).toInt(), rank);
        QVERIFY2(m.captured(2).toDouble() >= 400.0, qPrintable(said));
        return;
    }
    // The ranks end when --comm-timeout ends the hang: the job failed, as it would have.
    QVERIFY2(job.exitCode != 0, qPrintable(job.out + job.err));
    QVERIFY2(captured.exitCode == 4, qPrintable(said));
    QVERIFY2(said.contains(QRegularExpression("^" + record + R"( \(group 0, #\d+, rank \d+\): )",
                                              QRegularExpression::MultilineOption)),
             qPrintable(said));
    // The diverged rank's own record, from its engine's watchdog, with its C++ line.
    QVERIFY2(said.contains(QRegularExpression(
                 QString(R"(^  rank_stalled \(group 0, #\d+, rank %1\): )").arg(rank),
                 QRegularExpression::MultilineOption)),
             qPrintable(said));
    QVERIFY2(said.contains(QRegularExpression("^" + line, QRegularExpression::MultilineOption)),
             qPrintable(said));
}

QTEST_GUILESS_MAIN(TestGlooRun)
#include "tst_gloorun.moc"

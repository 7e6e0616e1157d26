// The rank helpers' own promise (rankjob.h, processtree.h): a launch the test ends, at its
// timeout (finishRanks) or when the test ends first (a RankLaunch deleted, cleanup()), or
// whose test process is killed (a CTest timeout), leaves no rank alive, though scripts/launch
// starts each rank in a session of its own and the ranks ignore SIGTERM. The ranks' pids are
// read from what they wrote and looked up afterwards.

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QProcessEnvironment>
#include <QTemporaryDir>
#include <QTest>

#include <unistd.h>

#include "processtree.h"
#include "rankjob.h"

namespace {

// The pids the hanging ranks wrote (each rank's and its child's), once every rank wrote them;
// empty after 30 s.
std::vector<pid_t> rankPids(const QString &dir, int ranks)
{
    for (int waited = 0; waited < 30000; waited += 50) {
        std::vector<pid_t> pids;
        for (int r = 0; r < ranks; ++r) {
            QFile f(QStringLiteral("%1/rank%2.pids").arg(dir).arg(r));
            if (!f.open(QIODevice::ReadOnly)) break;
            const QList<QByteArray> words = f.readAll().trimmed().split(' ');
            if (words.size() != 2) break;
            for (const QByteArray &w : words)
                pids.push_back(static_cast<pid_t>(w.toInt()));
        }
        if (pids.size() == std::size_t(2 * ranks)) return pids;
        QThread::msleep(50);
    }
    return {};
}

// The pids among `pids` still alive after up to waitMs (an ended process is reaped by init).
QStringList alive(const std::vector<pid_t> &pids, int waitMs = 5000)
{
    QStringList left;
    for (int waited = 0; waited <= waitMs; waited += 50) {
        left.clear();
        for (pid_t pid : pids)
            if (shardscope::test::processAlive(pid)) left << QString::number(pid);
        if (left.isEmpty()) break;
        QThread::msleep(50);
    }
    return left;
}

// Two hanging ranks (hanging_rank.sh) under scripts/launch, through startRanks; grace: the
// launcher's --grace.
QProcess *launchHanging(const QString &dir, QObject *parent, int grace = 60)
{
    return shardscope::test::startRanks(
        parent, QProcessEnvironment::systemEnvironment(), QStringLiteral(SHARDSCOPE_LAUNCH),
        QStringLiteral("/bin/bash"), QStringLiteral(SHARDSCOPE_HANGING_RANK), {dir}, dir,
        QStringLiteral("0.1"), 2, grace);
}

} // namespace

class TestRankJob : public QObject
{
    Q_OBJECT

  private slots:
    // finishRanks past its timeout: the launch and both ranks (and what they started) end.
    void timedOutLaunchLeavesNoRank()
    {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        QProcess *p = launchHanging(dir.path(), this);
        const std::vector<pid_t> pids = rankPids(dir.path(), 2);
        QCOMPARE(pids.size(), std::size_t(4));
        for (pid_t pid : pids)
            QVERIFY2(shardscope::test::processAlive(pid), qPrintable(QString::number(pid)));
        const shardscope::test::ProcessRun r = shardscope::test::finishRanks(p, 1000);
        QCOMPARE(r.exitCode, -1); // ended, not finished
        QVERIFY(r.timedOut && !r.finished());
        const QStringList left = alive(pids);
        QVERIFY2(left.isEmpty(), qPrintable("still alive: " + left.join(' ')));
    }

    // A test that returns before it finishes its launch (a failed QVERIFY): cleanup()'s
    // endRankLaunches ends the launch it left, with its ranks.
    void abandonedLaunchEndsWithTheTest()
    {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        QObject test;
        QProcess *p = launchHanging(dir.path(), &test);
        const std::vector<pid_t> pids = rankPids(dir.path(), 2);
        QCOMPARE(pids.size(), std::size_t(4));
        const auto launch = static_cast<pid_t>(p->processId());
        shardscope::test::endRankLaunches(&test);
        QVERIFY(test.findChildren<QProcess *>().isEmpty());
        const QStringList left = alive(pids);
        QVERIFY2(left.isEmpty(), qPrintable("still alive: " + left.join(' ')));
        QVERIFY(!shardscope::test::processAlive(launch));
    }

    // The test process killed (SIGKILL, as CTest ends a test past its timeout: no destructor
    // runs): the launcher, told by the kernel (PR_SET_PDEATHSIG), stops the ranks, and SIGKILLs
    // them after its --grace (1 s here) since they ignore SIGTERM.
    void killedTestLeavesNoRank()
    {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        QProcess test; // this executable, holding a launch (main, TST_RANKJOB_HOLD)
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("TST_RANKJOB_HOLD", dir.path());
        test.setProcessEnvironment(env);
        test.start(QCoreApplication::applicationFilePath(), {});
        QVERIFY(test.waitForStarted());
        const std::vector<pid_t> pids = rankPids(dir.path(), 2);
        QCOMPARE(pids.size(), std::size_t(4));
        test.kill();
        QVERIFY(test.waitForFinished(5000));
        const QStringList left = alive(pids, 15000);
        QVERIFY2(left.isEmpty(), qPrintable("still alive: " + left.join(' ')));
    }
};

int main(int argc, char **argv)
{
    if (const QString hold = qEnvironmentVariable("TST_RANKJOB_HOLD"); !hold.isEmpty()) {
        QCoreApplication app(argc, argv); // a test that started a launch and hangs
        QProcess *p = launchHanging(hold, &app, 1);
        if (!p->waitForStarted()) return 1;
        for (;;)
            ::pause();
    }
    QCoreApplication app(argc, argv);
    TestRankJob test;
    return QTest::qExec(&test, argc, argv);
}
#include "tst_rankjob.moc"

// The inspector attached to a whole job of real shardscope-train --backend gloo processes
// (a process per rank, torchrun's environment, discovery files in a private runtime
// directory): one window shows every rank (tree, timeline lanes, partition map, memory);
// the attach dialog groups the processes into a job row; a rank killed with SIGKILL is
// marked lost and keeps its data while the others go on; a rank stopped with SIGSTOP is
// marked not answering; an unreachable endpoint is named and the others attached; a
// process whose clock runs 7 s ahead is mapped onto the job's timeline.

#include <QtTest>

#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QProcess>
#include <QTableWidget>
#include <QTcpServer>
#include <QTemporaryDir>

#include <csignal>
#include <memory>
#include <set>
#include <vector>

#include "mainwindow.h"
#include "models/moduletreemodel.h"
#include "session/jobsession.h"
#include "views/attachdialog.h"
#include "views/gathertimeline.h"
#include "views/moduletreeview.h"
#include "views/partitionmap.h"
#include "wire/discovery.h"
#include "wire/snapshot.h"

using namespace shardscope;

namespace {

const QStringList kModel = {"--layers", "1",  "--hidden", "35", "--groups", "5", "--seq", "16",
                            "--batch",  "12", "--kernel", "4",  "--vocab",  "97"};

// The ranks of one job, started with torchrun's environment; killed when it goes.
struct Job
{
    std::vector<std::unique_ptr<QProcess>> ranks;
    QString name;
    ~Job()
    {
        for (auto &p : ranks)
            p->kill(); // SIGKILL ends a stopped process too
        for (auto &p : ranks)
            p->waitForFinished(5000);
    }
    qint64 pid(int r) const { return ranks[static_cast<std::size_t>(r)]->processId(); }
};

std::size_t laneSize(const session::SessionStore &s, int r)
{
    return r < s.laneCount() ? s.lane(r).size() : 0;
}

// The timestamp of rank r's StepBegin of `step`, or 0.
std::uint64_t stepBeginTs(const session::SessionStore &s, int r, std::uint32_t step)
{
    if (r >= s.laneCount()) return 0;
    const session::EventLane &lane = s.lane(r);
    for (std::size_t i = 0; i < lane.size(); ++i) {
        const telemetry::Event e = lane.at(i);
        if (e.type == EventType::StepBegin && e.step == step) return e.tsNs;
    }
    return 0;
}

} // namespace

class TestJobAttach : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase();
    void oneWindowShowsEveryRankOfTheJob();
    void aKilledRankIsLostAndKeepsItsData();
    void aStoppedRankIsShownNotAnswering();
    void quitWithAStoppedRankWritesWhatItHasAndSaysSo();
    void clocksAreMappedAndAnUnreachableProcessIsNamed();
    void aJobFromItsRankFiles();

  private:
    // Starts `world` ranks (env: extra variables per rank) and waits until each has written
    // its discovery file.
    void startJob(Job &job, int world, const QString &name,
                  const std::vector<QStringList> &extraEnv = {},
                  const QStringList &run = {"--steps", "1000000", "--comm-timeout", "6"});

    QString m_program;
    QTemporaryDir m_runtime;
};

void TestJobAttach::initTestCase()
{
    const QString bin = qEnvironmentVariable("SHARDSCOPE_BIN_DIR");
    QVERIFY2(!bin.isEmpty(), "SHARDSCOPE_BIN_DIR is not set; run the test through ctest");
    m_program = bin + "/shardscope-train";
    QVERIFY2(QFile::exists(m_program), qPrintable(m_program + " does not exist"));
    QVERIFY(m_runtime.isValid());
    QFile::setPermissions(m_runtime.path(), QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
}

void TestJobAttach::startJob(Job &job, int world, const QString &name,
                             const std::vector<QStringList> &extraEnv, const QStringList &run)
{
    job.name = name;
    QTcpServer probe; // a free port for rank 0's rendezvous, released just before use
    probe.listen(QHostAddress::LocalHost);
    const QString port = QString::number(probe.serverPort());
    probe.close();
    for (int r = 0; r < world; ++r) {
        auto p = std::make_unique<QProcess>();
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.remove("SHARDSCOPE_TEST_CLOCK_OFFSET_NS");
        env.insert("TORCHELASTIC_RUN_ID", name); // the job's name, as torchrun sets it
        env.insert("RANK", QString::number(r));
        env.insert("LOCAL_RANK", QString::number(r));
        env.insert("WORLD_SIZE", QString::number(world));
        env.insert("MASTER_ADDR", "127.0.0.1");
        env.insert("MASTER_PORT", port);
        env.insert("XDG_RUNTIME_DIR", m_runtime.path());
        if (static_cast<std::size_t>(r) < extraEnv.size())
            for (const QString &kv : extraEnv[static_cast<std::size_t>(r)])
                env.insert(kv.section('=', 0, 0), kv.section('=', 1));
        p->setProcessEnvironment(env);
        p->setProcessChannelMode(QProcess::ForwardedErrorChannel);
        p->setStandardOutputFile(QProcess::nullDevice());
        p->start(m_program, kModel + QStringList{"--backend", "gloo"} + run);
        QVERIFY(p->waitForStarted(10000));
        job.ranks.push_back(std::move(p));
    }
    const std::string dir = (m_runtime.path() + "/shardscope").toStdString();
    QTRY_VERIFY_WITH_TIMEOUT(
        [&] {
            int n = 0;
            for (const auto &e : wire::listLiveEngines(dir))
                n += e.job.id == name.toStdString();
            return n == world;
        }(),
        30000);
}

void TestJobAttach::oneWindowShowsEveryRankOfTheJob()
{
    Job job;
    startJob(job, 3, "three");
    const QString dir = m_runtime.path() + "/shardscope";

    // The attach dialog shows the job as one row above its three processes.
    {
        views::AttachDialog dialog(dir);
        QCOMPARE(dialog.engineCount(), 3);
        QCOMPARE(dialog.jobCount(), 1);
        QTableWidget *t = dialog.enginesTable();
        QCOMPARE(t->rowCount(), 4);
        QCOMPARE(t->item(0, 5)->text(), QStringLiteral("job:three"));
        QVERIFY2(t->item(0, 6)->text().startsWith(QStringLiteral("3 of 3 ranks live")),
                 qPrintable(t->item(0, 6)->text()));
        for (int r = 0; r < 3; ++r)
            QVERIFY2(t->item(r + 1, 6)->text().startsWith(QStringLiteral("rank %1").arg(r)),
                     qPrintable(t->item(r + 1, 6)->text()));
        QCOMPARE(dialog.endpoint(), QStringLiteral("job:three")); // one click attaches the job
    }

    app::MainWindow w;
    w.show();
    QCOMPARE(w.attach(QStringLiteral("job:three"), {}, dir), QString());
    QVERIFY(w.attachedToJob());
    session::JobSession *session = w.jobSession();
    QCOMPARE(session->processCount(), 3);
    session::SessionStore *store = w.store();
    QTRY_VERIFY_WITH_TIMEOUT(store->hasState() && store->state().localRanks.size() == 3 &&
                                 laneSize(*store, 0) > 0 && laneSize(*store, 1) > 0 &&
                                 laneSize(*store, 2) > 0 && session->caughtUp(),
                             30000);
    QCOMPARE(store->worldSize(), 3);
    QCOMPARE(store->state().localRanks, (std::vector<int>{0, 1, 2}));
    for (int i = 0; i < 3; ++i) {
        QCOMPARE(session->ranks(i), std::vector<int>{i});
        QCOMPARE(session->health(i), session::JobSession::Health::Live);
    }
    // Events land in the lane of the global rank that emitted them.
    for (int r = 0; r < 3; ++r)
        QCOMPARE(int(store->lane(r).at(0).rank), r);
    QVERIFY2(session->summary().contains(QStringLiteral("job three: 3 of 3 ranks live")),
             qPrintable(session->summary()));
    // Every view shows every rank: the tree (a model over the merged state), the timeline's
    // lanes, the partition map and memory per rank.
    QTRY_VERIFY(w.tree()->model()->rowCount() > 0);
    for (const state::ParamRecord &p : store->state().params)
        QCOMPARE(p.status.size(), std::size_t(3));
    auto *timeline = w.findChild<views::GatherTimeline *>();
    QVERIFY(timeline);
    QTRY_COMPARE_WITH_TIMEOUT(timeline->laneCount(), 3, 10000);
    auto *partition = w.findChild<views::PartitionMap *>();
    QVERIFY(partition);
    QTRY_COMPARE_WITH_TIMEOUT(partition->worldSize(), 3, 10000);
    QTRY_VERIFY_WITH_TIMEOUT(store->memory().size() >= 3 && store->memory()[0].tsNs > 0 &&
                                 store->memory()[1].tsNs > 0 && store->memory()[2].tsNs > 0,
                             10000);
    QVERIFY(w.windowTitle().contains(QStringLiteral("job:three")));

    // The app itself: shardscope --attach job:NAME exports one snapshot of the whole job.
    QTemporaryDir out;
    const QString file = out.filePath("job.json");
    QProcess app;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("XDG_RUNTIME_DIR", m_runtime.path());
    app.setProcessEnvironment(env);
    app.setProcessChannelMode(QProcess::MergedChannels);
    app.start(QFileInfo(m_program).dir().filePath("shardscope"),
              {"--attach", "job:three", "--after-step", QString::number(store->completedStep() + 2),
               "--export-snapshot", file, "--quit"});
    QVERIFY(app.waitForFinished(60000));
    const QString said = QString::fromUtf8(app.readAll());
    QVERIFY2(app.exitCode() == 0, qPrintable(said));
    auto snap = wire::readSnapshotFile(file.toStdString());
    QVERIFY2(snap, snap ? "" : snap.error().c_str());
    QCOMPARE(snap->state.worldSize, 3);
    QCOMPARE(snap->state.localRanks, (std::vector<int>{0, 1, 2}));
    std::set<int> ranksSeen;
    for (const telemetry::Event &e : snap->events)
        ranksSeen.insert(e.rank);
    QCOMPARE(ranksSeen, (std::set<int>{0, 1, 2}));
}

void TestJobAttach::aKilledRankIsLostAndKeepsItsData()
{
    Job job;
    startJob(job, 3, "killed");
    app::MainWindow w;
    QCOMPARE(w.attach(QStringLiteral("job:killed"), {}, m_runtime.path() + "/shardscope"),
             QString());
    session::JobSession *session = w.jobSession();
    session::SessionStore *store = w.store();
    QTRY_VERIFY_WITH_TIMEOUT(store->hasState() && store->completedStep() >= 3 &&
                                 laneSize(*store, 1) > 0 && session->caughtUp(),
                             30000);
    // caughtUp() says every state arrived, not that the store has merged them yet: it merges a
    // job's states at most every 100 ms. Rank 1's part must be shown before it can be kept.
    QTRY_COMPARE_WITH_TIMEOUT(store->state().localRanks, (std::vector<int>{0, 1, 2}), 10000);
    const auto before = laneSize(*store, 1);
    ::kill(static_cast<pid_t>(job.pid(1)), SIGKILL);
    QTRY_COMPARE_WITH_TIMEOUT(session->health(1), session::JobSession::Health::Lost, 10000);
    // The others are not lost with it (they fail later, naming rank 1, within --comm-timeout).
    QVERIFY(session->health(0) != session::JobSession::Health::Lost);
    QVERIFY(session->health(2) != session::JobSession::Health::Lost);
    const QString line = session->processLine(1);
    QVERIFY2(line.startsWith(QStringLiteral("rank 1 lost: connection closed at step ")),
             qPrintable(line));
    QVERIFY2(session->summary().contains(QStringLiteral("2 of 3 ranks live")) ||
                 session->summary().contains(QStringLiteral("rank 1 lost")),
             qPrintable(session->summary()));
    QVERIFY(session->anyProblem());
    // Nothing received from rank 1 is lost: its lane and its part of the state stay.
    QVERIFY(laneSize(*store, 1) >= before);
    QCOMPARE(store->state().localRanks, (std::vector<int>{0, 1, 2}));
    // The ranks that go on end by themselves, naming rank 1; their data stays too.
    QTRY_VERIFY_WITH_TIMEOUT(session->allDone(), 30000);
    QVERIFY(laneSize(*store, 0) > 0 && laneSize(*store, 2) > 0);
    // The merge of their last states, sent after the loss, still holds rank 1's part.
    store->mergeSources();
    QCOMPARE(store->state().localRanks, (std::vector<int>{0, 1, 2}));
    for (int i : {0, 2})
        QVERIFY2(session->processLine(i).contains(QStringLiteral("rank 1")),
                 qPrintable(session->processLine(i)));
}

void TestJobAttach::aStoppedRankIsShownNotAnswering()
{
    Job job;
    startJob(job, 3, "stopped");
    app::MainWindow w;
    w.jobSession()->setSilenceTimeoutMs(2500);
    QCOMPARE(w.attach(QStringLiteral("job:stopped"), {}, m_runtime.path() + "/shardscope"),
             QString());
    session::JobSession *session = w.jobSession();
    session::SessionStore *store = w.store();
    QTRY_VERIFY_WITH_TIMEOUT(store->hasState() && store->completedStep() >= 3 &&
                                 laneSize(*store, 2) > 0 && session->caughtUp(),
                             30000);
    const auto before = laneSize(*store, 2);
    ::kill(static_cast<pid_t>(job.pid(2)), SIGSTOP);
    QTRY_COMPARE_WITH_TIMEOUT(session->health(2), session::JobSession::Health::Silent, 15000);
    const QString line = session->processLine(2);
    QVERIFY2(line.startsWith(QStringLiteral("rank 2 not answering")), qPrintable(line));
    // The others still answer (their servers send heartbeats while training waits).
    QVERIFY(session->health(0) != session::JobSession::Health::Silent);
    QVERIFY(session->health(1) != session::JobSession::Health::Silent);
    QVERIFY(laneSize(*store, 2) >= before);
    // Past --comm-timeout the others fail, naming rank 2.
    QTRY_VERIFY_WITH_TIMEOUT(session->health(0) != session::JobSession::Health::Live &&
                                 session->health(1) != session::JobSession::Health::Live,
                             30000);
    QVERIFY2(session->processLine(0).contains(QStringLiteral("rank 2")),
             qPrintable(session->processLine(0)));
    QCOMPARE(session->health(2), session::JobSession::Health::Silent);
}

// Issue #30, defects 9 and 10: `shardscope --attach job:X --quit` with a rank stopped
// (SIGSTOP) exited 0 with that rank simply absent, or, when the job could not advance
// without it, waited its whole --timeout, exited 1 and wrote nothing. A process not
// answering now keeps the job from counting as caught up, and once it has been silent for
// the silence timeout the app writes what it has, names it, and exits 3.
void TestJobAttach::quitWithAStoppedRankWritesWhatItHasAndSaysSo()
{
    Job job;
    startJob(job, 2, "halted");
    ::kill(static_cast<pid_t>(job.pid(1)), SIGSTOP); // before the app attaches
    QTemporaryDir out;
    const QString file = out.filePath("halted.json");
    QProcess app;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("XDG_RUNTIME_DIR", m_runtime.path());
    env.insert("QT_QPA_PLATFORM", "offscreen");
    app.setProcessEnvironment(env);
    app.setProcessChannelMode(QProcess::MergedChannels);
    QElapsedTimer t;
    t.start();
    app.start(QFileInfo(m_program).dir().filePath("shardscope"),
              {"--attach", "job:halted", "--after-step", "1", "--timeout", "45",
               "--export-snapshot", file, "--quit"});
    QVERIFY(app.waitForFinished(60000));
    const QString said = QString::fromUtf8(app.readAll());
    QVERIFY2(app.exitCode() == 3, qPrintable(said));
    QVERIFY2(t.elapsed() < 30000, qPrintable(QString::number(t.elapsed())));
    QVERIFY2(said.contains("the job is incomplete at step") && said.contains("rank 1") &&
                 said.contains("(stopped or hung) before the condition was met"),
             qPrintable(said));
    auto snap = wire::readSnapshotFile(file.toStdString());
    QVERIFY2(snap, snap ? "" : snap.error().c_str());
    QCOMPARE(snap->state.worldSize, 2);
}

void TestJobAttach::clocksAreMappedAndAnUnreachableProcessIsNamed()
{
    constexpr qint64 kOffset = 7'000'000'000; // rank 1's clock runs 7 s ahead
    Job job;
    startJob(job, 2, "clock",
             {{}, {QStringLiteral("SHARDSCOPE_TEST_CLOCK_OFFSET_NS=%1").arg(kOffset)}});
    std::vector<session::JobTarget> targets;
    QString name;
    QCOMPARE(session::JobSession::resolve(QStringLiteral("job:clock"), targets, name,
                                          m_runtime.path() + "/shardscope"),
             QString());
    QCOMPARE(targets.size(), std::size_t(2));
    const QString missing = "unix:" + m_runtime.path() + "/nobody-listens.sock";
    app::MainWindow w;
    QCOMPARE(w.attach(targets[0].endpoint + "," + targets[1].endpoint + "," + missing, {}),
             QString());
    session::JobSession *session = w.jobSession();
    session::SessionStore *store = w.store();
    QCOMPARE(session->processCount(), 3);
    QTRY_VERIFY_WITH_TIMEOUT(store->hasState() && store->completedStep() >= 4 &&
                                 session->health(0) == session::JobSession::Health::Live &&
                                 session->health(1) == session::JobSession::Health::Live,
                             30000);
    // The endpoint nobody serves is named; the two others are attached.
    QTRY_COMPARE_WITH_TIMEOUT(session->health(2), session::JobSession::Health::Unreachable, 10000);
    QVERIFY2(session->summary().contains(QStringLiteral("unreachable")),
             qPrintable(session->summary()));
    QVERIFY2(session->summary().contains(QStringLiteral("2 of 2 ranks live")),
             qPrintable(session->summary()));

    // Rank 1's timestamps are shifted by the measured offset onto rank 0's timeline, within
    // the measured uncertainty (plus the time the probe takes to be answered).
    const wire::ClockShift s0 = session->clockShift(0);
    const wire::ClockShift s1 = session->clockShift(1);
    QVERIFY(s0.known && s1.known);
    const qint64 relative = s1.shiftNs - s0.shiftNs;
    const qint64 error = std::abs(relative - kOffset);
    QVERIFY2(error <= static_cast<qint64>(s0.uncertaintyNs + s1.uncertaintyNs) + 2'000'000,
             qPrintable(QStringLiteral("shift %1 ns, uncertainty %2 ns")
                            .arg(relative)
                            .arg(s0.uncertaintyNs + s1.uncertaintyNs)));
    QVERIFY(!(s0.sharedClock && s1.sharedClock));
    QVERIFY2(session->details().contains(QStringLiteral("±")), qPrintable(session->details()));
    // Both ranks begin step 3 together (gloo's collectives keep them in step): on the mapped
    // timeline within a fraction of a second, where the raw clocks are 7 s apart. The step
    // reached above may be rank 0's alone: rank 1's events can still be on their way.
    QTRY_VERIFY_WITH_TIMEOUT(stepBeginTs(*store, 0, 3) != 0 && stepBeginTs(*store, 1, 3) != 0,
                             10000);
    const std::uint64_t t0 = stepBeginTs(*store, 0, 3);
    const std::uint64_t t1 = stepBeginTs(*store, 1, 3);
    const qint64 apart = std::abs(static_cast<qint64>(t1 - t0));
    QVERIFY2(apart < 500'000'000,
             qPrintable(QStringLiteral("step 3 begins %1 ns apart").arg(apart)));
}

QTEST_MAIN(TestJobAttach)
// Issue 53: the snapshot files a job's rank processes wrote (run.rank{rank}.json, what a user
// has after a multi-node job died) open as one job, merged as a live job is: in the window
// (every rank's lane and statuses), from the command line (shardscope FILE FILE, exported), in
// shardscope-capture --open; two files of one rank are refused, naming them.
void TestJobAttach::aJobFromItsRankFiles()
{
    QTemporaryDir out;
    const QString pattern = out.filePath("run.rank{rank}.json");
    {
        Job job;
        startJob(job, 2, "files", {}, {"--steps", "3", "--snapshot-out", pattern});
        for (auto &p : job.ranks) {
            QVERIFY(p->waitForFinished(60000));
            QCOMPARE(p->exitCode(), 0);
        }
    }
    const QString f0 = out.filePath("run.rank0.json"), f1 = out.filePath("run.rank1.json");
    QVERIFY(QFile::exists(f0) && QFile::exists(f1));

    app::MainWindow w;
    QCOMPARE(w.openSnapshots({f1, f0}), QString());
    session::SessionStore *store = w.store();
    QVERIFY(store->hasState());
    QCOMPARE(store->worldSize(), 2);
    QCOMPARE(store->state().localRanks, (std::vector<int>{0, 1}));
    QVERIFY(laneSize(*store, 0) > 0 && laneSize(*store, 1) > 0);
    QCOMPARE(int(store->lane(1).at(0).rank), 1);
    for (const state::ParamRecord &p : store->state().params)
        QCOMPARE(p.status.size(), std::size_t(2));
    QVERIFY2(w.openSnapshots({f0, f0}).contains(QStringLiteral("both hold rank 0")),
             qPrintable(w.openSnapshots({f0, f0})));

    const QString bin = QFileInfo(m_program).dir().path();
    QProcess app;
    app.setProcessChannelMode(QProcess::MergedChannels);
    const QString exported = out.filePath("job.json");
    app.start(bin + "/shardscope", {f0, f1, "--export-snapshot", exported, "--quit"});
    QVERIFY(app.waitForFinished(60000));
    QVERIFY2(app.exitCode() == 0, app.readAll().constData());
    QProcess capture;
    capture.setProcessChannelMode(QProcess::MergedChannels);
    const QString captured = out.filePath("captured.json");
    capture.start(bin + "/shardscope-capture", {"--open", f0, "--open", f1, "--out", captured});
    QVERIFY(capture.waitForFinished(60000));
    const QString said = QString::fromUtf8(capture.readAll());
    QVERIFY2(capture.exitCode() == 0 &&
                 said.contains(QStringLiteral("opened 2 snapshot files of one job: ranks 0-1")),
             qPrintable(said));
    for (const QString &file : {exported, captured}) {
        auto snap = wire::readSnapshotFile(file.toStdString());
        QVERIFY2(snap, snap ? "" : snap.error().c_str());
        QCOMPARE(snap->state.worldSize, 2);
        QCOMPARE(snap->state.localRanks, (std::vector<int>{0, 1}));
        std::set<int> ranksSeen;
        for (const telemetry::Event &e : snap->events)
            ranksSeen.insert(e.rank);
        QCOMPARE(ranksSeen, (std::set<int>{0, 1}));
        QCOMPARE(snap->state.violations.size(), store->state().violations.size());
    }
    capture.start(bin + "/shardscope-capture", {"--open", f0, "--open", f0, "--out", captured});
    QVERIFY(capture.waitForFinished(60000));
    QCOMPARE(capture.exitCode(), 1);
    QVERIFY(QString::fromUtf8(capture.readAll()).contains(QStringLiteral("both hold rank 0")));
}

#include "tst_jobattach.moc"

// The promises of processrun.h and pythonrun.h that every suite running a program relies on:
// what a finished child printed and how it ended; a child that never started or ran past its
// time, told apart from one that failed; the time limit ending a child's whole tree where
// asked (a check's ranks in sessions of their own); the Python environment's variables and
// the line a marker names. Plain shell children: no Python needed.

#include <QFile>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <QTest>

#include "processrun.h"
#include "processtree.h"
#include "pythonrun.h"

using shardscope::test::ProcessRun;
using shardscope::test::RunOptions;
using shardscope::test::runProcess;

class TestProcessRun : public QObject
{
    Q_OBJECT

  private slots:
    void finishedChildSaysWhatItPrinted()
    {
        const ProcessRun r =
            runProcess("/bin/sh", {"-c", "echo said; echo complained >&2; exit 3"});
        QVERIFY(r.started && !r.timedOut && r.finished());
        QCOMPARE(r.exitCode, 3);
        QCOMPARE(r.out, QString("said\n"));
        QCOMPARE(r.err, QString("complained\n"));
    }

    void environmentAndFolderAreTheChilds()
    {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        RunOptions options;
        options.environment.insert("SHARDSCOPE_TEST_WORD", "given");
        options.workingDirectory = dir.path();
        const ProcessRun r =
            runProcess("/bin/sh", {"-c", "echo $SHARDSCOPE_TEST_WORD; pwd -P"}, options);
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.out, "given\n" + QDir(dir.path()).canonicalPath() + "\n");
    }

    void missingProgramNeverStarted()
    {
        const ProcessRun r = runProcess("/nonexistent/program", {});
        QVERIFY(!r.started && !r.timedOut && !r.finished());
        QCOMPARE(r.exitCode, -1);
        QVERIFY2(r.err.contains("/nonexistent/program did not start"), qPrintable(r.err));
    }

    void crashIsNoExitCode()
    {
        const ProcessRun r = runProcess("/bin/sh", {"-c", "kill -SEGV $$"});
        QVERIFY(r.finished());
        QCOMPARE(r.exitCode, -1);
    }

    // Past its time a child is ended and says so; with endTree a grandchild in a session of
    // its own (as scripts/launch and shardscope-check start ranks) ends too.
    void timeoutEndsTheChild_data()
    {
        QTest::addColumn<bool>("endTree");
        QTest::newRow("the child alone") << false;
        QTest::newRow("its whole tree") << true;
    }

    void timeoutEndsTheChild()
    {
        QFETCH(bool, endTree);
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        const QString pidFile = dir.filePath("grandchild.pid");
        RunOptions options;
        options.timeoutMs = 1000;
        options.endTree = endTree;
        const ProcessRun r = runProcess(
            "/bin/sh", {"-c", "setsid sleep 300 & echo $! > " + pidFile + "; echo started; wait"},
            options);
        QVERIFY(r.started && r.timedOut && !r.finished());
        QCOMPARE(r.exitCode, -1);
        QCOMPARE(r.out, QString("started\n")); // what it printed before it was ended
        QVERIFY2(r.err.contains("did not finish in 1 s; it was ended"), qPrintable(r.err));
        QFile f(pidFile);
        QVERIFY(f.open(QIODevice::ReadOnly));
        const pid_t grandchild = static_cast<pid_t>(f.readAll().trimmed().toInt());
        QVERIFY(grandchild > 0);
        if (endTree) {
            QVERIFY(!shardscope::test::processAlive(grandchild));
        } else {
            // The reason endTree exists: killing the child alone leaves it running.
            QVERIFY(shardscope::test::processAlive(grandchild));
            shardscope::test::endProcessTree(grandchild);
        }
    }

    void pythonEnvironmentHasThePackageAndNoToken()
    {
        qputenv("SHARDSCOPE_TOKEN", "secret");
        qputenv("SHARDSCOPE_DS_PATH", "/ds/release");
        qputenv("SHARDSCOPE_TORCH_EXTENSIONS", "/ops/cache");
        const auto restore = qScopeGuard([] {
            qunsetenv("SHARDSCOPE_TOKEN");
            qunsetenv("SHARDSCOPE_DS_PATH");
            qunsetenv("SHARDSCOPE_TORCH_EXTENSIONS");
        });
        const QProcessEnvironment env = shardscope::test::pythonEnvironment("/build/python");
        QCOMPARE(env.value("PYTHONPATH"), QString("/build/python"));
        QCOMPARE(env.value("OMP_NUM_THREADS"), QString("1"));
        QVERIFY(!env.contains("SHARDSCOPE_TOKEN"));
        QVERIFY(!env.contains("TORCH_EXTENSIONS_DIR"));
        const QProcessEnvironment ds = shardscope::test::deepSpeedEnvironment("/build/python");
        QCOMPARE(ds.value("PYTHONPATH"), QString("/ds/release:/build/python"));
        QCOMPARE(ds.value("TORCH_EXTENSIONS_DIR"), QString("/ops/cache"));
        QVERIFY(!ds.contains("SHARDSCOPE_TOKEN"));
    }

    void interpreterOverride()
    {
        qunsetenv("SHARDSCOPE_TEST_PYTHON");
        QCOMPARE(shardscope::test::pythonInterpreter("/venv/python", "SHARDSCOPE_TEST_PYTHON"),
                 QString("/venv/python"));
        qputenv("SHARDSCOPE_TEST_PYTHON", "/other/python");
        QCOMPARE(shardscope::test::pythonInterpreter("/venv/python", "SHARDSCOPE_TEST_PYTHON"),
                 QString("/other/python"));
        QCOMPARE(shardscope::test::pythonInterpreter("/venv/python"), QString("/venv/python"));
        qunsetenv("SHARDSCOPE_TEST_PYTHON");
    }

    void lineOfAMarker()
    {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        QFile f(dir.filePath("script.py"));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write("import torch\n\nx = 1  # story: here\ny = 2  # story: here\n");
        f.close();
        QCOMPARE(shardscope::test::lineOf(f.fileName(), "# story: here"), 3); // the first
        QCOMPARE(shardscope::test::lineOf(f.fileName(), "# story: nowhere"), -1);
        QCOMPARE(shardscope::test::lineOf(dir.filePath("missing.py"), "import"), -1);
    }

    void missingNativeModuleIsSaid()
    {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        QVERIFY(QDir(dir.path()).mkpath("shardscope"));
        QVERIFY(shardscope::test::nativeModuleMissing(dir.path()).contains("was not built"));
        QFile so(dir.filePath("shardscope/_native.cpython-311-x86_64-linux-gnu.so"));
        QVERIFY(so.open(QIODevice::WriteOnly));
        so.close();
        QCOMPARE(shardscope::test::nativeModuleMissing(dir.path()), QString());
    }

    // The probe (a shell stands in for Python: `-c code`): its failure says what cannot be
    // done and what the probe printed; its success is no reason, and hands back its run.
    void prerequisiteProbe()
    {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        QVERIFY(QDir(dir.path()).mkpath("shardscope"));
        const QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        QVERIFY(shardscope::test::pythonPrerequisiteMissing("/bin/sh", dir.path(), env, "exit 0",
                                                            "import x")
                    .contains("was not built"));
        QFile so(dir.filePath("shardscope/_native.so"));
        QVERIFY(so.open(QIODevice::WriteOnly));
        so.close();
        QCOMPARE(
            shardscope::test::pythonPrerequisiteMissing("/bin/sh", dir.path(), env,
                                                        "echo no module named x >&2; exit 1",
                                                        "import x (scripts/deps installs it)"),
            QString("/bin/sh cannot import x (scripts/deps installs it): no module named x\n"));
        ProcessRun probe;
        QCOMPARE(shardscope::test::pythonPrerequisiteMissing("/bin/sh", dir.path(), env,
                                                             "echo 2.13.0", "import x", &probe),
                 QString());
        QCOMPARE(probe.out, QString("2.13.0\n"));
    }
};

QTEST_GUILESS_MAIN(TestProcessRun)
#include "tst_processrun.moc"

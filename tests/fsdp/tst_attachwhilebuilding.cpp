// Issue #49, defect 8: attaching to a job while its ranks build the model, on real ranks of a
// Transformers job (tests/fsdp/slow_build.py through scripts/launch: T5ForConditionalGeneration
// under FSDP2). Rank 0 has named its model and waits in its first all-gather; rank 1 is still
// between fully_shard on its T5Blocks and on the model, announcing a provisional name. Then
// shardscope-capture --list prints the job with the model the user built (its class: not a
// block's, not fully_shard's FSDP<Class>) and the argument that attaches it; the inspector and
// shardscope-capture attached with that argument during the build hold both ranks once the
// job trains. Before, the inspector refused one rank as "not one job" (the ranks' model names
// differed), and --list named the model T5Block.

#include <QtTest>

#include <functional>
#include <optional>

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QTemporaryDir>

#include <nlohmann/json.hpp>

#include "prerequisite.h"
#include "pythonrun.h"
#include "rankjob.h"
#include "snapshotquery.h"

using json = nlohmann::json;
using shardscope::test::readJson;

namespace {

const QString kModel = QStringLiteral("T5ForConditionalGeneration");

QString python()
{
    return shardscope::test::pythonInterpreter(QStringLiteral(SHARDSCOPE_PYTHON_EXE),
                                               "SHARDSCOPE_FSDP_PYTHON");
}

// Reads what a process printed on stdout until `done` holds of all of it, or timeoutMs.
QString readUntil(QProcess &p, const std::function<bool(const QString &)> &done, int timeoutMs)
{
    QString said;
    QElapsedTimer t;
    t.start();
    while (!done(said) && t.elapsed() < timeoutMs &&
           (p.state() != QProcess::NotRunning || p.bytesAvailable() > 0)) {
        p.waitForReadyRead(200);
        said += QString::fromUtf8(p.readAllStandardOutput());
    }
    return said;
}

} // namespace

class TestAttachWhileBuilding : public QObject
{
    Q_OBJECT

  private slots:
    void initTestCase()
    {
        QVERIFY(m_dir.isValid());
        QFile::setPermissions(m_dir.path(), QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
        m_env = shardscope::test::pythonEnvironment(QStringLiteral(SHARDSCOPE_PYTHON_DIR));
        m_env.insert("XDG_RUNTIME_DIR", m_dir.path());
        m_skip = shardscope::test::pythonPrerequisiteMissing(
            python(), QStringLiteral(SHARDSCOPE_PYTHON_DIR), m_env,
            "from torch.distributed.fsdp import fully_shard; "
            "from transformers import T5ForConditionalGeneration",
            "import torch's FSDP2 and Transformers' T5 (scripts/deps installs both)");
        // A skip would hide what scripts/deps failed to install: it fails unless asked for
        // (tests/support/prerequisite.h, as tst_fsdpagent).
        if (const QString refused = shardscope::test::refusedSkip({"fsdp"}, m_skip);
            !refused.isEmpty())
            QFAIL(qPrintable(refused));
        if (!m_skip.isEmpty()) qWarning("skipping: %s", qPrintable(m_skip));
    }

    void attachWhileTheRanksBuildTheModel()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString go = m_dir.filePath("go");
        QProcess *ranks = shardscope::test::startRanks(
            this, m_env, QStringLiteral(SHARDSCOPE_LAUNCH), python(),
            QStringLiteral(SHARDSCOPE_SOURCE_DIR) + "/tests/fsdp/slow_build.py",
            {"--go", go, "--steps", "2", "--hold", "3"}, m_dir.path());
        // Ends the ranks whatever happens below (rank 1 waits for `go` forever).
        std::optional<shardscope::test::ProcessRun> ran;
        const auto release = qScopeGuard([&] {
            QFile goFile(go);
            (void)goFile.open(QIODevice::WriteOnly);
            if (!ran) shardscope::test::finishRanks(ranks, 60000);
        });

        // Rank 1 waits inside the build; rank 0 is past it (its discovery names a model).
        const QDir disc(m_dir.path() + "/shardscope");
        QString model0, model1;
        const auto provisional = [](const QString &m) { return m.contains("(model not "); };
        QElapsedTimer t;
        for (t.start(); t.elapsed() < 180000; QThread::msleep(100)) {
            model0.clear();
            model1.clear();
            for (const QString &f : disc.entryList({"*.json"})) {
                const json d = readJson(disc.filePath(f));
                if (!d.is_object() || !d.contains("job") || !d.contains("model")) continue;
                (d["job"]["ranks"] == json::array({0}) ? model0 : model1) =
                    QString::fromStdString(d["model"].get<std::string>());
            }
            // Rank 0 past its blocks (a block's name, before, was no sign of the model).
            if (QFile::exists(go + ".waiting") && !model0.isEmpty() && !model1.isEmpty() &&
                !provisional(model0) && !model0.contains("Block"))
                break;
            if (ranks->state() == QProcess::NotRunning) break;
        }
        QVERIFY2(QFile::exists(go + ".waiting") && !model0.isEmpty() && !provisional(model0),
                 qPrintable("rank 0: " + model0 + "; rank 1: " + model1 +
                            QString::fromUtf8(ranks->readAllStandardError())));
        // Each rank's own name: the user's class once the root is known, else provisional.
        QCOMPARE(model0, kModel);
        QVERIFY2(provisional(model1), qPrintable(model1));

        // --list: the job with its model and the argument that attaches it.
        QProcess list;
        list.setProcessEnvironment(m_env);
        list.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture", {"--list"});
        QVERIFY(list.waitForFinished(30000));
        const QString listed = QString::fromUtf8(list.readAllStandardOutput());
        const QRegularExpressionMatch line =
            QRegularExpression(R"(^job (\S+)  \(world size 2, 2 of 2 ranks live\)  model (.+)  )"
                               R"(--attach (\S+)$)",
                               QRegularExpression::MultilineOption)
                .match(listed);
        QVERIFY2(line.hasMatch(), qPrintable(listed));
        QCOMPARE(line.captured(2), kModel);
        const QString argument = line.captured(3);
        QCOMPARE(argument, "job:" + line.captured(1));
        QVERIFY2(!listed.contains("Block") && !listed.contains("FSDP" + kModel),
                 qPrintable(listed));

        // Attached with that argument now, while rank 1 still builds.
        const QString captured = m_dir.filePath("capture.json");
        QProcess capture;
        capture.setProcessEnvironment(m_env);
        capture.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
                      {"--attach", argument, "--until-step", "2", "--out", captured});
        std::vector<std::pair<QString, QString>> files{{"shardscope-capture", captured}};
#ifdef SHARDSCOPE_HAVE_GUI
        const QString exported = m_dir.filePath("inspector.json");
        QProcess gui;
        QProcessEnvironment guiEnv = m_env;
        guiEnv.insert("QT_QPA_PLATFORM", "offscreen");
        gui.setProcessEnvironment(guiEnv);
        gui.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope",
                  {"--attach", argument, "--after-step", "2", "--export-snapshot", exported,
                   "--timeout", "150", "--quit"});
        files.emplace_back("the inspector", exported);
        QString guiSaid = readUntil(
            gui, [](const QString &s) { return s.contains("attached to job:"); }, 90000);
        QVERIFY2(guiSaid.contains("attached to job:"),
                 qPrintable(guiSaid + QString::fromUtf8(gui.readAllStandardError())));
#endif
        QString captureSaid = readUntil(
            capture, [](const QString &s) { return s.count("attached to ") == 2; }, 90000);
        QVERIFY2(captureSaid.count("attached to ") == 2,
                 qPrintable(captureSaid + QString::fromUtf8(capture.readAllStandardError())));
        // Every process sends its state on attaching (then one a second): both clients have
        // rank 1's state of the build before it goes on.
        QTest::qWait(4000);
        QVERIFY2(!QFile::exists(go), "rank 1 was released early");
        {
            QFile goFile(go);
            QVERIFY(goFile.open(QIODevice::WriteOnly));
        }

        QVERIFY(capture.waitForFinished(150000));
        captureSaid += QString::fromUtf8(capture.readAllStandardOutput());
        const QString captureErr = QString::fromUtf8(capture.readAllStandardError());
        QVERIFY2(capture.exitCode() == 0, qPrintable(captureSaid + captureErr));
#ifdef SHARDSCOPE_HAVE_GUI
        QVERIFY(gui.waitForFinished(150000));
        guiSaid += QString::fromUtf8(gui.readAllStandardOutput());
        const QString guiErr = QString::fromUtf8(gui.readAllStandardError());
        QVERIFY2(gui.exitCode() == 0 && !guiErr.contains("not one job"),
                 qPrintable(guiSaid + guiErr));
#endif
        ran = shardscope::test::finishRanks(ranks, 150000);
        QVERIFY2(ran->exitCode == 0, qPrintable(ran->out));
        QVERIFY2(ran->out.contains("rank 0 step 2 loss") && ran->out.contains("rank 1 step 2 loss"),
                 qPrintable(ran->out));

        // One job: both ranks, the model as the user built it, the step reached.
        for (const auto &[who, file] : files) {
            const json whole = readJson(file);
            QVERIFY2(whole.is_object(), qPrintable(who + ": " + file));
            const json &engine = whole["engine"];
            QVERIFY2(engine["local_ranks"] == json::array({0, 1}),
                     qPrintable(who + ": " + QString::fromStdString(engine.dump())));
            QCOMPARE(QString::fromStdString(engine["model"].get<std::string>()), kModel);
            QVERIFY2(engine["step"].get<int>() >= 2,
                     qPrintable(who + ": " + QString::fromStdString(engine.dump())));
        }
    }

  private:
    QTemporaryDir m_dir;
    QProcessEnvironment m_env;
    QString m_skip;
};

QTEST_GUILESS_MAIN(TestAttachWhileBuilding)
#include "tst_attachwhilebuilding.moc"

#pragma once
// Runs a training script on rank processes through scripts/launch (torchrun's environment), as
// the agents' tests do (tests/deepspeed, tests/fsdp): start one, wait for it, read what each
// rank announced in the discovery folder. What each test checks stays in the test.

#include <QDir>
#include <QObject>
#include <QProcess>
#include <QProcessEnvironment>
#include <QRegularExpression>
#include <QString>
#include <QStringList>
#include <QThread>

#include <csignal>
#include <sys/prctl.h>

#include <nlohmann/json.hpp>

#include "processrun.h"
#include "processtree.h"
#include "snapshotquery.h"
#include "snapshotschema.h"

namespace shardscope::test {

// A running scripts/launch. Ending it (deleting it, or finishRanks after its timeout) ends
// its ranks too, which run in sessions of their own (endProcessTree): a test that fails or
// times out leaves no rank behind.
class RankLaunch : public QProcess
{
  public:
    using QProcess::QProcess;
    ~RankLaunch() override { end(); }
    void end()
    {
        if (state() == QProcess::NotRunning) return;
        endProcessTree(static_cast<pid_t>(processId()));
        waitForFinished(5000);
    }
};

// Ends every launch `parent` holds that still runs (a test's cleanup(): the launches a
// failed test left running), and deletes them.
inline void endRankLaunches(QObject *parent)
{
    for (RankLaunch *launch : parent->findChildren<RankLaunch *>(Qt::FindDirectChildrenOnly))
        if (launch->state() != QProcess::NotRunning) delete launch;
}

// Starts `python script args` on `ranks` processes with scripts/launch (`launch`), in env with
// XDG_RUNTIME_DIR=runtime (where the ranks' discovery files go). monitorInterval: how long the
// launcher takes to notice a rank that died and stop the others (torchrun's
// --monitor-interval); a survivor meant to fail with its own error needs that long to reach
// it. The process (a RankLaunch) belongs to parent. The launcher gets SIGTERM when the test
// process dies (a CTest timeout kills it, and no destructor runs): it stops its ranks, SIGKILL
// after `grace` seconds.
inline QProcess *startRanks(QObject *parent, QProcessEnvironment env, const QString &launch,
                            const QString &python, const QString &script, const QStringList &args,
                            const QString &runtime,
                            const QString &monitorInterval = QStringLiteral("0.1"), int ranks = 2,
                            int grace = 60)
{
    auto *p = new RankLaunch(parent);
    env.insert("XDG_RUNTIME_DIR", runtime);
    p->setProcessEnvironment(env);
    p->setChildProcessModifier([] { ::prctl(PR_SET_PDEATHSIG, SIGTERM); });
    p->start(launch, QStringList{"-n", QString::number(ranks), "--grace", QString::number(grace),
                                 "--monitor-interval", monitorInterval, python, script} +
                         args);
    return p;
}

// Waits for a launch (after timeoutMs it is ended with its ranks: endProcessTree), collects
// what it printed and deletes it. Its exit code is -1 when it was killed or crashed. `out`
// holds everything it printed (stdout, a newline, stderr), `err` stderr alone: scripts/launch
// keeps each rank's streams apart; tracebacks and the agents' "shardscope: rank R: ..." lines
// are on stderr.
inline ProcessRun finishRanks(QProcess *p, int timeoutMs = 150000)
{
    ProcessRun r = finishProcess(*p, timeoutMs, true);
    r.out += "\n" + r.err;
    delete p;
    return r;
}

// The loss rank `rank` printed for step `step` in a launch's output, as the examples print
// it ("rank R step S loss L"); empty when it printed none.
inline QString printedLoss(const QString &out, int rank, int step)
{
    const QRegularExpression line(QString("rank %1 step %2 loss ([0-9.]+)").arg(rank).arg(step));
    return line.match(out).captured(1);
}

// The endpoint rank `rank` announced in runtime's discovery folder (docs/protocol.md), polled
// every 100 ms for up to timeoutMs; empty when it never did.
inline QString announcedEndpoint(const QString &runtime, int rank, int timeoutMs = 60000)
{
    const QDir disc(runtime + "/shardscope");
    for (int waited = 0; waited <= timeoutMs; waited += 100) {
        for (const QString &f : disc.entryList({"*.json"})) {
            const nlohmann::json d = readJson(disc.filePath(f));
            if (d.is_object() && d["job"]["ranks"] == nlohmann::json::array({rank}))
                return QString::fromStdString(d["endpoint"]);
        }
        QThread::msleep(100);
    }
    return {};
}

// Whether rank `rank` failed with torch's own exception (a RuntimeError or torch.distributed's
// Dist*Error, as a collective whose peer died raises) in a launch's output; torch 2 prefixes a
// rank's traceback lines with "[rankN]: ". When it did not, the whole output is printed
// (QVERIFY2 cuts its message short).
inline bool failedWithTorchError(const QString &out, int rank)
{
    const QRegularExpression error(
        QString(R"(\[rank %1\] (\[rank%1\]: )?(RuntimeError|torch\.distributed\.Dist\w*Error): )")
            .arg(rank));
    if (out.contains(error)) return true;
    for (const QString &line : out.split('\n'))
        qWarning("%s", qPrintable(line));
    return false;
}

// The last exception rank 0 printed ("[rank0]: <Type>Error: <message>", torch 2's prefix on
// a rank's traceback lines), with its dotted module: what a user's run ended with. Empty
// when none. The agents' tests compare it with and without the agent. A type named neither
// ...Error nor ...Exception counts where a message follows it at the line's start
// ("torch._dynamo.exc.Unsupported: ...", what dynamo raises under fullgraph=True).
inline QString lastRankException(const QString &err)
{
    static const QRegularExpression re(
        R"(\[rank0\]: ((?:[A-Za-z_][\w.]*\.)?\w*(?:Error|Exception)\b.*|)"
        R"((?:[A-Za-z_]\w*\.)*[A-Z][a-z]\w*: .*))"); // Unsupported: ..., not ninja's FAILED: ...
    QString last;
    for (auto it = re.globalMatch(err); it.hasNext();)
        last = it.next().captured(1);
    return last;
}

// A shardscope-capture attached to a rank that was killed: it ends with exit code 3, says the
// engine went away (app/shardscope-capture), and `written` (its --out) is a valid snapshot.
// Returns what is wrong, empty when nothing is.
inline QString lostRankCaptureProblem(QProcess &capture, const QString &written)
{
    if (!capture.waitForFinished(60000)) return QStringLiteral("the capture did not end");
    const QString said = QString::fromUtf8(capture.readAllStandardOutput());
    if (capture.exitCode() != 3)
        return QString("the capture exited %1, not 3: %2").arg(capture.exitCode()).arg(said);
    if (!said.contains("capture ended early: the engine went away before it finished"))
        return "the capture did not say the engine went away: " + said;
    const auto problems = snapshotSchemaProblems(readJson(written));
    return problems.empty() ? QString() : QString::fromStdString(problems.front());
}

} // namespace shardscope::test

#pragma once
// Runs a child process to its end, as every suite that starts a program does (the project's
// executables, shardscope-check, a Python snippet): what it printed and how it ended, ended by
// the test when it runs past its time. Rank jobs that stay running while a test talks to
// them: rankjob.h; a trainer or app a test talks to: runprocess.h.

#include <QDir>
#include <QProcess>
#include <QProcessEnvironment>
#include <QString>
#include <QStringList>

#include <sys/types.h>

#include "processtree.h"

namespace shardscope::test {

// A finished child process: its exit code (-1: it crashed, was killed, or never started),
// what it printed on stdout and on stderr, and whether it started and ran past its time.
struct ProcessRun
{
    int exitCode = -1;
    bool started = false;
    bool timedOut = false;
    QString out;
    QString err;

    // It started and ended on its own within its time (with any exit code).
    bool finished() const { return started && !timedOut; }
};

struct RunOptions
{
    QProcessEnvironment environment = QProcessEnvironment::systemEnvironment();
    QString workingDirectory; // empty: the test's own
    int timeoutMs = 90000;
    // At the timeout, end the process with every process below it (endProcessTree: ranks in
    // sessions of their own, as shardscope-check starts them), not the process alone.
    bool endTree = false;
};

// Waits for a started process to end, or ends it once timeoutMs have passed (endTree: with
// every process below it), and collects what it printed.
inline ProcessRun finishProcess(QProcess &p, int timeoutMs, bool endTree = false)
{
    ProcessRun r;
    r.started = true;
    if (!p.waitForFinished(timeoutMs)) {
        r.timedOut = true;
        if (endTree)
            endProcessTree(static_cast<pid_t>(p.processId()));
        else
            p.kill();
        p.waitForFinished(30000);
    }
    if (!r.timedOut && p.exitStatus() == QProcess::NormalExit) r.exitCode = p.exitCode();
    r.out = QString::fromUtf8(p.readAllStandardOutput());
    r.err = QString::fromUtf8(p.readAllStandardError());
    if (r.timedOut)
        r.err += QString("\n%1 did not finish in %2 s; it was ended")
                     .arg(p.program())
                     .arg(timeoutMs / 1000);
    return r;
}

// Runs `program args` to its end, or until options.timeoutMs have passed (then it is ended,
// and what it printed until then is kept).
inline ProcessRun runProcess(const QString &program, const QStringList &args,
                             const RunOptions &options = {})
{
    QProcess p;
    p.setProcessEnvironment(options.environment);
    if (!options.workingDirectory.isEmpty()) p.setWorkingDirectory(options.workingDirectory);
    p.start(program, args);
    if (!p.waitForStarted(10000)) {
        ProcessRun r;
        r.err = program + " did not start: " + p.errorString();
        return r;
    }
    return finishProcess(p, options.timeoutMs, options.endTree);
}

// The project's executable `name` in $SHARDSCOPE_BIN_DIR (CTest sets it: ShardScopeTest.cmake);
// empty when it is not set.
inline QString binPath(const QString &name)
{
    const QString dir = qEnvironmentVariable("SHARDSCOPE_BIN_DIR");
    return dir.isEmpty() ? QString() : QDir(dir).filePath(name);
}

// Runs the project's executable `name` (shardscope-capture, shardscope-train, ...) to its end.
inline ProcessRun
runBinary(const QString &name, const QStringList &args, int timeoutMs = 90000,
          const QProcessEnvironment &env = QProcessEnvironment::systemEnvironment())
{
    RunOptions options;
    options.environment = env;
    options.timeoutMs = timeoutMs;
    return runProcess(binPath(name), args, options);
}

} // namespace shardscope::test

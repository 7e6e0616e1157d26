#pragma once
// What the suites that run Python (the agents' rank jobs, shardscope-check, snippets) share:
// the interpreter, the environment it runs in, whether what it needs is installed, and the
// line of a script a test names by a marker. The paths come from the suite's CMake
// definitions (SHARDSCOPE_PYTHON_EXE, SHARDSCOPE_PYTHON_DIR), passed in.

#include <QDir>
#include <QFile>
#include <QProcessEnvironment>
#include <QString>
#include <QStringList>

#include "processrun.h"

namespace shardscope::test {

// The interpreter a suite runs: `built` (the build's, the one the native module is built
// for), or the one the environment variable `overrideVariable` names when it is set
// (SHARDSCOPE_FSDP_PYTHON: the same Python version with another torch, docs/fsdp.md).
inline QString pythonInterpreter(const QString &built, const char *overrideVariable = nullptr)
{
    const QString other = overrideVariable ? qEnvironmentVariable(overrideVariable) : QString();
    return other.isEmpty() ? built : other;
}

// The environment a test's Python runs in: the test's own, with the built shardscope package
// (pythonDir) on PYTHONPATH, one thread a process (two ranks share a small machine), and no
// SHARDSCOPE_TOKEN from the developer's shell.
inline QProcessEnvironment pythonEnvironment(const QString &pythonDir)
{
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("PYTHONPATH", pythonDir);
    env.insert("OMP_NUM_THREADS", "1");
    env.remove("SHARDSCOPE_TOKEN");
    return env;
}

// pythonEnvironment for DeepSpeed: the release under test first on the path
// (SHARDSCOPE_DS_PATH, where scripts/deps installed it; unset: the environment's own) and its
// JIT-built ops in a cache of their own (SHARDSCOPE_TORCH_EXTENSIONS).
inline QProcessEnvironment deepSpeedEnvironment(const QString &pythonDir)
{
    QProcessEnvironment env = pythonEnvironment(pythonDir);
    const QString dsPath = qEnvironmentVariable("SHARDSCOPE_DS_PATH");
    if (!dsPath.isEmpty()) env.insert("PYTHONPATH", dsPath + ":" + pythonDir);
    const QString ext = qEnvironmentVariable("SHARDSCOPE_TORCH_EXTENSIONS");
    if (!ext.isEmpty()) env.insert("TORCH_EXTENSIONS_DIR", ext);
    return env;
}

// Why the built shardscope package in pythonDir cannot be imported (its native module was
// not built); empty when it can.
inline QString nativeModuleMissing(const QString &pythonDir)
{
    if (!QDir(pythonDir + "/shardscope").entryList({"_native*.so"}).isEmpty()) return {};
    return QStringLiteral("the shardscope Python module was not built (pybind11-dev and "
                          "python3-dev: scripts/deps)");
}

// Runs `python -c code` in env, as a suite's initTestCase probes what its cases import.
inline ProcessRun probePython(const QString &python, const QProcessEnvironment &env,
                              const QString &code)
{
    RunOptions options;
    options.environment = env;
    options.timeoutMs = 120000;
    return runProcess(python, {"-c", code}, options);
}

// What a Python suite's cases lack (prerequisite.h's `why`), empty when nothing: the native
// module in pythonDir, or what `python -c code` in env imports (`cannot` names it and what
// installs it: "import torch's FSDP2 (scripts/deps installs torch)"). `probe`, when given,
// gets the probe's run (what the code printed: a release's version).
inline QString pythonPrerequisiteMissing(const QString &python, const QString &pythonDir,
                                         const QProcessEnvironment &env, const QString &code,
                                         const QString &cannot, ProcessRun *probe = nullptr)
{
    if (const QString missing = nativeModuleMissing(pythonDir); !missing.isEmpty()) return missing;
    const ProcessRun r = probePython(python, env, code);
    if (probe) *probe = r;
    if (r.exitCode == 0) return {};
    return python + " cannot " + cannot + ": " + r.err.right(400);
}

// The 1-based number of the first line of file that contains text; -1 when none does (or the
// file cannot be read), never a line a report could name.
inline int lineOf(const QString &file, const QString &text)
{
    QFile f(file);
    if (!f.open(QIODevice::ReadOnly)) return -1;
    for (int n = 1; !f.atEnd(); ++n)
        if (QString::fromUtf8(f.readLine()).contains(text)) return n;
    return -1;
}

} // namespace shardscope::test

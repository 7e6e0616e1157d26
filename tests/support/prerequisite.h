#pragma once
// The one rule for a test whose prerequisite is missing (the real-stack suites: real FSDP2 or
// DeepSpeed ranks, shardscope-check on them). A skip there would make `scripts/test` report
// "Passed" for cases that never ran (a machine where DeepSpeed failed to install), so it fails
// the run, unless the person running the tests asked for that skip by name:
//
//   SHARDSCOPE_ALLOW_SKIP=deepspeed,fsdp scripts/test
//
// Names: `fsdp` (tst_fsdpagent, gpu_allocator_fsdp), `deepspeed` (tst_deepspeedagent and its
// releases, gpu_allocator_deepspeed, the deepspeed_ops fixtures), `deepspeed-X.Y.Z` (one
// release), `check` (tst_check and its releases), and for parts of the build a configuration
// can leave out: `trainer` (shardscope-train), `gui` (the inspector), `python` (the native
// module, a python3 to run). Only the GPU cases skip on their own, for want of a GPU
// (tests/cuda/gpuavailable.h, gpu_allocator_check.py), and the cases of a CPU feature this
// machine lacks (an invariant TSC, transparent huge pages). The Python
// side of the same rule, for the Python test scripts: tests/support/prerequisite.py.

#include <QString>
#include <QStringList>

namespace shardscope::test {

// The names in SHARDSCOPE_ALLOW_SKIP (comma-separated, blanks ignored).
inline QStringList allowedSkips()
{
    QStringList names;
    for (const QString &n : qEnvironmentVariable("SHARDSCOPE_ALLOW_SKIP").split(','))
        if (!n.trimmed().isEmpty()) names << n.trimmed();
    return names;
}

// What fails the run when a suite known by `names` (any one of them allows the skip) lacks a
// prerequisite (`why`, what is missing and what installs it); empty when nothing is missing
// or the skip was asked for. A suite's initTestCase QFAILs with it.
inline QString refusedSkip(const QStringList &names, const QString &why)
{
    if (why.isEmpty()) return {};
    const QStringList allowed = allowedSkips();
    for (const QString &n : names)
        if (allowed.contains(n)) return {};
    return QString("a prerequisite is missing, so these cases cannot run: %1. Install it; or, to "
                   "skip them on purpose, run with SHARDSCOPE_ALLOW_SKIP=%2")
        .arg(why, names.value(0));
}

} // namespace shardscope::test

// A case that cannot run because `why` (a prerequisite named `name`) is missing: skipped when
// SHARDSCOPE_ALLOW_SKIP names it, else failed with what to do.
#define SHARDSCOPE_SKIP_IF_ALLOWED(name, why)                                                      \
    do {                                                                                           \
        const QString refused_ = ::shardscope::test::refusedSkip({QStringLiteral(name)}, why);     \
        if (!refused_.isEmpty()) QFAIL(qPrintable(refused_));                                      \
        QSKIP(qPrintable(QString(why)));                                                           \
    } while (false)

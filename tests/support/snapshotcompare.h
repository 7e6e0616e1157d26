#pragma once
// Field-by-field comparison of two snapshots for Qt tests: every member of the meta, the
// engine state, its modules, parameters and violations, the events and the dropped count.
// A difference fails the current test at the first field that differs; callers that go on
// afterwards check QTest::currentTestFailed().

#include <QtTest>

#include <cstring>

#include "wire/snapshot.h"

namespace shardscope::test {

// Every field of two engine states: config, modules, parameters, externals, violations.
inline void compareStates(const state::EngineState &a, const state::EngineState &b)
{
    QCOMPARE(a.modelName, b.modelName);
    QCOMPARE(a.fixDialect, b.fixDialect);
    QCOMPARE(a.worldSize, b.worldSize);
    QCOMPARE(a.backend, b.backend);
    QCOMPARE(a.step, b.step);
    QCOMPARE(a.config.persistenceThreshold, b.config.persistenceThreshold);
    QCOMPARE(a.config.prefetchBucketSize, b.config.prefetchBucketSize);
    QCOMPARE(a.config.maxLiveParameters, b.config.maxLiveParameters);
    QCOMPARE(a.config.guard, b.config.guard);
    QCOMPARE(a.localRanks, b.localRanks);
    QCOMPARE(a.modules.size(), b.modules.size());
    for (std::size_t i = 0; i < a.modules.size(); ++i) {
        QCOMPARE(a.modules[i].id, b.modules[i].id);
        QCOMPARE(a.modules[i].path, b.modules[i].path);
        QCOMPARE(a.modules[i].type, b.modules[i].type);
        QCOMPARE(a.modules[i].parent, b.modules[i].parent);
        QCOMPARE(a.modules[i].unitGroup, b.modules[i].unitGroup);
        QCOMPARE(a.modules[i].reshardAfterForward, b.modules[i].reshardAfterForward);
        QCOMPARE(a.modules[i].mesh, b.modules[i].mesh);
    }
    QCOMPARE(a.params.size(), b.params.size());
    for (std::size_t i = 0; i < a.params.size(); ++i) {
        const state::ParamRecord &p = a.params[i], &q = b.params[i];
        QCOMPARE(p.id, q.id);
        QCOMPARE(p.name, q.name);
        QCOMPARE(p.owner, q.owner);
        QCOMPARE(p.shape, q.shape);
        QCOMPARE(p.dtype, q.dtype);
        QCOMPARE(p.numel, q.numel);
        QCOMPARE(p.paddedNumel, q.paddedNumel);
        QCOMPARE(p.partitionNumel, q.partitionNumel);
        QCOMPARE(p.persistent, q.persistent);
        QCOMPARE(p.late, q.late);
        QCOMPARE(p.partitioned, q.partitioned);
        QCOMPARE(p.replaces, q.replaces);
        QCOMPARE(p.placements, q.placements);
        QCOMPARE(p.status, q.status);
        QCOMPARE(p.externals.size(), q.externals.size());
        for (std::size_t k = 0; k < p.externals.size(); ++k) {
            QCOMPARE(p.externals[k].module, q.externals[k].module);
            QCOMPARE(p.externals[k].automatic, q.externals[k].automatic);
        }
        QCOMPARE(p.activeModules, q.activeModules);
        QCOMPARE(p.gatherCount, q.gatherCount);
        QCOMPARE(p.gatherBytes, q.gatherBytes);
        QCOMPARE(p.gatherNs, q.gatherNs);
        QCOMPARE(p.lastGatherTsNs, q.lastGatherTsNs);
    }
    QCOMPARE(a.violations.size(), b.violations.size());
    for (std::size_t i = 0; i < a.violations.size(); ++i) {
        const state::ViolationRecord &v = a.violations[i], &w = b.violations[i];
        QCOMPARE(v.kind, w.kind);
        QCOMPARE(v.step, w.step);
        QCOMPARE(v.lastStep, w.lastStep);
        QCOMPARE(v.rank, w.rank);
        QCOMPARE(v.accessor, w.accessor);
        QCOMPARE(v.param, w.param);
        QCOMPARE(v.paramName, w.paramName);
        QCOMPARE(v.owner, w.owner);
        QCOMPARE(v.status, w.status);
        QCOMPARE(v.action, w.action);
        QCOMPARE(v.read, w.read);
        QCOMPARE(v.severity, w.severity);
        QCOMPARE(v.count, w.count);
        QCOMPARE(v.tsNs, w.tsNs);
        QCOMPARE(v.fix, w.fix);
        QCOMPARE(v.message, w.message);
        QCOMPARE(v.location, w.location);
        QCOMPARE(v.building, w.building);
        QCOMPARE(v.collective, w.collective);
    }
}

inline void compareSnapshots(const wire::Snapshot &x, const wire::Snapshot &y)
{
    QCOMPARE(x.meta.producer, y.meta.producer);
    QCOMPARE(x.meta.pid, y.meta.pid);
    QCOMPARE(x.meta.createdUnixMs, y.meta.createdUnixMs);
    QCOMPARE(x.meta.endpoint, y.meta.endpoint);
    compareStates(x.state, y.state);
    if (QTest::currentTestFailed()) return;
    QCOMPARE(x.events.size(), y.events.size());
    for (std::size_t i = 0; i < x.events.size(); ++i)
        QVERIFY2(std::memcmp(&x.events[i], &y.events[i], sizeof(telemetry::Event)) == 0,
                 qPrintable(QStringLiteral("event %1 differs").arg(i)));
    QCOMPARE(x.droppedEvents, y.droppedEvents);
}

} // namespace shardscope::test

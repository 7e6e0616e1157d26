// The Chrome / Perfetto trace export: valid JSON, one pid per rank with process_name,
// X events with cat and integer microseconds, violations as instant events, distributedInfo;
// overlapping gathers of a rank on their own threads, so X spans on every thread nest; ids
// that Perfetto's importer takes as written (none 0, no tid in two processes).

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTest>

#include <algorithm>
#include <cmath>
#include <limits>

#include "perfettorules.h"
#include "session/traceexport.h"
#include "sessioncore/tracebuilder.h"
#include "syntheticstate.h"
#include "telemetry/eventfields.h"

using namespace shardscope;
using namespace shardscope::test;

class TestTraceExport : public QObject
{
    Q_OBJECT
  private slots:
    void requiredFields();
    void overlappingGathersGetTheirOwnThreads();
    void idsArePerfettosOwn();
    void parentsComeBeforeTheirChildren();
    void idsAreSpacedOrPacked();
    void reduceScattersAndAllocatorCounters();
};

void TestTraceExport::requiredFields()
{
    session::SessionStore store;
    store.applyState(smallState(2));
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(1000000, 0, telemetry::makeStepBegin()),
            eventAt(1000000, 0, telemetry::makeModuleEnter({.module = 7})),
            eventAt(1001000, 0,
                    telemetry::makeFetchBegin(
                        {.param = 0, .cause = 7, .bytes = 6464, .reason = FetchReason::Guard})),
            eventAt(1003600, 0,
                    telemetry::makeFetchEnd(
                        {.param = 0, .cause = 7, .bytes = 6464, .reason = FetchReason::Guard})),
            lmHeadViolation(1003700, 0),
            eventAt(1010000, 0, telemetry::makeModuleExit({.module = 7})),
            eventAt(1020000, 0, telemetry::makeStepEnd(4.25)),
            eventAt(1002000, 1, telemetry::makeModuleEnter({.module = 1})),
            eventAt(1002500, 1, telemetry::makeModuleExit({.module = 1})),
        },
        false);
    QJsonParseError err{};
    const QJsonDocument doc = QJsonDocument::fromJson(session::chromeTrace(store), &err);
    QCOMPARE(err.error, QJsonParseError::NoError);
    const QJsonObject root = doc.object();
    QCOMPARE(root.value(QStringLiteral("distributedInfo"))
                 .toObject()
                 .value(QStringLiteral("world_size"))
                 .toInt(),
             2);
    QCOMPARE(root.value(QStringLiteral("distributedInfo"))
                 .toObject()
                 .value(QStringLiteral("backend"))
                 .toString(),
             QStringLiteral("cpu"));
    const QJsonArray events = root.value(QStringLiteral("traceEvents")).toArray();
    QSet<int> processNames;
    int gathers = 0, modules = 0, instants = 0, steps = 0;
    for (const QJsonValue &v : events) {
        const QJsonObject e = v.toObject();
        const QString ph = e.value(QStringLiteral("ph")).toString();
        if (ph == QLatin1String("M") &&
            e.value(QStringLiteral("name")).toString() == QLatin1String("process_name"))
            processNames.insert(e.value(QStringLiteral("pid")).toInt());
        if (ph == QLatin1String("X")) {
            QVERIFY(e.contains(QStringLiteral("cat")));
            const double ts = e.value(QStringLiteral("ts")).toDouble();
            const double dur = e.value(QStringLiteral("dur")).toDouble();
            QCOMPARE(ts, std::floor(ts));
            QCOMPARE(dur, std::floor(dur));
            const QString cat = e.value(QStringLiteral("cat")).toString();
            if (cat == QLatin1String("gather,guard")) {
                ++gathers;
                QCOMPARE(e.value(QStringLiteral("name")).toString(),
                         QStringLiteral("embed.weight"));
                QCOMPARE(ts, 1.0);                                   // (1,001,000 - 1,000,000) ns
                QCOMPARE(dur, 3.0);                                  // 2,600 ns rounds to 3 us
                QCOMPARE(e.value(QStringLiteral("pid")).toInt(), 1); // rank 0
            } else if (cat.startsWith(QLatin1String("module"))) {
                ++modules;
            } else if (cat == QLatin1String("step")) {
                ++steps;
                QCOMPARE(e.value(QStringLiteral("args"))
                             .toObject()
                             .value(QStringLiteral("loss"))
                             .toDouble(),
                         4.25);
            }
        }
        if (ph == QLatin1String("i")) {
            ++instants;
            QCOMPARE(e.value(QStringLiteral("cat")).toString(), QStringLiteral("violation"));
            QCOMPARE(e.value(QStringLiteral("name")).toString(),
                     QStringLiteral("unregistered_access"));
            QCOMPARE(
                e.value(QStringLiteral("args")).toObject().value(QStringLiteral("fix")).toString(),
                QStringLiteral("register_external_parameter(lm_head, embed.weight)"));
            QCOMPARE(e.value(QStringLiteral("ts")).toDouble(), 4.0); // 3,700 ns
        }
    }
    QCOMPARE(processNames, (QSet<int>{1, 101})); // ranks 0 and 1
    QCOMPARE(gathers, 1);
    QCOMPARE(modules, 2);
    QCOMPARE(steps, 1);
    QCOMPARE(instants, 1);
}

namespace {

struct XSpan
{
    qint64 ts = 0;
    qint64 end = 0;
    QString name;
};

// Chrome's trace viewer and Perfetto need the X spans of one thread to nest: any two are
// disjoint (touching is fine) or one contains the other.
QString firstBadPair(const QList<XSpan> &spans)
{
    for (qsizetype i = 0; i < spans.size(); ++i) {
        for (qsizetype j = i + 1; j < spans.size(); ++j) {
            const XSpan &a = spans[i];
            const XSpan &b = spans[j];
            const bool disjoint = a.end <= b.ts || b.end <= a.ts;
            const bool aHoldsB = a.ts <= b.ts && b.end <= a.end;
            const bool bHoldsA = b.ts <= a.ts && a.end <= b.end;
            if (!disjoint && !aHoldsB && !bHoldsA)
                return QStringLiteral("%1 [%2, %3] and %4 [%5, %6]")
                    .arg(a.name)
                    .arg(a.ts)
                    .arg(a.end)
                    .arg(b.name)
                    .arg(b.ts)
                    .arg(b.end);
        }
    }
    return QString();
}

} // namespace

void TestTraceExport::overlappingGathersGetTheirOwnThreads()
{
    // Rank 0 prefetches blocks.1.fc.weight (3) and .bias (4) while blocks.0 runs; both are
    // still in flight when blocks.1 starts, and lm_head.bias (5) is issued once 3 is done.
    // Module ends are sub-microsecond so that rounding each duration on its own would
    // push blocks.1 past its parent blocks.
    const std::uint64_t t0 = 1000000;
    session::SessionStore store;
    store.applyState(smallState(2));
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(t0, 0, telemetry::makeStepBegin()),
            eventAt(t0 + 1400, 0, telemetry::makeModuleEnter({.module = 2})), // blocks, us 1
            eventAt(t0 + 1600, 0, telemetry::makeModuleEnter({.module = 3})), // blocks.0, us 2
            eventAt(t0 + 1700, 0,
                    telemetry::makeFetchBegin({.param = 3,
                                               .cause = 3,
                                               .bytes = 1024,
                                               .reason = FetchReason::Prefetch})), // us 2
            eventAt(t0 + 2600, 0,
                    telemetry::makeFetchBegin({.param = 4,
                                               .cause = 3,
                                               .bytes = 64,
                                               .reason = FetchReason::Prefetch})), // us 3
            eventAt(t0 + 4000, 0, telemetry::makeModuleExit({.module = 3})),       // us 4
            eventAt(t0 + 4600, 0, telemetry::makeModuleEnter({.module = 5})),      // blocks.1, us 5
            eventAt(t0 + 5000, 0,
                    telemetry::makeFetchEnd({.param = 3,
                                             .cause = 3,
                                             .bytes = 1024,
                                             .reason = FetchReason::Prefetch})), // us 5
            eventAt(t0 + 5400, 0,
                    telemetry::makeFetchBegin({.param = 5,
                                               .cause = 5,
                                               .bytes = 404,
                                               .reason = FetchReason::Prefetch})), // us 5
            eventAt(t0 + 7000, 0,
                    telemetry::makeFetchEnd({.param = 4,
                                             .cause = 3,
                                             .bytes = 64,
                                             .reason = FetchReason::Prefetch})), // us 7
            eventAt(t0 + 8000, 0,
                    telemetry::makeFetchEnd({.param = 5,
                                             .cause = 5,
                                             .bytes = 404,
                                             .reason = FetchReason::Prefetch})), // us 8
            eventAt(t0 + 10400, 0, telemetry::makeModuleExit({.module = 5})),    // us 10
            eventAt(t0 + 10400, 0, telemetry::makeModuleExit({.module = 2})),
            eventAt(t0 + 12000, 0, telemetry::makeStepEnd(1.5)),
            eventAt(t0 + 2000, 1,
                    telemetry::makeFetchBegin(
                        {.param = 0, .cause = 1, .bytes = 6464, .reason = FetchReason::Prefetch})),
            eventAt(t0 + 3000, 1,
                    telemetry::makeFetchEnd(
                        {.param = 0, .cause = 1, .bytes = 6464, .reason = FetchReason::Prefetch})),
        },
        false);
    QJsonParseError err{};
    const QJsonDocument doc = QJsonDocument::fromJson(session::chromeTrace(store), &err);
    QCOMPARE(err.error, QJsonParseError::NoError);

    QMap<QPair<int, int>, QList<XSpan>> byThread;
    QMap<QPair<int, int>, QString> threadNames;
    QMap<QString, QJsonObject> gathers; // rank 0's, by param
    QMap<QString, int> gatherTid;
    for (const QJsonValue &v : doc.object().value(QStringLiteral("traceEvents")).toArray()) {
        const QJsonObject e = v.toObject();
        const QString ph = e.value(QStringLiteral("ph")).toString();
        const QPair<int, int> thread(e.value(QStringLiteral("pid")).toInt(),
                                     e.value(QStringLiteral("tid")).toInt());
        if (ph == QLatin1String("M") &&
            e.value(QStringLiteral("name")).toString() == QLatin1String("thread_name"))
            threadNames.insert(thread, e.value(QStringLiteral("args"))
                                           .toObject()
                                           .value(QStringLiteral("name"))
                                           .toString());
        if (ph != QLatin1String("X")) continue;
        const qint64 ts = e.value(QStringLiteral("ts")).toInteger();
        const qint64 dur = e.value(QStringLiteral("dur")).toInteger();
        QVERIFY(dur >= 0);
        byThread[thread].append(XSpan{ts, ts + dur, e.value(QStringLiteral("name")).toString()});
        if (thread.first == 1 && // rank 0
            e.value(QStringLiteral("cat")).toString().startsWith(QLatin1String("gather,"))) {
            gathers.insert(e.value(QStringLiteral("name")).toString(), e);
            gatherTid.insert(e.value(QStringLiteral("name")).toString(), thread.second);
        }
    }
    for (auto it = byThread.cbegin(); it != byThread.cend(); ++it) {
        QVERIFY2(threadNames.contains(it.key()),
                 qPrintable(QStringLiteral("pid %1 tid %2 has spans but no thread_name")
                                .arg(it.key().first)
                                .arg(it.key().second)));
        const QString bad = firstBadPair(it.value());
        QVERIFY2(bad.isEmpty(), qPrintable(QStringLiteral("on pid %1 tid %2 (%3): %4 overlap")
                                               .arg(it.key().first)
                                               .arg(it.key().second)
                                               .arg(threadNames.value(it.key()), bad)));
    }

    QCOMPARE(gathers.size(), 3);
    const QString w = QStringLiteral("blocks.1.fc.weight");
    const QString b = QStringLiteral("blocks.1.fc.bias");
    const QString h = QStringLiteral("lm_head.bias");
    // The weight and the bias are in flight together: two threads, the first one lowest.
    QCOMPARE(threadNames.value({1, gatherTid.value(w)}), QStringLiteral("gathers 0"));
    QCOMPARE(threadNames.value({1, gatherTid.value(b)}), QStringLiteral("gathers 1"));
    // lm_head.bias starts when the weight's gather ends: its thread is free again.
    QCOMPARE(gatherTid.value(h), gatherTid.value(w));
    QCOMPARE(gathers[b].value(QStringLiteral("ts")).toInteger(), 3);
    QCOMPARE(gathers[b].value(QStringLiteral("dur")).toInteger(), 4);
    QCOMPARE(gathers[h].value(QStringLiteral("ts")).toInteger(), 5);
    QCOMPARE(gathers[h].value(QStringLiteral("dur")).toInteger(), 3);
    QCOMPARE(gathers[b].value(QStringLiteral("cat")).toString(), QStringLiteral("gather,prefetch"));
    const QJsonObject args = gathers[b].value(QStringLiteral("args")).toObject();
    QCOMPARE(args.value(QStringLiteral("param")).toString(), b);
    QCOMPARE(args.value(QStringLiteral("module")).toString(), QStringLiteral("blocks.0"));
    QCOMPARE(args.value(QStringLiteral("reason")).toString(), QStringLiteral("prefetch"));
    QCOMPARE(args.value(QStringLiteral("bytes")).toInteger(), 64);
    QCOMPARE(args.value(QStringLiteral("step")).toInteger(), 1);
    // Rank 0: modules (3 spans, blocks.1 inside blocks although it begins 0.6 us later
    // and both end at 10.4 us), steps, gathers 0 and 1; rank 1: gathers 0.
    QCOMPARE(byThread.size(), 5);
    QCOMPARE(byThread.value({1, gatherTid.value(w)}).size(), 2);
    QCOMPARE(byThread.value({1, gatherTid.value(b)}).size(), 1);
    const auto modulesThread = threadNames.key(QStringLiteral("modules"));
    QCOMPARE(modulesThread.first, 1);
    QCOMPARE(byThread.value(modulesThread).size(), 3);
    int rank1Gathers = 0;
    for (auto it = byThread.cbegin(); it != byThread.cend(); ++it)
        if (it.key().first == 101) { // rank 1
            QCOMPARE(threadNames.value(it.key()), QStringLiteral("gathers 0"));
            rank1Gathers += int(it.value().size());
        }
    QCOMPARE(rank1Gathers, 1);
}

void TestTraceExport::idsArePerfettosOwn()
{
    {
        // Every kind of event on three ranks: ids spaced by 100. blocks (2) and blocks.0 (3)
        // start in one microsecond, and blocks.0 ends first.
        session::SessionStore store;
        store.applyState(smallState(3));
        std::vector<telemetry::Event> events;
        for (int r = 0; r < 3; ++r) {
            const std::uint64_t t = 1000000 + std::uint64_t(r) * 50;
            events.push_back(eventAt(t, r, telemetry::makeStepBegin()));
            events.push_back(eventAt(t + 100, r, telemetry::makeModuleEnter({.module = 2})));
            events.push_back(eventAt(t + 150, r, telemetry::makeModuleEnter({.module = 3})));
            for (ParamId p : {1u, 2u})
                events.push_back(eventAt(
                    t + 200 + p, r,
                    telemetry::makeFetchBegin(
                        {.param = p, .cause = 3, .bytes = 64, .reason = FetchReason::Forward})));
            for (ParamId p : {1u, 2u})
                events.push_back(eventAt(
                    t + 3000 + p, r,
                    telemetry::makeFetchEnd(
                        {.param = p, .cause = 3, .bytes = 64, .reason = FetchReason::Forward})));
            events.push_back(eventAt(
                t + 3500, r, telemetry::makeBroadcast({.param = 0, .root = 0, .bytes = 6464})));
            events.push_back(lmHeadViolation(t + 3600, r));
            const telemetry::ReduceScatterFields reduce{.module = 3, .bytes = 128, .params = 2};
            events.push_back(eventAt(t + 3700, r, telemetry::makeReduceScatterBegin(reduce)));
            events.push_back(eventAt(t + 3900, r, telemetry::makeReduceScatterEnd(reduce)));
            events.push_back(eventAt(t + 4000, r, telemetry::makeModuleExit({.module = 3})));
            events.push_back(eventAt(t + 4500, r, telemetry::makeModuleExit({.module = 2})));
            events.push_back(eventAt(t + 5000, r, telemetry::makeStepEnd(2.0)));
            events.push_back(eventAt(t + 5000, r, telemetry::makeAllocatorSample({10, 20, 30})));
        }
        store.appendEvents(events, false);
        const QJsonDocument doc = QJsonDocument::fromJson(session::chromeTrace(store));
        const QString problem = perfettoProblem(doc, 100);
        QVERIFY2(problem.isEmpty(), qPrintable(problem));
    }
    {
        // 120 gathers in flight at once on rank 1: 123 threads there, so ids spaced by 1000.
        session::SessionStore store;
        store.applyState(largeState(2, 60, 2));
        std::vector<telemetry::Event> events;
        for (ParamId p = 0; p < 120; ++p)
            events.push_back(eventAt(
                2000000 + p, 1,
                telemetry::makeFetchBegin(
                    {.param = p, .cause = 1, .bytes = 256, .reason = FetchReason::Prefetch})));
        for (ParamId p = 0; p < 120; ++p)
            events.push_back(eventAt(
                2100000 + p, 1,
                telemetry::makeFetchEnd(
                    {.param = p, .cause = 1, .bytes = 256, .reason = FetchReason::Prefetch})));
        events.push_back(eventAt(2000000, 0, telemetry::makeModuleEnter({.module = 1})));
        events.push_back(eventAt(2200000, 0, telemetry::makeModuleExit({.module = 1})));
        store.appendEvents(events, false);
        const QJsonDocument doc = QJsonDocument::fromJson(session::chromeTrace(store));
        const QString problem = perfettoProblem(doc, 1000);
        QVERIFY2(problem.isEmpty(), qPrintable(problem));
        QSet<int> gatherTids;
        for (const QJsonValue &v : doc.object().value(QStringLiteral("traceEvents")).toArray())
            if (v.toObject()
                    .value(QStringLiteral("cat"))
                    .toString()
                    .startsWith(QLatin1String("gather,")))
                gatherTids.insert(v.toObject().value(QStringLiteral("tid")).toInt());
        QCOMPARE(gatherTids.size(), 120);
        QCOMPARE(*std::min_element(gatherTids.begin(), gatherTids.end()),
                 1004); // rank 1's "gathers 0"
        QCOMPARE(*std::max_element(gatherTids.begin(), gatherTids.end()), 1123);
    }
}

// On the modules thread, spans are written in start order, the longer first and, as long,
// the one entered first: a Perfetto that keeps file order for timestamp ties nests them as
// they nested. blocks (2) and blocks.0 (3) cover the same microseconds, [0, 4].
void TestTraceExport::parentsComeBeforeTheirChildren()
{
    const std::uint64_t t0 = 1000000;
    session::SessionStore store;
    store.applyState(smallState(1));
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(t0, 0, telemetry::makeStepBegin()),
            eventAt(t0 + 100, 0, telemetry::makeModuleEnter({.module = 2})),
            eventAt(t0 + 150, 0, telemetry::makeModuleEnter({.module = 3})),
            eventAt(t0 + 200, 0, telemetry::makeModuleEnter({.module = 4})), // blocks.0.fc
            eventAt(t0 + 1300, 0, telemetry::makeModuleExit({.module = 4})), // [0, 1]
            eventAt(t0 + 4100, 0, telemetry::makeModuleExit({.module = 3})), // [0, 4]
            eventAt(t0 + 4200, 0, telemetry::makeModuleExit({.module = 2})), // [0, 4]
            eventAt(t0 + 5000, 0, telemetry::makeStepEnd(1.0)),
        },
        false);
    const QJsonDocument doc = QJsonDocument::fromJson(session::chromeTrace(store));
    QStringList order;
    for (const QJsonValue &v : doc.object().value(QStringLiteral("traceEvents")).toArray()) {
        const QJsonObject e = v.toObject();
        if (e.value(QStringLiteral("ph")).toString() == QLatin1String("X") &&
            e.value(QStringLiteral("cat")).toString().startsWith(QLatin1String("module")))
            order << e.value(QStringLiteral("name")).toString();
    }
    QCOMPARE(order, (QStringList{"blocks", "blocks.0", "blocks.0.fc"}));
}

void TestTraceExport::idsAreSpacedOrPacked()
{
    const session::TraceIds few(std::vector<int>{4, 4, 99});
    QCOMPARE(few.stride(), 100);
    QCOMPARE(few.pid(0), 1);
    QCOMPARE(few.tid(2, 98), 299);
    QCOMPARE(session::TraceIds(std::vector<int>{100}).stride(), 1000);
    QCOMPARE(session::TraceIds(std::vector<int>{}).stride(), 100);

    // 65,536 ranks (the decoders' bound) with 40,000 threads on one: spaced by 100,000 the
    // ids would pass 2^31, so the blocks are packed, each right after the one before.
    std::vector<int> many(65536, 4);
    many[7] = 40000;
    const session::TraceIds packed(many);
    QCOMPARE(packed.stride(), 0);
    QCOMPARE(packed.pid(0), 1);
    for (int r = 0; r + 1 < int(many.size()); ++r)
        QCOMPARE(packed.pid(r + 1) - packed.pid(r), many[std::size_t(r)]);
    QVERIFY(packed.tid(65535, 3) < std::numeric_limits<std::int32_t>::max());
}

// Gradient reduce-scatters: paired by (rank, module, parameter) into X spans on the rank's
// "reduce-scatters k" threads (never a gathers thread), overlapping ones on separate threads;
// the CUDA allocator's figures as a counter of the rank's process.
void TestTraceExport::reduceScattersAndAllocatorCounters()
{
    const std::uint64_t t0 = 1000000;
    session::SessionStore store;
    store.applyState(smallState(2));
    const telemetry::ReduceScatterFields group{.module = 5, .bytes = 4096, .params = 2};
    const telemetry::ReduceScatterFields one{.module = 6, .param = 3, .bytes = 1024, .params = 1};
    const telemetry::ReduceScatterFields other{.module = 3, .bytes = 512, .params = 2};
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(t0, 0, telemetry::makeStepBegin()),
            eventAt(t0 + 1000, 0,
                    telemetry::makeFetchBegin({.param = 0, .cause = 1, .bytes = 6464})),
            eventAt(t0 + 2000, 0, telemetry::makeReduceScatterBegin(group)),
            eventAt(t0 + 3000, 0, telemetry::makeReduceScatterBegin(one)),
            eventAt(t0 + 5000, 0, telemetry::makeFetchEnd({.param = 0, .cause = 1, .bytes = 6464})),
            eventAt(t0 + 6000, 0, telemetry::makeReduceScatterEnd(group)),
            eventAt(t0 + 7000, 0, telemetry::makeReduceScatterEnd(one)),
            eventAt(t0 + 8000, 0, telemetry::makeStepEnd(1.0)),
            eventAt(t0 + 8000, 0, telemetry::makeAllocatorSample({1000, 2048, 1500})),
            eventAt(t0 + 2000, 1, telemetry::makeReduceScatterBegin(other)),
            eventAt(t0 + 2500, 1, telemetry::makeReduceScatterEnd(other)),
        },
        false);
    const QJsonDocument doc = QJsonDocument::fromJson(session::chromeTrace(store));
    const QString problem = perfettoProblem(doc, 100);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));

    QMap<QPair<int, int>, QString> threadNames;
    QMap<QString, QJsonObject> reduces; // by name
    QList<QJsonObject> counters;
    for (const QJsonValue &v : doc.object().value(QStringLiteral("traceEvents")).toArray()) {
        const QJsonObject e = v.toObject();
        const QString ph = e.value(QStringLiteral("ph")).toString();
        const QPair<int, int> thread(e.value(QStringLiteral("pid")).toInt(),
                                     e.value(QStringLiteral("tid")).toInt());
        if (ph == QLatin1String("M") &&
            e.value(QStringLiteral("name")).toString() == QLatin1String("thread_name"))
            threadNames.insert(thread, e.value(QStringLiteral("args"))
                                           .toObject()
                                           .value(QStringLiteral("name"))
                                           .toString());
        if (ph == QLatin1String("X") &&
            e.value(QStringLiteral("cat")).toString() == QLatin1String("reduce_scatter"))
            reduces.insert(e.value(QStringLiteral("name")).toString(), e);
        if (ph == QLatin1String("C")) counters.append(e);
    }
    auto threadOf = [&](const QJsonObject &e) {
        return threadNames.value(
            {e.value(QStringLiteral("pid")).toInt(), e.value(QStringLiteral("tid")).toInt()});
    };
    QCOMPARE(reduces.size(), 3);
    const QJsonObject g = reduces.value(QStringLiteral("reduce-scatter blocks.1"));
    const QJsonObject p = reduces.value(QStringLiteral("reduce-scatter blocks.1.fc.weight"));
    const QJsonObject r1 = reduces.value(QStringLiteral("reduce-scatter blocks.0"));
    QCOMPARE(g.value(QStringLiteral("pid")).toInt(), 1);
    QCOMPARE(g.value(QStringLiteral("ts")).toInteger(), 2);
    QCOMPARE(g.value(QStringLiteral("dur")).toInteger(), 4);
    QCOMPARE(threadOf(g), QStringLiteral("reduce-scatters 0"));
    QCOMPARE(threadOf(p), QStringLiteral("reduce-scatters 1")); // in flight with the group's
    QCOMPARE(p.value(QStringLiteral("ts")).toInteger(), 3);
    QCOMPARE(p.value(QStringLiteral("dur")).toInteger(), 4);
    const QJsonObject ga = g.value(QStringLiteral("args")).toObject();
    QCOMPARE(ga.value(QStringLiteral("module")).toString(), QStringLiteral("blocks.1"));
    QCOMPARE(ga.value(QStringLiteral("bytes")).toInteger(), 4096);
    QCOMPARE(ga.value(QStringLiteral("params")).toInteger(), 2);
    QVERIFY(!ga.contains(QStringLiteral("param"))); // a whole group
    QCOMPARE(p.value(QStringLiteral("args")).toObject().value(QStringLiteral("param")).toString(),
             QStringLiteral("blocks.1.fc.weight"));
    QCOMPARE(r1.value(QStringLiteral("pid")).toInt(), 101);
    QCOMPARE(threadOf(r1), QStringLiteral("reduce-scatters 0"));
    QCOMPARE(counters.size(), 1);
    const QJsonObject c = counters.front();
    QCOMPARE(c.value(QStringLiteral("name")).toString(), QStringLiteral("CUDA allocator"));
    QCOMPARE(c.value(QStringLiteral("pid")).toInt(), 1);
    QCOMPARE(c.value(QStringLiteral("ts")).toInteger(), 8);
    const QJsonObject ca = c.value(QStringLiteral("args")).toObject();
    QCOMPARE(ca.value(QStringLiteral("allocated")).toInteger(), 1000);
    QCOMPARE(ca.value(QStringLiteral("reserved")).toInteger(), 2048);
    QCOMPARE(ca.value(QStringLiteral("peak allocated")).toInteger(), 1500);
}

QTEST_GUILESS_MAIN(TestTraceExport)
#include "tst_traceexport.moc"

// The Chrome / Perfetto trace export: valid JSON, one pid per rank with process_name,
// X events with cat and integer microseconds, violations as instant events, distributedInfo.

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTest>

#include "session/traceexport.h"
#include "syntheticstate.h"

using namespace shardscope;
using namespace shardscope::testing;

class tst_TraceExport : public QObject
{
    Q_OBJECT
  private slots:
    void requiredFields();
};

void tst_TraceExport::requiredFields()
{
    SessionStore store;
    store.applyState(smallState(2));
    store.appendEvents(
        std::vector<Event>{
            makeEvent(1000000, 0, EventType::StepBegin),
            makeEvent(1000000, 0, EventType::ModuleEnter, 7),
            makeEvent(1001000, 0, EventType::FetchBegin, 0, 7, 6464,
                      static_cast<std::uint8_t>(FetchReason::Guard)),
            makeEvent(1003600, 0, EventType::FetchEnd, 0, 7, 6464,
                      static_cast<std::uint8_t>(FetchReason::Guard)),
            lmHeadViolation(1003700, 0),
            makeEvent(1010000, 0, EventType::ModuleExit, 7),
            makeEvent(1020000, 0, EventType::StepEnd, 0, 0, std::bit_cast<std::uint64_t>(4.25)),
            makeEvent(1002000, 1, EventType::ModuleEnter, 1),
            makeEvent(1002500, 1, EventType::ModuleExit, 1),
        },
        false);
    QJsonParseError err{};
    const QJsonDocument doc = QJsonDocument::fromJson(chromeTrace(store), &err);
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
                QCOMPARE(ts, 1.0);  // (1,001,000 - 1,000,000) ns
                QCOMPARE(dur, 3.0); // 2,600 ns rounds to 3 us
                QCOMPARE(e.value(QStringLiteral("pid")).toInt(), 0);
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
    QCOMPARE(processNames, (QSet<int>{0, 1}));
    QCOMPARE(gathers, 1);
    QCOMPARE(modules, 2);
    QCOMPARE(steps, 1);
    QCOMPARE(instants, 1);
}

QTEST_GUILESS_MAIN(tst_TraceExport)
#include "tst_traceexport.moc"

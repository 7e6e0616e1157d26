// The violations table: rows per (kind, accessor, parameter) with counts, checked by
// QAbstractItemModelTester while violations arrive; CSV export.

#include <QAbstractItemModelTester>
#include <QSortFilterProxyModel>
#include <QTest>

#include "models/severitycolor.h"
#include "models/violationsmodel.h"
#include "session/sessionstore.h"
#include "syntheticstate.h"

using namespace shardscope;
using namespace shardscope::test;

class TestViolationsModel : public QObject
{
    Q_OBJECT
  private slots:
    void rowsAppearAndCount();
    void csv();
    void oneRowPerSourceLocation();
    void lateAttachTimesCountFromTheFirstViolation();
    void severityIsAColumnAndAColour();
    void checkpointKindsAreRowsOfTheirOwn();
};

// Issue 54: the checkpoint kinds, which the agents record in their States (no event kind
// carries them), are rows of their own: named by their kind, on the model (no reader), an
// error each, with the agent's words and fix line; one row per call site.
void TestViolationsModel::checkpointKindsAreRowsOfTheirOwn()
{
    session::SessionStore store;
    models::ViolationsModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    state::EngineState st = smallState();
    state::ViolationRecord save;
    save.kind = ViolationKind::PartitionedSave;
    save.param = 0;
    save.paramName = "embed.weight";
    save.owner = 0;
    save.rank = 1;
    save.step = save.lastStep = 3;
    save.action = GuardAction::Recorded;
    save.count = 2;
    save.tsNs = 4000;
    save.message = "model.state_dict() was taken while ZeRO-3 partitions the model: 6 parameters";
    save.fix = "engine.save_16bit_model(DIR)";
    save.location = {"/src/train.py", 88, "main", {}};
    state::ViolationRecord resume = save;
    resume.kind = ViolationKind::ResumeWorldSize;
    resume.param = kNoParam;
    resume.paramName.clear();
    resume.count = 1;
    resume.location.line = 40;
    resume.fix = "python -m deepspeed.checkpoint.ds_to_universal";
    st.violations = {save, resume};
    store.applyState(std::move(st));
    store.flush();
    QCOMPARE(model.rowCount(), 2);
    for (int row = 0; row < 2; ++row) {
        const QString kind = model.index(row, models::ViolationsModel::Kind).data().toString();
        QVERIFY2(kind == "partitioned_save" || kind == "resume_world_size", qPrintable(kind));
        QCOMPARE(model.index(row, models::ViolationsModel::Severity).data().toString(),
                 QStringLiteral("error"));
        QCOMPARE(model.index(row, models::ViolationsModel::Accessor).data().toString(),
                 QStringLiteral("<none>"));
        if (kind == "partitioned_save") {
            QCOMPARE(model.index(row, models::ViolationsModel::Parameter).data().toString(),
                     QStringLiteral("embed.weight"));
            QCOMPARE(model.index(row, models::ViolationsModel::Count).data().toString(),
                     QStringLiteral("2"));
            QCOMPARE(model.index(row, 0).data(models::ViolationsModel::FixRole).toString(),
                     QStringLiteral("engine.save_16bit_model(DIR)"));
        }
    }
}

// Each row shows its severity (state/severity.h) in a column of its own, and the kind and
// severity in its colour: a read of attributes only (T5's `.dtype`, sent live with the
// event's read flag) is information in grey, a read DeepSpeed gathered a cost in amber, a
// read that crashes an error in red. Sorting by the column puts errors first.
void TestViolationsModel::severityIsAColumnAndAColour()
{
    session::SessionStore store;
    models::ViolationsModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QSortFilterProxyModel proxy;
    proxy.setSourceModel(&model);
    proxy.setSortRole(models::ViolationsModel::SortRole);
    proxy.sort(models::ViolationsModel::Severity, Qt::AscendingOrder);
    QAbstractItemModelTester proxyTester(&proxy,
                                         QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model.headerData(models::ViolationsModel::Severity, Qt::Horizontal).toString(),
             QStringLiteral("Severity"));
    store.applyState(smallState());
    store.flush();
    auto access = [](std::uint64_t ts, ModuleId accessor, GuardAction action, ViolationRead read) {
        return eventAt(ts, 0,
                       telemetry::makeUnregisteredAccess({.accessor = accessor,
                                                          .param = 0,
                                                          .owner = 1,
                                                          .status = ParamStatus::NotAvailable,
                                                          .action = action,
                                                          .read = read}));
    };
    store.appendEvents(
        std::vector<telemetry::Event>{
            access(100, 7, GuardAction::AutoRegistered, ViolationRead::Attribute),
            access(200, 8, GuardAction::AutoRegistered, ViolationRead::Values),
            access(300, kNoModule, GuardAction::Recorded, ViolationRead::Values)},
        false);
    store.flush();
    QCOMPARE(model.rowCount(), 3);
    const QStringList expected{"info", "cost", "error"};
    const QList<QColor> colours{models::severityColor(Severity::Info),
                                models::severityColor(Severity::Cost),
                                models::severityColor(Severity::Error)};
    for (int r = 0; r < 3; ++r) {
        QCOMPARE(model.index(r, models::ViolationsModel::Severity).data().toString(), expected[r]);
        QCOMPARE(model.index(r, models::ViolationsModel::Severity)
                     .data(Qt::ForegroundRole)
                     .value<QColor>(),
                 colours[r]);
        QCOMPARE(
            model.index(r, models::ViolationsModel::Kind).data(Qt::ForegroundRole).value<QColor>(),
            colours[r]);
        QCOMPARE(model.index(r, 0).data(models::ViolationsModel::SeverityRole).toInt(), 2 - r);
    }
    QVERIFY(colours[0] != colours[2] && colours[1] != colours[2] && colours[0] != colours[1]);
    // The attribute read's words: no values, nothing to fix; its tooltip says what info means.
    const QString tip =
        model.index(0, models::ViolationsModel::Kind).data(Qt::ToolTipRole).toString();
    QVERIFY2(tip.contains(QStringLiteral("read only attributes")), qPrintable(tip));
    QVERIFY2(tip.contains(QStringLiteral("info: no values were read")), qPrintable(tip));
    QVERIFY(model.index(0, 0).data(models::ViolationsModel::FixRole).toString().isEmpty());
    QVERIFY2(model.index(2, 0).data(Qt::ToolTipRole).toString().contains(QStringLiteral("error: ")),
             qPrintable(model.index(2, 0).data(Qt::ToolTipRole).toString()));
    // Errors first.
    QCOMPARE(proxy.index(0, models::ViolationsModel::Severity).data().toString(),
             QStringLiteral("error"));
    QCOMPARE(proxy.index(2, models::ViolationsModel::Severity).data().toString(),
             QStringLiteral("info"));
    // The tree colours a module by its worst: lm_head (7) has only the attribute read.
    QCOMPARE(store.moduleSeverity(7), std::optional<Severity>(Severity::Info));
    QCOMPARE(store.moduleSeverity(1), std::optional<Severity>(Severity::Error)); // the owner
    QCOMPARE(store.paramSeverity(0), std::optional<Severity>(Severity::Error));
}

void TestViolationsModel::rowsAppearAndCount()
{
    session::SessionStore store;
    models::ViolationsModel model(&store);
    QSortFilterProxyModel proxy;
    proxy.setSourceModel(&model);
    proxy.setSortRole(models::ViolationsModel::SortRole);
    proxy.sort(models::ViolationsModel::Count, Qt::DescendingOrder);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QAbstractItemModelTester proxyTester(&proxy,
                                         QAbstractItemModelTester::FailureReportingMode::QtTest);
    store.applyState(smallState());
    store.appendEvents(std::vector<telemetry::Event>{eventAt(5, 0, telemetry::makeStepBegin())},
                       false);
    store.flush();
    QCOMPARE(model.rowCount(), 0);
    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(1000005, 0)}, false);
    store.flush();
    QCOMPARE(model.rowCount(), 1);
    QCOMPARE(model.index(0, models::ViolationsModel::Kind).data().toString(),
             QStringLiteral("unregistered_access"));
    QCOMPARE(model.index(0, models::ViolationsModel::Accessor).data().toString(),
             QStringLiteral("lm_head"));
    QCOMPARE(model.index(0, models::ViolationsModel::Parameter).data().toString(),
             QStringLiteral("embed.weight"));
    QCOMPARE(model.index(0, models::ViolationsModel::Owner).data().toString(),
             QStringLiteral("embed"));
    QCOMPARE(model.index(0, models::ViolationsModel::Status).data().toString(),
             QStringLiteral("NOT_AVAILABLE"));
    QCOMPARE(model.index(0, models::ViolationsModel::Action).data().toString(),
             QStringLiteral("gathered"));
    QCOMPARE(model.index(0, models::ViolationsModel::Time).data().toString(),
             QStringLiteral("0.001 s"));
    QCOMPARE(model.index(0, 0).data(models::ViolationsModel::FixRole).toString(),
             QStringLiteral("register_external_parameter(lm_head, embed.weight)"));
    for (int i = 0; i < 5; ++i)
        store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(
                               2000000 + static_cast<std::uint64_t>(i), i % 4, 2)},
                           false);
    store.appendEvents(std::vector<telemetry::Event>{eventAt(
                           3000000, 1, telemetry::makeLateParameter({.module = 8, .param = 7}))},
                       false);
    store.flush();
    QCOMPARE(model.rowCount(), 1); // late: its violation comes with the producer's State
    state::EngineState st = smallState();
    state::ViolationRecord late;
    late.kind = ViolationKind::LateParameter;
    late.accessor = 8;
    late.param = 7;
    late.paramName = "pos_conv.weight_v";
    late.owner = 8;
    late.rank = 1;
    late.step = late.lastStep = 2;
    late.status = ParamStatus::Available;
    late.count = 1;
    late.tsNs = 3000001;
    st.violations.push_back(late);
    store.applyState(std::move(st));
    store.flush();
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.index(0, models::ViolationsModel::Count).data().toString(), QStringLiteral("6"));
    QCOMPARE(model.index(0, models::ViolationsModel::Rank).data().toString(),
             QStringLiteral("0-3"));
    QCOMPARE(model.index(0, models::ViolationsModel::Step).data().toString(),
             QStringLiteral("1-2"));
    QCOMPARE(model.index(1, models::ViolationsModel::Kind).data().toString(),
             QStringLiteral("late_parameter"));
    QCOMPARE(model.index(1, models::ViolationsModel::Parameter).data().toString(),
             QStringLiteral("pos_conv.weight_v"));
    QCOMPARE(proxy.index(0, models::ViolationsModel::Count).data().toString(), QStringLiteral("6"));
    store.clear();
    store.flush();
    QCOMPARE(model.rowCount(), 0);
}

void TestViolationsModel::csv()
{
    session::SessionStore store;
    models::ViolationsModel model(&store);
    store.applyState(smallState());
    store.appendEvents(
        std::vector<telemetry::Event>{lmHeadViolation(100, 0), lmHeadViolation(101, 2)}, false);
    store.flush();
    const QStringList lines =
        QString::fromUtf8(model.toCsv()).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
    QCOMPARE(lines.size(), 2);
    QCOMPARE(
        lines[0],
        QStringLiteral(
            "time_ns,step,last_step,ranks,kind,severity,accessor,parameter,owner,status,action,"
            "count,fix,location,function"));
    QCOMPARE(lines[1],
             QStringLiteral(
                 "100,1,1,\"0, "
                 "2\",unregistered_access,cost,lm_head,embed.weight,embed,NOT_AVAILABLE,gathered,2,"
                 "\"register_external_parameter(lm_head, embed.weight)\",,"));
}

// The same (accessor, parameter) read from two places in the user's code is two rows, each
// with its file:line (the table's column, the copyable role, the CSV); a live event, which
// carries no location, counts into its violation's row instead of making a third.
void TestViolationsModel::oneRowPerSourceLocation()
{
    session::SessionStore store;
    models::ViolationsModel model(&store);
    state::EngineState st = smallState();
    state::ViolationRecord a;
    a.kind = ViolationKind::UnregisteredAccess;
    a.accessor = 7;
    a.param = 0;
    a.owner = 1;
    a.step = a.lastStep = 1;
    a.count = 1;
    a.tsNs = 100;
    a.fix = "register_external_parameter(lm_head, embed.weight)";
    a.location = {"/src/model.py", 48, "Head.forward", {"/src/model.py:84 in forward"}};
    state::ViolationRecord b = a;
    b.location = {"/src/model.py", 91, "Head.logits", {}};
    b.tsNs = 200;
    st.violations = {a, b};
    store.applyState(st);
    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(300, 1)}, false);
    store.flush();
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.index(0, models::ViolationsModel::Location).data().toString(),
             QStringLiteral("model.py:48"));
    QCOMPARE(model.index(1, models::ViolationsModel::Location).data().toString(),
             QStringLiteral("model.py:91"));
    QCOMPARE(model.index(1, 0).data(models::ViolationsModel::LocationRole).toString(),
             QStringLiteral("/src/model.py:91"));
    QVERIFY(model.index(0, 0)
                .data(Qt::ToolTipRole)
                .toString()
                .contains(QStringLiteral("from /src/model.py:84 in forward")));
    QCOMPARE(model.index(0, models::ViolationsModel::Count).data().toString(), QStringLiteral("2"));
    const QStringList lines =
        QString::fromUtf8(model.toCsv()).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
    QVERIFY2(lines[1].endsWith(QStringLiteral(",/src/model.py:48,Head.forward")),
             qPrintable(lines[1]));
    QVERIFY2(lines[2].endsWith(QStringLiteral(",/src/model.py:91,Head.logits")),
             qPrintable(lines[2]));
}

// A client that attaches late gets the state's violations (from steps long past) and only
// the recent history: times count from the earliest moment known, so the violations keep
// their own times instead of all reading 0.000 s before the history's first event; and
// they stay put when new events arrive.
void TestViolationsModel::lateAttachTimesCountFromTheFirstViolation()
{
    session::SessionStore store;
    models::ViolationsModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    state::EngineState st = smallState();
    state::ViolationRecord early;
    early.kind = ViolationKind::UnregisteredAccess;
    early.accessor = 7;
    early.param = 0;
    early.owner = 1;
    early.step = 1;
    early.lastStep = 40;
    early.count = 40;
    early.tsNs = 2'000'000'000;
    state::ViolationRecord late = early;
    late.kind = ViolationKind::LateParameter;
    late.accessor = 3;
    late.param = 8;
    late.tsNs = 2'500'000'000;
    st.violations = {early, late};
    store.applyState(st);
    // The history holds the last steps only, from 60 s on.
    store.appendEvents(
        std::vector<telemetry::Event>{eventAt(60'000'000'000, 0, telemetry::makeStepBegin(), 41)},
        false);
    store.flush();
    QCOMPARE(store.timeOrigin(), std::uint64_t(2'000'000'000));
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.index(0, models::ViolationsModel::Time).data().toString(),
             QStringLiteral("0.000 s"));
    QCOMPARE(model.index(1, models::ViolationsModel::Time).data().toString(),
             QStringLiteral("0.500 s"));
    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(61'000'000'000, 2, 41)},
                       false);
    store.flush();
    QCOMPARE(store.timeOrigin(), std::uint64_t(2'000'000'000));
    QCOMPARE(model.index(1, models::ViolationsModel::Time).data().toString(),
             QStringLiteral("0.500 s"));
}

QTEST_GUILESS_MAIN(TestViolationsModel)
#include "tst_violationsmodel.moc"

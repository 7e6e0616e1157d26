// The two consumers of an engine's frames, the inspector's session (Connection and
// SessionStore, what File > Export snapshot writes) and shardscope-capture's fold
// (client::ClientState, what --out writes), fed the same frames, hold the same violations:
// a frame means one thing, whoever reads it (issue #49, defect 9: a late parameter sent as
// docs/protocol.md and docs/snapshot.md describe it was two rows per rank in the inspector,
// one in capture).

#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <tuple>

#include "client/clientstate.h"
#include "fakeengine.h"
#include "session/connection.h"
#include "session/sessionstore.h"
#include "session/snapshotio.h"
#include "syntheticstate.h"
#include "wire/snapshot.h"

using namespace shardscope;
using namespace shardscope::test;

class TestConsumers : public QObject
{
    Q_OBJECT
  private slots:
    void lateParameterAsDocumentedIsOneRowInBoth();
};

namespace {

using Row = std::tuple<int, ModuleId, ParamId, ModuleId, int, std::uint64_t>;

// Kind, accessor, parameter, owner, rank, count of every record, in one order.
std::vector<Row> rowsOf(const wire::Snapshot &snap)
{
    std::vector<Row> out;
    for (const state::ViolationRecord &v : snap.state.violations)
        out.emplace_back(static_cast<int>(v.kind), v.accessor, v.param, v.owner, v.rank, v.count);
    std::sort(out.begin(), out.end());
    return out;
}

QString text(const std::vector<Row> &rows)
{
    QStringList out;
    for (const auto &[kind, accessor, param, owner, rank, count] : rows)
        out << QStringLiteral("(kind %1, accessor %2, param %3, owner %4, rank %5, count %6)")
                   .arg(kind)
                   .arg(accessor == kNoModule ? QStringLiteral("null") : QString::number(accessor))
                   .arg(param)
                   .arg(owner)
                   .arg(rank)
                   .arg(count);
    return out.join(QStringLiteral(", "));
}

wire::Frame stateFrame(const state::EngineState &st)
{
    wire::Snapshot snap;
    snap.state = st;
    return {wire::MessageType::State, wire::encodeSnapshot(snap)};
}

} // namespace

// weight_norm's weight_g and weight_v created after partitioning on ranks 0 and 1, sent as
// documented: a late_parameter event with `a` the owner module (pos_conv), then the State's
// violation, recorded when the step began with them unadopted, with a null accessor (no
// module read them). Both consumers hold one row per parameter and rank, the State's.
void TestConsumers::lateParameterAsDocumentedIsOneRowInBoth()
{
    state::EngineState first = smallState(2);
    state::EngineState second = smallState(2);
    second.step = 2;
    for (int rank : {0, 1})
        for (ParamId p : {ParamId(6), ParamId(7)}) {
            state::ViolationRecord v;
            v.kind = ViolationKind::LateParameter;
            v.accessor = kNoModule;
            v.param = p;
            v.paramName = second.params[p].name;
            v.owner = 8; // pos_conv
            v.rank = rank;
            v.step = v.lastStep = 2;
            v.status = ParamStatus::Available;
            v.action = GuardAction::Recorded;
            v.count = 1;
            v.tsNs = 2000 + static_cast<std::uint64_t>(rank);
            v.fix = "adopt it";
            v.message = "created after partitioning";
            second.violations.push_back(v);
        }
    std::vector<telemetry::Event> late;
    for (int rank : {0, 1})
        for (ParamId p : {ParamId(6), ParamId(7)})
            late.push_back(
                eventAt(1000 + p, rank, telemetry::makeLateParameter({.module = 8, .param = p})));
    wire::Goodbye bye;
    bye.reason = "training finished";
    // What the engine sends after the Welcome: FakeEngine's own State and empty history, then
    // the live events, the State of step 2, the Goodbye.
    const std::vector<wire::Frame> frames{
        stateFrame(first),
        {wire::MessageType::HistoryBegin, wire::encodeHistoryBegin(0)},
        {wire::MessageType::HistoryEnd, {}},
        {wire::MessageType::EventBatch, wire::encodeEvents(late)},
        stateFrame(second),
        {wire::MessageType::Goodbye, wire::encodeGoodbye(bye)}};

    // shardscope-capture's fold.
    client::ClientState capture;
    for (const wire::Frame &f : frames) {
        const wire::Status applied = capture.apply(f);
        QVERIFY2(applied, applied ? "" : applied.error().c_str());
    }
    QVERIFY(capture.finished());

    // The inspector's session, over a real connection, and its exported snapshot.
    FakeEngine engine;
    engine.state = first;
    session::SessionStore store;
    session::Connection conn(&store);
    conn.attach(engine.endpoint());
    QTRY_VERIFY(engine.clientReady());
    QTRY_VERIFY(conn.caughtUp());
    for (std::size_t i = 3; i < frames.size(); ++i)
        engine.sendFrame(frames[i]);
    QTRY_COMPARE(conn.state(), session::Connection::State::Finished);
    store.flush();
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("inspector.json"));
    QCOMPARE(session::exportSnapshotFile(path, store), QString());
    auto exported = wire::readSnapshotFile(path.toStdString());
    QVERIFY2(exported, exported ? "" : exported.error().c_str());

    const std::vector<Row> inCapture = rowsOf(capture.snapshot());
    const std::vector<Row> inInspector = rowsOf(*exported);
    QCOMPARE(inCapture.size(), std::size_t(4)); // 2 parameters x 2 ranks, the State's
    QVERIFY2(
        inInspector == inCapture,
        qPrintable(
            QStringLiteral("inspector: %1\ncapture: %2").arg(text(inInspector), text(inCapture))));
    // Both still know the parameters are late.
    for (ParamId p : {ParamId(6), ParamId(7)}) {
        QVERIFY(capture.snapshot().state.params[p].late);
        QVERIFY(exported->state.params[p].late);
    }
}

QTEST_GUILESS_MAIN(TestConsumers)
#include "tst_consumers.moc"

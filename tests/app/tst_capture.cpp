#include <QtTest>

#include <QElapsedTimer>
#include <QProcess>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "agent/agentstate.h"
#include "client/clientstate.h"
#include "client/inspectorclient.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "core/engineprovider.h"
#include "prerequisite.h"
#include "processrun.h"
#include "server/inspector.h"
#include "snapshotquery.h"
#include "snapshotschema.h"
#include "telemetry/eventfields.h"
#include "wire/discovery.h"
#include "wire/snapshot.h"

using namespace shardscope;

namespace {

using Run = test::ProcessRun;
using test::readJson;

Run runCapture(const QStringList &args,
               const QProcessEnvironment &env = QProcessEnvironment::systemEnvironment())
{
    return test::runBinary(QStringLiteral("shardscope-capture"), args, 60000, env);
}

// A small in-process engine for the capture tool to attach to.
struct LocalEngine
{
    std::unique_ptr<core::Engine> engine;
    ModuleId lin = 0;
    ParamId w = 0;

    LocalEngine()
    {
        core::EngineConfig cfg;
        cfg.worldSize = 2;
        cfg.persistenceThreshold = 4;
        cfg.modelName = "local";
        engine = std::make_unique<core::Engine>(cfg, comm::makeCpuWorld(2));
        lin = engine->addModule(engine->root(), "lin", "Linear");
        std::vector<float> init(12, 1.0f);
        w = engine->addParameter(lin, "weight", {3, 4}, DType::F32, init.data());
        engine->partition();
    }
    void steps(int n)
    {
        engine->forEachLocalRank([&](int r) {
            for (int s = 0; s < n; ++s) {
                engine->beginStep(r);
                {
                    core::ModuleScope scope(*engine, r, lin, Phase::Forward);
                    (void)engine->access(r, w);
                }
                engine->endStep(r, 1.0);
            }
        });
    }
};

// shardscope-train with the inspector on a loopback port; endpoint() parses its announcement.
struct Trainer
{
    QProcess process;
    QString endpoint;
    QString output;

    bool start(const QStringList &extra)
    {
        process.setProcessChannelMode(QProcess::MergedChannels); // its errors show in output
        process.start(test::binPath("shardscope-train"),
                      QStringList{"--externals", "none", "--listen", "tcp:127.0.0.1:0"} + extra);
        if (!process.waitForStarted(10000)) return false;
        while (endpoint.isEmpty() && (process.canReadLine() || process.waitForReadyRead(30000))) {
            while (process.canReadLine()) {
                const QString line = QString::fromLocal8Bit(process.readLine());
                output += line;
                static const QRegularExpression re("inspector: listening on (tcp:\\S+)");
                if (auto m = re.match(line); m.hasMatch()) endpoint = m.captured(1);
            }
        }
        return !endpoint.isEmpty();
    }
    int finish()
    {
        process.waitForFinished(120000);
        output += QString::fromLocal8Bit(process.readAllStandardOutput());
        return process.exitStatus() == QProcess::NormalExit ? process.exitCode() : -1;
    }
};

bool snapshotSchemaProblemsEmpty(const nlohmann::json &j)
{
    const auto problems = test::snapshotSchemaProblems(j);
    for (const auto &p : problems)
        qWarning("schema: %s", p.c_str());
    return problems.empty();
}

bool haveTrainer()
{
    return QFileInfo::exists(test::binPath("shardscope-train"));
}

} // namespace

class TestCapture : public QObject
{
    Q_OBJECT
  private slots:
    void initTestCase();
    void badFlagsExitTwoWithAMessage_data();
    void badFlagsExitTwoWithAMessage();
    void unreachableEndpointIsAClearError();
    void wrongTokenIsRefused();
    void listShowsLiveEngines();
    void capturesALocalEngineUntilItFinishes();
    void trainerEndToEndFindsTheTiedEmbeddingAccess();
    void untilStepStopsAfterThatStep();
    void exportedTraceEqualsTheInspectorsExportOfTheSnapshot();
    void snapshotDocExampleDecodes();
    void pythonClientFromTheProtocolDocWorks();
    void engineDyingMidRunIsWrittenWithItsOwnStatus();
    void tokenFileAndEnvironmentAreUsed();
    void outputIntoAFifoIsWrittenNotReplaced();
    void twoRunsOfOneNameAreToldApart();
    void aStoppedRankEndsTheJobCapture();
    void aJobsStalledCollectiveIsPrintedWithItsOwnStatus();
    void aLiveJobsStalledCollectiveTravelsTheWire();

  private:
    QTemporaryDir m_runtime;
};

void TestCapture::initTestCase()
{
    QVERIFY(m_runtime.isValid());
    ::setenv("XDG_RUNTIME_DIR", m_runtime.path().toLocal8Bit().constData(), 1);
    QVERIFY2(QFileInfo::exists(test::binPath("shardscope-capture")),
             "shardscope-capture not found in SHARDSCOPE_BIN_DIR");
}

void TestCapture::badFlagsExitTwoWithAMessage_data()
{
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("message");
    QTest::newRow("nothing") << QStringList{} << "--attach ENDPOINT is required";
    QTest::newRow("no out")
        << QStringList{"--attach", "tcp:127.0.0.1:5"}
        << "--out FILE (a snapshot) or --export-trace FILE (a trace) is required";
    QTest::newRow("bad endpoint") << QStringList{"--attach", "http://x", "--out", "f"}
                                  << "unknown endpoint";
    QTest::newRow("bad seconds") << QStringList{"--attach", "tcp:127.0.0.1:5", "--out",
                                                "f",        "--seconds",       "soon"}
                                 << "--seconds expects a positive number, got 'soon'";
    QTest::newRow("both stops") << QStringList{"--attach",     "tcp:127.0.0.1:5",
                                               "--out",        "f",
                                               "--seconds",    "1",
                                               "--until-step", "2"}
                                << "cannot be combined";
    QTest::newRow("unknown") << QStringList{"--frobnicate"} << "unknown option '--frobnicate'";
    QTest::newRow("missing value") << QStringList{"--attach"} << "--attach needs a value";
}

void TestCapture::badFlagsExitTwoWithAMessage()
{
    QFETCH(QStringList, args);
    QFETCH(QString, message);
    const Run r = runCapture(args);
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains(message), qPrintable(r.err));
    QVERIFY(r.err.contains("shardscope-capture --help"));
}

void TestCapture::unreachableEndpointIsAClearError()
{
    QTemporaryDir dir;
    const Run r = runCapture(
        {"--attach", "unix:" + dir.filePath("none.sock"), "--out", dir.filePath("s.json")});
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("cannot connect to unix:") && r.err.contains("is the engine running?"),
             qPrintable(r.err));
    QVERIFY(!QFileInfo::exists(dir.filePath("s.json")));
}

void TestCapture::wrongTokenIsRefused()
{
    QTemporaryDir dir;
    LocalEngine local;
    server::InspectorOptions o;
    o.endpoint = "tcp:127.0.0.1:0";
    o.token = "s3cret";
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*local.engine), o);
    const QString ep = QString::fromStdString(inspector.endpoint());
    Run r = runCapture({"--attach", ep, "--out", dir.filePath("s.json"), "--token", "guess"});
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("the engine refused the connection: wrong token"), qPrintable(r.err));
    r = runCapture({"--attach", ep, "--out", dir.filePath("s.json")});
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("requires a token"), qPrintable(r.err));
    QVERIFY(!QFileInfo::exists(dir.filePath("s.json")));
}

void TestCapture::listShowsLiveEngines()
{
    QTemporaryDir runtime;
    ::setenv("XDG_RUNTIME_DIR", runtime.path().toLocal8Bit().constData(), 1);
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    Run r = runCapture({"--list"}, env);
    QCOMPARE(r.exitCode, 0);
    QVERIFY2(r.out.contains("no live ShardScope engines"), qPrintable(r.out));
    {
        LocalEngine local;
        server::Inspector inspector(std::make_unique<core::EngineStateProvider>(*local.engine),
                                    server::InspectorOptions{});
        r = runCapture({"--list"}, env);
        QCOMPARE(r.exitCode, 0);
        QVERIFY2(r.out.contains(QString::number(::getpid())), qPrintable(r.out));
        QVERIFY2(r.out.contains(QString::fromStdString(inspector.endpoint())), qPrintable(r.out));
        QVERIFY2(r.out.contains("local"), qPrintable(r.out));
    }
    r = runCapture({"--list"}, env);
    QVERIFY2(r.out.contains("no live ShardScope engines"), qPrintable(r.out));
    // Issue #14, defect 6: a directory others can write to (as one created first by another
    // user) may hold planted entries and FIFOs: nothing in it is listed or opened.
    const QString dir = runtime.filePath("shardscope");
    {
        std::ofstream(dir.toStdString() + "/" + std::to_string(::getpid()) + ".json")
            << "{\"format\":\"shardscope-discovery\",\"version\":1,\"pid\":" << ::getpid()
            << ",\"endpoint\":\"tcp:127.0.0.1:1\",\"model\":\"planted\",\"world_size\":1,"
               "\"backend\":\"cpu\",\"start_unix_ms\":0}";
    }
    QCOMPARE(::mkfifo((dir.toStdString() + "/1.json").c_str(), 0666), 0);
    QCOMPARE(::chmod(dir.toLocal8Bit().constData(), 0777), 0);
    r = runCapture({"--list"}, env);
    QCOMPARE(r.exitCode, 0);
    QVERIFY2(!r.out.contains("planted"), qPrintable(r.out));
    QVERIFY2(r.out.contains("is not a private directory of yours"), qPrintable(r.out));
    QCOMPARE(::chmod(dir.toLocal8Bit().constData(), 0700), 0);
    r = runCapture({"--list"}, env); // private again: the FIFO is skipped without waiting
    QCOMPARE(r.exitCode, 0);
    QVERIFY2(r.out.contains("planted"), qPrintable(r.out));
    ::setenv("XDG_RUNTIME_DIR", m_runtime.path().toLocal8Bit().constData(), 1);
}

void TestCapture::capturesALocalEngineUntilItFinishes()
{
    QTemporaryDir dir;
    LocalEngine local;
    server::InspectorOptions o;
    o.endpoint = "unix:" + dir.filePath("e.sock").toStdString();
    auto inspector = std::make_unique<server::Inspector>(
        std::make_unique<core::EngineStateProvider>(*local.engine), o);
    local.steps(3);
    QProcess capture;
    capture.start(test::binPath("shardscope-capture"),
                  {"--attach", QString::fromStdString(inspector->endpoint()), "--out",
                   dir.filePath("c.json")});
    QVERIFY(capture.waitForStarted());
    QVERIFY(capture.waitForReadyRead(30000)); // "attached to ..."
    local.steps(2);
    inspector->finish();
    QVERIFY(capture.waitForFinished(30000));
    QCOMPARE(capture.exitCode(), 0);
    auto snap = wire::readSnapshotFile(dir.filePath("c.json").toStdString());
    QVERIFY2(snap.ok(), snap.error().c_str());
    QCOMPARE(snap->state.step, std::uint32_t(5));
    QCOMPARE(snap->meta.producer, std::string("shardscope-capture"));
    QCOMPARE(snap->meta.pid, std::int64_t(::getpid()));
    int stepEnds = 0;
    for (const telemetry::Event &e : snap->events)
        stepEnds += e.type == EventType::StepEnd;
    QCOMPARE(stepEnds, 5 * 2); // history (3 steps) and live (2 steps), both ranks
    QVERIFY(snapshotSchemaProblemsEmpty(readJson(dir.filePath("c.json"))));
}

void TestCapture::trainerEndToEndFindsTheTiedEmbeddingAccess()
{
    if (!haveTrainer()) SHARDSCOPE_SKIP_IF_ALLOWED("trainer", "shardscope-train is not built");
    QTemporaryDir dir;
    const QString fileOut = dir.filePath("train.json");
    const QString captured = dir.filePath("capture.json");
    Trainer trainer;
    QVERIFY2(trainer.start({"--steps", "30", "--snapshot-out", fileOut}),
             qPrintable(trainer.output));

    QProcess capture;
    capture.start(test::binPath("shardscope-capture"),
                  {"--attach", trainer.endpoint, "--out", captured});

    auto client = client::InspectorClient::connect(trainer.endpoint.toStdString(), {});
    QVERIFY2(client.ok(), client.error().c_str());
    client::ClientState state;
    const state::ViolationRecord *found = nullptr;
    bool sawEvent = false;
    while (!state.finished() && !(found && sawEvent && state.liveEvents() > 0)) {
        auto frame = (*client)->next(30000);
        QVERIFY2(frame.ok() && frame->has_value(),
                 frame.ok() ? "no frame for 30 s" : frame.error().c_str());
        QVERIFY(state.apply(**frame).ok());
        const state::EngineState &s = state.snapshot().state;
        const ModuleId lmHead = [&] {
            for (const state::ModuleRecord &m : s.modules)
                if (m.path == "lm_head") return m.id;
            return kNoModule;
        }();
        for (const state::ViolationRecord &v : s.violations) {
            if (v.kind != ViolationKind::UnregisteredAccess || v.accessor != lmHead) continue;
            for (const state::ParamRecord &p : s.params)
                if (p.id == v.param && p.name == "embed.weight" &&
                    s.modules[v.owner].path == "embed")
                    found = &v;
        }
        for (const telemetry::Event &e : state.snapshot().events)
            if (e.type == EventType::UnregisteredAccess &&
                telemetry::readAccess(e).accessor == lmHead && lmHead != kNoModule)
                sawEvent = true;
    }
    QVERIFY2(found, "no unregistered access of embed.weight by lm_head");
    QVERIFY2(found->step <= 2, "the access was not found within the first steps");
    QCOMPARE(found->fix, std::string("register_external_parameter(lm_head, embed.weight)"));
    QVERIFY(sawEvent);
    QVERIFY(state.liveEvents() > 0);
    client->reset();

    QCOMPARE(trainer.finish(), 0);
    QVERIFY(capture.waitForFinished(60000));
    QCOMPARE(capture.exitCode(), 0);

    const nlohmann::json a = readJson(fileOut);
    const nlohmann::json b = readJson(captured);
    QVERIFY(snapshotSchemaProblemsEmpty(a));
    QVERIFY(snapshotSchemaProblemsEmpty(b));
    QVERIFY(wire::readSnapshotFile(captured.toStdString()).ok());
    QCOMPARE(b["engine"]["step"].get<int>(), 30);
    QCOMPARE(a["modules"], b["modules"]);
    QCOMPARE(a["params"].size(), b["params"].size());
    QVERIFY(a["params"].size() > 5);
    for (std::size_t i = 0; i < a["params"].size(); ++i)
        for (const char *k :
             {"id", "name", "module", "shape", "dtype", "numel", "padded_numel", "partition_numel",
              "persistent", "partitioned", "late", "status", "external_modules"})
            QVERIFY2(a["params"][i][k] == b["params"][i][k],
                     qPrintable(QString::fromStdString(a["params"][i]["name"].dump()) + " " + k));
    QVERIFY(!test::eventList(b).empty());
}

void TestCapture::untilStepStopsAfterThatStep()
{
    if (!haveTrainer()) SHARDSCOPE_SKIP_IF_ALLOWED("trainer", "shardscope-train is not built");
    QTemporaryDir dir;
    Trainer live;
    // It trains once the capture is attached, and for long enough: 20 steps took the trainer
    // ~100 ms, and the capture's last State could already say step 20 when it saw step 3 end.
    QVERIFY2(live.start({"--steps", "400", "--wait-for-client=60"}), qPrintable(live.output));
    const Run r = runCapture(
        {"--attach", live.endpoint, "--until-step", "3", "--out", dir.filePath("s.json")});
    QCOMPARE(r.exitCode, 0);
    auto snap = wire::readSnapshotFile(dir.filePath("s.json").toStdString());
    QVERIFY2(snap.ok(), snap.error().c_str());
    QVERIFY(snap->state.step >= 3);
    QVERIFY2(snap->state.step < 400, std::to_string(snap->state.step).c_str());
    bool step3Ended = false;
    for (const telemetry::Event &e : snap->events)
        step3Ended = step3Ended || (e.type == EventType::StepEnd && e.step == 3);
    QVERIFY(step3Ended);
    QCOMPARE(live.finish(), 0); // the trainer carries on after the capture left
}

// shardscope-capture --export-trace writes the bytes the inspector's export writes for the
// snapshot the same capture wrote (docs/trace.md): both fill the Qt-free session store and
// call its one trace writer. A real shardscope-train run, with its tied-embedding violation.
void TestCapture::exportedTraceEqualsTheInspectorsExportOfTheSnapshot()
{
    if (!haveTrainer()) SHARDSCOPE_SKIP_IF_ALLOWED("trainer", "shardscope-train is not built");
    if (!QFileInfo::exists(test::binPath("shardscope")))
        SHARDSCOPE_SKIP_IF_ALLOWED(
            "gui", "the inspector (shardscope) is not built (SHARDSCOPE_BUILD_GUI=OFF)");
    QTemporaryDir dir;
    const QString snap = dir.filePath("capture.json.gz");
    const QString captured = dir.filePath("capture.trace.json");
    const QString exported = dir.filePath("inspector.trace.json");
    Trainer trainer;
    QVERIFY2(trainer.start({"--steps", "8"}), qPrintable(trainer.output));
    const Run r =
        runCapture({"--attach", trainer.endpoint, "--out", snap, "--export-trace", captured});
    QVERIFY2(r.exitCode == 0, qPrintable(r.err));
    QVERIFY2(r.out.contains(snap + " and " + captured), qPrintable(r.out));
    QCOMPARE(trainer.finish(), 0);

    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("QT_QPA_PLATFORM", "offscreen");
    QProcess gui;
    gui.setProcessEnvironment(env);
    gui.start(test::binPath("shardscope"), {"--open", snap, "--export-trace", exported, "--quit"});
    QVERIFY(gui.waitForFinished(60000));
    QVERIFY2(gui.exitStatus() == QProcess::NormalExit && gui.exitCode() == 0,
             gui.readAllStandardError().constData());

    QFile a(captured), b(exported);
    QVERIFY(a.open(QIODevice::ReadOnly));
    QVERIFY(b.open(QIODevice::ReadOnly));
    const QByteArray mine = a.readAll(), theirs = b.readAll();
    // Not a trace of nothing: module and gather spans of every step, the violation.
    const nlohmann::json trace = nlohmann::json::parse(mine.toStdString());
    std::size_t modules = 0, gathers = 0, violations = 0;
    for (const nlohmann::json &e : trace["traceEvents"]) {
        const std::string cat = e.value("cat", "");
        modules += cat.starts_with("module,");
        gathers += cat.starts_with("gather,");
        violations += cat == "violation";
    }
    QVERIFY2(modules > 50 && gathers > 50 && violations > 0,
             qPrintable(QString("%1 module spans, %2 gathers, %3 violations")
                            .arg(modules)
                            .arg(gathers)
                            .arg(violations)));
    QCOMPARE(trace["otherData"]["step"].get<int>(), 8);
    if (mine != theirs) {
        qsizetype at = 0;
        while (at < mine.size() && at < theirs.size() && mine[at] == theirs[at])
            ++at;
        QFAIL(qPrintable(
            QString("the traces differ at byte %1 of %2/%3: capture `%4`, inspector `%5`")
                .arg(at)
                .arg(mine.size())
                .arg(theirs.size())
                .arg(QString::fromUtf8(mine.mid(std::max<qsizetype>(0, at - 60), 160)),
                     QString::fromUtf8(theirs.mid(std::max<qsizetype>(0, at - 60), 160)))));
    }
}

// The last fenced block of the given language in a document of docs/.
QString docBlock(const QString &doc, const QString &language)
{
    QFile f(QStringLiteral(SHARDSCOPE_SOURCE_DIR) + "/docs/" + doc);
    if (!f.open(QIODevice::ReadOnly)) return {};
    const QString text = QString::fromUtf8(f.readAll());
    const QString fence = "```" + language + "\n";
    const qsizetype start = text.lastIndexOf(fence);
    if (start < 0) return {};
    const qsizetype end = text.indexOf("```", start + fence.size());
    return text.mid(start + fence.size(), end - start - fence.size());
}

void TestCapture::snapshotDocExampleDecodes()
{
    const QString example = docBlock("snapshot.md", "json");
    QVERIFY(!example.isEmpty());
    auto snap = wire::decodeSnapshot(example.toStdString());
    QVERIFY2(snap.ok(), snap.error().c_str());
    QCOMPARE(snap->state.violations.size(), std::size_t(1));
    QCOMPARE(snap->events.size(), std::size_t(2)); // columns: times as differences
    QCOMPARE(snap->events[1].type, EventType::UnregisteredAccess);
    QCOMPARE(snap->events[1].tsNs, std::uint64_t(1503093148064));
    QCOMPARE(telemetry::readAccess(snap->events[1]).status, ParamStatus::NotAvailable);
    QCOMPARE(telemetry::readAccess(snap->events[1]).action, GuardAction::Gathered);
    QVERIFY(snapshotSchemaProblemsEmpty(nlohmann::json::parse(example.toStdString())));
}

void TestCapture::pythonClientFromTheProtocolDocWorks()
{
    if (!haveTrainer()) SHARDSCOPE_SKIP_IF_ALLOWED("trainer", "shardscope-train is not built");
    if (QStandardPaths::findExecutable("python3").isEmpty())
        SHARDSCOPE_SKIP_IF_ALLOWED("python", "python3 is not installed");
    QTemporaryDir dir;
    const QString script = dir.filePath("client.py");
    {
        QFile f(script);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(docBlock("protocol.md", "python").toUtf8());
    }
    Trainer trainer;
    // 20 steps are over in a fraction of a second, often before python3 has started:
    // the run waits for its client.
    QVERIFY2(trainer.start({"--steps", "20", "--wait-for-client=60"}), qPrintable(trainer.output));
    test::RunOptions options;
    options.timeoutMs = 60000;
    const Run py = test::runProcess("python3", {script, trainer.endpoint}, options);
    QVERIFY(py.finished());
    const QString &out = py.out;
    QVERIFY2(py.exitCode == 0, qPrintable(py.err));
    QVERIFY2(out.contains("unregistered_access lm_head embed.weight embed "
                          "register_external_parameter(lm_head, embed.weight)"),
             qPrintable(out));
    QVERIFY2(out.contains("0 lost; step 20"), qPrintable(out));
    QCOMPARE(trainer.finish(), 0);
}

// Issue #14, defect 13: the capture exited 0 when the engine died mid-run. It writes what
// it has, says the engine went away, and exits 3.
void TestCapture::engineDyingMidRunIsWrittenWithItsOwnStatus()
{
    if (!haveTrainer()) SHARDSCOPE_SKIP_IF_ALLOWED("trainer", "shardscope-train is not built");
    QTemporaryDir dir;
    const QString out = dir.filePath("early.json");
    Trainer trainer;
    QVERIFY2(trainer.start({"--steps", "100000"}), qPrintable(trainer.output));
    QProcess capture;
    capture.start(test::binPath("shardscope-capture"),
                  {"--attach", trainer.endpoint, "--out", out});
    QVERIFY(capture.waitForStarted());
    QVERIFY(capture.waitForReadyRead(30000)); // "attached to ..."
    trainer.process.kill();
    trainer.process.waitForFinished(10000);
    QVERIFY(capture.waitForFinished(30000));
    const QString said = QString::fromLocal8Bit(capture.readAllStandardOutput());
    QCOMPARE(capture.exitCode(), 3);
    QVERIFY2(said.contains("capture ended early: the engine went away"), qPrintable(said));
    QVERIFY(wire::readSnapshotFile(out.toStdString()).ok());
}

// Issue #14, defect 7: the token from --token-file (a private file) or SHARDSCOPE_TOKEN.
void TestCapture::tokenFileAndEnvironmentAreUsed()
{
    QTemporaryDir dir;
    LocalEngine local;
    server::InspectorOptions o;
    o.endpoint = "unix:" + dir.filePath("e.sock").toStdString();
    o.token = "s3cret";
    auto inspector = std::make_unique<server::Inspector>(
        std::make_unique<core::EngineStateProvider>(*local.engine), o);
    local.steps(1);
    const QString token = dir.filePath("token");
    {
        std::ofstream(token.toStdString()) << "s3cret\n";
    }
    QFile::setPermissions(token, QFile::ReadOwner | QFile::WriteOwner | QFile::ReadOther);
    const QString endpoint = QString::fromStdString(inspector->endpoint());
    const QStringList args = {"--attach",  endpoint, "--out", dir.filePath("c.json"),
                              "--seconds", "0.5"};
    Run r = runCapture(args + QStringList{"--token-file", token});
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains("chmod 600"), qPrintable(r.err));
    QFile::setPermissions(token, QFile::ReadOwner | QFile::WriteOwner);
    r = runCapture(args + QStringList{"--token-file", token});
    QVERIFY2(r.exitCode == 0, qPrintable(r.err));
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("SHARDSCOPE_TOKEN", "s3cret");
    r = runCapture(args, env);
    QVERIFY2(r.exitCode == 0, qPrintable(r.err));
    env.insert("SHARDSCOPE_TOKEN", "wrong");
    r = runCapture(args, env);
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("wrong token"), qPrintable(r.err));
}

// Reads a FIFO from a thread of this process until its writers are done. It opens the FIFO
// before any writer exists (O_NONBLOCK), so a writer that looks for a reader finds one.
class FifoReader
{
  public:
    explicit FifoReader(const QString &path)
        : m_fd(::open(path.toLocal8Bit().constData(), O_RDONLY | O_NONBLOCK))
    {
        if (m_fd >= 0) m_thread = std::thread([this] { loop(); });
    }
    ~FifoReader()
    {
        m_writersDone = true;
        if (m_thread.joinable()) m_thread.join();
        if (m_fd >= 0) ::close(m_fd);
    }
    bool opened() const { return m_fd >= 0; }
    // Once every writer has closed: drains what is left and writes it all to copy.
    bool finish(const QString &copy)
    {
        m_writersDone = true;
        if (m_thread.joinable()) m_thread.join();
        QFile out(copy);
        return out.open(QIODevice::WriteOnly) &&
               out.write(m_data.data(), qint64(m_data.size())) == qint64(m_data.size());
    }

  private:
    void loop()
    {
        char buf[65536];
        for (;;) {
            const ssize_t n = ::read(m_fd, buf, sizeof buf);
            if (n > 0) {
                m_data.append(buf, std::size_t(n));
                continue;
            }
            // 0: no writer (none yet, or all done); -1 with EAGAIN: a writer, nothing yet.
            if (n == 0 && m_writersDone) return;
            if (n < 0 && errno != EAGAIN && errno != EINTR) return; // finish() compares the copy
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    int m_fd;
    std::atomic<bool> m_writersDone{false};
    std::string m_data;
    std::thread m_thread;
};

// Issue #30, defect 4: the write-then-rename replaced a FIFO or a device (/dev/null as root)
// with a regular file. The one writer writes into them; what cannot be written is refused
// before the run, by the capture tool and by the inspector a training process starts.
void TestCapture::outputIntoAFifoIsWrittenNotReplaced()
{
    QTemporaryDir dir;
    Run r = runCapture({"--attach", "tcp:127.0.0.1:5", "--out", dir.path()});
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains("is a directory"), qPrintable(r.err));
    r = runCapture({"--attach", "tcp:127.0.0.1:5", "--out", dir.filePath("missing/s.json")});
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains("does not exist"), qPrintable(r.err));
    r = runCapture({"--attach", "tcp:127.0.0.1:5", "--out", "/proc/self/s.json"});
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains("cannot create a file in /proc/self"), qPrintable(r.err));

    const QString fifo = dir.filePath("pipe.json"), ownFifo = dir.filePath("own.json");
    QCOMPARE(::mkfifo(fifo.toLocal8Bit().constData(), 0600), 0);
    QCOMPARE(::mkfifo(ownFifo.toLocal8Bit().constData(), 0600), 0);
    LocalEngine local;
    {
        server::InspectorOptions bad;
        bad.listen = false;
        bad.snapshotOut = dir.path().toStdString();
        QVERIFY_THROWS_EXCEPTION(
            server::InspectorError,
            server::Inspector(std::make_unique<core::EngineStateProvider>(*local.engine), bad));
    }
    server::InspectorOptions o;
    o.endpoint = "unix:" + dir.filePath("e.sock").toStdString();
    o.snapshotOut = ownFifo.toStdString(); // the training process's own snapshot
    auto inspector = std::make_unique<server::Inspector>(
        std::make_unique<core::EngineStateProvider>(*local.engine), o);
    local.steps(2);
    // The reader of both FIFOs (the capture's snapshot and the engine's) opens them here,
    // before any writer looks for a reader: a reader process started alongside may not have
    // opened them yet on a loaded machine.
    FifoReader capturedCopy(fifo), ownCopy(ownFifo);
    QVERIFY(capturedCopy.opened() && ownCopy.opened());
    QProcess capture;
    capture.start(test::binPath("shardscope-capture"),
                  {"--attach", QString::fromStdString(inspector->endpoint()), "--out", fifo});
    QVERIFY(capture.waitForStarted());
    QVERIFY(capture.waitForReadyRead(30000)); // "attached to ..."
    local.steps(1);
    inspector->finish();
    QVERIFY(capture.waitForFinished(30000));
    QVERIFY2(capture.exitCode() == 0, capture.readAllStandardError().constData());
    QVERIFY(capturedCopy.finish(fifo + ".copy") && ownCopy.finish(ownFifo + ".copy"));
    for (const QString &f : {fifo, ownFifo}) {
        struct stat st
        {
        };
        QCOMPARE(::stat(f.toLocal8Bit().constData(), &st), 0);
        QVERIFY2(S_ISFIFO(st.st_mode), "the FIFO was replaced");
    }
    auto captured = wire::readSnapshotFile((fifo + ".copy").toStdString());
    QVERIFY2(captured.ok(), captured.error().c_str());
    QCOMPARE(captured->meta.producer, std::string("shardscope-capture"));
    QCOMPARE(captured->state.step, std::uint32_t(3));
    auto own = wire::readSnapshotFile((ownFifo + ".copy").toStdString());
    QVERIFY2(own.ok(), own.error().c_str());
    QCOMPARE(own->state.step, std::uint32_t(3));
    QCOMPARE(QDir(dir.path()).entryList({"*.tmp*"}, QDir::Files), QStringList{});
}

// Issue #30, defect 2: a job is one run (id, rendezvous, world size), not a name. Two jobs
// named "none" (torchrun's static rendezvous) were merged, every event twice; a discovery
// file naming another process's endpoint was merged in; the same endpoint listed twice was
// attached twice; processes of one name and different world sizes made a capture that wrote
// nothing.
void TestCapture::twoRunsOfOneNameAreToldApart()
{
    QTemporaryDir dir, runtime;
    const QString disc = runtime.filePath("shardscope");
    QVERIFY(QDir().mkpath(disc));
    QCOMPARE(::chmod(disc.toLocal8Bit().constData(), 0700), 0);
    const char *savedPort = std::getenv("MASTER_PORT");
    const std::string oldPort = savedPort ? savedPort : "";
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    auto startRun = [&](LocalEngine &local, const char *port, const QString &sock) {
        ::setenv("MASTER_PORT", port, 1);
        server::InspectorOptions o;
        o.job = "none";
        o.endpoint = "unix:" + dir.filePath(sock).toStdString();
        return std::make_unique<server::Inspector>(
            std::make_unique<core::EngineStateProvider>(*local.engine), o);
    };
    LocalEngine a, b;
    auto runA = startRun(a, "1001", "a.sock");
    auto runB = startRun(b, "1002", "b.sock");
    ::unsetenv("MASTER_ADDR");
    if (savedPort)
        ::setenv("MASTER_PORT", oldPort.c_str(), 1);
    else
        ::unsetenv("MASTER_PORT");
    QProcess sleeper; // a live process that is not the one at the endpoint its file names
    sleeper.start("sleep", {"60"});
    QVERIFY(sleeper.waitForStarted());
    auto announce = [&](const QString &file, const std::string &endpoint, std::int64_t pid,
                        const std::string &id, const std::string &rendezvous, int world,
                        std::vector<int> ranks = {0, 1}, const std::string &model = "local") {
        wire::DiscoveryEntry e;
        e.pid = pid;
        e.endpoint = endpoint;
        e.model = model;
        e.worldSize = world;
        e.backend = "cpu";
        e.job.id = id;
        e.job.rendezvous = rendezvous;
        e.job.worldSize = world;
        e.job.ranks = std::move(ranks);
        QVERIFY(wire::writeFileAtomically(disc.toStdString() + "/" + file.toStdString(),
                                          wire::encodeDiscovery(e)));
    };
    announce("a.json", runA->endpoint(), ::getpid(), "none", "127.0.0.1:1001", 2);
    announce("a-again.json", runA->endpoint(), ::getpid(), "none", "127.0.0.1:1001", 2);
    announce("forged.json", runB->endpoint(), sleeper.processId(), "none", "127.0.0.1:1001", 2);
    announce("b.json", runB->endpoint(), ::getpid(), "none", "127.0.0.1:1002", 2);
    announce("w2.json", runA->endpoint(), ::getpid(), "sized", "127.0.0.1:1003", 2);
    announce("w3.json", runB->endpoint(), ::getpid(), "sized", "127.0.0.1:1003", 3);
    // Issue #49, defect 8: a job named with a space, one rank still building its model.
    announce("m0.json", "unix:/nowhere/m0.sock", ::getpid(), "my run", "127.0.0.1:1004", 2, {0},
             "(model not sharded yet: shown once fully_shard's root runs its first forward or "
             "attach(model))");
    announce("m1.json", "unix:/nowhere/m1.sock", ::getpid(), "my run", "127.0.0.1:1004", 2, {1},
             "T5ForConditionalGeneration");
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("XDG_RUNTIME_DIR", runtime.path());

    Run r = runCapture({"--list"}, env);
    QCOMPARE(r.exitCode, 0);
    QVERIFY2(r.out.contains("job none@127.0.0.1:1001  (world size 2, 2 of 2 ranks live)") &&
                 r.out.contains("job none@127.0.0.1:1002  (world size 2, 2 of 2 ranks live)"),
             qPrintable(r.out));
    QVERIFY2(!r.out.contains("4 of 2"), qPrintable(r.out));
    // Issue #49, defect 8: each job with its model and the argument that attaches it, as it is
    // typed in a shell; a job whose ranks still build the model is named by the rank that
    // built it, each rank's own name in its row.
    QVERIFY2(r.out.contains("job none@127.0.0.1:1001  (world size 2, 2 of 2 ranks live)  model "
                            "local  --attach job:none@127.0.0.1:1001\n"),
             qPrintable(r.out));
    QVERIFY2(r.out.contains("job my run  (world size 2, 2 of 2 ranks live)  model "
                            "T5ForConditionalGeneration  --attach 'job:my run'\n") &&
                 r.out.contains("(model not sharded yet"),
             qPrintable(r.out));

    r = runCapture({"--attach", "job:none", "--out", dir.filePath("both.json")}, env);
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("job none names 2 runs: none@127.0.0.1:1001 (world size 2), "
                            "none@127.0.0.1:1002 (world size 2); attach one of them as "
                            "job:ID@RENDEZVOUS, e.g. job:none@127.0.0.1:1001"),
             qPrintable(r.err));
    QVERIFY(!QFileInfo::exists(dir.filePath("both.json")));
    r = runCapture({"--attach", "job:sized", "--out", dir.filePath("sized.json")}, env);
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("disagree on the world size"), qPrintable(r.err));

    a.steps(2);
    b.steps(3);
    QProcess capture;
    capture.setProcessEnvironment(env);
    capture.start(test::binPath("shardscope-capture"),
                  {"--attach", "job:none@127.0.0.1:1001", "--out", dir.filePath("a.json")});
    QVERIFY(capture.waitForStarted());
    QVERIFY(capture.waitForReadyRead(30000));
    QThread::msleep(500);
    runA->finish();
    QVERIFY(capture.waitForFinished(30000));
    const QString out = QString::fromLocal8Bit(capture.readAllStandardOutput());
    const QString err = QString::fromLocal8Bit(capture.readAllStandardError());
    QVERIFY2(capture.exitCode() == 0, qPrintable(out + err));
    QVERIFY2(err.contains("announces pid " + QString::number(sleeper.processId())) &&
                 err.contains("not this job's process; skipped"),
             qPrintable(err));
    QVERIFY2(out.contains("of job none@127.0.0.1:1001 (1 processes)"), qPrintable(out));
    auto snap = wire::readSnapshotFile(dir.filePath("a.json").toStdString());
    QVERIFY2(snap.ok(), snap.error().c_str());
    int stepEnds = 0;
    for (const telemetry::Event &e : snap->events)
        stepEnds += e.type == EventType::StepEnd;
    QCOMPARE(stepEnds, 2 * 2); // run A's 2 steps on its 2 ranks, each once
    QCOMPARE(snap->state.step, std::uint32_t(2));
    sleeper.kill();
    sleeper.waitForFinished();
}

// Issue #30, defect 12: `--attach job:X` never ended when one process was stopped (SIGSTOP)
// and the others had gone: a stopped server sends not even its heartbeat. After 5 s of
// silence of every process still attached, the capture writes what it has and exits 3.
void TestCapture::aStoppedRankEndsTheJobCapture()
{
    if (!haveTrainer()) SHARDSCOPE_SKIP_IF_ALLOWED("trainer", "shardscope-train is not built");
    QTemporaryDir dir, runtime;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("XDG_RUNTIME_DIR", runtime.path());
    env.insert("TORCHELASTIC_RUN_ID", "stopjob");
    env.insert("MASTER_ADDR", "127.0.0.1");
    env.insert("MASTER_PORT", "1");
    QProcess ranks[2];
    for (QProcess &p : ranks) {
        p.setProcessEnvironment(env);
        p.setProcessChannelMode(QProcess::MergedChannels);
        p.start(test::binPath("shardscope-train"), {"--backend", "cpu", "--world-size", "2",
                                                    "--steps", "1000000", "--externals", "none"});
        QVERIFY(p.waitForStarted());
    }
    const auto cleanup = qScopeGuard([&] {
        for (QProcess &p : ranks) {
            ::kill(static_cast<pid_t>(p.processId()), SIGCONT);
            p.kill();
            p.waitForFinished();
        }
    });
    for (int i = 0;
         i < 300 && QDir(runtime.filePath("shardscope")).entryList({"*.json"}).size() < 2; ++i)
        QThread::msleep(100);
    QCOMPARE(QDir(runtime.filePath("shardscope")).entryList({"*.json"}).size(), 2);
    QProcess capture;
    capture.setProcessEnvironment(env);
    capture.start(test::binPath("shardscope-capture"),
                  {"--attach", "job:stopjob@127.0.0.1:1", "--out", dir.filePath("s.json")});
    QVERIFY(capture.waitForStarted());
    QVERIFY(capture.waitForReadyRead(30000));
    QThread::msleep(1000);
    ::kill(static_cast<pid_t>(ranks[0].processId()), SIGSTOP);
    ranks[1].kill(); // gone without a goodbye
    QElapsedTimer t;
    t.start();
    const bool ended = capture.waitForFinished(30000);
    const QString said = QString::fromLocal8Bit(capture.readAllStandardOutput()) +
                         QString::fromLocal8Bit(capture.readAllStandardError());
    QVERIFY2(ended, qPrintable("the capture did not end: " + said));
    QVERIFY2(t.elapsed() < 15000, qPrintable(QString::number(t.elapsed())));
    QVERIFY2(capture.exitCode() == 3, qPrintable(said));
    QVERIFY2(said.contains("has sent nothing for 5 s, not even a heartbeat: stopped (SIGSTOP) or "
                           "hung"),
             qPrintable(said));
    auto snap = wire::readSnapshotFile(dir.filePath("s.json").toStdString());
    QVERIFY2(snap.ok(), snap.error().c_str());
    QVERIFY(snap->state.step > 0);
}

QTEST_GUILESS_MAIN(TestCapture)
// Issue 51: the rank files of a job whose rank 0 waits in a gather rank 1 never issued (rank 1
// ran one batch fewer and ended). shardscope-capture --open aligns them, prints the job's
// rank_stalled with rank 0's line and the fix, writes it into the snapshot, and exits 4; the
// same job without the extra gather exits 0 and prints none.
void TestCapture::aJobsStalledCollectiveIsPrintedWithItsOwnStatus()
{
    QTemporaryDir dir;
    auto writeRanks = [&](const QString &name, bool hang) -> QStringList {
        QStringList files;
        for (int r = 0; r < 2; ++r) {
            wire::Snapshot s;
            s.meta.producer = "tst";
            s.state.modelName = "tiny";
            s.state.worldSize = 2;
            s.state.backend = "gloo";
            s.state.fixDialect = "deepspeed";
            s.state.localRanks = {r};
            s.state.modules = {{0, "", "Model", kNoModule}, {1, "embed", "Embedding", 0}};
            for (std::uint64_t seq = 1; seq <= 4; ++seq)
                for (const EventType t : {EventType::CollectiveBegin, EventType::CollectiveEnd}) {
                    const telemetry::CollectiveFields f{CollectiveKind::AllGather, 1, 0, seq, 4096,
                                                        FetchReason::Forward,      1};
                    const telemetry::Event e = t == EventType::CollectiveBegin
                                                   ? telemetry::makeCollectiveBegin(f)
                                                   : telemetry::makeCollectiveEnd(f);
                    s.events.push_back(telemetry::stamped(
                        e, seq * 10'000'000 + (t == EventType::CollectiveEnd ? 1000 : 0), 1,
                        std::uint16_t(r)));
                }
            if (hang && r == 0) {
                s.events.push_back(telemetry::stamped(
                    telemetry::makeCollectiveBegin(
                        {CollectiveKind::AllGather, 1, 0, 5, 4096, FetchReason::Forward, 1}),
                    50'000'000, 2, 0));
                // Its watchdog's record: waited 6 s at the script's line.
                state::ViolationRecord v;
                v.kind = ViolationKind::RankStalled;
                v.rank = 0;
                v.count = 1;
                v.accessor = 1;
                v.message = "this rank has waited 6.0 s";
                v.location = {"/job/train.py", 88, "evaluate", {}};
                v.collective.seq = 5;
                v.collective.waitedMs = 6000;
                state::CollectiveSide side;
                side.ranks = {0};
                side.position = CollectivePosition::Waiting;
                v.collective.sides = {side};
                v.collective.sites = {{0, 5, 6000, v.location}};
                s.state.violations.push_back(v);
            }
            const QString file = dir.filePath(name + ".rank" + QString::number(r) + ".json");
            if (!wire::writeSnapshotFile(file.toStdString(), s)) return QStringList{};
            files << "--open" << file;
        }
        return files;
    };
    const QStringList hung = writeRanks("hung", true), healthy = writeRanks("healthy", false);
    QCOMPARE(hung.size(), 4); // --open FILE, twice
    QCOMPARE(healthy.size(), 4);
    const QString out = dir.filePath("job.json");
    Run r = runCapture(hung + QStringList{"--out", out});
    QVERIFY2(r.finished(), qPrintable(r.err));
    QVERIFY2(r.exitCode == 4, qPrintable(r.out + r.err));
    QVERIFY2(r.out.contains("rank_stalled (group 0, #5, rank 0): collective #5 of the default "
                            "process group stalled"),
             qPrintable(r.out));
    QVERIFY2(r.out.contains("rank 0 waits in an all-gather for `embed` (forward, 4.0 KiB, 1 "
                            "parameter), at /job/train.py:88"),
             qPrintable(r.out));
    QVERIFY2(r.out.contains("rank 1 had ended after #4"), qPrintable(r.out));
    QVERIFY2(r.out.contains("fix: DistributedSampler(dataset, drop_last=True)"), qPrintable(r.out));
    const auto written = wire::readSnapshotFile(out.toStdString());
    QVERIFY2(written.ok(), written.ok() ? "" : written.error().c_str());
    const auto job = std::count_if(
        written->state.violations.begin(), written->state.violations.end(),
        [](const state::ViolationRecord &v) {
            return v.kind == ViolationKind::RankStalled && v.collective.sides.size() == 2;
        });
    QCOMPARE(job, 1);
    r = runCapture(healthy + QStringList{"--out", out});
    QCOMPARE(r.exitCode, 0);
    QVERIFY2(!r.out.contains("rank_stalled"), qPrintable(r.out));
    // A threshold that is no number: said, naming the variable, before anything is read.
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("SHARDSCOPE_STALL_SECONDS", "soon");
    r = runCapture(hung + QStringList{"--out", out}, env);
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.contains("SHARDSCOPE_STALL_SECONDS is `soon`"), qPrintable(r.err));
}

// The same over the wire: two rank processes' agent states (as the Python agents fill them)
// served by their endpoints, attached as one job. Their collective events (kinds 22, 23: the
// capture's Hello lists "events_3") and rank 0's watchdog record with its collective (StateBinary
// layout 5) reach the capture, which finds the stall and exits 4.
void TestCapture::aLiveJobsStalledCollectiveTravelsTheWire()
{
    QTemporaryDir dir;
    std::vector<agent::AgentState *> states;
    std::vector<std::unique_ptr<server::Inspector>> inspectors;
    QStringList endpoints;
    for (int r = 0; r < 2; ++r) {
        agent::AgentConfig cfg;
        cfg.modelName = "tiny";
        cfg.rank = r;
        cfg.worldSize = 2;
        cfg.dialect = state::FixDialect::DeepSpeed;
        auto provider = std::make_unique<agent::AgentState>(cfg);
        states.push_back(provider.get());
        server::InspectorOptions o;
        o.endpoint = "unix:" + dir.filePath("r" + QString::number(r) + ".sock").toStdString();
        inspectors.push_back(std::make_unique<server::Inspector>(std::move(provider), o));
        endpoints << QString::fromStdString(inspectors.back()->endpoint());
    }
    const ModuleId embed0 = states[0]->ensureModule("embed", "Embedding");
    const ModuleId embed1 = states[1]->ensureModule("embed", "Embedding");
    for (std::uint64_t i = 0; i < 4; ++i)
        for (auto [st, m] : {std::pair{states[0], embed0}, std::pair{states[1], embed1}}) {
            const std::uint64_t seq =
                st->collectiveBegin(CollectiveKind::AllGather, 0, m, FetchReason::Forward, 4096, 1);
            st->collectiveEnd(0, seq);
        }
    QProcess capture;
    capture.start(test::binPath("shardscope-capture"),
                  {"--attach", endpoints.join(","), "--out", dir.filePath("job.json")});
    QVERIFY(capture.waitForStarted());
    QVERIFY(capture.waitForReadyRead(30000)); // "attached to ..."
    // Rank 0 evaluates one batch more: its gather waits, its watchdog says where; rank 1 ends.
    const std::uint64_t seq = states[0]->collectiveBegin(CollectiveKind::AllGather, 0, embed0,
                                                         FetchReason::Forward, 4096, 1);
    const auto inFlight = states[0]->inFlight(0, seq);
    QVERIFY(inFlight.has_value());
    states[0]->collectiveStalled(*inFlight, 6.0, {"/job/train.py", 91, "evaluate", {}}, {});
    QTest::qWait(300); // its State (the record) goes out before the goodbye
    inspectors[1]->finish();
    inspectors[0]->finish();
    QVERIFY(capture.waitForFinished(30000));
    const QString out = QString::fromUtf8(capture.readAllStandardOutput());
    QVERIFY2(capture.exitCode() == 4,
             qPrintable(out + QString::fromUtf8(capture.readAllStandardError())));
    QVERIFY2(out.contains("rank_stalled (group 0, #5, rank 0): collective #5 of the default "
                          "process group stalled for 6.0 s: rank 0 waits in an all-gather for "
                          "`embed`"),
             qPrintable(out));
    QVERIFY2(out.contains("at /job/train.py:91; rank 1 had ended after #4"), qPrintable(out));
    auto snap = wire::readSnapshotFile(dir.filePath("job.json").toStdString());
    QVERIFY2(snap.ok(), snap.error().c_str());
    int begins = 0;
    for (const telemetry::Event &e : snap->events)
        begins += e.type == EventType::CollectiveBegin;
    QCOMPARE(begins, 9);
}

#include "tst_capture.moc"

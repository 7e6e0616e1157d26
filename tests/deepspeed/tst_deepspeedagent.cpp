// The DeepSpeed agent against real DeepSpeed ZeRO-3 on CPU: two rank processes over gloo
// (scripts/launch, torchrun's environment), python/examples/deepspeed_stories.py with each
// story's flags, and what every rank recorded, read back with our own snapshot decoder and
// the snapshot schema checks; one run is captured live by shardscope-capture.
//
// One CTest test per DeepSpeed release of the tested range (TESTED_VERSIONS in
// python/shardscope/_dsinternals.py): SHARDSCOPE_DS_VERSION names the release the test expects,
// SHARDSCOPE_DS_PATH the folder scripts/deps installed it in (empty: the project environment's
// own, pinned in python/requirements.txt).

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QProcess>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QSet>
#include <QStringList>
#include <QTemporaryDir>
#include <QTest>
#include <QThread>
#include <QVersionNumber>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <csignal>
#include <map>
#include <optional>
#include <set>

#include "prerequisite.h"
#include "pythonrun.h"
#include "rankjob.h"
#include "ranksnapshots.h"
#include "snapshotquery.h"
#include "snapshotschema.h"
#include "wire/snapshot.h"

using nlohmann::json;

namespace {

using shardscope::test::fetchesOf;
using shardscope::test::findParam;
using shardscope::test::lineOf;
using shardscope::test::moduleIdOf;
using shardscope::test::readJson;
using shardscope::test::violations;

using Run = shardscope::test::ProcessRun;

// The project environment's Python (scripts/deps), the one the native module is built for.
QString python()
{
    return QStringLiteral(SHARDSCOPE_PYTHON_EXE);
}

// The environment of a DeepSpeed run on CPU (tests/support/pythonrun.h: the release under
// test, its JIT-built ops such as the CPU accelerator's shared-memory collective) on
// DeepSpeed's CPU accelerator.
QProcessEnvironment dsEnvironment()
{
    QProcessEnvironment env =
        shardscope::test::deepSpeedEnvironment(QStringLiteral(SHARDSCOPE_PYTHON_DIR));
    env.insert("DS_ACCELERATOR", "cpu");
    env.insert("LOCAL_SIZE", "2"); // DeepSpeed's CPU accelerator: devices on this machine
    return env;
}

constexpr int kForward = 0, kBackward = 1, kGatheredParameters = 3,
              kGuard = 4; // fetch reasons (docs/protocol.md)

} // namespace

class TestDeepSpeedAgent : public QObject
{
    Q_OBJECT

    QTemporaryDir m_dir;
    QString m_skip;
    std::optional<Run> m_compiled; // compiledModel's compiled run, which compiledModelAsEager reads
    QString m_version;             // the DeepSpeed release the ranks import

    // Starts the stories on 2 ranks (tests/support/rankjob.h); runtime: the XDG_RUNTIME_DIR
    // of the run (discovery); monitorInterval: as startRanks says.
    QProcess *start(const QStringList &args, const QString &runtime,
                    const QString &monitorInterval = QStringLiteral("0.1"),
                    const QString &script = QStringLiteral(SHARDSCOPE_EXAMPLE))
    {
        return shardscope::test::startRanks(this, dsEnvironment(),
                                            QStringLiteral(SHARDSCOPE_LAUNCH), python(), script,
                                            args, runtime, monitorInterval);
    }

    Run run(const QStringList &args, const QString &script = QStringLiteral(SHARDSCOPE_EXAMPLE))
    {
        return shardscope::test::finishRanks(
            start(args, m_dir.path(), QStringLiteral("0.1"), script));
    }

    // The inspector attached to endpoint as to shardscope-train, offscreen, exporting what it
    // shows once step afterStep is over.
    void startInspector(QProcess &gui, const QString &endpoint, const QString &out)
    {
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("QT_QPA_PLATFORM", "offscreen");
        gui.setProcessEnvironment(env);
        gui.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope",
                  {"--attach", endpoint, "--after-step", "3", "--export-snapshot", out, "--quit"});
    }

    // Story 1's read inside T5's forward, in both ranks' snapshot_out (hfT5ReadInForward).
    // Besides it, every T5 under ZeRO-3 has one silent registration a block and nothing else:
    // T5DenseActDense reads self.wo.weight.dtype before it calls wo (docs/deepspeed.md). That
    // read touches no values: an attribute read, severity info (issue 49, item 10), never the
    // crash-class error; the model's read of shared.weight's values is a cost (DeepSpeed
    // gathers it for the read).
    void checkT5ReadInForward(const QString &name, int steps, bool silent)
    {
        const std::vector<json> snaps = snapshots(name);
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            QCOMPARE(s["engine"]["step"].get<int>(), steps);
            std::vector<json> reads;
            for (const json &v : violations(s, "unregistered_access"))
                if (v["param"] == "shared.weight") reads.push_back(v);
            const json *shared = findParam(s, "shared.weight");
            QVERIFY(shared);
            QVERIFY2((*shared)["external_modules"] == json::array({""}), shared->dump().c_str());
            static const QRegularExpression woRead(
                R"(^(encoder|decoder)\.block\.[01]\.layer\.[12]\.DenseReluDense\.wo\.weight$)");
            int woReads = 0;
            for (const json &v : s["violations"]) {
                if (v["param"] == "shared.weight") continue;
                QVERIFY2(v["kind"] == "unregistered_access" && v["action"] == "auto_registered" &&
                             woRead.match(QString::fromStdString(v["param"].get<std::string>()))
                                 .hasMatch(),
                         v.dump().c_str());
                QVERIFY2(v["read"] == "attribute" && v["severity"] == "info" &&
                             v["status"] == "NOT_AVAILABLE" && v["fix"] == "",
                         v.dump().c_str());
                QVERIFY2(v["message"].get<std::string>().find("read only attributes") !=
                             std::string::npos,
                         v.dump().c_str());
                ++woReads;
            }
            QCOMPARE(woReads, 4); // --layers 2: two blocks in each stack
            if (!silent) {
                QVERIFY2(reads.empty(), s["violations"].dump().c_str());
                QVERIFY2((*shared)["external_auto_modules"].empty(), shared->dump().c_str());
                continue;
            }
            QCOMPARE(reads.size(), std::size_t(1));
            QCOMPARE(reads[0]["accessor"].get<std::string>(), std::string(""));
            QCOMPARE(reads[0]["action"].get<std::string>(), std::string("auto_registered"));
            QCOMPARE(reads[0]["severity"].get<std::string>(), std::string("cost"));
            QVERIFY2(!reads[0].contains("read"), reads[0].dump().c_str()); // its values
            QCOMPARE(reads[0]["fix"].get<std::string>(),
                     std::string("deepspeed.zero.register_external_parameter(model, "
                                 "model.shared.weight)"));
            QVERIFY2((*shared)["external_auto_modules"] == json::array({""}),
                     shared->dump().c_str());
        }
    }

    QString snapshotArg(const QString &name)
    {
        return shardscope::test::rankSnapshotArg(m_dir.path(), name);
    }
    QString snapshotOf(const QString &name, int rank)
    {
        return shardscope::test::rankSnapshotPath(m_dir.path(), name, rank);
    }

    // Both ranks' snapshots, decoded with our decoder and passing the schema checks.
    std::vector<json> snapshots(const QString &name)
    {
        return shardscope::test::rankSnapshots(m_dir.path(), name);
    }

    // `python args` in a DeepSpeed run's environment (XDG_RUNTIME_DIR: the suite's folder,
    // where an agent announces itself; unset: leave the test's own).
    Run runPython(const QStringList &args, int timeoutMs = 120000,
                  const QProcessEnvironment &extra = {}, bool ownRuntime = true)
    {
        shardscope::test::RunOptions options;
        options.environment = dsEnvironment();
        if (ownRuntime) options.environment.insert("XDG_RUNTIME_DIR", m_dir.path());
        for (const QString &key : extra.keys())
            options.environment.insert(key, extra.value(key));
        options.timeoutMs = timeoutMs;
        return shardscope::test::runProcess(python(), args, options);
    }

  private slots:
    // A case that failed or timed out before it finished its launch leaves no rank running.
    void cleanup() { shardscope::test::endRankLaunches(this); }

    void initTestCase()
    {
        QVERIFY(m_dir.isValid());
        const QString want = qEnvironmentVariable("SHARDSCOPE_DS_VERSION");
        Run probe;
        m_skip = shardscope::test::pythonPrerequisiteMissing(
            python(), QStringLiteral(SHARDSCOPE_PYTHON_DIR), dsEnvironment(),
            "import torch, deepspeed; print(deepspeed.__version__)",
            "import torch and DeepSpeed (scripts/deps installs them)", &probe);
        m_version = probe.out.trimmed().section('\n', -1);
        if (m_skip.isEmpty() && !want.isEmpty() && m_version != want)
            m_skip = "DeepSpeed " + want + " was asked for, " + python() + " imports " + m_version +
                     " (scripts/deps installs the tested releases)";
        // A skip would hide a missing install step (everything above is what scripts/deps
        // installs): it fails unless asked for, for DeepSpeed or for this release.
        if (const QString refused = shardscope::test::refusedSkip(
                {"deepspeed", "deepspeed-" + (want.isEmpty() ? m_version : want)}, m_skip);
            !refused.isEmpty())
            QFAIL(qPrintable(refused));
        if (!m_skip.isEmpty()) qWarning("skipping: %s", qPrintable(m_skip));
    }

    // Story 1 as users hit it: DeepSpeed registers embed.weight on lm_head silently inside
    // the engine's forward. Recorded with the fix; a live capture of rank 1 sees it too.
    void tiedEmbeddingInForward()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QTemporaryDir runtime;
        // The ranks hold after step 3 until the clients below are done (at most 120 s): on
        // a loaded machine the inspector may take seconds to start.
        const QString release = m_dir.filePath("tied.release");
        QProcess *p =
            start({"--externals", "none", "--weight-norm", "off", "--steps", "3", "--hold", "120",
                   "--hold-until", release, "--snapshot-out", snapshotArg("tied")},
                  runtime.path());
        // Both ranks announce themselves in discovery, as one job, with their ranks.
        QProcess list;
        QString listed;
        for (int i = 0; i < 600 && !listed.contains("2 of 2 ranks live"); ++i) {
            QThread::msleep(100);
            QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
            env.insert("XDG_RUNTIME_DIR", runtime.path());
            list.setProcessEnvironment(env);
            list.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture", {"--list"});
            list.waitForFinished(10000);
            listed = QString::fromUtf8(list.readAllStandardOutput());
        }
        QVERIFY2(listed.contains("2 of 2 ranks live"), qPrintable(listed));
        QVERIFY2(listed.contains("rank 0") && listed.contains("rank 1"), qPrintable(listed));
        const QDir disc(runtime.path() + "/shardscope");
        QString endpoint;
        QString endpoint0;
        QString job;
        for (const QString &f : disc.entryList({"*.json"})) {
            const json d = readJson(disc.filePath(f));
            QCOMPARE(d["job"]["world_size"].get<int>(), 2);
            QCOMPARE(d["backend"].get<std::string>(), std::string("gloo"));
            if (job.isEmpty()) job = QString::fromStdString(d["job"]["id"]);
            QCOMPARE(QString::fromStdString(d["job"]["id"]), job); // one job
            if (d["job"]["ranks"] == json::array({1}))
                endpoint = QString::fromStdString(d["endpoint"]);
            if (d["job"]["ranks"] == json::array({0}))
                endpoint0 = QString::fromStdString(d["endpoint"]);
        }
        QVERIFY2(!endpoint.isEmpty() && !endpoint0.isEmpty(), "no discovery file for a rank");
        QProcess capture;
        capture.start(
            QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
            {"--attach", endpoint, "--until-step", "3", "--out", m_dir.filePath("capture.json")});
        // The whole job, both rank processes, in one snapshot.
        QProcess jobCapture;
        QProcessEnvironment jobEnv = QProcessEnvironment::systemEnvironment();
        jobEnv.insert("XDG_RUNTIME_DIR", runtime.path());
        jobCapture.setProcessEnvironment(jobEnv);
        jobCapture.start(
            QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
            {"--attach", "job:" + job, "--until-step", "3", "--out", m_dir.filePath("job.json")});
        // The inspector attaches to rank 0 as to shardscope-train and exports what it shows.
        QProcess gui;
        startInspector(gui, endpoint0, m_dir.filePath("gui.json"));
        QVERIFY(capture.waitForFinished(120000));
        QVERIFY2(capture.exitCode() == 0, capture.readAllStandardError().constData());
        // Step 3 is over and the ranks hold: their discovery files name the model now, not
        // the "model not built yet" they were written with before the model existed.
        int named = 0;
        for (const QString &f : disc.entryList({"*.json"})) {
            const json d = readJson(disc.filePath(f));
            if (!d.is_object()) continue; // the rank finished and removed it meanwhile
            QCOMPARE(QString::fromStdString(d.value("model", "")), QStringLiteral("TinyLM"));
            ++named;
        }
        QVERIFY2(named > 0, "no discovery file left while the ranks hold");
        QVERIFY(gui.waitForFinished(120000));
        QVERIFY2(gui.exitCode() == 0, gui.readAllStandardError().constData());
        QVERIFY(jobCapture.waitForFinished(120000));
        QVERIFY2(jobCapture.exitCode() == 0, jobCapture.readAllStandardError().constData());
        QVERIFY(QFile(release).open(QIODevice::WriteOnly));
        const Run ran = shardscope::test::finishRanks(p, 150000);
        QVERIFY(ran.finished());
        QVERIFY2(ran.exitCode == 0, qPrintable(ran.out));

        std::vector<json> snaps = snapshots("tied");
        QCOMPARE(snaps.size(), std::size_t(2));
        json captured = readJson(m_dir.filePath("capture.json"));
        QVERIFY(shardscope::test::snapshotSchemaProblems(captured).empty());
        snaps.push_back(captured);
        json shown = readJson(m_dir.filePath("gui.json"));
        QVERIFY(shardscope::test::snapshotSchemaProblems(shown).empty());
        snaps.push_back(shown);
        // Fetch reasons and causes: lm_head's read of the embedding is DeepSpeed's
        // automatic-registration gather (`guard`, caused by lm_head); afterwards the embedding
        // is lm_head's registered parameter, fetched for its backward (in forward it is still
        // there from embed's fetch), and embed's own for embed's forward.
        for (std::size_t i = 0; i < 2; ++i) {
            const json &s = snaps[i];
            const int lmHead = moduleIdOf(s, "lm_head");
            const auto f = fetchesOf(s, "embed.weight");
            QVERIFY2(f.contains({kGuard, lmHead}), shardscope::test::eventList(s).dump().c_str());
            QVERIFY2(f.contains({kBackward, lmHead}),
                     shardscope::test::eventList(s).dump().c_str());
            QVERIFY2(f.contains({kForward, moduleIdOf(s, "embed")}),
                     shardscope::test::eventList(s).dump().c_str());
            const auto fc = fetchesOf(s, "fc.weight");
            QVERIFY2(fc.contains({kForward, moduleIdOf(s, "fc")}),
                     shardscope::test::eventList(s).dump().c_str());
        }
        for (const json &s : snaps) {
            const auto v = violations(s, "unregistered_access");
            QCOMPARE(v.size(), std::size_t(1));
            QCOMPARE(v[0]["accessor"].get<std::string>(), std::string("lm_head"));
            QCOMPARE(v[0]["param"].get<std::string>(), std::string("embed.weight"));
            QCOMPARE(v[0]["owner"].get<std::string>(), std::string("embed"));
            QCOMPARE(v[0]["status"].get<std::string>(), std::string("NOT_AVAILABLE"));
            QCOMPARE(v[0]["action"].get<std::string>(), std::string("auto_registered"));
            // lm_head computes with the values DeepSpeed gathered for it: a cost, not an
            // attribute read, in the snapshots, the capture and what the inspector shows.
            QCOMPARE(v[0]["severity"].get<std::string>(), std::string("cost"));
            QVERIFY2(!v[0].contains("read"), v[0].dump().c_str());
            QCOMPARE(v[0]["fix"].get<std::string>(),
                     std::string("deepspeed.zero.register_external_parameter(model.lm_head, "
                                 "model.embed.weight)"));
            const json *embed = findParam(s, "embed.weight");
            QVERIFY(embed);
            QVERIFY2((*embed)["external_modules"] == json::array({"lm_head"}),
                     (*embed)["external_modules"].dump().c_str());
            QVERIFY2((*embed)["external_auto_modules"] == json::array({"lm_head"}),
                     (*embed)["external_auto_modules"].dump().c_str());
            QCOMPARE((*embed)["partitioned"].get<bool>(), true);
            QVERIFY((*embed)["gather_count"].get<std::uint64_t>() > 0);
            QCOMPARE(s["engine"]["fix_dialect"].get<std::string>(), std::string("deepspeed"));
        }
        // The job's capture: both ranks observed, each rank's violation and statuses.
        const json whole = readJson(m_dir.filePath("job.json"));
        QVERIFY(shardscope::test::snapshotSchemaProblems(whole).empty());
        QVERIFY2(whole["engine"]["local_ranks"] == json::array({0, 1}),
                 whole["engine"].dump().c_str());
        const auto jv = violations(whole, "unregistered_access");
        QCOMPARE(jv.size(), std::size_t(2));
        QCOMPARE(jv[0]["rank"].get<int>() + jv[1]["rank"].get<int>(), 1);
        QCOMPARE(QString::fromStdString(whole["endpoint"]), "job:" + job);
        std::set<int> eventRanks;
        for (const json &e : shardscope::test::eventList(whole))
            eventRanks.insert(e["rank"].get<int>());
        QVERIFY(eventRanks == (std::set<int>{0, 1}));

        // The live capture saw module scopes, fetches with reasons, releases and steps.
        std::set<std::string> types;
        for (const json &e : shardscope::test::eventList(captured))
            types.insert(e["type"].get<std::string>());
        for (const char *t : {"module_enter", "module_exit", "fetch_begin", "fetch_end", "release",
                              "external_register", "step_begin", "step_end"})
            QVERIFY2(types.contains(t), t);
    }

    // The fixes: manual registration and the weight_norm workaround. Clean, and
    // weight_g/weight_v are shown as late parameters that deepspeed.initialize adopted. The
    // last step runs under the script's own torch function mode (--own-mode).
    void fixedModelIsClean()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--externals", "manual", "--weight-norm", "workaround", "--steps", "2",
                           "--own-mode", "--snapshot-out", snapshotArg("fixed")});
        QVERIFY2(r.exitCode == 0, qPrintable(r.out));
        // The script's own torch function mode, pushed while the agent watched a parameter
        // held outside forward, stays active through the forward and leaves the stack empty.
        QVERIFY2(r.out.count("own mode: active throughout") == 2, qPrintable(r.out));
        const std::vector<json> snaps = snapshots("fixed");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());
            // Each step ends with the loss handed to engine.backward (u0: the double's bits).
            int stepEnds = 0;
            for (const json &e : shardscope::test::eventList(s))
                if (e["type"] == "step_end") {
                    const double loss = std::bit_cast<double>(e["u0"].get<std::uint64_t>());
                    QVERIFY2(loss > 1.0 && loss < 10.0, e.dump().c_str()); // ~log(37) untrained
                    ++stepEnds;
                }
            QCOMPARE(stepEnds, 2);
            // Stage 3's gradient buckets: reduce-scatter pairs in each step's backward, moving
            // every parameter's padded fp32 gradient once per step.
            std::map<int, std::uint64_t> reducedBytes, begun;
            std::uint64_t allParams = 0;
            for (const json &p : s["params"])
                allParams += p["padded_numel"].get<std::uint64_t>() * 4;
            for (const json &e : shardscope::test::eventList(s)) {
                if (e["type"] == "reduce_scatter_begin")
                    begun[e["step"].get<int>()] += e["u0"].get<std::uint64_t>();
                if (e["type"] == "reduce_scatter_end")
                    reducedBytes[e["step"].get<int>()] += e["u0"].get<std::uint64_t>();
            }
            QCOMPARE(begun, reducedBytes);
            QVERIFY2(reducedBytes.size() == 2 && reducedBytes[1] == allParams &&
                         reducedBytes[2] == allParams,
                     (std::to_string(allParams) + " bytes expected per step; " +
                      json(reducedBytes).dump())
                         .c_str());
            // Registered by hand: never a guard gather, fetched for lm_head's scopes.
            const int lmHead = moduleIdOf(s, "lm_head");
            const auto f = fetchesOf(s, "embed.weight");
            QVERIFY2(f.contains({kForward, lmHead}) && f.contains({kBackward, lmHead}),
                     shardscope::test::eventList(s).dump().c_str());
            for (const auto &[reason, cause] : f)
                QVERIFY2(reason != kGuard, shardscope::test::eventList(s).dump().c_str());
            const json *embed = findParam(s, "embed.weight");
            QVERIFY(embed);
            QVERIFY2((*embed)["external_modules"] == json::array({"lm_head"}),
                     (*embed)["external_modules"].dump().c_str());
            QVERIFY2((*embed)["external_auto_modules"] == json::array(),
                     (*embed)["external_auto_modules"].dump().c_str());
            for (const char *name : {"pos_conv.conv.weight_g", "pos_conv.conv.weight_v"}) {
                const json *p = findParam(s, name);
                QVERIFY2(p, name);
                QCOMPARE((*p)["late"].get<bool>(), true);
                QCOMPARE((*p)["partitioned"].get<bool>(), true);
                QCOMPARE((*p)["replaces"].get<std::string>(), std::string("pos_conv.conv.weight"));
                QVERIFY2((*p)["external_modules"] == json::array({"pos_conv"}),
                         (*p)["external_modules"].dump().c_str());
            }
        }
    }

    // shardscope.deepspeed.pause()/resume() between steps (--toggle 1: of steps 1-2 and of
    // steps 3-4 one observed and one paused, which drawn per pair; the script says which it
    // paused): paused steps leave no event, the step numbers stay DeepSpeed's, and after resume
    // every status is what DeepSpeed says (all released between steps: persistence threshold 0).
    void pauseAndResume()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--externals", "manual", "--weight-norm", "workaround", "--steps", "4",
                           "--toggle", "1", "--snapshot-out", snapshotArg("paused")});
        QVERIFY2(r.exitCode == 0, qPrintable(r.out));
        std::set<int> observed{1, 2, 3, 4}, paused;
        static const QRegularExpression pausedLine(
            R"(rank 0 step (\d+) loss \S+ \(agent paused\))");
        for (auto it = pausedLine.globalMatch(r.out); it.hasNext();) {
            const int step = it.next().captured(1).toInt();
            paused.insert(step);
            observed.erase(step);
        }
        QVERIFY2(paused.size() == 2 && (paused.count(1) + paused.count(2)) == 1, qPrintable(r.out));
        const std::vector<json> snaps = snapshots("paused");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            // The last step the agent saw (a paused last step is DeepSpeed's alone).
            QCOMPARE(s["engine"]["step"].get<int>(), *observed.rbegin());
            std::set<int> stepsSeen, stepsBegun;
            int fetches = 0;
            for (const json &e : shardscope::test::eventList(s)) {
                stepsSeen.insert(e["step"].get<int>());
                if (e["type"] == "step_begin") stepsBegun.insert(e["step"].get<int>());
                if (e["type"] == "fetch_end") ++fetches;
            }
            QVERIFY2(stepsBegun == observed, shardscope::test::eventList(s).dump().c_str());
            for (int step : paused)
                QVERIFY2(!stepsSeen.count(step), shardscope::test::eventList(s).dump().c_str());
            QVERIFY(fetches > 0);
            for (const json &p : s["params"])
                QVERIFY2(p["status"] == "NN", p.dump().c_str());
            QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());
        }
    }

    // A checkpoint saved in the middle of a run, and a new process resumed from it, as users
    // save and resume DeepSpeed runs: after step 1 of 3, engine.save_checkpoint (ZeRO's
    // partitioned files) and engine.save_16bit_model (with
    // stage3_gather_16bit_weights_on_model_save: every parameter gathered, rank 0 writes the
    // whole model). The second is shown as what it is, a GatheredParameters gather and release
    // of every parameter between the steps, and neither is flagged. engine.load_checkpoint in
    // the new process: DeepSpeed's global step restored, so the steps go on as 2 and 3, with
    // the losses the first run had there.
    void checkpointsSavedAndResumed()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString dir = m_dir.filePath("checkpoints");
        const QStringList model{"--externals", "manual", "--weight-norm", "workaround"};
        const Run saved =
            run(model + QStringList{"--steps", "3", "--save-at", "1", "--save-how", "checkpoint",
                                    "16bit", "gathered", "--save-dir", dir, "--snapshot-out",
                                    snapshotArg("ckpt-saved")});
        QVERIFY2(saved.exitCode == 0, qPrintable(saved.out + saved.err.right(3000)));
        QVERIFY2(saved.out.contains("rank 0 saved 16bit embed.weight (37, 16)"),
                 qPrintable(saved.out));
        // The state dict taken inside GatheredParameters (the fix for the pitfall below): whole
        // tensors in the file, and no record (the violations are empty, below).
        for (int rank = 0; rank < 2; ++rank)
            QVERIFY2(saved.out.contains(QString("rank %1 saved gathered: 6 tensors, 0 empty, "
                                                "embed.weight (37, 16)")
                                            .arg(rank)),
                     qPrintable(saved.out));
        const Run resumed = run(model + QStringList{"--steps", "2", "--first-step", "2", "--resume",
                                                    dir + "/checkpoint", "--snapshot-out",
                                                    snapshotArg("ckpt-resumed")});
        QVERIFY2(resumed.exitCode == 0, qPrintable(resumed.out + resumed.err.right(3000)));
        const std::vector<json> s = snapshots("ckpt-saved"), r = snapshots("ckpt-resumed");
        QCOMPARE(s.size(), std::size_t(2));
        QCOMPARE(r.size(), std::size_t(2));
        using shardscope::test::printedLoss;
        using shardscope::test::stepsBegun;
        for (int rank = 0; rank < 2; ++rank) {
            const auto i = std::size_t(rank);
            for (const json *snap : {&s[i], &r[i]}) {
                QVERIFY2((*snap)["violations"].empty(), (*snap)["violations"].dump().c_str());
                for (const json &p : (*snap)["params"])
                    QVERIFY2(p["status"] == "NN", p.dump().c_str());
            }
            QVERIFY(stepsBegun(s[i]) == (std::vector<int>{1, 2, 3}));
            QVERIFY(stepsBegun(r[i]) == (std::vector<int>{2, 3}));
            for (int step : {2, 3}) {
                const QString want = printedLoss(saved.out, rank, step);
                QVERIFY2(!want.isEmpty() && printedLoss(resumed.out, rank, step) == want,
                         qPrintable(saved.out + "\n---\n" + resumed.out));
            }
            // Between step 1's end and step 2's beginning: the 16-bit save's gathers.
            std::set<std::int64_t> all, fetched, released;
            for (const json &p : s[i]["params"])
                all.insert(p["id"].get<std::int64_t>());
            bool between = false;
            for (const json &e : shardscope::test::eventList(s[i])) {
                if (e["type"] == "step_end" && e["step"] == 1)
                    between = true;
                else if (e["type"] == "step_begin" && between)
                    break;
                else if (between && e["type"] == "fetch_end") {
                    QVERIFY2(e["flags"] == kGatheredParameters && e["b"] == 0xffffffffu,
                             e.dump().c_str());
                    fetched.insert(e["a"].get<std::int64_t>());
                } else if (between && e["type"] == "release")
                    released.insert(e["a"].get<std::int64_t>());
            }
            QVERIFY2(fetched == all && released == all,
                     (json(fetched).dump() + " fetched, " + json(released).dump() +
                      " released of " + json(all).dump())
                         .c_str());
        }
    }

    // Issue 54, the checkpoint pitfalls of ZeRO-3, each recorded at the script's line with the
    // words of engine/state/violationtext.cpp, and the script's own output and exceptions
    // unchanged: torch.save(model.state_dict()) on 3 ranks writes ZeRO-3's placeholders (the
    // file really holds empty tensors: the story loads it back); a full state dict (the 16-bit
    // save's) loaded into the partitioned model at world 2 (torch raises a size mismatch, the
    // same with and without the agent; inside GatheredParameters(modifier_rank=0) it loads,
    // and gives no record); engine.load_checkpoint at world 2 of the checkpoint saved at 3,
    // said before DeepSpeed's ZeRORuntimeException. The fixed saves: checkpointsSavedAndResumed.
    void checkpointPitfalls()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString dir = m_dir.filePath("pitfalls");
        const QString example = QStringLiteral(SHARDSCOPE_EXAMPLE);
        // The launcher acts on a failed rank 2 s later (its --monitor-interval): each rank
        // raises torch's exception on its own before the others are stopped, so that what
        // every rank printed is compared, not who failed first.
        const auto ranks = [&](int world, const QStringList &args) {
            QProcessEnvironment env = dsEnvironment();
            env.insert("LOCAL_SIZE", QString::number(world));
            return shardscope::test::finishRanks(shardscope::test::startRanks(
                this, env, QStringLiteral(SHARDSCOPE_LAUNCH), python(), example,
                QStringList{"--externals", "manual", "--weight-norm", "workaround"} + args,
                m_dir.path(), QStringLiteral("2"), world));
        };
        const auto only = [](const json &snap, const std::string &kind, int line) {
            const json &vs = snap["violations"];
            if (vs.size() != 1) return "not one violation: " + vs.dump();
            const json &v = vs[0];
            if (v["kind"] != kind || v["status"] != "NOT_AVAILABLE" || v["severity"] != "error" ||
                v["owner"] != "" ||
                !v["location"]["file"].get<std::string>().ends_with("deepspeed_stories.py") ||
                v["location"]["line"] != line)
                return "not " + kind + " at line " + std::to_string(line) + ": " + v.dump();
            return std::string();
        };

        // torch.save(model.state_dict()) on 3 ranks, beside DeepSpeed's own saves
        const Run saved =
            ranks(3, {"--steps", "1", "--save-at", "1", "--save-how", "state-dict", "checkpoint",
                      "16bit", "--save-dir", dir, "--snapshot-out", snapshotArg("pitfall-save")});
        QVERIFY2(saved.exitCode == 0, qPrintable(saved.out + saved.err.right(3000)));
        const int saveLine =
            shardscope::test::lineOf(example, "torch.save(model.state_dict(), path)  # every rank");
        QVERIFY(saveLine > 0);
        const std::vector<json> s =
            shardscope::test::rankSnapshots(m_dir.path(), "pitfall-save", 3);
        QCOMPARE(s.size(), std::size_t(3));
        for (int rank = 0; rank < 3; ++rank) {
            QVERIFY2(saved.out.contains(QString("rank %1 saved state-dict: 6 tensors, 6 empty, "
                                                "embed.weight (0,)")
                                            .arg(rank)),
                     qPrintable(saved.out));
            const json &snap = s[std::size_t(rank)];
            const std::string problem = only(snap, "partitioned_save", saveLine);
            QVERIFY2(problem.empty(), problem.c_str());
            const json &v = snap["violations"][0];
            QCOMPARE(v["param"].get<std::string>(), std::string("embed.weight"));
            QVERIFY2(v["message"].get<std::string>().starts_with(
                         "model.state_dict() was taken while ZeRO-3 partitions the model: 6 "
                         "parameters (`embed.weight` first) are placeholders of size 0") &&
                         v["message"].get<std::string>().find("loses 7.5 KiB of weights") !=
                             std::string::npos &&
                         v["fix"].get<std::string>().starts_with("engine.save_16bit_model(DIR)"),
                     v.dump().c_str());
            QVERIFY2(saved.err.count(
                         QString("shardscope: rank %1: model.state_dict() was taken").arg(rank)) ==
                         1,
                     qPrintable(saved.err.right(3000)));
        }

        // a full state dict into the partitioned model: inside GatheredParameters without
        // modifier_rank (discarded at the exit, recorded), the fix, then the pitfall
        const QStringList load{
            "--steps",         "1",           "--load-full", dir + "/16bit/pytorch_model.bin",
            "--load-full-how", "no-modifier", "gathered",    "plain"};
        const Run with =
            ranks(2, load + QStringList{"--snapshot-out", snapshotArg("pitfall-load")});
        const Run without = ranks(2, load + QStringList{"--no-agent"});
        // Both fail with torch's exception (compared below). The status is the launcher's: the
        // raising rank's 1, or 134 when the other rank's process aborts first in DeepSpeed's
        // CPU collective teardown ("terminate called without an active exception"), a race of
        // the two ranks that 0.16.9 loses now and then with or without the agent.
        const auto failed = [](int code) { return code == 1 || code == 134; };
        QVERIFY2(failed(with.exitCode) && failed(without.exitCode),
                 qPrintable(QString("exit %1 with the agent, %2 without\n")
                                .arg(with.exitCode)
                                .arg(without.exitCode) +
                            with.err.right(3000) + "\n---\n" + without.err.right(3000)));
        QVERIFY(!without.err.contains("shardscope:"));
        const auto lastError = shardscope::test::lastRankException;
        QVERIFY2(lastError(with.err).startsWith(
                     "RuntimeError: Error(s) in loading state_dict for TinyLM"),
                 qPrintable(with.err.right(3000)));
        QCOMPARE(lastError(with.err), lastError(without.err));
        const auto mismatches = [](const QString &err) {
            QStringList lines;
            for (const QString &l : err.split('\n'))
                if (l.startsWith("[rank 0]") && l.contains("copying a param with shape"))
                    lines << l;
            return lines;
        };
        QVERIFY2(mismatches(with.err).size() == 6, qPrintable(with.err.right(3000)));
        QCOMPARE(mismatches(with.err), mismatches(without.err));
        const int loadLine = shardscope::test::lineOf(
            example, "model.load_state_dict(full)  # ZeRO-3's placeholders");
        const int discardedLine = shardscope::test::lineOf(
            example, "model.load_state_dict(full)  # discarded at the exit: no modifier_rank");
        QVERIFY(loadLine > 0 && discardedLine > 0);
        const std::vector<json> l = snapshots("pitfall-load");
        QCOMPARE(l.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            // the gathered load: the file's weights, the same with and without the agent
            const QRegularExpression loaded(
                QString("rank %1 loaded gathered embed.weight sum (\\S+) \\(file (\\S+)\\)")
                    .arg(rank));
            const auto m = loaded.match(with.out), n = loaded.match(without.out);
            QVERIFY2(m.hasMatch() && n.hasMatch() && m.captured(1) == m.captured(2) &&
                         m.captured(0) == n.captured(0),
                     qPrintable(with.out + "\n---\n" + without.out));
            // the load without modifier_rank: the weights before it, with and without the agent
            const QRegularExpression discarded(
                QString("rank %1 loaded no-modifier embed.weight sum (\\S+) \\(file (\\S+)\\)")
                    .arg(rank));
            const auto d = discarded.match(with.out), e = discarded.match(without.out);
            QVERIFY2(d.hasMatch() && e.hasMatch() && d.captured(1) != d.captured(2) &&
                         d.captured(0) == e.captured(0),
                     qPrintable(with.out + "\n---\n" + without.out));
            // two rows: the discarded load (the parameters gathered) and the pitfall
            json snap = l[std::size_t(rank)];
            QCOMPARE(snap["violations"].size(), std::size_t(2));
            json first = snap["violations"][0], second = snap["violations"][1];
            if (first["location"]["line"] != discardedLine) std::swap(first, second);
            QVERIFY2(first["kind"] == "partitioned_load" && first["status"] == "AVAILABLE" &&
                         first["location"]["line"] == discardedLine &&
                         first["message"].get<std::string>().starts_with(
                             "model.load_state_dict loaded 6 parameters (`embed.weight` first) "
                             "(7.5 KiB) inside deepspeed.zero.GatheredParameters without "
                             "modifier_rank") &&
                         first["fix"].get<std::string>().find("modifier_rank=0)") !=
                             std::string::npos,
                     first.dump().c_str());
            snap["violations"] = json::array({second});
            const std::string problem = only(snap, "partitioned_load", loadLine);
            QVERIFY2(problem.empty(), problem.c_str());
            const json &v = second;
            QVERIFY2(v["message"].get<std::string>().starts_with(
                         "model.load_state_dict was given full tensors for 6 parameters") &&
                         v["fix"].get<std::string>().starts_with(
                             "with deepspeed.zero.GatheredParameters(list(model.parameters()), "
                             "modifier_rank=0): model.load_state_dict(state_dict)"),
                     v.dump().c_str());
        }

        // DeepSpeed's checkpoint of 3 ranks resumed on 2
        const Run resumed = ranks(2, {"--steps", "1", "--resume", dir + "/checkpoint",
                                      "--snapshot-out", snapshotArg("pitfall-resume")});
        QVERIFY2(resumed.exitCode != 0, qPrintable(resumed.out));
        QVERIFY2(lastError(resumed.err)
                     .contains("ZeRORuntimeException: The checkpoint being loaded "
                               "used a DP world size of 3 but the current world "
                               "size is 2"),
                 qPrintable(resumed.err.right(3000)));
        const int resumeLine =
            shardscope::test::lineOf(example, "engine.load_checkpoint(args.resume)");
        QVERIFY(resumeLine > 0);
        const std::vector<json> r = snapshots("pitfall-resume");
        QCOMPARE(r.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const std::string problem = only(r[std::size_t(rank)], "resume_world_size", resumeLine);
            QVERIFY2(problem.empty(), problem.c_str());
            const json &v = r[std::size_t(rank)]["violations"][0];
            QVERIFY2(v["message"].get<std::string>().find(
                         "saved at a data-parallel world size of 3, in a run at world size 2") !=
                             std::string::npos &&
                         v["fix"].get<std::string>().starts_with(
                             "python -m deepspeed.checkpoint.ds_to_universal --input_folder "),
                     v.dump().c_str());
            // said before DeepSpeed raised
            const qsizetype said = resumed.err.indexOf(
                QString("[rank %1] shardscope: rank %1: engine.load_checkpoint resumes").arg(rank));
            const qsizetype raised = resumed.err.indexOf(
                QString("[rank %1] [rank%1]: deepspeed.runtime.zero.utils.ZeRORuntimeException")
                    .arg(rank));
            QVERIFY2(said >= 0 && (raised < 0 || said < raised),
                     qPrintable(resumed.err.right(3000)));
        }
    }

    // gradient_accumulation_steps 2 (--grad-accum 2, engine.backward(loss=...)): two
    // forwards, backwards and engine.step() calls per optimizer step. A step begins at the
    // first forward and ends once, when DeepSpeed's global_steps advances, with the loss of
    // the last micro-batch; the second forward closes no step and opens its own scopes.
    // The model is built as DeepSpeed's getting-started guide builds it, without zero.Init
    // (--no-zero-init), so deepspeed.initialize partitions it whole: none of its parameters
    // is late (issue 49, defect 7: every one was), and each is partitioned over both ranks.
    void gradientAccumulationEndsOneStepPerOptimizerStep()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        // Issue #30, defects 6 and 8: one snapshot_out without {rank} and one explicit
        // listen= for every rank (as a script hard-codes them). Rank 1 used to die of
        // "another engine is already listening", and only rank 0's snapshot was written.
        // Each rank now gets its own, as shardscope-train's (PATH.rank<N>), and says so.
        const QString sock = m_dir.filePath("accum.sock");
        const QString out = m_dir.filePath("accum.json");
        const Run r = run({"--externals", "manual", "--weight-norm", "workaround", "--steps", "2",
                           "--grad-accum", "2", "--no-zero-init", "--snapshot-out", out, "--listen",
                           "unix:" + sock});
        QVERIFY2(r.exitCode == 0, qPrintable(r.out));
        QVERIFY2(r.out.contains("has no {rank} in a job of 2 ranks: rank 0 writes " + out +
                                ", rank N writes " + out + ".rank<N>"),
                 qPrintable(r.out));
        QVERIFY2(r.out.contains("in a job of 2 ranks: rank N listens on unix:" + sock + ".rank<N>"),
                 qPrintable(r.out));
        QVERIFY(QFile::rename(out, snapshotOf("accum", 0)));
        QVERIFY(QFile::rename(out + ".rank1", snapshotOf("accum", 1)));
        const std::vector<json> snaps = snapshots("accum");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            QCOMPARE(s["engine"]["step"].get<int>(), 2);
            const int fc = moduleIdOf(s, "fc");
            std::vector<int> begun, ended;
            std::map<int, int> fcForwards; // step -> forward entries of fc
            for (const json &e : shardscope::test::eventList(s)) {
                if (e["type"] == "step_begin") begun.push_back(e["step"].get<int>());
                if (e["type"] == "step_end") {
                    ended.push_back(e["step"].get<int>());
                    const double loss = std::bit_cast<double>(e["u0"].get<std::uint64_t>());
                    QVERIFY2(loss > 1.0 && loss < 10.0, e.dump().c_str());
                }
                if (e["type"] == "module_enter" && e["a"] == fc && e["flags"] == 0)
                    ++fcForwards[e["step"].get<int>()];
            }
            QVERIFY2(begun == (std::vector<int>{1, 2}),
                     shardscope::test::eventList(s).dump().c_str());
            QVERIFY2(ended == (std::vector<int>{1, 2}),
                     shardscope::test::eventList(s).dump().c_str());
            QVERIFY2(fcForwards == (std::map<int, int>{{1, 2}, {2, 2}}),
                     shardscope::test::eventList(s).dump().c_str());
            QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());
            QCOMPARE(s["params"].size(), std::size_t(6)); // weight_norm's weight_g and weight_v too
            for (const json &p : s["params"]) {
                QVERIFY2(p["late"] == false && !p.contains("replaces"), p.dump().c_str());
                const auto numel = p["numel"].get<std::uint64_t>();
                QVERIFY2(p["partitioned"] == true &&
                             p["partition_numel"].get<std::uint64_t>() == (numel + 1) / 2,
                         p.dump().c_str());
            }
        }
        QVERIFY2(!r.out.contains("partitioned before install()"), qPrintable(r.out));
    }

    // What DeepSpeed changed after 0.14.5 in the calls the agent observes, in one run:
    // - set_z3_leaf_modules(model, [PositionalConv]): pos_conv gathers its conv's parameters
    //   itself and the conv gets no scope of its own; the fetches name pos_conv as their cause;
    // - a plain loss.backward() (supported from 0.18.3; engine.backward(loss) before): steps
    //   begin and end as with engine.backward, each ends with the loss the script printed, and
    //   backward scopes are closed at the step's end;
    // - GatheredParameters nested over an overlapping parameter (0.19.4 raises): DeepSpeed's
    //   exception reaches the script unchanged, both snapshots are written, and every parameter
    //   is back to NOT_AVAILABLE; before 0.19.4 the nested gather runs;
    // - _invalidate_trace, also called from _register_deepspeed_module (0.19.2): no
    //   trace_invalidated in a run whose steps all run the same modules in the same order.
    void newerDeepSpeedCalls()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QVersionNumber ds = QVersionNumber::fromString(m_version);
        const bool plainBackward = ds >= QVersionNumber(0, 18, 3);
        const bool nestedRaises = ds >= QVersionNumber(0, 19, 4);
        QStringList args{
            "--externals", "manual", "--weight-norm",     "workaround",     "--steps",
            "3",           "--leaf", "--nested-gathered", "--snapshot-out", snapshotArg("newer")};
        if (plainBackward) args << "--plain-backward";
        const Run r = run(args);
        if (nestedRaises) {
            QVERIFY2(r.exitCode != 0, qPrintable(r.out));
            QVERIFY2(r.err.contains("RuntimeError: Nested GatheredParameters contexts cannot "
                                    "overlap parameters"),
                     qPrintable(r.err));
        } else {
            QVERIFY2(r.exitCode == 0, qPrintable(r.out));
            QVERIFY2(r.out.contains("rank 0 nested gather: (16, 16)"), qPrintable(r.out));
        }
        const std::vector<json> snaps = snapshots("newer");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const json &s = snaps[std::size_t(rank)];
            QCOMPARE(s["engine"]["step"].get<int>(), 3);
            const int posConv = moduleIdOf(s, "pos_conv"), conv = moduleIdOf(s, "pos_conv.conv");
            QVERIFY(posConv >= 0 && conv >= 0);
            std::vector<int> begun;
            std::vector<double> losses;
            std::map<std::pair<int, int>, int> open; // (module, phase) -> entries - exits
            for (const json &e : shardscope::test::eventList(s)) {
                if (e["type"] == "step_begin") begun.push_back(e["step"].get<int>());
                if (e["type"] == "step_end")
                    losses.push_back(std::bit_cast<double>(e["u0"].get<std::uint64_t>()));
                if (e["type"] == "module_enter") {
                    QVERIFY2(e["a"] != conv, "a leaf module's child got a scope of its own");
                    ++open[{e["a"].get<int>(), e["flags"].get<int>()}];
                }
                if (e["type"] == "module_exit") --open[{e["a"].get<int>(), e["flags"].get<int>()}];
                // Every step runs the same modules in the same order; DeepSpeed's own
                // _invalidate_trace at module registration (0.19.2) is not one.
                QVERIFY2(e["type"] != "trace_invalidated", e.dump().c_str());
            }
            QVERIFY2(begun == (std::vector<int>{1, 2, 3}),
                     shardscope::test::eventList(s).dump().c_str());
            for (const auto &[scope, n] : open)
                QVERIFY2(n == 0, qPrintable(QString("module %1 phase %2: %3 scopes left open")
                                                .arg(scope.first)
                                                .arg(scope.second)
                                                .arg(n)));
            // The losses the script printed, to its 4 decimals.
            QCOMPARE(losses.size(), std::size_t(3));
            for (int step = 1; step <= 3; ++step) {
                const QString line = QString("rank %1 step %2 loss %3")
                                         .arg(rank)
                                         .arg(step)
                                         .arg(losses[std::size_t(step - 1)], 0, 'f', 4);
                QVERIFY2(r.out.contains(line), qPrintable(line + " not in:\n" + r.out));
            }
            for (const char *name :
                 {"pos_conv.conv.bias", "pos_conv.conv.weight_g", "pos_conv.conv.weight_v"}) {
                // Fetched for pos_conv (on its entry, or prefetched for it), never for conv.
                int forPosConv = 0;
                for (const auto &[reason, module] : fetchesOf(s, name)) {
                    QVERIFY2(module != conv, name);
                    forPosConv += module == posConv;
                }
                QVERIFY2(forPosConv > 0, name);
            }
            for (const json &p : s["params"]) // one letter per rank: N is NOT_AVAILABLE
                QVERIFY2(p["status"] == "NN", p.dump().c_str());
        }
    }

    // engine.compile() (torch.compile; DeepSpeed's ZeRO-3 hooks run outside its graphs): the
    // agent leaves dynamo what DeepSpeed gives it. Before, dynamo resolved the agent's scope
    // hook unbound (post_sub_module_forward_function lost its self: a TypeError in every
    // compiled forward), and gave up on the agent's native ZeROOrderedDict.__getitem__, running
    // whole frames eagerly, so that story 1 unregistered ran with the agent and failed without.
    // A registered model trains (its registrations made while dynamo traces, before 0.19.3),
    // every parameter released after each step, nothing flagged (compiledModelAsEager: the
    // same as eagerly). With DeepCompile the agent says what it cannot see, and changes
    // nothing else.
    void compiledModel()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QStringList common{"--weight-norm", "workaround", "--steps", "3"};
        m_compiled = run(QStringList{"--externals", "manual", "--compile", "eager",
                                     "--snapshot-out", snapshotArg("compiled")} +
                         common);
        const Run &compiled = *m_compiled;
        QVERIFY2(compiled.exitCode == 0, qPrintable(compiled.out + compiled.err.right(3000)));
        const std::vector<json> c = snapshots("compiled");
        QCOMPARE(c.size(), std::size_t(2));
        for (const json &cs : c) {
            QCOMPARE(cs["engine"]["step"].get<int>(), 3);
            for (const json &cp : cs["params"])
                QVERIFY2(cp["status"] == "NN", cp.dump().c_str());
            QVERIFY(violations(cs, "unregistered_access").empty());
        }
        const auto lastError = shardscope::test::lastRankException;
        // DeepCompile on ZeRO-3: before DeepSpeed compiles, the agent says what it will not see
        // (DeepSpeed takes the module hooks out). On this CPU DeepSpeed then fails building
        // DeepCompile's op (it needs CUDA's headers), as it does without the agent: which rank
        // builds the op and which waits for it is a race (RuntimeError: Error building extension
        // 'dc', or ImportError: .../dc.so), and the build's output is ninja's order, so the run
        // is held to that failure, not to a second run's text (a run without the agent failed
        // the same way on every release tested; it cost each release's suite 15-20 s).
        const Run dc = run(
            QStringList{"--externals", "manual", "--compile", "eager", "--deepcompile"} + common);
        QVERIFY2((dc.out + dc.err)
                     .contains("shardscope: DeepCompile (\"compile\": {\"deepcompile\": "
                               "true}) gathers and releases ZeRO-3's parameters inside "
                               "the compiled graph"),
                 qPrintable(dc.err.right(3000)));
        if (dc.exitCode != 0) {
            static const QRegularExpression buildFailed(
                R"((?:RuntimeError: Error building extension 'dc'|ImportError: \S*dc\.so))");
            QVERIFY2(buildFailed.match(lastError(dc.err)).hasMatch(),
                     qPrintable(lastError(dc.err) + "\n" + dc.err.right(3000)));
        }
    }

    // The compiled run of compiledModel observed as the eager one (every scope and gather,
    // the same losses), and story 1 unregistered under compile failing with the exception of a
    // run without the agent. The same on every release (what differs between releases, the
    // registration while dynamo traces and DeepCompile, is compiledModel's): run on the newest.
    void compiledModelAsEager()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QStringList common{"--weight-norm", "workaround", "--steps", "3"};
        if (!m_compiled) // compiledModel's run, else its own
            m_compiled = run(QStringList{"--externals", "manual", "--compile", "eager",
                                         "--snapshot-out", snapshotArg("compiled")} +
                             common);
        const Run &compiled = *m_compiled;
        QVERIFY2(compiled.exitCode == 0, qPrintable(compiled.out + compiled.err.right(3000)));
        const Run eager =
            run(QStringList{"--externals", "manual", "--snapshot-out", snapshotArg("uncompiled")} +
                common);
        QVERIFY2(eager.exitCode == 0, qPrintable(eager.out + eager.err.right(3000)));
        const std::vector<json> c = snapshots("compiled"), e = snapshots("uncompiled");
        QCOMPARE(c.size(), std::size_t(2));
        QCOMPARE(e.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const json &cs = c[std::size_t(rank)], &es = e[std::size_t(rank)];
            const std::string differs = shardscope::test::observedDifferently(cs, es);
            QVERIFY2(differs.empty(), differs.c_str());
            for (int step = 1; step <= 3; ++step) { // the same losses, printed by the script
                const QString got = shardscope::test::printedLoss(compiled.out, rank, step);
                QVERIFY2(!got.isEmpty() &&
                             got == shardscope::test::printedLoss(eager.out, rank, step),
                         qPrintable(compiled.out + "\n---\n" + eager.out));
            }
        }
        // Story 1 unregistered under compile: the exception of a run without the agent.
        const auto lastError = shardscope::test::lastRankException;
        const Run broken = run(QStringList{"--externals", "none", "--compile", "eager"} + common);
        const Run without =
            run(QStringList{"--externals", "none", "--compile", "eager", "--no-agent"} + common);
        QVERIFY2(without.exitCode != 0, qPrintable(without.out));
        QVERIFY2(broken.exitCode != 0, qPrintable(broken.out));
        QVERIFY2(!lastError(without.err).isEmpty(), qPrintable(without.err.right(3000)));
        QCOMPARE(lastError(broken.err), lastError(without.err));
    }

    // Story 1's training loop reads the embedding outside any forward: DeepSpeed fails on the
    // empty placeholder; the violation is in the snapshot although the run raised, and the
    // exception is DeepSpeed's, unchanged.
    // The fix follows what the read needs: its gradient (story 1's differentiable read) or
    // only its values (under torch.no_grad()).
    void readOutsideForward_data()
    {
        QTest::addColumn<QString>("use");
        QTest::addColumn<QString>("fix");
        QTest::newRow("needs its gradient")
            << "grad"
            << "deepspeed.zero.register_external_parameter(model, model.embed.weight)  # and "
               "move the read into model.forward";
        QTest::newRow("under no_grad")
            << "no-grad"
            << "with deepspeed.zero.GatheredParameters(model.embed.weight): <read it here>";
    }

    void readOutsideForward()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QString, use);
        QFETCH(QString, fix);
        const Run r = run({"--externals", "manual", "--weight-norm", "off", "--steps", "2",
                           "--read-outside", use, "--snapshot-out", snapshotArg("outside-" + use)});
        QVERIFY(r.exitCode != 0);
        QVERIFY2(r.out.contains("RuntimeError: mat2 must be a matrix"), qPrintable(r.out));
        const std::vector<json> snaps = snapshots("outside-" + use);
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            const auto v = violations(s, "unregistered_access");
            QCOMPARE(v.size(), std::size_t(1));
            QVERIFY(v[0]["accessor"].is_null());
            QCOMPARE(v[0]["param"].get<std::string>(), std::string("embed.weight"));
            QCOMPARE(v[0]["status"].get<std::string>(), std::string("NOT_AVAILABLE"));
            QCOMPARE(QString::fromStdString(v[0]["fix"].get<std::string>()), fix);
        }
    }

    // Story 2: weight_norm on a conv zero.Init already partitioned. Recorded while the model
    // is built, before DeepSpeed's IndexError, which reaches the script unchanged.
    void weightNormAfterInit()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--weight-norm", "unsafe", "--snapshot-out", snapshotArg("wn")});
        QVERIFY(r.exitCode != 0);
        QVERIFY2(r.out.contains("IndexError: Dimension out of range (expected to be in range of "
                                "[-1, 0], but got 2)"),
                 qPrintable(r.out));
        const std::vector<json> snaps = snapshots("wn");
        QCOMPARE(snaps.size(), std::size_t(2));
        // the line below the story's `if weight_norm == "unsafe":`
        const int weightNormLine = shardscope::test::lineOf(QStringLiteral(SHARDSCOPE_EXAMPLE),
                                                            "if weight_norm == \"unsafe\":") +
                                   1;
        QVERIFY(weightNormLine > 1);
        for (const json &s : snaps) {
            const auto v = violations(s, "unregistered_access");
            QCOMPARE(v.size(), std::size_t(1));
            QVERIFY(v[0]["accessor"].is_null());
            QVERIFY2(v[0]["param"] == "pos_conv.conv.weight", v[0].dump().c_str());
            // The model never existed (the IndexError came first): the fix names the weight as
            // the constructor that read it does, a path that exists there, and the record
            // says which modules were being built and where.
            QCOMPARE(v[0]["fix"].get<std::string>(),
                     std::string("with deepspeed.zero.GatheredParameters(self.conv.weight, "
                                 "modifier_rank=0): <change it here>"));
            QCOMPARE(v[0]["location"]["line"].get<int>(), weightNormLine);
            QCOMPARE(v[0]["location"]["function"].get<std::string>(),
                     std::string("PositionalConv.__init__"));
            QVERIFY2(QRegularExpression("^TinyLM \\(deepspeed_stories\\.py:\\d+\\) > \\.pos_conv "
                                        "PositionalConv \\(deepspeed_stories\\.py:\\d+\\)$")
                         .match(QString::fromStdString(v[0]["building"].get<std::string>()))
                         .hasMatch(),
                     v[0].dump().c_str());
        }
    }

    // An exception inside the backward pass that the script catches and goes on from (a batch
    // skipped after an out-of-memory error): ZeRO-3's epilogue never ran, so the gradients
    // already bucketed for their reduce-scatter stay in the bucket, and DeepSpeed fails later,
    // far from the cause (at the next backward, AssertionError; or step, TypeError). The agent
    // records it once a rank as that backward raises (backward_unfinished, on the root, at the
    // script's backward line, with the bucketed count: fc's weight and bias), says it on
    // stderr, and changes nothing: the script catches its own RuntimeError, and the run ends
    // with DeepSpeed's exception of the run without the agent. engine.backward(loss) on every
    // release (the native hook), and a plain loss.backward() from 0.18.3 (the backward watcher).
    void exceptionInsideBackward_data()
    {
        QTest::addColumn<QString>("call");
        QTest::newRow("engine.backward(loss)") << "engine.backward(loss)";
        if (QVersionNumber::fromString(m_version) >= QVersionNumber(0, 18, 3))
            QTest::newRow("loss.backward()") << "loss.backward()";
    }

    void exceptionInsideBackward()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QString, call);
        QStringList args{"--externals", "manual", "--steps", "3", "--raise-in-backward", "2"};
        if (call == "loss.backward()") args << "--plain-backward";
        const QString name = call == "loss.backward()" ? "plain-raised" : "raised";
        const Run with = run(args + QStringList{"--snapshot-out", snapshotArg(name)});
        const Run without = run(args + QStringList{"--no-agent"});
        QVERIFY(!without.err.contains("shardscope:"));
        QVERIFY2(without.exitCode != 0, qPrintable(without.out));
        QVERIFY2(with.exitCode != 0, qPrintable(with.out));
        const auto lastError = shardscope::test::lastRankException;
        QVERIFY2(!lastError(without.err).isEmpty(), qPrintable(without.err.right(3000)));
        QCOMPARE(lastError(with.err), lastError(without.err));
        int callLine = 0;
        {
            QFile ex(QStringLiteral(SHARDSCOPE_EXAMPLE));
            QVERIFY(ex.open(QIODevice::ReadOnly));
            for (int n = 1; !ex.atEnd(); ++n)
                if (QString::fromUtf8(ex.readLine()).trimmed() == call) {
                    callLine = n;
                    break;
                }
        }
        QVERIFY(callLine > 0);
        const std::vector<json> snaps = snapshots(name);
        QCOMPARE(snaps.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const QString skipped = QString("rank %1 step 2 skipped: out of memory in a user's "
                                            "backward")
                                        .arg(rank);
            QVERIFY2(with.out.contains(skipped) && without.out.contains(skipped),
                     qPrintable(with.out + "\n---\n" + without.out));
            const QString said = QString("shardscope: rank %1: DeepSpeed ZeRO-3's backward did "
                                         "not finish: it raised RuntimeError: out of memory in a "
                                         "user's backward")
                                     .arg(rank);
            QVERIFY2(with.err.count(said) == 1, qPrintable(with.err.right(3000)));
            const json &s = snaps[std::size_t(rank)];
            QCOMPARE(s["violations"].size(), std::size_t(1));
            const json &v = s["violations"][0];
            QCOMPARE(v["kind"].get<std::string>(), std::string("backward_unfinished"));
            QCOMPARE(v["step"].get<int>(), 2);
            QVERIFY2(v["owner"] == "" && v["param"].is_null() && v["accessor"].is_null(),
                     v.dump().c_str());
            QCOMPARE(v["status"].get<std::string>(), std::string("NOT_AVAILABLE"));
            QVERIFY2(v["message"].get<std::string>().find(
                         "after the gradients of 2 parameters were put in stage 3's reduce "
                         "bucket") != std::string::npos,
                     v.dump().c_str());
            QVERIFY2(v["fix"].get<std::string>().starts_with("raise  # in the except around the "
                                                             "backward"),
                     v.dump().c_str());
            QVERIFY2(v["location"]["file"].get<std::string>().ends_with("deepspeed_stories.py") &&
                         v["location"]["function"] == "main" &&
                         v["location"]["line"].get<int>() == callLine,
                     v.dump().c_str());
        }
    }

    // Issue 51, on two real ranks with SHARDSCOPE_STALL_SECONDS=2. A healthy run with a slow
    // rank (rank 0 sleeps 1 s before step 2's forward: a straggler, not stuck): every all-gather
    // batch, reduce bucket and GatheredParameters collective is one begin/end pair, the same
    // signature at the same (group, seq) on both ranks, and nothing is recorded. A rank that
    // raises: its exception as the script raises it, nothing recorded. GatheredParameters on rank
    // 0 only (the others wait in a barrier): rank 0's watchdog records rank_stalled at the
    // script's line and flushes it while the job still hangs, rank 1 records nothing.
    void divergedRanks()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QProcessEnvironment env = dsEnvironment();
        env.insert("SHARDSCOPE_STALL_SECONDS", "2");
        const auto launch = [&](const QStringList &args) {
            return shardscope::test::startRanks(this, env, QStringLiteral(SHARDSCOPE_LAUNCH),
                                                python(), QStringLiteral(SHARDSCOPE_EXAMPLE),
                                                QStringList{"--externals", "manual"} + args,
                                                m_dir.path());
        };
        const auto hangRecords = [](const json &s) {
            return violations(s, "rank_stalled").size() +
                   violations(s, "collective_mismatch").size();
        };
        QElapsedTimer timer;
        timer.start();

        const Run slow = shardscope::test::finishRanks(
            launch({"--steps", "3", "--diverge", "slow", "--diverge-step", "2", "--snapshot-out",
                    snapshotArg("slow")}));
        QVERIFY2(slow.exitCode == 0, qPrintable(slow.out.right(3000)));
        QVERIFY2(slow.out.contains("rank 0 reached the end") &&
                     slow.out.contains("rank 1 reached the end"),
                 qPrintable(slow.out.right(3000)));
        QVERIFY2(!slow.err.contains("rank_stalled"), qPrintable(slow.err.right(3000)));
        const std::vector<json> snaps = snapshots("slow");
        QCOMPARE(snaps.size(), std::size_t(2));
        std::vector<std::vector<shardscope::test::Collective>> byRank;
        for (const json &s : snaps) {
            QCOMPARE(hangRecords(s), std::size_t(0));
            byRank.push_back(shardscope::test::collectivesOf(s));
        }
        QCOMPARE(byRank[0].size(), byRank[1].size());
        std::set<int> kinds, reasons;
        for (std::size_t i = 0; i < byRank[0].size(); ++i) {
            const auto &c = byRank[0][i];
            QVERIFY2(c.key() == byRank[1][i].key(),
                     qPrintable(QString("collective %1 differs between the ranks").arg(i)));
            QCOMPARE(c.seq, std::uint64_t(i + 1)); // one group: 1, 2, 3, ...
            QCOMPARE(c.group, std::uint32_t(0));
            QVERIFY(c.ended && byRank[1][i].ended);
            QVERIFY(c.bytes > 0 && c.params > 0);
            kinds.insert(c.kind);
            reasons.insert(c.reason);
        }
        // all-gathers (the coordinator's batches, the weight_norm workaround's GatheredParameters)
        // and reduce buckets, and the modifier_rank broadcast; forward, backward, prefetch and
        // gathered_parameters
        QVERIFY2((kinds == std::set<int>{0, 1, 2}), qPrintable(QString::number(kinds.size())));
        QVERIFY(reasons.contains(kForward) && reasons.contains(kBackward) &&
                reasons.contains(kGatheredParameters));
        // One per batch, not per parameter: fewer all-gathers than fetches.
        QVERIFY(std::count_if(byRank[0].begin(), byRank[0].end(), [](const auto &c) {
                    return c.kind == 0;
                }) < shardscope::test::countEvents(snaps[0], "fetch_begin"));
        const qint64 slowMs = timer.restart();

        const QStringList raise{"--steps", "2", "--diverge", "raise", "--diverge-step", "2"};
        const Run raised = shardscope::test::finishRanks(
            launch(raise + QStringList{"--snapshot-out", snapshotArg("raise")}));
        QVERIFY(raised.exitCode != 0);
        // The script's own exception, as it raises it (nothing of the agent's before or in it),
        // and its output up to there.
        QCOMPARE(shardscope::test::lastRankException(raised.err),
                 QStringLiteral("RuntimeError: rank 0 failed at step 2 (--diverge raise)"));
        QVERIFY2(raised.out.contains("rank 0 step 1 loss") && !raised.err.contains("shardscope:"),
                 qPrintable(raised.out.right(3000)));
        for (int rank = 0; rank < 2; ++rank)
            QCOMPARE(hangRecords(readJson(snapshotOf("raise", rank))), std::size_t(0));
        const qint64 raiseMs = timer.restart();

        QProcess *hang = launch(
            {"--steps", "2", "--diverge", "gathered", "--snapshot-out", snapshotArg("gathered")});
        // The record reaches the file while the job hangs (nothing else writes it before).
        bool recorded = false;
        for (QElapsedTimer wait; !wait.isValid() || wait.elapsed() < 90000; QThread::msleep(250)) {
            if (!wait.isValid()) wait.start();
            QFile f(snapshotOf("gathered", 0));
            if (f.open(QIODevice::ReadOnly) && f.readAll().contains("rank_stalled")) {
                recorded = true;
                break;
            }
        }
        QThread::msleep(1000); // rank 1 would have its own record by now, if it made one
        hang->terminate();     // the launcher stops the ranks: the agents write their files
        const Run hung = shardscope::test::finishRanks(hang);
        QVERIFY2(recorded, qPrintable(hung.out.right(3000)));
        QVERIFY2(!hung.out.contains("reached the end"), qPrintable(hung.out.right(3000)));
        const int gatheredLine =
            lineOf(QStringLiteral(SHARDSCOPE_EXAMPLE),
                   "with deepspeed.zero.GatheredParameters([engine.module.fc.weight]):");
        QVERIFY(gatheredLine > 0);
        const json s0 = readJson(snapshotOf("gathered", 0));
        const json s1 = readJson(snapshotOf("gathered", 1));
        const auto stalled = violations(s0, "rank_stalled");
        QCOMPARE(stalled.size(), std::size_t(1));
        const json &v = stalled[0];
        QVERIFY2(v["location"]["file"].get<std::string>().ends_with("deepspeed_stories.py") &&
                     v["location"]["line"].get<int>() == gatheredLine &&
                     v["location"]["function"] == "diverge",
                 v.dump().c_str());
        QVERIFY2(v["message"].get<std::string>().find("GatheredParameters") != std::string::npos,
                 v.dump().c_str());
        QVERIFY2(hung.err.contains(QStringLiteral("shardscope: rank 0: rank_stalled: all_gather")),
                 qPrintable(hung.err.right(3000)));
        QCOMPARE(hangRecords(s1), std::size_t(0));
        // The collective rank 0 waits in: the GatheredParameters all-gather of fc.weight, one
        // more than rank 1 issued, never ended.
        const auto c0 = shardscope::test::collectivesOf(s0);
        const auto c1 = shardscope::test::collectivesOf(s1);
        QCOMPARE(c0.size(), c1.size() + 1);
        const auto &last = c0.back();
        QVERIFY(!last.ended && last.kind == 0 && last.module == "fc" &&
                last.reason == kGatheredParameters && last.params == 1);
        qInfo("divergedRanks: slow %lld ms, raise %lld ms, hang "
              "%lld ms",
              slowMs, raiseMs, timer.elapsed());
    }

    // ZeRO++ hierarchical partitioning (zero_hpz_partition_size 2) on 4 ranks. Each parameter's
    // partition and padding in each rank's state are the ones DeepSpeed holds (the story prints
    // them after initialize: ds_tensor.ds_numel and the partition's world,
    // ds_zero_partition_world_size from 0.19.3, else the job's), its gathers move the padded
    // tensor, and the held bytes of the rank's memory samples are the sum of its partitions,
    // with hpZ's secondary ones (numel/2 per rank, from a release to the optimizer step) while
    // the rank has them.
    void hpzPartitions()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const int world = 4;
        const Run r = shardscope::test::finishRanks(shardscope::test::startRanks(
            this, dsEnvironment(), QStringLiteral(SHARDSCOPE_LAUNCH), python(),
            QStringLiteral(SHARDSCOPE_EXAMPLE),
            {"--hpz", "2", "--steps", "2", "--snapshot-out", snapshotArg("hpz")}, m_dir.path(),
            QStringLiteral("0.1"), world));
        QVERIFY2(r.exitCode == 0, qPrintable(r.out.right(4000)));
        struct Held
        {
            long long numel = 0, world = 0, secondary = 0;
        };
        std::map<std::pair<int, std::string>, Held> ds;
        const QRegularExpression line(
            QStringLiteral("rank (\\d+) partition (\\S+) (\\d+) (\\d+) (\\d+)"));
        for (auto it = line.globalMatch(r.out); it.hasNext();) {
            const auto m = it.next();
            ds[{m.captured(1).toInt(), m.captured(2).toStdString()}] = Held{
                m.captured(3).toLongLong(), m.captured(4).toLongLong(), m.captured(5).toLongLong()};
        }
        QCOMPARE(ds.size(), std::size_t(world * 6));
        for (int rank = 0; rank < world; ++rank) {
            const QString path = snapshotOf("hpz", rank);
            const auto decoded = shardscope::wire::readSnapshotFile(path.toStdString());
            QVERIFY2(decoded, decoded ? "" : decoded.error().c_str());
            QCOMPARE(decoded->state.worldSize, world);
            const json s = readJson(path);
            QVERIFY(shardscope::test::snapshotSchemaProblems(s).empty());
            long long held = 0, secondary = 0;
            QCOMPARE(s["params"].size(), std::size_t(6));
            for (const json &p : s["params"]) {
                const std::string name = p["name"];
                QVERIFY2(ds.count({rank, name}), name.c_str());
                const Held h = ds[{rank, name}];
                QCOMPARE(h.world, (long long)world);
                QCOMPARE(p["partition_numel"].get<long long>(), h.numel);
                QCOMPARE(p["padded_numel"].get<long long>(), h.numel * h.world);
                QVERIFY2(p["gather_count"].get<long long>() > 0, p.dump().c_str());
                QCOMPARE(p["gather_bytes"].get<long long>(),
                         p["gather_count"].get<long long>() * h.numel * h.world * 4);
                held += h.numel * 4;
                secondary += h.secondary;
            }
            QVERIFY2(secondary > 0,
                     "no secondary (hpZ) partition: zero_hpz_partition_size was not in effect");
            // The held bytes count the secondary partitions while the rank has them: every one
            // after backward, none after the optimizer step dropped them.
            long long sampled = -1, most = -1;
            for (const json &e : shardscope::test::eventList(s))
                if (e["type"] == "memory_sample") {
                    sampled = e["u0"].get<long long>();
                    most = std::max(most, sampled);
                }
            QCOMPARE(sampled, held);
            QCOMPARE(most, held + secondary * 4);
        }
    }

    // guard="error": the agent raises at the first unregistered access, with the fix line,
    // instead of DeepSpeed's silent registration.
    void guardError()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--externals", "none", "--weight-norm", "off", "--guard", "error",
                           "--snapshot-out", snapshotArg("guard")});
        QVERIFY(r.exitCode != 0);
        QVERIFY2(r.out.contains("shardscope.UnregisteredAccessError"), qPrintable(r.out));
        QVERIFY2(r.out.contains("fix: deepspeed.zero.register_external_parameter(model.lm_head, "
                                "model.embed.weight)"),
                 qPrintable(r.out));
        const std::vector<json> snaps = snapshots("guard");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            const auto v = violations(s, "unregistered_access");
            QCOMPARE(v.size(), std::size_t(1));
            QCOMPARE(v[0]["action"].get<std::string>(), std::string("error"));
        }
    }

    // ---- Hugging Face models (python/examples/hf_stories.py), built from small configs.

    // Story 1 as its user wrote it: a Trainer (deepspeed= a ZeRO-3 config) whose compute_loss
    // multiplies differentiable one-hot inputs by model.module.shared.weight, outside any
    // forward. DeepSpeed's own error reaches the script; the read was recorded first, in the
    // user's names, with the fix for a read that needs its gradient. The story's own attempt
    // (registering it in __init__) does not help a read outside forward: still recorded. The
    // same loss in a loop of the user's own with Accelerate (a ZeRO-3 DeepSpeedPlugin,
    // accelerator.prepare and accelerator.backward): the same record.
    void hfT5ReadInComputeLoss_data()
    {
        QTest::addColumn<QString>("externals");
        QTest::addColumn<QString>("loop");
        QTest::newRow("as the story wrote it") << "none"
                                               << "trainer";
        QTest::newRow("with the story's registration") << "manual"
                                                       << "trainer";
        QTest::newRow("in an Accelerate loop") << "none"
                                               << "accelerate";
    }

    void hfT5ReadInComputeLoss()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QString, externals);
        QFETCH(QString, loop);
        const QString name = "t5-loss-" + externals + "-" + loop;
        const Run r = run({"--case", "t5-compute-loss", "--externals", externals, "--loop", loop,
                           "--snapshot-out", snapshotArg(name)},
                          QStringLiteral(SHARDSCOPE_HF_EXAMPLE));
        QVERIFY(r.exitCode != 0);
        QVERIFY2(r.err.contains("RuntimeError: mat2 must be a matrix") &&
                     r.err.contains("sampled_input.view(b * l, c).mm(model.module.shared.weight)"),
                 qPrintable(r.out));
        const std::vector<json> snaps = snapshots(name);
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            QCOMPARE(s["engine"]["model"].get<std::string>(),
                     std::string("T5ForConditionalGeneration"));
            QVERIFY(findParam(s, "shared.weight")); // the tied weight by the name the code uses
            QVERIFY(!findParam(s, "lm_head.weight"));
            std::vector<json> reads;
            for (const json &v : violations(s, "unregistered_access"))
                if (v["param"] == "shared.weight") reads.push_back(v);
            QCOMPARE(reads.size(), std::size_t(1));
            QVERIFY(reads[0]["accessor"].is_null());
            QCOMPARE(reads[0]["action"].get<std::string>(), std::string("recorded"));
            QCOMPARE(reads[0]["fix"].get<std::string>(),
                     std::string("deepspeed.zero.register_external_parameter(model, "
                                 "model.shared.weight)  # and move the read into model.forward"));
        }
    }

    // The same read inside the model's forward: DeepSpeed registers shared.weight on the model
    // silently (recorded as such, with the line that makes it explicit: the "silent" row runs
    // in hfTrainerAttachedLive, which reads these snapshots too); registered in __init__, as
    // the fix of the compute_loss read above has it (--fixed), the run is clean.
    void hfT5ReadInForward_data()
    {
        QTest::addColumn<QStringList>("args");
        QTest::addColumn<bool>("silent");
        QTest::newRow("compute_loss's read, fixed")
            << QStringList{"--case", "t5-compute-loss", "--fixed"} << false;
        // Transformers' activation checkpointing: each block's forward runs again inside the
        // backward pass (DeepSpeed gathers its parameters again there); the same record.
        QTest::newRow("compute_loss's read, fixed, activation checkpointing")
            << QStringList{"--case", "t5-compute-loss", "--fixed", "--activation-checkpointing"}
            << false;
    }

    void hfT5ReadInForward()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QStringList, args);
        QFETCH(bool, silent);
        const QString name =
            "t5-forward-" +
            QString::fromUtf8(QTest::currentDataTag()).replace(QRegularExpression("[^a-z]"), "-");
        const Run r = run(args + QStringList{"--steps", "2", "--snapshot-out", snapshotArg(name)},
                          QStringLiteral(SHARDSCOPE_HF_EXAMPLE));
        QVERIFY2(r.exitCode == 0, qPrintable(r.out));
        QVERIFY2(r.out.contains("[rank 0] rank 0 step 2 loss"), qPrintable(r.out));
        checkT5ReadInForward(name, 2, silent);
    }

    // Story 2 on Wav2Vec2Model. Built the way Transformers builds under ZeRO-3
    // (HfDeepSpeedConfig, from_config inside zero.Init), Transformers' __init__ workaround
    // gathers the conv for parametrizations.weight_norm, but its weight initialisation then
    // computes the parametrized conv.weight from the partitioned original1/original0 and
    // fails; built inside zero.Init without HfDeepSpeedConfig, Transformers applies the plain
    // weight_norm to the partitioned conv (the story). Either way the user's IndexError is
    // unchanged, and the read is in both ranks' snapshots first, in the model's names.
    void hfWav2Vec2_data()
    {
        QTest::addColumn<QString>("setup");
        QTest::addColumn<QString>("param");
        QTest::addColumn<int>("readers");      // how many ranks read it (Transformers: rank 0 only)
        QTest::addColumn<QString>("selfPath"); // the parameter as the fix line names it
        QTest::newRow("as Transformers builds it")
            << "hf"
            << "encoder.pos_conv_embed.conv.parametrizations.weight.original1" << 1
            << "model.encoder.pos_conv_embed.conv.parametrizations.weight.original1";
        QTest::newRow("zero.Init without HfDeepSpeedConfig")
            << "zero-init"
            << "encoder.pos_conv_embed.conv.weight" << 2 << "self.conv.weight";
    }

    void hfWav2Vec2()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QString, setup);
        QFETCH(QString, param);
        QFETCH(int, readers);
        QFETCH(QString, selfPath);
        const QString name = "wav2vec2-" + setup;
        const Run r =
            run({"--case", "wav2vec2", "--setup", setup, "--snapshot-out", snapshotArg(name)},
                QStringLiteral(SHARDSCOPE_HF_EXAMPLE));
        QVERIFY(r.exitCode != 0);
        QVERIFY2(r.err.contains("IndexError: Dimension out of range (expected to be in range of "
                                "[-1, 0], but got 2)"),
                 qPrintable(r.out));
        const std::vector<json> snaps = snapshots(name);
        QCOMPARE(snaps.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const auto v = violations(snaps[rank], "unregistered_access");
            if (rank >= readers) { // it failed in the next collective, without reading it
                QVERIFY2(v.empty(), snaps[rank]["violations"].dump().c_str());
                continue;
            }
            QCOMPARE(v.size(), std::size_t(1));
            QVERIFY(v[0]["accessor"].is_null());
            QCOMPARE(QString::fromStdString(v[0]["param"].get<std::string>()), param);
            // Read while the model was being built (zero-init: the build failed), the fix
            // names the parameter from the constructor running (Transformers' own), never
            // `model.`; read once zero.Init had built it (Transformers' weight
            // initialisation, hf), by the model's dotted name.
            QCOMPARE(QString::fromStdString(v[0]["fix"].get<std::string>()),
                     "with deepspeed.zero.GatheredParameters(" + selfPath +
                         ", modifier_rank=0): <change it here>");
            QCOMPARE(v[0].contains("building"), selfPath.startsWith("self."));
            if (v[0].contains("building"))
                QVERIFY2(v[0]["building"].get<std::string>().starts_with("Wav2Vec2Model ("),
                         v[0].dump().c_str());
            QVERIFY2(v[0]["location"]["file"].get<std::string>().ends_with("hf_stories.py"),
                     v[0].dump().c_str());
        }
    }

    // A Trainer run where the user added only the agent's lines: the whole job attached live
    // by shardscope-capture and the inspector, both ranks, the model's own names.
    void hfTrainerAttachedLive()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QTemporaryDir runtime;
        const QString release = m_dir.filePath("trainer.release"); // as in tiedEmbeddingInForward
        QProcess *p =
            start({"--case", "t5-forward", "--steps", "4", "--hold", "120", "--hold-until", release,
                   "--snapshot-out", snapshotArg("trainer")},
                  runtime.path(), QStringLiteral("0.1"), QStringLiteral(SHARDSCOPE_HF_EXAMPLE));
        const QDir disc(runtime.path() + "/shardscope");
        QString job, endpoint0;
        int announced = 0;
        for (int i = 0; i < 1200 && announced < 2; ++i) { // both ranks, before attaching the job
            QThread::msleep(100);
            announced = 0;
            for (const QString &f : disc.entryList({"*.json"})) {
                const json d = readJson(disc.filePath(f));
                if (!d.is_object()) continue;
                ++announced;
                job = QString::fromStdString(d["job"]["id"]);
                if (d["job"]["ranks"] == json::array({0}))
                    endpoint0 = QString::fromStdString(d["endpoint"]);
            }
        }
        QVERIFY2(announced == 2 && !endpoint0.isEmpty(), "the ranks never announced themselves");
        QProcess capture;
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("XDG_RUNTIME_DIR", runtime.path());
        capture.setProcessEnvironment(env);
        capture.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
                      {"--attach", "job:" + job, "--until-step", "3", "--out",
                       m_dir.filePath("trainer-job.json")});
        QProcess gui;
        startInspector(gui, endpoint0, m_dir.filePath("trainer-gui.json"));
        QVERIFY(capture.waitForFinished(180000));
        QVERIFY2(capture.exitCode() == 0, capture.readAllStandardError().constData());
        QVERIFY(gui.waitForFinished(180000));
        QVERIFY2(gui.exitCode() == 0, gui.readAllStandardError().constData());
        QVERIFY(QFile(release).open(QIODevice::WriteOnly));
        const Run ran = shardscope::test::finishRanks(p, 180000);
        QVERIFY(ran.finished());
        QVERIFY2(ran.exitCode == 0, qPrintable(ran.err));
        checkT5ReadInForward("trainer", 4, true); // DeepSpeed's silent registration
        if (QTest::currentTestFailed()) return;
        const json whole = readJson(m_dir.filePath("trainer-job.json"));
        const json shown = readJson(m_dir.filePath("trainer-gui.json"));
        for (const json *s : {&whole, &shown}) {
            QVERIFY(shardscope::test::snapshotSchemaProblems(*s).empty());
            QCOMPARE((*s)["engine"]["model"].get<std::string>(),
                     std::string("T5ForConditionalGeneration"));
            QVERIFY((*s)["engine"]["step"].get<int>() >= 3);
            QVERIFY2((*s)["modules"].size() > 100, (*s)["engine"].dump().c_str());
            QVERIFY(findParam(*s, "shared.weight"));
            QVERIFY(moduleIdOf(*s, "encoder.block.0.layer.0.SelfAttention.q") >= 0);
            bool silent = false;
            for (const json &v : violations(*s, "unregistered_access"))
                silent = silent || (v["param"] == "shared.weight" && v["accessor"] == "");
            QVERIFY2(silent, (*s)["violations"].dump().c_str());
            // The memory plot's samples, for each rank: its partitions, and gathers that come
            // and go (a whole T5 block is never gathered for the whole step).
            std::map<int, std::pair<std::uint64_t, std::uint64_t>> memory; // rank -> held, max
            std::map<int, std::uint64_t> lowest;
            for (const json &e : shardscope::test::eventList(*s)) {
                if (e["type"] != "memory_sample") continue;
                auto &[held, most] = memory[e["rank"].get<int>()];
                held = e["u0"].get<std::uint64_t>();
                most = std::max(most, e["u1"].get<std::uint64_t>());
                auto low = lowest.try_emplace(e["rank"].get<int>(), ~0ull).first;
                low->second = std::min(low->second, e["u1"].get<std::uint64_t>());
            }
            QCOMPARE(memory.size(), s == &whole ? std::size_t(2) : std::size_t(1));
            for (const auto &[rank, m] : memory) {
                QVERIFY2(m.first > 0 && m.second > 0 && lowest[rank] < m.second,
                         qPrintable(QString("rank %1: held %2, most gathered %3, least %4")
                                        .arg(rank)
                                        .arg(m.first)
                                        .arg(m.second)
                                        .arg(lowest[rank])));
            }
        }
        QVERIFY2(whole["engine"]["local_ranks"] == json::array({0, 1}),
                 whole["engine"].dump().c_str());
    }

    // A client attaching before the model is built is told so; then rank 1 is killed
    // (SIGKILL) inside a module's forward of step 3, a second after fc's forward began: the
    // capture attached to it writes what it received and says the engine went away, rank 0 fails in
    // DeepSpeed's collective and still writes its snapshot; the dead rank leaves no snapshot
    // (nothing was flushed).
    void rankKilledMidStep()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QTemporaryDir runtime;
        const QString go = m_dir.filePath("build-now");
        // The ranks wait for this file: whatever fails below, they are let go.
        const auto letGo = qScopeGuard([&] { QFile(go).open(QIODevice::WriteOnly); });
        QProcess *p = start({"--externals", "manual", "--weight-norm", "workaround", "--steps", "6",
                             "--wait-before-build", go, "--kill-rank", "1", "--kill-at-step", "3",
                             "--snapshot-out", snapshotArg("killed")},
                            runtime.path(), QStringLiteral("5"));
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("XDG_RUNTIME_DIR", runtime.path());
        const QString endpoint = shardscope::test::announcedEndpoint(runtime.path(), 1);
        QVERIFY2(!endpoint.isEmpty(), "rank 1 never announced itself");
        // Before the model exists: a valid snapshot that says so, and nothing else.
        QProcess early;
        early.start(
            QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
            {"--attach", endpoint, "--seconds", "0.5", "--out", m_dir.filePath("early.json")});
        QVERIFY(early.waitForFinished(60000));
        QVERIFY2(early.exitCode() == 0, early.readAllStandardError().constData());
        const json before = readJson(m_dir.filePath("early.json"));
        QVERIFY(shardscope::test::snapshotSchemaProblems(before).empty());
        QVERIFY2(before["engine"]["model"].get<std::string>().starts_with(
                     "TinyLM (model not built yet: shown once zero.Init or deepspeed.initialize "
                     "has run)"),
                 before["engine"].dump().c_str());
        QVERIFY(before["params"].empty());

        QProcess live;
        live.start(
            QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
            {"--attach", endpoint, "--until-step", "6", "--out", m_dir.filePath("dead.json")});
        QVERIFY(live.waitForStarted());
        QThread::msleep(300);
        QFile(go).open(QIODevice::WriteOnly);
        const Run ran = shardscope::test::finishRanks(p, 150000);
        QVERIFY(ran.finished());
        const QString &out = ran.out;
        QVERIFY2(ran.exitCode != 0, qPrintable(out));
        QVERIFY2(out.contains("[rank 0] rank 0 step 2") && !out.contains("rank 0 step 3 loss"),
                 qPrintable(out));
        // The survivor's own exception (torch's, from the collective its peer left), unchanged.
        QVERIFY2(shardscope::test::failedWithTorchError(out, 0),
                 "rank 0 did not fail with torch's own error");
        const QString lost =
            shardscope::test::lostRankCaptureProblem(live, m_dir.filePath("dead.json"));
        QVERIFY2(lost.isEmpty(), qPrintable(lost));
        const json dead = readJson(m_dir.filePath("dead.json"));
        // Its state is the last one sent (at most every 200 ms); its events reach the kill.
        QVERIFY(findParam(dead, "embed.weight"));
        std::set<int> begun;
        bool scopeSeen = false;
        for (const json &e : shardscope::test::eventList(dead)) {
            if (e["type"] == "step_begin") begun.insert(e["step"].get<int>());
            if (e["type"] == "module_enter" && e["step"] == 3 &&
                e["a"] == moduleIdOf(dead, "pos_conv"))
                scopeSeen = true;
        }
        QVERIFY2(begun == (std::set<int>{1, 2, 3}),
                 shardscope::test::eventList(dead).dump().c_str());
        QVERIFY2(scopeSeen, "the events of step 3 before the kill did not reach the client");

        const auto survivor =
            shardscope::wire::readSnapshotFile(snapshotOf("killed", 0).toStdString());
        QVERIFY2(bool(survivor), survivor ? "" : survivor.error().c_str());
        QCOMPARE(survivor->state.step, 3u);
        QVERIFY(!QFileInfo::exists(snapshotOf("killed", 1)));
    }

    // Issue #30, defect 11: a rank that fails while its model is built said goodbye with
    // "training finished", and a capture of the job exited 0 ("captured step 0"). Its goodbye
    // now says "training failed: ..." and the capture exits 3; the peer the launcher stops
    // (SIGTERM) says "training stopped".
    void rankFailingWhileItsModelIsBuilt()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QTemporaryDir runtime;
        const QString go = m_dir.filePath("build-fail-now");
        const auto letGo = qScopeGuard([&] { QFile(go).open(QIODevice::WriteOnly); });
        QProcess *p = start({"--wait-before-build", go, "--fail-build-rank", "1", "--snapshot-out",
                             snapshotArg("buildfail")},
                            runtime.path(), QStringLiteral("1"));
        QString job;
        QSet<QString> announced;
        for (int i = 0; i < 600 && announced.size() < 2; ++i) {
            QThread::msleep(100);
            const QDir disc(runtime.path() + "/shardscope");
            for (const QString &f : disc.entryList({"*.json"})) {
                const json d = readJson(disc.filePath(f));
                if (!d.is_object() || !d.contains("job")) continue;
                job = QString::fromStdString(d["job"]["id"].get<std::string>());
                announced.insert(f);
            }
        }
        QCOMPARE(announced.size(), 2);
        QProcess capture;
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("XDG_RUNTIME_DIR", runtime.path());
        capture.setProcessEnvironment(env);
        capture.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
                      {"--attach", "job:" + job, "--out", m_dir.filePath("buildfail.json")});
        QVERIFY(capture.waitForStarted());
        QVERIFY(capture.waitForReadyRead(30000)); // attached
        QThread::msleep(300);
        QFile(go).open(QIODevice::WriteOnly);
        const Run ran = shardscope::test::finishRanks(p, 150000);
        QVERIFY(ran.finished());
        const QString &out = ran.out;
        QVERIFY2(ran.exitCode != 0, qPrintable(out));
        QVERIFY(capture.waitForFinished(60000));
        const QString said = QString::fromUtf8(capture.readAllStandardOutput()) +
                             QString::fromUtf8(capture.readAllStandardError());
        QVERIFY2(capture.exitCode() == 3, qPrintable(said + "\n" + out));
        QVERIFY2(said.contains("the run failed: ") &&
                     said.contains("training failed: RuntimeError: rank 1 cannot build its "
                                   "model (--fail-build-rank)"),
                 qPrintable(said));
        QVERIFY(QFileInfo::exists(m_dir.filePath("buildfail.json")));
    }

    // Issue #30, defect 5: install() after deepspeed.initialize was accepted with a warning,
    // and then every gather count stayed 0 with no fetch or release event: the parameters
    // converted before it were not observed. attach(engine) adopts them: from then on their
    // fetches are seen, and the agent says that what came before is not.
    void lateInstallObservesFromThen()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString script = QStringLiteral(
            "import os, socket, json, warnings, glob, torch, deepspeed\n"
            "import shardscope.deepspeed as ssd\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1',\n"
            "                  MASTER_PORT=str(port))\n"
            "deepspeed.init_distributed('gloo')\n"
            "cfg = {'train_batch_size': 1, 'zero_allow_untested_optimizer': True,\n"
            "       'zero_optimization': {'stage': 3, 'stage3_param_persistence_threshold': 0}}\n"
            "with deepspeed.zero.Init(config_dict_or_path=cfg):\n"
            "    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))\n"
            "eng, *_ = deepspeed.initialize(model=m, config=cfg,\n"
            "                               optimizer=torch.optim.SGD(m.parameters(), lr=0.1))\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); a = ssd.install(listen=False)\n"
            "print('LATE:', any('came after deepspeed.initialize' in str(x.message) for x in w))\n"
            "ssd.attach(eng)\n"
            "for _ in range(3):\n"
            "    loss = eng(torch.ones(1, 8)).sum(); eng.backward(loss); eng.step()\n"
            "st = json.loads(a.native.state_json())\n"
            "print('GATHERS:', len(st['params']), min(p['gather_count'] for p in st['params']))\n"
            "ssd.finish()\n"
            "torch.distributed.destroy_process_group()\n"
            "for f in glob.glob(f'/dev/shm/deepspeed_*_127.0.0.1_{port}_*'): os.unlink(f)\n");
        const Run p = runPython({"-c", script});
        QVERIFY(p.finished());
        const QString &out = p.out;
        const QString &err = p.err;
        QVERIFY2(p.exitCode == 0, qPrintable(out + err));
        QVERIFY2(out.contains("LATE: True"), qPrintable(out));
        const QRegularExpression gathers("GATHERS: 4 (\\d+)");
        const auto m = gathers.match(out);
        QVERIFY2(m.hasMatch() && m.captured(1).toInt() > 0, qPrintable(out));
        QVERIFY2(err.contains("shardscope: rank 0: 4 parameters were partitioned before install(); "
                              "their fetches and releases are observed from now on, what happened "
                              "to them before is not"),
                 qPrintable(err));
    }

    // Issue #30, defect 1: a rank blocked in native code (here the rendezvous, its peer never
    // comes) ignored SIGTERM once the agent was installed: its handler was Python, which
    // cannot run there. The native signal path writes the snapshot and the process dies of
    // the signal, as without the agent.
    void sigtermWhileBlockedInRendezvous()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString out = m_dir.filePath("term.json");
        const QString script = QStringLiteral(
            "import os, socket, sys, datetime, torch.distributed as dist\n"
            "import shardscope.deepspeed as ssd\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "ssd.install(listen=False, snapshot_out=sys.argv[1])\n"
            "print('WAITING', flush=True)\n"
            "dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0,\n"
            "                        world_size=2, timeout=datetime.timedelta(seconds=600))\n"
            "print('RENDEZVOUS ENDED', flush=True)\n");
        QProcess p;
        QProcessEnvironment env = dsEnvironment();
        env.insert("XDG_RUNTIME_DIR", m_dir.path());
        env.insert("RANK", "0");
        env.insert("WORLD_SIZE", "2");
        p.setProcessEnvironment(env);
        p.start(python(), {"-c", script, out});
        QVERIFY(p.waitForStarted());
        QString said;
        while (!said.contains("WAITING") && p.waitForReadyRead(60000))
            said += QString::fromUtf8(p.readAllStandardOutput());
        QVERIFY2(said.contains("WAITING"), qPrintable(said + p.readAllStandardError()));
        QThread::msleep(1500); // inside the rendezvous's wait
        QElapsedTimer t;
        t.start();
        ::kill(static_cast<pid_t>(p.processId()), SIGTERM);
        const bool ended = p.waitForFinished(15000);
        if (!ended) p.kill(), p.waitForFinished(5000);
        const QString err = QString::fromUtf8(p.readAllStandardError());
        QVERIFY2(ended, qPrintable("still alive 15 s after SIGTERM: " + err));
        QVERIFY2(t.elapsed() < 10000, qPrintable(QString::number(t.elapsed())));
        QCOMPARE(p.exitStatus(), QProcess::CrashExit); // died of the signal: exit 143 in a shell
        QCOMPARE(p.exitCode(), SIGTERM);
        QVERIFY2(err.contains("shardscope (rank 0): terminated (SIGTERM); finishing the inspector"),
                 qPrintable(err));
        auto snap = shardscope::wire::readSnapshotFile(out.toStdString());
        QVERIFY2(snap.ok(), snap.error().c_str());
        QCOMPARE(snap->state.worldSize, 2);
    }

    // CI (stop 37): rank 1 of hfWav2Vec2, failing in its next collective as rank 0 raised,
    // was stopped by the launcher while its finish() ran and left no snapshot. finish() put
    // SIGTERM's default disposition back before finishing the inspector, so a signal during
    // it killed the process mid-finish. Now a SIGTERM at any point of finish() waits for it:
    // every trial (the signal at 0 %, 10 %, ... past 100 % of the measured finish time) dies
    // of the signal with its whole snapshot written (tests/deepspeed/sigterm_during_finish.py).
    void sigtermWhileFinishing()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        const int trials = 12;
        const Run p = runPython(
            {QStringLiteral(SHARDSCOPE_SOURCE_DIR) + "/tests/deepspeed/sigterm_during_finish.py",
             dir.path(), QString::number(trials)},
            120000, {}, false);
        QVERIFY(p.finished());
        const QString &out = p.out;
        QVERIFY2(p.exitCode == 0, qPrintable(out + p.err));
        for (int k = 0; k < trials; ++k) {
            const QRegularExpression line(
                QString(R"(trial %1 delay [0-9.]+ ms: signal 15, snapshot yes)").arg(k));
            QVERIFY2(out.contains(line), qPrintable(out));
            auto snap = shardscope::wire::readSnapshotFile(
                dir.filePath(QString("trial%1.json").arg(k)).toStdString());
            QVERIFY2(snap.ok(), snap.error().c_str());
            QCOMPARE(snap->state.params.size(), std::size_t(20000));
        }
    }

  private:
    // The scripts misuse() runs, each once whatever rows run: "misuse" misuses one agent in
    // turn (each step leaves it as the next one needs it), "options" gives install() bad
    // options, "nodeepspeed" installs it in a Python without DeepSpeed.
    static QString misuseScript(const QString &program)
    {
        if (program == "options")
            return QStringLiteral(
                "import os, shardscope, shardscope.deepspeed as ssd\n"
                "d = os.environ['XDG_RUNTIME_DIR']\n"
                "for kw in [dict(history=-1), dict(history='x'), dict(history=True),\n"
                "           dict(job=5), dict(listen=7),\n"
                "           dict(snapshot_out=d + '/missing/s.json'),\n"
                "           dict(snapshot_out='/proc/s.json'), dict(snapshot_out=d)]:\n"
                "    try:\n        ssd.install(**kw); print('ACCEPTED:', kw)\n"
                "    except shardscope.ShardScopeError as e:\n"
                "        print('REFUSED:', e)\n"
                "    except Exception as e:\n"
                "        print('OTHER:', type(e).__name__, e)\n");
        if (program == "nodeepspeed")
            return QStringLiteral(
                "import sys; sys.modules['deepspeed'] = None\n"
                "import shardscope, shardscope.deepspeed as ssd\n"
                "try:\n    ssd.install(listen=False)\n"
                "except shardscope.ShardScopeError as e:\n    print('NODS:', e)\n");
        return QStringLiteral(
            "import deepspeed, shardscope, shardscope.deepspeed as ssd\n"
            "real = deepspeed.__version__\n"
            // an untested release whose hooks are all there: a warning, and it runs
            "deepspeed.__version__ = '0.15.1'\n"
            "import warnings\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); ssd.install(listen=False)\n"
            "print('VERSION:', w[0].message)\n"
            "ssd.finish()\n"
            "deepspeed.__version__ = real\n"
            // a hook this DeepSpeed lacks: refused, naming it
            "from deepspeed.runtime.zero import partitioned_param_coordinator as pc\n"
            "saved = pc.PartitionedParameterCoordinator._invalidate_trace\n"
            "del pc.PartitionedParameterCoordinator._invalidate_trace\n"
            "try:\n    ssd.install(listen=False)\nexcept shardscope.ShardScopeError as e:\n"
            "    print('HOOK:', e)\n"
            "pc.PartitionedParameterCoordinator._invalidate_trace = saved\n"
            "ssd.install(listen=False)\n"
            "try:\n    ssd.install(listen=False)\nexcept shardscope.ShardScopeError as e:\n"
            "    print('TWICE:', e)\n"
            "try:\n    ssd.finish(); ssd.install(guard='strict')\nexcept "
            "shardscope.ShardScopeError as e:\n"
            "    print('GUARD:', e)\n"
            "import os, tempfile\n"
            "f = tempfile.NamedTemporaryFile('w', delete=False); f.write('secret\\n'); f.close()\n"
            "os.chmod(f.name, 0o644)\n"
            "try:\n    ssd.install(listen=False, token_file=f.name)\nexcept "
            "shardscope.ShardScopeError as e:\n"
            "    print('TOKEN:', e)\n"
            "os.unlink(f.name)\n"
            // finish() frees the agent (nothing holds it: no cycle through the native side)
            "import gc, weakref, socket, torch\n"
            "a = ssd.install(listen=False); r = weakref.ref(a); ssd.finish(); del a; gc.collect()\n"
            "print('FREED:', r() is None)\n"
            // the script ends and DeepSpeed partitioned nothing (Accelerate under cpu=True,
            // say): the agent says why its inspector is empty
            "import io, contextlib\n"
            "err = io.StringIO()\n"
            "with contextlib.redirect_stderr(err):\n    ssd.install(listen=False); ssd.finish()\n"
            "print('NOTHING:', ' '.join(err.getvalue().split()))\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1', "
            "MASTER_PORT=str(port))\n"
            "ssd.install(listen=False)\n"
            "deepspeed.init_distributed('gloo')\n"
            "cfg = {'train_batch_size': 1, 'zero_optimization': {'stage': 3}}\n"
            "with deepspeed.zero.Init(config_dict_or_path=cfg):\n    lin = torch.nn.Linear(4, 4)\n"
            // ds_status observed without changing what a parameter is or how it behaves
            "plain = torch.nn.Parameter(torch.zeros(1))\n"
            "try:\n    del plain.ds_status\nexcept AttributeError as e:\n    print('DEL:', e)\n"
            "print('EXACT:', type(lin.weight) is torch.nn.Parameter, lin.weight.ds_status.name,\n"
            "      hasattr(plain, 'ds_status'))\n"
            // issue #30, defect 3: the user's own torch function mode, entered before the
            // agent's became pending (a partitioned parameter read outside forward), leaves
            // as it would without the agent, and sees nothing afterwards
            "from torch.overrides import TorchFunctionMode\n"
            "from torch._C import _len_torch_function_stack as depth\n"
            "class Mine(TorchFunctionMode):\n"
            "    seen = 0\n"
            "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
            "        Mine.seen += 1; return func(*args, **(kwargs or {}))\n"
            "with Mine():\n    w = lin.weight; pending = depth()\n"
            "before = Mine.seen; torch.ones(2) + 1\n"
            "print('OWNMODE:', pending, Mine.seen - before, depth())\n"
            // issue #30, defect 7: a read outside forward the user repeats is said (and the
            // snapshot flushed) once, not per use (one violation of this step: counted once, as
            // the engine counts it); it used to cost milliseconds each
            "import io, json, contextlib\n"
            "err = io.StringIO()\n"
            "with contextlib.redirect_stderr(err):\n"
            "    for _ in range(300): lin.weight.sum()\n"
            "said = json.loads(ssd.agent().native.state_json())['violations']\n"
            "print('REPEATED:', err.getvalue().count('shardscope: rank 0:'),\n"
            "      [v['count'] for v in said if v['param'] == 'weight'])\n"
            // The agent's mode, pending for a parameter read after forward (the Parameter object,
            // legal), is off torch's stack while loss.backward() runs through it: the scopes'
            // close there must not forget it, or it stays on the script's stack for good
            "m2 = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
            "eng, *_ = deepspeed.initialize(model=m2, optimizer=torch.optim.SGD(m2.parameters(), "
            "lr=0.1),\n"
            "    config={'train_batch_size': 1, 'zero_allow_untested_optimizer': True,\n"
            "    'zero_optimization': {'stage': 3, 'stage3_param_persistence_threshold': 0}})\n"
            "depths = []\n"
            "for _ in range(3):\n"
            "    loss = eng(torch.ones(1, 4)).sum(); held = eng.module[0].weight\n"
            "    eng.backward(loss); eng.step(); depths.append(depth())\n"
            "print('BACKWARD:', depths[0], max(depths) <= 1)\n"
            "ssd.finish()\n"
            "print('MODES:', depth())\n"
            "print('RESTORED:', 'ds_status' not in torch.nn.Parameter.__dict__, "
            "lin.weight.ds_status.name)\n"
            // a model that is not ZeRO-3
            "ssd.install(listen=False)\n"
            "m = torch.nn.Linear(4, 4)\n"
            "try:\n    deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), "
            "lr=0.1),\n"
            "        config={'train_batch_size': 1, 'zero_optimization': {'stage': 0}})\n"
            "except shardscope.ShardScopeError as e:\n    print('STAGE:', e)\n"
            "ssd.finish()\n"
            // install() after the model was built (and after deepspeed.initialize)
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); ssd.install(listen=False)\n"
            "print('LATE:', *[str(x.message) for x in w if 'came after' in str(x.message)])\n"
            "ssd.finish()\n"
            "torch.distributed.destroy_process_group()\n"
            // DeepSpeed's CPU collective leaves its /dev/shm buffers (scripts/launch removes
            // them for the runs it starts)
            "import glob\n"
            "for f in glob.glob(f'/dev/shm/deepspeed_*_127.0.0.1_{port}_*'): os.unlink(f)\n");
    }

    std::map<QString, Run> m_misuseRuns;

    const Run &misuseRun(const QString &program)
    {
        auto it = m_misuseRuns.find(program);
        if (it == m_misuseRuns.end())
            it = m_misuseRuns
                     .emplace(program, runPython({"-c", misuseScript(program)},
                                                 program == "misuse" ? 120000 : 60000))
                     .first;
        return it->second;
    }

  private slots:
    // Misuse gets a clear message: an unknown DeepSpeed version, the agent started twice, a
    // model that is not ZeRO-3. finish() frees the agent; ds_status is observed without
    // changing the parameters' class or how the attribute behaves. A row: what the script
    // `program` printed for one misuse (every one of `said`, none of `unsaid`, and the first
    // of `said` exactly `times` times when times > 0).
    void misuse_data()
    {
        QTest::addColumn<QString>("program");
        QTest::addColumn<QStringList>("said");
        QTest::addColumn<QStringList>("unsaid");
        QTest::addColumn<int>("times");
        QTest::newRow("untested release")
            << "misuse"
            << QStringList{"VERSION: shardscope.deepspeed is untested on DeepSpeed 0.15.1 "
                           "(tested: DeepSpeed 0.19.8, 0.16.9 on torch 2.13, 2.14, 2.15); every "
                           "DeepSpeed hook it needs is there, so it runs."}
            << QStringList{} << 0;
        QTest::newRow("missing hook")
            << "misuse"
            << QStringList{"HOOK: shardscope.deepspeed cannot observe DeepSpeed ",
                           ": deepspeed.runtime.zero.partitioned_param_coordinator."
                           "PartitionedParameterCoordinator._invalidate_trace does not "
                           "exist. It is tested on DeepSpeed 0.19.8, 0.16.9; run one of "
                           "those, or leave the agent out of this run."}
            << QStringList{} << 0;
        QTest::newRow("installed twice")
            << "misuse" << QStringList{"TWICE: shardscope.deepspeed.install() was already called"}
            << QStringList{} << 0;
        QTest::newRow("unknown guard")
            << "misuse" << QStringList{"GUARD: guard='strict': use one of 'warn', 'error'"}
            << QStringList{} << 0;
        // The token file is checked as every ShardScope executable checks it.
        QTest::newRow("token file others can read")
            << "misuse" << QStringList{"TOKEN: the ShardScope token:", "chmod 600"} << QStringList{}
            << 0;
        QTest::newRow("finish frees the agent")
            << "misuse" << QStringList{"FREED: True"} << QStringList{} << 0;
        QTest::newRow("nothing partitioned")
            << "misuse"
            << QStringList{"NOTHING: shardscope: rank 0: the script ended without DeepSpeed "
                           "partitioning a model in this process",
                           "Accelerator(cpu=True)"}
            << QStringList{} << 0;
        QTest::newRow("ds_status deleted")
            << "misuse" << QStringList{"DEL: 'Parameter' object has no attribute 'ds_status'"}
            << QStringList{} << 0;
        QTest::newRow("parameter class unchanged")
            << "misuse" << QStringList{"EXACT: True NOT_AVAILABLE False"} << QStringList{} << 0;
        QTest::newRow("ds_status restored")
            << "misuse" << QStringList{"RESTORED: True NOT_AVAILABLE"} << QStringList{} << 0;
        // two modes while the agent's is pending; after the user's exit only the agent's, the
        // user's sees no more calls; after finish() none
        QTest::newRow("user's torch function mode")
            << "misuse" << QStringList{"OWNMODE: 2 0 1", "MODES: 0"} << QStringList{} << 0;
        QTest::newRow("repeated read said once")
            << "misuse" << QStringList{"REPEATED: 1 [1]"} << QStringList{} << 0;
        // pending after the first step (it is left at the next forward's first scope), never
        // two, none after finish() (MODES: 0 above)
        QTest::newRow("mode through backward")
            << "misuse" << QStringList{"BACKWARD: 1 True"} << QStringList{} << 0;
        QTest::newRow("not ZeRO-3")
            << "misuse"
            << QStringList{"STAGE: this DeepSpeed engine runs ZeRO stage 0; "
                           "shardscope.deepspeed inspects ZeRO-3"}
            << QStringList{} << 0;
        // (after lin's zero.Init, and the engine the stage-0 initialize made, if still alive)
        QTest::newRow("installed late")
            << "misuse"
            << QStringList{"LATE: shardscope.deepspeed.install() came after ",
                           "what happened while the model was built",
                           "Call install() first, before the model is built"}
            << QStringList{} << 0;
        // Issue #30, defect 13: bad options are the agent's own errors, at install(), not a
        // pybind TypeError, nor one line at finish() saying the snapshot was lost.
        QTest::newRow("bad options")
            << "options"
            << QStringList{"REFUSED: shardscope.deepspeed.install(): ",
                           "history=-1: give the number of recent events",
                           "history='x'",
                           "history=True",
                           "job=5: give the job's name as a non-empty string",
                           "listen=7: use None",
                           "/missing/s.json': cannot write",
                           "does not exist; create it first",
                           "snapshot_out='/proc/s.json': cannot write /proc/s.json: cannot create "
                           "a file in /proc",
                           "it is a directory; name a file in it"}
            << QStringList{"ACCEPTED", "OTHER"} << 8;
        // A Python without DeepSpeed (a Transformers script run without it): what to install.
        QTest::newRow("no DeepSpeed")
            << "nodeepspeed"
            << QStringList{"NODS: shardscope.deepspeed needs DeepSpeed, and ",
                           "(DeepSpeed is missing: ",
                           "Install DeepSpeed 0.19.8 into this Python (pip install "
                           "deepspeed==0.19.8"}
            << QStringList{} << 0;
    }

    void misuse()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QString, program);
        QFETCH(QStringList, said);
        QFETCH(QStringList, unsaid);
        QFETCH(int, times);
        const Run &r = misuseRun(program);
        QVERIFY2(r.finished(), qPrintable(r.err));
        QVERIFY2(r.exitCode == 0, qPrintable(r.out + r.err));
        bool all = true;
        for (const QString &s : said)
            all = all && r.out.contains(s);
        for (const QString &s : unsaid)
            all = all && !r.out.contains(s);
        if (!all)
            for (const QString &line : r.out.split('\n')) // QVERIFY2 cuts its message short
                qWarning("%s", qPrintable(line));
        for (const QString &s : said)
            QVERIFY2(r.out.contains(s), qPrintable(s));
        for (const QString &s : unsaid)
            QVERIFY2(!r.out.contains(s), qPrintable(s));
        if (times > 0) QCOMPARE(r.out.count(said.front()), times);
    }
};

QTEST_GUILESS_MAIN(TestDeepSpeedAgent)
#include "tst_deepspeedagent.moc"

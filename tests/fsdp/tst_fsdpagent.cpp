// The FSDP2 agent (shardscope.fsdp) against real torch FSDP2 on CPU: two rank processes over
// gloo (scripts/launch, torchrun's environment; `init_device_mesh("cpu", (2,))`),
// python/examples/fsdp_stories.py with each story's flags, and what every rank recorded, read
// back with our own snapshot decoder and the snapshot schema checks. One run is attached live
// (shardscope-capture on one rank and on the whole job, and the inspector on the job).
// Each launch costs ~10 s on a small machine: the fixes share one run.

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QProcess>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QStringList>
#include <QTemporaryDir>
#include <QTest>
#include <QThread>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <map>
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

using shardscope::test::countEvents;
using shardscope::test::fetchesOf;
using shardscope::test::findParam;
using shardscope::test::moduleIdOf;
using shardscope::test::moduleOf;
using shardscope::test::readJson;
using shardscope::test::violations;

using Run = shardscope::test::ProcessRun;

// The interpreter the ranks run: the build's (torch from python/requirements.txt), or
// SHARDSCOPE_FSDP_PYTHON, an interpreter of the same Python version with another torch (how
// torch 2.11 was checked: docs/fsdp.md, "Tested releases").
QString python()
{
    return shardscope::test::pythonInterpreter(QStringLiteral(SHARDSCOPE_PYTHON_EXE),
                                               "SHARDSCOPE_FSDP_PYTHON");
}

QProcessEnvironment fsdpEnvironment()
{
    return shardscope::test::pythonEnvironment(QStringLiteral(SHARDSCOPE_PYTHON_DIR));
}

// The example's line that carries `marker` (a "# story: ..." comment), -1 when none does.
int exampleLine(const char *marker)
{
    return shardscope::test::lineOf(QStringLiteral(SHARDSCOPE_EXAMPLE), QString::fromUtf8(marker));
}

// Fetch reasons (docs/protocol.md); an explicit unshard() is `gathered_parameters`.
constexpr int kForward = 0, kPrefetch = 2, kExplicit = 3;

} // namespace

class TestFsdpAgent : public QObject
{
    Q_OBJECT

    QTemporaryDir m_dir;
    QString m_skip;
    bool m_torchRefusesTied = true;

    QProcess *start(const QStringList &args, const QString &runtime,
                    const QString &monitorInterval = QStringLiteral("0.1"))
    {
        return shardscope::test::startRanks(
            this, fsdpEnvironment(), QStringLiteral(SHARDSCOPE_LAUNCH), python(),
            QStringLiteral(SHARDSCOPE_EXAMPLE), args, runtime, monitorInterval);
    }

    Run run(const QStringList &args, int ranks = 2,
            const QString &script = QStringLiteral(SHARDSCOPE_EXAMPLE))
    {
        return shardscope::test::finishRanks(shardscope::test::startRanks(
            this, fsdpEnvironment(), QStringLiteral(SHARDSCOPE_LAUNCH), python(), script, args,
            m_dir.path(), QStringLiteral("0.1"), ranks));
    }

    // python/examples/hf_fsdp_stories.py: story 1 on Transformers' T5.
    Run runHf(const QStringList &args)
    {
        return run(args, 2, QStringLiteral(SHARDSCOPE_HF_FSDP_EXAMPLE));
    }

    QString snapshotArg(const QString &name)
    {
        return shardscope::test::rankSnapshotArg(m_dir.path(), name);
    }
    QString snapshotOf(const QString &name, int rank)
    {
        return shardscope::test::rankSnapshotPath(m_dir.path(), name, rank);
    }

    // Every rank's snapshot, decoded with our decoder (in the fsdp dialect) and passing the
    // schema checks.
    std::vector<json> snapshots(const QString &name, int world = 2)
    {
        return shardscope::test::rankSnapshots(m_dir.path(), name, world, "fsdp");
    }

    // Each rank's line "shardscope: rank R: ..." comes before torch's error `error` of that rank.
    static void checkRecordedFirst(const QString &err, const QString &error)
    {
        for (int rank = 0; rank < 2; ++rank) {
            const QString prefix = QString("[rank %1] ").arg(rank);
            const qsizetype ours = err.indexOf(prefix + QString("shardscope: rank %1:").arg(rank));
            qsizetype theirs = -1;
            for (qsizetype at = err.indexOf(error); at >= 0; at = err.indexOf(error, at + 1)) {
                const qsizetype line = err.lastIndexOf('\n', at) + 1;
                if (err.mid(line, prefix.size()) == prefix) {
                    theirs = at;
                    break;
                }
            }
            QVERIFY2(ours >= 0 && theirs > ours, qPrintable(err.right(3000)));
        }
    }

  private slots:
    // A case that failed or timed out before it finished its launch leaves no rank running.
    void cleanup() { shardscope::test::endRankLaunches(this); }

    void initTestCase()
    {
        QVERIFY(m_dir.isValid());
        Run probe;
        m_skip = shardscope::test::pythonPrerequisiteMissing(
            python(), QStringLiteral(SHARDSCOPE_PYTHON_DIR), fsdpEnvironment(),
            "from torch.distributed.fsdp import fully_shard; import torch; "
            "print(torch.__version__)",
            "import torch's FSDP2 (scripts/deps installs torch)", &probe);
        if (m_skip.isEmpty()) {
            // torch 2.13 refuses a parameter tied into two groups; before, it trains two copies
            const QList<QByteArray> v = probe.out.toUtf8().trimmed().split('.');
            m_torchRefusesTied =
                v.size() < 2 || v[0].toInt() > 2 || (v[0].toInt() == 2 && v[1].toInt() >= 13);
            qInfo("torch %s", qPrintable(v.join('.')));
        }
        // A skip would hide what scripts/deps failed to install: it fails unless asked for.
        if (const QString refused = shardscope::test::refusedSkip({"fsdp"}, m_skip);
            !refused.isEmpty())
            QFAIL(qPrintable(refused));
        if (!m_skip.isEmpty()) qWarning("skipping: %s", qPrintable(m_skip));
    }

    // A clean run with an explicit unshard() and forward prefetching, attached live: one rank
    // by shardscope-capture, the whole job (both rank processes as one view) by
    // shardscope-capture and by the inspector. State in FSDP's names; unshard/reshard events
    // with their causes; steps.
    void liveJob()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QTemporaryDir runtime;
        QProcess *p = start({"--explicit-unshard", "--read-outside", "grad", "--fixed", "--steps",
                             "3", "--hold", "10", "--snapshot-out", snapshotArg("live"),
                             "--describe", m_dir.filePath("describe.rank{rank}.json")},
                            runtime.path());
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("XDG_RUNTIME_DIR", runtime.path());
        QString listed;
        for (int i = 0; i < 600 && !listed.contains("2 of 2 ranks live"); ++i) {
            QThread::msleep(100);
            QProcess list;
            list.setProcessEnvironment(env);
            list.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture", {"--list"});
            list.waitForFinished(10000);
            listed = QString::fromUtf8(list.readAllStandardOutput());
        }
        QVERIFY2(listed.contains("2 of 2 ranks live"), qPrintable(listed));
        const QDir disc(runtime.path() + "/shardscope");
        // Both name the model as the user built it (TinyLM, not fully_shard's FSDPTinyLM)
        // once the root is known (its first forward); before, "model not sharded yet", never
        // a block (issue #49, defect 8).
        int named = 0;
        for (int i = 0; i < 600 && named < 2; ++i) {
            QThread::msleep(100);
            named = 0;
            for (const QString &f : disc.entryList({"*.json"}))
                named += readJson(disc.filePath(f)).value("model", "") == "TinyLM";
        }
        QCOMPARE(named, 2);
        QString endpoint1, job;
        for (const QString &f : disc.entryList({"*.json"})) {
            const json d = readJson(disc.filePath(f));
            QCOMPARE(d["job"]["world_size"].get<int>(), 2);
            if (job.isEmpty()) job = QString::fromStdString(d["job"]["id"]);
            QCOMPARE(QString::fromStdString(d["job"]["id"]), job);
            if (d["job"]["ranks"] == json::array({1}))
                endpoint1 = QString::fromStdString(d["endpoint"]);
        }
        QVERIFY(!endpoint1.isEmpty());
        QProcess capture;
        capture.start(
            QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
            {"--attach", endpoint1, "--until-step", "3", "--out", m_dir.filePath("capture.json")});
        QProcess jobCapture;
        jobCapture.setProcessEnvironment(env);
        jobCapture.start(
            QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
            {"--attach", "job:" + job, "--until-step", "3", "--out", m_dir.filePath("job.json")});
#ifdef SHARDSCOPE_HAVE_GUI
        QProcess gui;
        QProcessEnvironment guiEnv = env;
        guiEnv.insert("QT_QPA_PLATFORM", "offscreen");
        gui.setProcessEnvironment(guiEnv);
        gui.start(QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope",
                  {"--attach", "job:" + job, "--after-step", "3", "--export-snapshot",
                   m_dir.filePath("gui.json"), "--quit"});
#endif
        QVERIFY(capture.waitForFinished(120000));
        QVERIFY2(capture.exitCode() == 0, capture.readAllStandardError().constData());
        QVERIFY(jobCapture.waitForFinished(120000));
        QVERIFY2(jobCapture.exitCode() == 0, jobCapture.readAllStandardError().constData());
#ifdef SHARDSCOPE_HAVE_GUI
        QVERIFY(gui.waitForFinished(120000));
        QVERIFY2(gui.exitCode() == 0, gui.readAllStandardError().constData());
#endif
        const Run ran = shardscope::test::finishRanks(p, 150000);
        QVERIFY(ran.finished());
        QVERIFY2(ran.exitCode == 0, qPrintable(ran.out));

        const std::vector<json> snaps = snapshots("live");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());
            QCOMPARE(s["engine"]["step"].get<int>(), 3);
            QCOMPARE(s["engine"]["model"].get<std::string>(), std::string("TinyLM"));
            // Units: the modules fully_shard was called on, with reshard_after_forward and mesh.
            const json *root = moduleOf(s, "");
            const json *block = moduleOf(s, "blocks.0");
            QVERIFY(root && block);
            // The root keeps its parameters after forward (FSDP2's default for the root).
            QVERIFY2(
                (*root)["fsdp_unit"] ==
                    json({{"group_id", 0}, {"reshard_after_forward", "False"}, {"mesh", "dp=2"}}),
                root->dump().c_str());
            QCOMPARE((*block)["type"].get<std::string>(), std::string("FSDPBlock"));
            QVERIFY2((*block)["fsdp_unit"] == json({{"group_id", moduleIdOf(s, "blocks.0")},
                                                    {"reshard_after_forward", "True"},
                                                    {"mesh", "dp=2"}}),
                     block->dump().c_str());
            QCOMPARE((*moduleOf(s, "blocks.0.fc1"))["type"].get<std::string>(),
                     std::string("Linear"));
            QVERIFY(!moduleOf(s, "blocks.0.fc1")->contains("fsdp_unit"));
            // Parameters by FQN: global shape, dim 0 padded to the world size (33 -> 34 rows).
            const json *embed = findParam(s, "embed.weight");
            QVERIFY(embed);
            QVERIFY((*embed)["shape"] == json::array({33, 16}));
            QCOMPARE((*embed)["numel"].get<int>(), 528);
            QCOMPARE((*embed)["padded_numel"].get<int>(), 544);
            QCOMPARE((*embed)["partition_numel"].get<int>(), 272);
            QCOMPARE((*embed)["partitioned"].get<bool>(), true);
            QCOMPARE((*embed)["placements"].get<std::string>(), std::string("Shard(0)"));
            QCOMPARE((*embed)["module"].get<std::string>(), std::string("")); // its unit: the root
            QCOMPARE((*embed)["status"].get<std::string>(),
                     std::string("NN")); // sharded after the step
            QVERIFY((*embed)["gather_count"].get<int>() >= 3);
            const json *fc1 = findParam(s, "blocks.0.fc1.weight");
            QVERIFY(fc1);
            QCOMPARE((*fc1)["module"].get<std::string>(), std::string("blocks.0"));
            // Unshards with their causes: blocks.0 by the explicit unshard() before each
            // forward, and prefetched by blocks.1's backward; blocks.1 prefetched by blocks.0's
            // forward (set_modules_to_forward_prefetch) and by the root's backward (the root
            // keeps its own unsharded after forward); the root's own parameters for its forward.
            const int b0 = moduleIdOf(s, "blocks.0"), b1 = moduleIdOf(s, "blocks.1");
            const auto f0 = fetchesOf(s, "blocks.0.fc1.weight");
            const std::string events = shardscope::test::eventList(s).dump();
            QVERIFY2(f0.contains({kExplicit, -1}), events.c_str());
            QVERIFY2(f0.contains({kPrefetch, b1}), events.c_str());
            const auto f1 = fetchesOf(s, "blocks.1.fc1.weight");
            QVERIFY2(f1.contains({kPrefetch, b0}), events.c_str());
            QVERIFY2(f1.contains({kPrefetch, 0}), events.c_str());
            QVERIFY2(!f1.contains({kForward, b1}), events.c_str()); // it was prefetched
            QVERIFY2(fetchesOf(s, "embed.weight").contains({kForward, 0}), events.c_str());
            QCOMPARE(countEvents(s, "step_begin"), 3);
            QCOMPARE(countEvents(s, "step_end"), 3);
            QVERIFY(countEvents(s, "release") > 0);
            QVERIFY(countEvents(s, "memory_sample") > 0);
            QVERIFY(countEvents(s, "module_enter") == countEvents(s, "module_exit"));
        }
        // describe(): placements and each rank's shard, in FSDP's words.
        const json d = readJson(m_dir.filePath("describe.rank1.json"));
        bool seen = false;
        for (const json &prm : d["params"]) {
            if (prm["fqn"] != "embed.weight") continue;
            seen = true;
            QVERIFY2(prm["placements"] == "Shard(0)", prm.dump().c_str()); // as in the state
            QVERIFY2(prm["shards"][1] ==
                         json({{"rank", 1}, {"offset", 272}, {"length", 256}, {"padding", 16}}),
                     prm.dump().c_str());
            QCOMPARE(prm["status"].get<std::string>(), std::string("sharded"));
        }
        QVERIFY2(seen, d.dump().c_str());
        QCOMPARE(d["units"].size(), std::size_t(3));
        for (int rank = 0; rank < 2; ++rank)
            checkReduceScatters(
                snaps[std::size_t(rank)],
                readJson(m_dir.filePath(QStringLiteral("describe.rank%1.json").arg(rank))));

        // Live: one rank, and the whole job as one view.
        const json captured = readJson(m_dir.filePath("capture.json"));
        QVERIFY(shardscope::test::snapshotSchemaProblems(captured).empty());
        QCOMPARE(captured["engine"]["fix_dialect"].get<std::string>(), std::string("fsdp"));
        std::set<std::string> types;
        for (const json &e : shardscope::test::eventList(captured))
            types.insert(e["type"].get<std::string>());
        for (const char *t : {"module_enter", "module_exit", "fetch_begin", "fetch_end", "release",
                              "step_begin", "step_end", "memory_sample"})
            QVERIFY2(types.contains(t), t);
        std::vector<std::pair<QString, json>> jobs{
            {"job.json", readJson(m_dir.filePath("job.json"))}};
#ifdef SHARDSCOPE_HAVE_GUI
        jobs.emplace_back("gui.json", readJson(m_dir.filePath("gui.json")));
#endif
        for (const auto &[name, whole] : jobs) {
            QVERIFY2(shardscope::test::snapshotSchemaProblems(whole).empty(), qPrintable(name));
            QVERIFY2(whole["engine"]["local_ranks"] == json::array({0, 1}),
                     (name + ": " + QString::fromStdString(whole["engine"].dump()))
                         .toUtf8()
                         .constData());
            QVERIFY(findParam(whole, "blocks.1.fc2.weight"));
            std::set<int> ranks;
            for (const json &e : shardscope::test::eventList(whole))
                ranks.insert(e["rank"].get<int>());
            QVERIFY2(ranks == (std::set<int>{0, 1}), qPrintable(name));
        }
    }

    // Gradient reduce-scatters: one reduce_scatter_begin/end pair per FSDP unit per step (a
    // whole group at once: no parameter), moving the unit's padded fp32 gradients, and summing
    // to describe()'s reduce_scatter_bytes.
    static void checkReduceScatters(const json &s, const json &described)
    {
        struct Seen
        {
            int begins = 0, ends = 0;
            std::uint64_t bytes = 0;
            std::uint64_t params = 0;
        };
        std::map<std::pair<int, std::uint32_t>, Seen> byStepUnit;
        std::uint64_t total = 0;
        for (const json &e : shardscope::test::eventList(s)) {
            const bool begin = e["type"] == "reduce_scatter_begin";
            if (!begin && e["type"] != "reduce_scatter_end") continue;
            QCOMPARE(e["b"].get<std::uint32_t>(), 0xffffffffu);
            Seen &x = byStepUnit[{e["step"].get<int>(), e["a"].get<std::uint32_t>()}];
            (begin ? x.begins : x.ends) += 1;
            if (!begin) total += e["u0"].get<std::uint64_t>();
            x.bytes = e["u0"].get<std::uint64_t>();
            x.params = e["u1"].get<std::uint64_t>();
        }
        QCOMPARE(byStepUnit.size(), std::size_t(3 * 3)); // 3 steps x 3 units
        for (const auto &[key, x] : byStepUnit) {
            std::string unit = "?";
            for (const json &m : s["modules"])
                if (m["id"] == key.second) unit = m["path"].get<std::string>();
            QVERIFY2(x.begins == 1 && x.ends == 1, unit.c_str());
            std::uint64_t expected = 0, params = 0;
            for (const json &p : s["params"])
                if (p["module"] == unit)
                    expected += p["padded_numel"].get<std::uint64_t>() * 4, ++params;
            QVERIFY2(x.bytes == expected, (unit + ": " + std::to_string(x.bytes)).c_str());
            QCOMPARE(x.params, params);
        }
        std::uint64_t described_bytes = 0;
        for (const json &u : described["units"]) {
            QCOMPARE(u["reduce_scatters"].get<int>(), 3);
            described_bytes += u["reduce_scatter_bytes"].get<std::uint64_t>();
        }
        QCOMPARE(total, described_bytes);
    }

    // HSDP on 4 ranks: a (replicate=2, shard=2) mesh. Units say the mesh by its dimensions,
    // parameters are (Replicate(), Shard(0)) with shards over 2 ranks (dim 0 padded to 2), ranks
    // 2 and 3 holding what 0 and 1 hold; every unit reduce-scatters its padded gradients once a
    // step (its all-reduce across the replicas is inside that span on CPU, docs/fsdp.md).
    void hsdp()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--hsdp", "2", "--snapshot-out", snapshotArg("hsdp"), "--describe",
                           m_dir.filePath("hsdp-describe.rank{rank}.json")},
                          4);
        QVERIFY2(r.exitCode == 0, qPrintable(r.out));
        const std::vector<json> snaps = snapshots("hsdp", 4);
        QCOMPARE(snaps.size(), std::size_t(4));
        for (int rank = 0; rank < 4; ++rank) {
            const json &s = snaps[std::size_t(rank)];
            QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());
            for (const char *unit : {"", "blocks.0", "blocks.1"}) {
                const json *m = moduleOf(s, unit);
                QVERIFY(m);
                QVERIFY2((*m)["fsdp_unit"]["mesh"] == "replicate=2, shard=2", m->dump().c_str());
            }
            const json *embed = findParam(s, "embed.weight");
            QVERIFY(embed);
            QCOMPARE((*embed)["placements"].get<std::string>(),
                     std::string("(Replicate(), Shard(0))"));
            QCOMPARE((*embed)["padded_numel"].get<int>(),
                     544); // 34 rows: padded to the shard world
            QCOMPARE((*embed)["partition_numel"].get<int>(), 272);
            QCOMPARE((*embed)["status"].get<std::string>(), std::string("NNNN"));
            checkReduceScatters(
                s, readJson(m_dir.filePath(QStringLiteral("hsdp-describe.rank%1.json").arg(rank))));
        }
        const json d = readJson(m_dir.filePath("hsdp-describe.rank3.json"));
        for (const json &prm : d["params"]) {
            if (prm["fqn"] != "embed.weight") continue;
            QCOMPARE(prm["shards"].size(), std::size_t(4));
            QVERIFY2(prm["shards"][3] ==
                         json({{"rank", 3}, {"offset", 272}, {"length", 256}, {"padding", 16}}),
                     prm.dump().c_str());
            QVERIFY2(prm["shards"][2] ==
                         json({{"rank", 2}, {"offset", 0}, {"length", 272}, {"padding", 0}}),
                     prm.dump().c_str());
        }
    }

    // Tied weights sharded by two fully_shard calls: torch 2.13 raises ValueError at the first
    // forward; each rank recorded it first, with the group that should hold both. Before 2.13
    // torch trains each group's copy on its own: the agent finds the tie at fully_shard, and
    // records it at the first forward with the same fix (SHARDSCOPE_FSDP_PYTHON, docs/fsdp.md).
    void tiedAcrossGroups()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--tied", "--steps", "2", "--snapshot-out", snapshotArg("tied")});
        if (m_torchRefusesTied) {
            QVERIFY2(r.exitCode != 0, qPrintable(r.out));
            const QString error = "ValueError: Parameter 'head.weight' is shared with a "
                                  "parameter already managed by another FSDP group";
            QVERIFY2(r.err.contains(error), qPrintable(r.err.right(3000)));
            checkRecordedFirst(r.err, "ValueError: Parameter");
        } else {
            QVERIFY2(r.exitCode == 0, qPrintable(r.out.right(3000)));
            QVERIFY2(r.err.contains("so the weights are no longer tied (this torch does not "
                                    "refuse it)"),
                     qPrintable(r.err.right(3000)));
        }
        const std::vector<json> snaps = snapshots("tied");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            const auto v = violations(s, "tied_across_groups");
            QCOMPARE(v.size(), std::size_t(1));
            QCOMPARE(v[0]["param"].get<std::string>(), std::string("embed.weight"));
            QCOMPARE(v[0]["owner"].get<std::string>(), std::string("embed"));
            QCOMPARE(v[0]["accessor"].get<std::string>(), std::string("head"));
            QCOMPARE(v[0]["fix"].get<std::string>(),
                     std::string("fully_shard([model.embed, model.head])  # one FSDP unit for "
                                 "both, instead of a fully_shard call for each"));
        }
    }

    // fully_shard on each block and then on the layers inside it (a loop over model.modules():
    // parents first) on fully_shard's default mesh: torch fails in the first layer's
    // fully_shard with an error that names no module (torch 2.13: "TypeError: Invariant
    // encountered: value was None when it should not be", from _init_sharding_spec_tp). Each
    // rank recorded and said it first, once: the layer and the block, both calls' lines and
    // the children-first fix; torch's error reaches the script unchanged, as without the agent.
    void shardOrder()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run with = run({"--parents-first", "--snapshot-out", snapshotArg("order")});
        const Run without = run({"--parents-first", "--no-agent"});
        QVERIFY2(without.exitCode != 0 && !without.err.contains("shardscope:"),
                 qPrintable(without.err.right(3000)));
        QCOMPARE(with.exitCode, without.exitCode);
        const QString error = shardscope::test::lastRankException(without.err);
        QVERIFY2(!error.isEmpty(), qPrintable(without.err.right(3000)));
        QCOMPARE(shardscope::test::lastRankException(with.err), error);
        if (m_torchRefusesTied) // torch 2.13, this suite's torch
            QCOMPARE(error, QString("TypeError: Invariant encountered: value was None when it "
                                    "should not be"));
        checkRecordedFirst(with.err, error);
        const int line = exampleLine("# story: parents first");
        QVERIFY(line > 0);
        const QString at = QString(SHARDSCOPE_EXAMPLE ":%1").arg(line);
        const std::vector<json> snaps = snapshots("order");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            QCOMPARE(with.err.count(QString("shardscope: rank %1: fully_shard(").arg(rank)), 1);
            const json &s = snaps[std::size_t(rank)];
            QVERIFY2(s["violations"].size() == 1, s["violations"].dump().c_str());
            const json &v = s["violations"][0];
            QCOMPARE(v["kind"].get<std::string>(), std::string("shard_order"));
            QCOMPARE(v["accessor"].get<std::string>(), std::string("blocks.0.fc1"));
            QCOMPARE(v["owner"].get<std::string>(), std::string("blocks.0"));
            QCOMPARE(v["param"].get<std::string>(), std::string("blocks.0.fc1.weight"));
            QCOMPARE(v["status"].get<std::string>(), std::string("NOT_AVAILABLE"));
            QCOMPARE(v["accessor_id"].get<int>(), moduleIdOf(s, "blocks.0.fc1"));
            QCOMPARE(v["owner_id"].get<int>(), moduleIdOf(s, "blocks.0"));
            QCOMPARE(v["location"]["file"].get<std::string>(), std::string(SHARDSCOPE_EXAMPLE));
            QCOMPARE(v["location"]["line"].get<int>(), line);
            QCOMPARE(v["location"]["function"].get<std::string>(), std::string("main"));
            // both calls' lines (here one line: the loop's), the layer's first
            const QString message = QString::fromStdString(v["message"].get<std::string>());
            QVERIFY2(message.startsWith("fully_shard(model.blocks[0].fc1) (" + at +
                                        ") came after fully_shard(model.blocks[0]) (" + at +
                                        "), which contains it"),
                     qPrintable(message));
            QCOMPARE(v["fix"].get<std::string>(),
                     std::string("fully_shard(model.blocks[0].fc1)  # before "
                                 "fully_shard(model.blocks[0]): children first; a loop over "
                                 "model.modules() goes over reversed(list(model.modules()))"));
            QVERIFY(moduleOf(s, "blocks.1.fc2")); // the model's tree, by its paths
        }
    }

    // Story 1 on Transformers' T5ForConditionalGeneration (hf_fsdp_stories.py), each T5Block a
    // unit and the model the root. T5 ties one embedding into model.shared,
    // encoder.embed_tokens, decoder.embed_tokens and lm_head.
    // - The encoder and decoder stacks each a unit as well (--case stacks): the embedding is
    //   tied into three groups. One record a rank, before torch's ValueError, whose fix names
    //   all three (a fix per pair would put the root into two units); that fix runs clean.
    // - The story's read in the training loop (--case compute-loss): after the root's forward
    //   FSDP2 keeps the root's group unsharded until backward (the root's default), so the
    //   read is of the whole weight and its gradient is reduced with the root's: nothing to
    //   flag, and the same losses as the read made inside the forward (--fixed). With the
    //   root resharded after forward (--root-reshards) the read meets the shard: torch's
    //   mixed-tensor error, recorded first, the fix and the line in the script's own names.
    void hfT5()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run stacks = runHf({"--case", "stacks", "--snapshot-out", snapshotArg("hf-stacks")});
        if (m_torchRefusesTied) {
            QVERIFY2(stacks.exitCode != 0, qPrintable(stacks.out));
            QVERIFY2(stacks.err.contains(
                         "ValueError: Parameter 'encoder.embed_tokens.weight' is "
                         "shared with a parameter already managed by another FSDP group"),
                     qPrintable(stacks.err.right(3000)));
            checkRecordedFirst(stacks.err, "ValueError: Parameter");
        } else {
            QVERIFY2(stacks.exitCode == 0, qPrintable(stacks.out.right(3000)));
        }
        const std::vector<json> st = snapshots("hf-stacks");
        QCOMPARE(st.size(), std::size_t(2));
        for (const json &s : st) {
            const auto v = violations(s, "tied_across_groups");
            QVERIFY2(v.size() == 1, s["violations"].dump().c_str());
            if (m_torchRefusesTied) { // torch 2.13's check: the root's group first
                QCOMPARE(v[0]["param"].get<std::string>(), std::string("shared.weight"));
                QCOMPARE(v[0]["fix"].get<std::string>(),
                         std::string("fully_shard([model, model.encoder, model.decoder])  # one "
                                     "FSDP unit for all of them, instead of a fully_shard call for "
                                     "each"));
                QVERIFY2(v[0]["message"].get<std::string>().starts_with(
                             "`shared.weight` is tied into FSDP units `encoder` and `decoder` as "
                             "well as `<root>`: three groups"),
                         v[0].dump().c_str());
            } else { // the agent's own check (torch 2.11): in the order fully_shard was called
                QCOMPARE(v[0]["param"].get<std::string>(),
                         std::string("encoder.embed_tokens.weight"));
                QVERIFY2(v[0]["fix"].get<std::string>().starts_with(
                             "fully_shard([model.encoder, model.decoder, model])  # one FSDP unit "
                             "for all of them"),
                         v[0].dump().c_str());
            }
        }
        const Run stacksFixed = runHf(
            {"--case", "stacks", "--fixed", "--snapshot-out", snapshotArg("hf-stacks-fixed")});
        QVERIFY2(stacksFixed.exitCode == 0,
                 qPrintable(stacksFixed.out + stacksFixed.err.right(3000)));
        const std::vector<json> sf = snapshots("hf-stacks-fixed");
        QCOMPARE(sf.size(), std::size_t(2));
        for (const json &s : sf)
            QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());

        const QStringList loss{"--case", "compute-loss", "--steps", "2"};
        const Run outside = runHf(loss + QStringList{"--snapshot-out", snapshotArg("hf-outside")});
        const Run inside = runHf(loss + QStringList{"--fixed", "--root-reshards", "--snapshot-out",
                                                    snapshotArg("hf-inside")});
        const Run resharded = runHf(
            loss + QStringList{"--root-reshards", "--snapshot-out", snapshotArg("hf-resharded")});
        QVERIFY2(outside.exitCode == 0, qPrintable(outside.out + outside.err.right(3000)));
        QVERIFY2(inside.exitCode == 0, qPrintable(inside.out + inside.err.right(3000)));
        QVERIFY2(resharded.exitCode != 0, qPrintable(resharded.out));
        checkRecordedFirst(resharded.err, "got mixed torch.Tensor and DTensor");
        const std::vector<json> o = snapshots("hf-outside"), in = snapshots("hf-inside"),
                                rs = snapshots("hf-resharded");
        QCOMPARE(o.size(), std::size_t(2));
        QCOMPARE(in.size(), std::size_t(2));
        QCOMPARE(rs.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const auto i = std::size_t(rank);
            QVERIFY2(o[i]["violations"].empty(), o[i]["violations"].dump().c_str());
            QVERIFY2(in[i]["violations"].empty(), in[i]["violations"].dump().c_str());
            for (int step : {1, 2}) {
                const QString want = shardscope::test::printedLoss(inside.out, rank, step);
                QVERIFY2(!want.isEmpty() &&
                             shardscope::test::printedLoss(outside.out, rank, step) == want,
                         qPrintable(outside.out + "\n---\n" + inside.out));
            }
            const auto v = violations(rs[i], "unregistered_access");
            QVERIFY2(v.size() == 1, rs[i]["violations"].dump().c_str());
            QCOMPARE(v[0]["param"].get<std::string>(), std::string("shared.weight"));
            QVERIFY2(v[0]["accessor"].is_null(), v[0].dump().c_str());
            QCOMPARE(v[0]["fix"].get<std::string>(),
                     std::string("# move the read of model.shared.weight into model.forward (FSDP "
                                 "unshards it there and reduce-scatters its gradient)"));
            QVERIFY2(v[0]["location"]["file"].get<std::string>().ends_with("hf_fsdp_stories.py") &&
                         v[0]["location"]["function"] == "main",
                     v[0].dump().c_str());
        }
    }

    // A LoRA adapter added after fully_shard (late, never sharded); the training loop's
    // to_local() of a resharded parameter under no_grad (no error: it computes on this rank's
    // shard); then its read for the gradient: torch's mixed-tensor error, recorded first.
    void lateAndReadOutside()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--late", "--to-local", "--read-outside", "grad", "--snapshot-out",
                           snapshotArg("read")});
        const int storyLine = exampleLine("# story: fails here"); // the read for the gradient
        const int toLocalLine = exampleLine("# story: to_local");
        QVERIFY(storyLine > 0 && toLocalLine > 0);
        QVERIFY2(r.exitCode != 0, qPrintable(r.out));
        const QString error = "RuntimeError: aten.mm.default got mixed torch.Tensor and DTensor";
        QVERIFY2(r.err.contains(error), qPrintable(r.err.right(3000)));
        checkRecordedFirst(r.err, error);
        const std::vector<json> snaps = snapshots("read");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            const auto late = violations(s, "late_parameter");
            QCOMPARE(late.size(), std::size_t(2));
            std::set<std::string> names;
            for (const json &v : late)
                names.insert(v["param"].get<std::string>());
            QVERIFY((names == std::set<std::string>{"head.lora.a.weight", "head.lora.b.weight"}));
            QVERIFY2(late[0]["fix"].get<std::string>().ends_with(
                         "> before fully_shard(model)  # or the fully_shard call above it"),
                     late[0].dump().c_str());
            const json *a = findParam(s, "head.lora.a.weight");
            QVERIFY(a);
            QCOMPARE((*a)["late"].get<bool>(), true);
            QCOMPARE((*a)["partitioned"].get<bool>(), false);
            // Two reads of blocks.1.fc1.weight, told apart by where the script made them.
            const auto reads = violations(s, "unregistered_access");
            QCOMPARE(reads.size(), std::size_t(2));
            const std::string file = QStringLiteral(SHARDSCOPE_EXAMPLE).toStdString();
            const json *grad = nullptr, *toLocal = nullptr;
            for (const json &v : reads) {
                QVERIFY(v["accessor"].is_null());
                QCOMPARE(v["param"].get<std::string>(), std::string("blocks.1.fc1.weight"));
                QCOMPARE(v["owner"].get<std::string>(), std::string("blocks.1"));
                QCOMPARE(v["status"].get<std::string>(), std::string("NOT_AVAILABLE"));
                const json &at = v["location"];
                QVERIFY2(at.is_object() && at["file"] == file && at["function"] == "main",
                         v.dump().c_str());
                (at["line"] == storyLine ? grad : at["line"] == toLocalLine ? toLocal : grad) = &v;
            }
            QVERIFY2(grad && toLocal && grad != toLocal, json(reads).dump().c_str());
            QCOMPARE((*grad)["fix"].get<std::string>(),
                     std::string("# move the read of model.blocks[1].fc1.weight into "
                                 "model.blocks[1].forward (FSDP unshards it there and "
                                 "reduce-scatters its gradient)"));
            QCOMPARE((*toLocal)["fix"].get<std::string>(),
                     std::string("model.blocks[1].fc1.weight.full_tensor()  # all-gathers it: "
                                 "every rank must run this line"));
        }
    }

    // The same read under torch.no_grad(), with guard="error": ShardScope's
    // UnregisteredAccessError with the fix line, before torch's error.
    void noGradReadUnderGuardError()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--read-outside", "no-grad", "--guard", "error", "--snapshot-out",
                           snapshotArg("guard")});
        QVERIFY2(r.exitCode != 0, qPrintable(r.out));
        QVERIFY2(
            r.err.contains("shardscope.UnregisteredAccessError: shardscope: `blocks.1.fc1.weight`"),
            qPrintable(r.err.right(3000)));
        QVERIFY2(r.err.contains("fix: model.blocks[1].fc1.weight.full_tensor()  # all-gathers it: "
                                "every rank must run this line"),
                 qPrintable(r.err.right(3000)));
        QVERIFY2(!r.err.contains("got mixed torch.Tensor and DTensor"),
                 qPrintable(r.err.right(3000)));
        const std::vector<json> snaps = snapshots("guard");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            const auto v = violations(s, "unregistered_access");
            QCOMPARE(v.size(), std::size_t(1));
            QCOMPARE(v[0]["action"].get<std::string>(), std::string("error"));
        }
    }

    // model.forward(x) instead of model(x): the root's pre-forward all-gather never runs.
    void directForward()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--call-forward", "--snapshot-out", snapshotArg("forward")});
        QVERIFY2(r.exitCode != 0, qPrintable(r.out));
        const QString error =
            "RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor";
        QVERIFY2(r.err.contains(error), qPrintable(r.err.right(3000)));
        checkRecordedFirst(r.err, error);
        const std::vector<json> snaps = snapshots("forward");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            const auto v = violations(s, "unregistered_access");
            QCOMPARE(v.size(), std::size_t(1));
            QCOMPARE(v[0]["accessor"].get<std::string>(), std::string(""));
            QCOMPARE(v[0]["param"].get<std::string>(), std::string("embed.weight"));
            QCOMPARE(v[0]["fix"].get<std::string>(),
                     std::string("model(...)  # call the module, not model.forward(...); for "
                                 "another method: torch.distributed.fsdp."
                                 "register_fsdp_forward_method(model, \"<method>\")"));
        }
    }

    // A non-root unit's forward called directly inside the root's forward
    // (`self.blocks[1].forward(x)` in the model's forward): that unit's pre-forward all-gather
    // never runs; recorded (the unit as accessor, the user's line) before torch's error.
    void blockForwardInsideRoot()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--call-block-forward", "--snapshot-out", snapshotArg("block")});
        QVERIFY2(r.exitCode != 0, qPrintable(r.out));
        const QString error = "got mixed torch.Tensor and DTensor";
        QVERIFY2(r.err.contains("RuntimeError: aten.addmm.default " + error),
                 qPrintable(r.err.right(3000)));
        checkRecordedFirst(r.err, error);
        const int callLine = exampleLine("# story: block forward");
        QVERIFY(callLine > 0);
        const std::vector<json> snaps = snapshots("block");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (const json &s : snaps) {
            const auto v = violations(s, "unregistered_access");
            QCOMPARE(v.size(), std::size_t(1));
            QCOMPARE(v[0]["accessor"].get<std::string>(), std::string("blocks.1"));
            QCOMPARE(v[0]["owner"].get<std::string>(), std::string("blocks.1"));
            QVERIFY2(v[0]["param"].get<std::string>().starts_with("blocks.1.fc1."),
                     v[0].dump().c_str());
            QCOMPARE(v[0]["step"].get<int>(), 1);
            QCOMPARE(v[0]["fix"].get<std::string>(),
                     std::string("model.blocks[1](...)  # call the module, not "
                                 "model.blocks[1].forward(...); for another method: "
                                 "torch.distributed.fsdp.register_fsdp_forward_method("
                                 "model.blocks[1], \"<method>\")"));
            // Where: the read in Block.forward, called from the line that bypassed FSDP.
            const json &at = v[0]["location"];
            const std::string call = QStringLiteral(SHARDSCOPE_EXAMPLE).toStdString() + ":" +
                                     std::to_string(callLine) + " in forward";
            QVERIFY2(at.is_object() && at["function"] == "Block.forward" && !at["chain"].empty() &&
                         at["chain"][0] == call,
                     v[0].dump().c_str());
        }
    }

    // torch.compile as FSDP2 users run it: each block compiled before fully_shard with
    // fullgraph=True and the loss function compiled (torchtitan's way), or the whole model
    // after fully_shard. FSDP's hooks run outside the graph (torch disables dynamo in them);
    // the agent's unit-forward check and read watching are inside it and must leave dynamo's
    // work as it is: the same graph breaks and graphs as without the agent (its check made
    // fullgraph fail with "Unsupported method call" on FsdpPath.status; its read watching
    // recompiled the loss every step; its forward wrapper, one code object for every unit
    // class, was compiled as a frame of its own). The same events per type, gathers and
    // losses as the eager run; a block's forward called directly (not compiled: only the
    // module call is) is still recorded, and under a compiled root the user's exception is
    // torch's, with the agent as without it.
    void compiledModel_data()
    {
        QTest::addColumn<QStringList>("compile");
        QTest::newRow("blocks, fullgraph, loss")
            << QStringList{"--compile", "blocks", "--fullgraph", "--compile-loss"};
        QTest::newRow("model, loss") << QStringList{"--compile", "model", "--compile-loss"};
    }

    void compiledModel()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QStringList, compile);
        compile += QStringList{"--compile-backend", "eager"}; // dynamo's tracing is what matters
        const QString name = compile[1];
        const Run compiled =
            run(compile + QStringList{"--snapshot-out", snapshotArg("compiled-" + name)});
        QVERIFY2(compiled.exitCode == 0, qPrintable(compiled.out + compiled.err.right(3000)));
        QVERIFY2(!compiled.err.contains("did not finish"), qPrintable(compiled.err.right(3000)));
        const Run alone = run(compile + QStringList{"--no-agent"});
        QVERIFY2(alone.exitCode == 0, qPrintable(alone.out + alone.err.right(3000)));
        for (int rank = 0; rank < 2; ++rank) { // "rank R dynamo: N graph breaks, M graphs"
            const QRegularExpression dynamo(QString("rank %1 dynamo: [^\\n]*").arg(rank));
            const QString with = dynamo.match(compiled.out).captured(0);
            QVERIFY2(!with.isEmpty() && with == dynamo.match(alone.out).captured(0),
                     qPrintable(compiled.out + "\n---\n" + alone.out));
        }
        const Run eager = run({"--snapshot-out", snapshotArg("eager-" + name)});
        QVERIFY2(eager.exitCode == 0, qPrintable(eager.out + eager.err.right(3000)));
        const std::vector<json> c = snapshots("compiled-" + name), e = snapshots("eager-" + name);
        QCOMPARE(c.size(), std::size_t(2));
        QCOMPARE(e.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const json &cs = c[std::size_t(rank)], &es = e[std::size_t(rank)];
            QVERIFY2(cs["violations"].empty(), cs["violations"].dump().c_str());
            const std::string differs = shardscope::test::observedDifferently(cs, es);
            QVERIFY2(differs.empty(), differs.c_str());
            checkLosses(cs, rank, compiled.out);
            checkLosses(es, rank, eager.out);
            if (QTest::currentTestFailed()) return;
        }
        // A block's forward called directly inside the root's forward.
        const Run broken = run(compile + QStringList{"--call-block-forward", "--snapshot-out",
                                                     snapshotArg("compiled-block-" + name)});
        const Run without = run(compile + QStringList{"--call-block-forward", "--no-agent"});
        QVERIFY2(broken.exitCode != 0 && without.exitCode != 0,
                 qPrintable(broken.out + without.out));
        const auto lastError = shardscope::test::lastRankException;
        // blocks: the RuntimeError itself; model: dynamo's TorchRuntimeError, which says it
        QVERIFY2(without.err.contains("got mixed torch.Tensor and DTensor") &&
                     !lastError(without.err).isEmpty(),
                 qPrintable(without.err.right(3000)));
        QCOMPARE(lastError(broken.err), lastError(without.err));
        if (name == "blocks") {
            const std::vector<json> snaps = snapshots("compiled-block-" + name);
            QCOMPARE(snaps.size(), std::size_t(2));
            for (const json &s : snaps) {
                const auto v = violations(s, "unregistered_access");
                QCOMPARE(v.size(), std::size_t(1));
                QCOMPARE(v[0]["accessor"].get<std::string>(), std::string("blocks.1"));
            }
        }
    }

    // Activation checkpointing, as Transformers' and torchtitan's call a block
    // (torch.utils.checkpoint around it): its forward runs again inside the backward pass,
    // where FSDP has unsharded the group for the backward. Nothing is flagged; the same
    // all-gathers, reshards, reduce-scatters and gathers per parameter as without
    // checkpointing, and the same losses (the reentrant variant's recomputed forward is a
    // forward scope of its own, so its module counts differ).
    void activationCheckpointing_data()
    {
        QTest::addColumn<QString>("variant");
        QTest::newRow("non-reentrant") << "non-reentrant";
        QTest::newRow("reentrant") << "reentrant";
    }

    void activationCheckpointing()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QString, variant);
        const Run r =
            run({"--checkpoint", variant, "--snapshot-out", snapshotArg("ac-" + variant)});
        QVERIFY2(r.exitCode == 0, qPrintable(r.out + r.err.right(3000)));
        QVERIFY2(!r.err.contains("did not finish"),
                 qPrintable(r.err.right(3000))); // a backward inside backward
        const Run plain = run({"--snapshot-out", snapshotArg("ac-plain-" + variant)});
        QVERIFY2(plain.exitCode == 0, qPrintable(plain.out + plain.err.right(3000)));
        const std::vector<json> c = snapshots("ac-" + variant),
                                e = snapshots("ac-plain-" + variant);
        QCOMPARE(c.size(), std::size_t(2));
        QCOMPARE(e.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const json &cs = c[std::size_t(rank)], &es = e[std::size_t(rank)];
            QVERIFY2(cs["violations"].empty(), cs["violations"].dump().c_str());
            for (const char *type : {"fetch_end", "release", "reduce_scatter_end", "step_end"})
                QVERIFY2(countEvents(cs, type) == countEvents(es, type) &&
                             countEvents(cs, type) > 0,
                         type);
            QCOMPARE(cs["params"].size(), es["params"].size());
            for (std::size_t i = 0; i < cs["params"].size(); ++i)
                QVERIFY2(cs["params"][i]["gather_count"] == es["params"][i]["gather_count"],
                         cs["params"][i].dump().c_str());
            checkLosses(cs, rank, r.out);
            checkLosses(es, rank, plain.out);
            if (QTest::currentTestFailed()) return;
            for (int step = 1; step <= 3; ++step) { // recomputed, not changed
                const QString got = shardscope::test::printedLoss(r.out, rank, step);
                QVERIFY2(!got.isEmpty() &&
                             got == shardscope::test::printedLoss(plain.out, rank, step),
                         qPrintable(r.out + "\n---\n" + plain.out));
            }
        }
    }

    // Backward under torch's compiled autograd (torch._dynamo.compiled_autograd._enable around
    // loss.backward()). torch 2.13 drops the final callback FSDP2's root queues at its
    // pre-backward (torch 2.11 raises at the queueing), so the backward never ends:
    // the root's group stays unsharded with its gradients unreduced, and from the next forward
    // on FSDP2 unshards every group and does nothing else, with no error: each rank trains its
    // own copy. The agent records it once a rank as that backward returns (backward_unfinished,
    // on the root unit, at the script's loss.backward() line, its fix turning compiled
    // autograd off) and says it on stderr, and changes nothing: the exit, the losses and,
    // where torch raises, the exception are those of the run without it. (An exception in
    // backward that the script catches and goes on from does the same: fsdp_misuse.py, in
    // misuse.) Compiled with fullgraph=True (`refused`), torch 2.13 refuses FSDP2's hooks and
    // raises Unsupported before FSDP2's pre-backward runs: the run ends in step 1 with torch's
    // exception, both snapshots are written, and nothing is recorded; a record, where torch
    // raises after FSDP2's pre-backward (torch 2.11), names that exception.
    void compiledAutograd_data()
    {
        QTest::addColumn<bool>("fullgraph");
        QTest::newRow("dropped") << false;
        QTest::newRow("refused") << true;
    }

    void compiledAutograd()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(bool, fullgraph);
        const bool torch213 = m_torchRefusesTied; // torch >= 2.13 (initTestCase)
        const QString name = fullgraph ? "compiled-autograd-refused" : "compiled-autograd";
        QStringList args{
            "--compiled-autograd", "--compile-backend", "eager", "--steps", "2", "--layers", "1"};
        if (fullgraph) args << "--fullgraph";
        const Run with = run(args + QStringList{"--snapshot-out", snapshotArg(name)});
        const Run without = run(args + QStringList{"--no-agent"});
        QVERIFY(!without.err.contains("shardscope:"));
        QCOMPARE(with.exitCode, without.exitCode);
        const std::vector<json> snaps = snapshots(name);
        QCOMPARE(snaps.size(), std::size_t(2));
        if (without.exitCode != 0) { // torch raised in the backward
            const QString error = shardscope::test::lastRankException(without.err);
            QVERIFY2(!error.isEmpty(), qPrintable(without.err.right(3000)));
            QCOMPARE(shardscope::test::lastRankException(with.err), error);
            // "torch._dynamo.exc.Unsupported: ..." as the record names it: "Unsupported: ..."
            const QString raised = error.section(':', 0, 0).section('.', -1) + ":";
            for (const json &s : snaps) {
                QCOMPARE(s["engine"]["step"].get<int>(), 1); // it ended in step 1's backward
                for (const json &e : shardscope::test::eventList(s))
                    QVERIFY2(e["type"] != "step_end", e.dump().c_str());
                QVERIFY2(s["violations"].size() <= 1, s["violations"].dump().c_str());
                for (const json &v : s["violations"])
                    QVERIFY2(v["kind"] == "backward_unfinished" &&
                                 QString::fromStdString(v["message"].get<std::string>())
                                     .contains("The backward raised " + raised),
                             v.dump().c_str());
                if (fullgraph && torch213) // refused before FSDP2's pre-backward
                    QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());
            }
            if (fullgraph && torch213)
                QVERIFY2(!with.err.contains("shardscope: rank"), qPrintable(with.err.right(3000)));
            return;
        }
        QVERIFY(!fullgraph); // torch refuses FSDP2's hooks under fullgraph=True
        const int backwardLine = exampleLine("# story: the backward");
        QVERIFY(backwardLine > 0);
        for (int rank = 0; rank < 2; ++rank) {
            const QString said = QString("shardscope: rank %1: FSDP2's backward did not finish: "
                                         "its final callback")
                                     .arg(rank);
            QVERIFY2(with.err.count(said) == 1, qPrintable(with.err.right(3000)));
            for (int step = 1; step <= 2; ++step) {
                const QString got = shardscope::test::printedLoss(with.out, rank, step);
                QVERIFY2(!got.isEmpty() &&
                             got == shardscope::test::printedLoss(without.out, rank, step),
                         qPrintable(with.out + "\n---\n" + without.out));
            }
            const json &s = snaps[std::size_t(rank)];
            QCOMPARE(s["engine"]["step"].get<int>(), 1); // no root forward after it
            // one record, at step 1, on the root unit, at the script's loss.backward() line
            QCOMPARE(s["violations"].size(), std::size_t(1));
            const json &v = s["violations"][0];
            QCOMPARE(v["kind"].get<std::string>(), std::string("backward_unfinished"));
            QCOMPARE(v["step"].get<int>(), 1);
            QVERIFY2(v["owner"] == "" && v["param"].is_null() && v["accessor"].is_null(),
                     v.dump().c_str());
            QCOMPARE(v["status"].get<std::string>(), std::string("AVAILABLE"));
            QVERIFY2(v["message"].get<std::string>().find("The backward ran under compiled "
                                                          "autograd") != std::string::npos,
                     v.dump().c_str());
            QVERIFY2(v["fix"].get<std::string>().rfind("torch._dynamo.config.compiled_autograd "
                                                       "= False",
                                                       0) == 0,
                     v.dump().c_str());
            QCOMPARE(v["location"]["file"].get<std::string>(), std::string(SHARDSCOPE_EXAMPLE));
            QCOMPARE(v["location"]["line"].get<int>(), backwardLine);
            QCOMPARE(v["location"]["function"].get<std::string>(), std::string("main"));
            for (const json &p : s["params"]) // every group unsharded by the later forwards
                QVERIFY2(p["status"].get<std::string>()[std::size_t(rank)] == 'A',
                         p.dump().c_str());
        }
    }

    // A checkpoint saved in the middle of a run, and a new process resumed from it, as users
    // save and resume FSDP2 runs. Saved after step 1 of 3 three ways: torch's distributed
    // checkpoint (get_state_dict, dcp.save), the full state dict gathered to rank 0
    // (full_state_dict, cpu_offload), each rank's own shards (state_dict() values' to_local()).
    // None of them is the user's read of a shard: nothing is flagged, and the steps go on.
    // Resumed from the dcp checkpoint (get_state_dict, dcp.load, set_state_dict, model and
    // optimizer) and from the full file into the shards (set_model_state_dict, broadcast from
    // rank 0, as a pretrained model is loaded): nothing flagged, and the losses the first run
    // had at those steps. The steps go on from the loaded optimizer's (AdamW's "step"): 2 and
    // 3; from the full file, with a fresh optimizer, from 1. torch's state initialization runs
    // an optimizer.step() of its own (zero gradients, learning rate 0): not counted.
    void checkpointsSavedAndResumed()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString dir = m_dir.filePath("checkpoints");
        const Run saved =
            run({"--steps", "3", "--save-at", "1", "--save-how", "dcp", "full", "local",
                 "--save-dir", dir, "--snapshot-out", snapshotArg("ckpt-saved")});
        QVERIFY2(saved.exitCode == 0, qPrintable(saved.out + saved.err.right(3000)));
        // the vocabulary's 33 rows: whole in the full file, 17 and 16 in the ranks' own shards
        for (const char *line :
             {"rank 0 saved full embed.weight (33, 16)", "rank 0 saved local embed.weight (17, 16)",
              "rank 1 saved local embed.weight (16, 16)"})
            QVERIFY2(saved.out.contains(line),
                     qPrintable(QString(line) + " not in:\n" + saved.out));
        const Run resumed = run({"--steps", "2", "--first-step", "2", "--resume", dir + "/dcp",
                                 "--snapshot-out", snapshotArg("ckpt-resumed")});
        QVERIFY2(resumed.exitCode == 0, qPrintable(resumed.out + resumed.err.right(3000)));
        const Run loaded =
            run({"--steps", "1", "--first-step", "2", "--resume", dir + "/full", "--resume-how",
                 "full", "--snapshot-out", snapshotArg("ckpt-loaded")});
        QVERIFY2(loaded.exitCode == 0, qPrintable(loaded.out + loaded.err.right(3000)));
        const std::vector<json> s = snapshots("ckpt-saved"), r = snapshots("ckpt-resumed"),
                                l = snapshots("ckpt-loaded");
        QCOMPARE(s.size(), std::size_t(2));
        QCOMPARE(r.size(), std::size_t(2));
        QCOMPARE(l.size(), std::size_t(2));
        using shardscope::test::printedLoss;
        using shardscope::test::stepsBegun;
        for (int rank = 0; rank < 2; ++rank) {
            const auto i = std::size_t(rank);
            for (const json *snap : {&s[i], &r[i], &l[i]}) {
                QVERIFY2((*snap)["violations"].empty(), (*snap)["violations"].dump().c_str());
                for (const json &p : (*snap)["params"])
                    QVERIFY2(p["status"] == "NN", p.dump().c_str()); // resharded after each step
            }
            QVERIFY(stepsBegun(s[i]) == (std::vector<int>{1, 2, 3}));
            QVERIFY(stepsBegun(r[i]) == (std::vector<int>{2, 3}));
            QVERIFY(stepsBegun(l[i]) == (std::vector<int>{1}));
            for (int step : {2, 3}) {
                const QString want = printedLoss(saved.out, rank, step);
                QVERIFY2(!want.isEmpty() && printedLoss(resumed.out, rank, step) == want,
                         qPrintable(saved.out + "\n---\n" + resumed.out));
            }
            QVERIFY2(printedLoss(loaded.out, rank, 2) == printedLoss(saved.out, rank, 2),
                     qPrintable(saved.out + "\n---\n" + loaded.out));
        }
    }

    // Rank `rank`'s exception as its traceback ends (torch's message with every line it
    // continues on), without the traceback's frames; empty when there is none.
    static QString rankException(const QString &err, int rank)
    {
        const QString prefix = QString("[rank %1] [rank%1]: ").arg(rank);
        static const QRegularExpression start(R"(^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)\b)");
        QStringList lines;
        for (const QString &line : err.split('\n'))
            if (line.startsWith(prefix)) lines.append(line.mid(prefix.size()));
        qsizetype at = lines.size();
        while (at > 0 && !start.match(lines[at - 1]).hasMatch())
            --at;
        return at > 0 ? lines.mid(at - 1).join('\n') : QString();
    }

    // Checkpoints that lose data (issue 54), as users write them (fsdp_stories.py). Saved after
    // steps 1 and 2: each rank's torch.save(model.state_dict()) (--save-how state-dict: each
    // file holds that rank's DTensor shards) beside the fixed forms, the full state dict
    // gathered to rank 0 and torch.save'd there (full) and torch's distributed checkpoint
    // (dcp). Each rank records the first once, at the script's torch.save line (a row counted
    // twice, said once), and nothing for the others; the files read back hold what the story
    // says. Then that full file loaded into the shards by set_model_state_dict (the fix: the
    // file's values, no record) and by model.load_state_dict (the pitfall): recorded before
    // torch's RuntimeError, which is the one the same run without the agent ends with.
    void checkpointPitfalls()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString dir = m_dir.filePath("pitfalls");
        const Run saved =
            run({"--steps", "2", "--save-at", "1", "2", "--save-how", "state-dict", "full", "dcp",
                 "--save-dir", dir, "--snapshot-out", snapshotArg("ckpt-lossy")});
        QVERIFY2(saved.exitCode == 0, qPrintable(saved.out + saved.err.right(3000)));
        // The model's 10 tensors, 3200 elements: rank 0's shards hold 1616 of them (33 rows
        // of embed and head: 17 on rank 0), rank 1's 1584; the fixed forms all 3200.
        for (const char *line : {"rank 0 saved state-dict rank0.pt: 10 tensors, 10 DTensors, "
                                 "numel 1616 of 3200",
                                 "rank 1 saved state-dict rank1.pt: 10 tensors, 10 DTensors, "
                                 "numel 1584 of 3200",
                                 "rank 0 saved full model.pt: 10 tensors, 0 DTensors, numel 3200 "
                                 "of 3200",
                                 "rank 0 saved dcp .metadata: 10 tensors, 0 DTensors, numel 3200 "
                                 "of 3200"})
            QVERIFY2(saved.out.count(line) == 2,
                     qPrintable(QString(line) + " not twice in:\n" + saved.out));
        const int saveLine = exampleLine("# story: torch.save state_dict");
        const int loadLine = exampleLine("# story: load_state_dict");
        QVERIFY(saveLine > 0 && loadLine > 0);
        const std::vector<json> s = snapshots("ckpt-lossy");
        QCOMPARE(s.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const json &snap = s[std::size_t(rank)];
            QVERIFY2(snap["violations"].size() == 1, snap["violations"].dump().c_str());
            const json &v = snap["violations"][0];
            QCOMPARE(v["kind"].get<std::string>(), std::string("partitioned_save"));
            QCOMPARE(v["rank"].get<int>(), rank);
            QCOMPARE(v["step"].get<int>(), 1);
            QCOMPARE(v["last_step"].get<int>(), 2);
            QCOMPARE(v["count"].get<int>(), 2);
            QCOMPARE(v["severity"].get<std::string>(), std::string("error"));
            QCOMPARE(v["param"].get<std::string>(), std::string("embed.weight"));
            QVERIFY2(v["param_id"] == (*findParam(snap, "embed.weight"))["id"], v.dump().c_str());
            QCOMPARE(v["owner"].get<std::string>(), std::string("")); // the root
            QCOMPARE(v["location"]["file"].get<std::string>(), std::string(SHARDSCOPE_EXAMPLE));
            QCOMPARE(v["location"]["line"].get<int>(), saveLine);
            QCOMPARE(v["location"]["function"].get<std::string>(), std::string("save_checkpoint"));
            // the bytes in the other rank's shards: (3200 - 1616) x 4 B, (3200 - 1584) x 4 B
            const QString message = QString::fromStdString(v["message"].get<std::string>());
            QVERIFY2(message.startsWith("torch.save wrote 10 parameters (`embed.weight` first) as "
                                        "DTensors of a model fully_shard shards: each rank's "
                                        "file holds that rank's shards alone, " +
                                        QString(rank == 0 ? "6.2 KiB" : "6.3 KiB") +
                                        " of them are in the other ranks' files"),
                     qPrintable(message));
            QVERIFY2(v["fix"].get<std::string>().starts_with(
                         "sd = get_model_state_dict(model, options=StateDictOptions("
                         "full_state_dict=True, cpu_offload=True))"),
                     v.dump().c_str());
            QCOMPARE(saved.err.count(QString("shardscope: rank %1: torch.save wrote").arg(rank)),
                     1);
        }

        const QStringList load{"--steps",      "1",    "--resume",       dir + "/full",
                               "--resume-how", "full", "load-state-dict"};
        const Run with = run(load + QStringList{"--snapshot-out", snapshotArg("ckpt-load")});
        const Run without = run(load + QStringList{"--no-agent"});
        QVERIFY2(without.exitCode != 0 && !without.err.contains("shardscope:"),
                 qPrintable(without.err.right(3000)));
        QCOMPARE(with.exitCode, without.exitCode);
        checkRecordedFirst(with.err, "RuntimeError: Error(s) in loading state_dict");
        const std::vector<json> l = snapshots("ckpt-load");
        QCOMPARE(l.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            // set_model_state_dict loaded the file, the same with the agent and without
            const QString fixed =
                QString("rank %1 loaded full: 10 of 10 tensors equal to the file").arg(rank);
            QVERIFY2(with.out.contains(fixed) && without.out.contains(fixed),
                     qPrintable(with.out + "\n---\n" + without.out));
            // load_state_dict: torch's own exception, whole, with the agent as without it
            const QString error = rankException(without.err, rank);
            QVERIFY2(error.startsWith("RuntimeError: Error(s) in loading state_dict for "
                                      "FSDPTinyLM:") &&
                         error.contains("got mixed torch.Tensor and DTensor"),
                     qPrintable(without.err.right(3000)));
            QCOMPARE(rankException(with.err, rank), error);
            const json &snap = l[std::size_t(rank)];
            QVERIFY2(snap["violations"].size() == 1, snap["violations"].dump().c_str());
            const json &v = snap["violations"][0];
            QCOMPARE(v["kind"].get<std::string>(), std::string("partitioned_load"));
            QCOMPARE(v["param"].get<std::string>(), std::string("embed.weight"));
            QCOMPARE(v["owner"].get<std::string>(), std::string(""));
            QCOMPARE(v["count"].get<int>(), 1);
            QCOMPARE(v["location"]["line"].get<int>(), loadLine);
            QCOMPARE(v["location"]["function"].get<std::string>(), std::string("load_checkpoint"));
            // every parameter, whole: 3200 x 4 B
            QVERIFY2(v["message"].get<std::string>().starts_with(
                         "model.load_state_dict was given plain tensors of the full shape for 10 "
                         "parameters (`embed.weight` first) that fully_shard holds as DTensor "
                         "shards (12.5 KiB in all)"),
                     v.dump().c_str());
            QCOMPARE(v["fix"].get<std::string>(),
                     std::string("set_model_state_dict(model, state_dict, options="
                                 "StateDictOptions(full_state_dict=True, broadcast_from_rank0="
                                 "True))  # torch.distributed.checkpoint.state_dict, on every "
                                 "rank; state_dict is needed on rank 0 only ({} on the others)"));
            QCOMPARE(with.err.count(QString("shardscope: rank %1: ").arg(rank)), 1);
        }
    }

    // Every fix at once, with attach(model) after fully_shard: clean; the adapter made
    // before fully_shard is sharded with head's group; the tied pair is one parameter. Each
    // step ends with the loss the script printed (its loss.backward()'s tensor).
    void fixesAreClean()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--tied", "--late", "--call-forward", "--call-block-forward",
                           "--to-local", "--read-outside", "no-grad", "--fixed", "--attach",
                           "--snapshot-out", snapshotArg("fixed")});
        QVERIFY2(r.exitCode == 0, qPrintable(r.out));
        QVERIFY2(!r.err.contains("Warning"), qPrintable(r.err)); // nor torch's about the loss
        const std::vector<json> snaps = snapshots("fixed");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            const json &s = snaps[std::size_t(rank)];
            QVERIFY2(s["violations"].empty(), s["violations"].dump().c_str());
            QCOMPARE(s["engine"]["step"].get<int>(), 3);
            const json *a = findParam(s, "head.lora.a.weight");
            QVERIFY(a);
            QCOMPARE((*a)["late"].get<bool>(), false);
            QCOMPARE((*a)["partitioned"].get<bool>(), true);
            QVERIFY(findParam(s, "embed.weight"));
            QVERIFY(!findParam(s, "head.weight")); // the same tensor, by its first name
            // fully_shard([model.embed, model.head]): one group, headed by embed.
            const json *embed = moduleOf(s, "embed"), *head = moduleOf(s, "head");
            QVERIFY(embed && head);
            QVERIFY2((*embed)["fsdp_unit"]["group_id"] == moduleIdOf(s, "embed"),
                     embed->dump().c_str());
            QVERIFY2((*head)["fsdp_unit"]["group_id"] == moduleIdOf(s, "embed"),
                     head->dump().c_str());
            checkLosses(s, rank, r.out);
        }
    }

    // The losses a rank's snapshot ends its 3 steps with are those the script printed, to its
    // 4 decimals.
    static void checkLosses(const json &s, int rank, const QString &out)
    {
        std::vector<double> losses;
        for (const json &e : shardscope::test::eventList(s))
            if (e["type"] == "step_end")
                losses.push_back(std::bit_cast<double>(e["u0"].get<std::uint64_t>()));
        QCOMPARE(losses.size(), std::size_t(3));
        for (int step = 1; step <= 3; ++step) {
            const QString line = QString("rank %1 step %2 loss %3")
                                     .arg(rank)
                                     .arg(step)
                                     .arg(losses[std::size_t(step - 1)], 0, 'f', 4);
            QVERIFY2(out.contains(line), qPrintable(line + " not in:\n" + out));
        }
    }

    // The loss differentiated by torch.autograd.backward(loss) instead of loss.backward() is
    // the step's loss too (no NaN).
    void lossThroughAutogradBackward()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run r = run({"--autograd-backward", "--snapshot-out", snapshotArg("autograd")});
        QVERIFY2(r.exitCode == 0, qPrintable(r.out + r.err));
        const std::vector<json> snaps = snapshots("autograd");
        QCOMPARE(snaps.size(), std::size_t(2));
        for (int rank = 0; rank < 2; ++rank) {
            checkLosses(snaps[std::size_t(rank)], rank, r.out);
            if (QTest::currentTestFailed()) return;
        }
    }

    // A rank killed (SIGKILL) inside step 3's forward while a client is attached to it: the
    // survivor fails with torch's own error from the collective its peer left, and writes its
    // snapshot; the client sees the rank go away, keeps what it was sent and says so.
    void rankKilledMidStep()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QTemporaryDir runtime;
        const QString go = m_dir.filePath("train-now");
        // The ranks wait for this file: whatever fails below, they are let go.
        const auto letGo = qScopeGuard([&] { QFile(go).open(QIODevice::WriteOnly); });
        QProcess *p = start({"--steps", "6", "--wait-before-train", go, "--kill-rank", "1",
                             "--kill-at-step", "3", "--snapshot-out", snapshotArg("killed")},
                            runtime.path(), QStringLiteral("5"));
        const QString endpoint = shardscope::test::announcedEndpoint(runtime.path(), 1);
        QVERIFY2(!endpoint.isEmpty(), "rank 1 never announced itself");
        QProcess live;
        live.start(
            QStringLiteral(SHARDSCOPE_BIN_DIR) + "/shardscope-capture",
            {"--attach", endpoint, "--until-step", "6", "--out", m_dir.filePath("dead.json")});
        QVERIFY(live.waitForStarted());
        QThread::msleep(300);
        QFile(go).open(QIODevice::WriteOnly);
        const Run r = shardscope::test::finishRanks(p);
        QVERIFY2(r.exitCode != 0, qPrintable(r.out));
        QVERIFY2(r.out.contains("[rank 0] rank 0 step 2 loss") &&
                     !r.out.contains("rank 0 step 3 loss"),
                 qPrintable(r.out));
        // The survivor's own exception (torch's, from the collective its peer left), unchanged.
        QVERIFY2(shardscope::test::failedWithTorchError(r.out, 0),
                 "rank 0 did not fail with torch's own error");
        const QString lost =
            shardscope::test::lostRankCaptureProblem(live, m_dir.filePath("dead.json"));
        QVERIFY2(lost.isEmpty(), qPrintable(lost));
        const json dead = readJson(m_dir.filePath("dead.json"));
        QCOMPARE(dead["engine"]["fix_dialect"].get<std::string>(), std::string("fsdp"));
        // Its state is the last one sent; its events reach into step 3, before the kill.
        QVERIFY(findParam(dead, "blocks.0.fc1.weight"));
        std::set<int> begun;
        bool unsharded3 = false;
        for (const json &e : shardscope::test::eventList(dead)) {
            if (e["type"] == "step_begin") begun.insert(e["step"].get<int>());
            if (e["type"] == "fetch_end" && e["step"] == 3) unsharded3 = true;
        }
        QVERIFY2(begun == (std::set<int>{1, 2, 3}),
                 shardscope::test::eventList(dead).dump().c_str());
        QVERIFY2(unsharded3, "the unshards of step 3 before the kill did not reach the client");

        // The survivor's snapshot decodes (step 3, its failure), the killed rank wrote none.
        const auto survivor =
            shardscope::wire::readSnapshotFile(snapshotOf("killed", 0).toStdString());
        QVERIFY2(bool(survivor), survivor ? "" : survivor.error().c_str());
        QCOMPARE(survivor->state.step, 3u);
        QCOMPARE(survivor->state.fixDialect, std::string("fsdp"));
        QVERIFY(
            shardscope::test::snapshotSchemaProblems(readJson(snapshotOf("killed", 0))).empty());
        QVERIFY(!QFileInfo::exists(snapshotOf("killed", 1)));
    }

    // Issue 51 on three real ranks (SHARDSCOPE_STALL_SECONDS=2): rank 2 gets one more batch at
    // the end (the others wait in a barrier). Until then every group unshard and reduce-scatter
    // is one begin/end pair with the same signature at the same (group, seq) on every rank;
    // then rank 2's unshard of the root waits: its watchdog records rank_stalled at the
    // script's line and flushes it while the job hangs; ranks 0 and 1 record nothing.
    void divergedRanks()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QElapsedTimer timer;
        timer.start();
        QProcessEnvironment env = fsdpEnvironment();
        env.insert("SHARDSCOPE_STALL_SECONDS", "2");
        QProcess *hang = shardscope::test::startRanks(this, env, QStringLiteral(SHARDSCOPE_LAUNCH),
                                                      python(), QStringLiteral(SHARDSCOPE_EXAMPLE),
                                                      {"--steps", "2", "--diverge", "extra-batch",
                                                       "--diverge-rank", "2", "--snapshot-out",
                                                       snapshotArg("extra-batch")},
                                                      m_dir.path(), QStringLiteral("0.1"), 3);
        bool recorded = false;
        for (QElapsedTimer wait; !wait.isValid() || wait.elapsed() < 90000; QThread::msleep(250)) {
            if (!wait.isValid()) wait.start();
            QFile f(snapshotOf("extra-batch", 2));
            if (f.open(QIODevice::ReadOnly) && f.readAll().contains("rank_stalled")) {
                recorded = true;
                break;
            }
        }
        QThread::msleep(1000); // the others would have their own records by now, if they made one
        hang->terminate();     // the launcher stops the ranks: the agents write their files
        const Run hung = shardscope::test::finishRanks(hang);
        QVERIFY2(recorded, qPrintable(hung.out.right(3000)));
        for (int rank = 0; rank < 3; ++rank)
            QVERIFY2(hung.out.contains(QString("rank %1 step 2 loss").arg(rank)) &&
                         !hung.out.contains(QString("rank %1 reached the end").arg(rank)),
                     qPrintable(hung.out.right(3000)));
        QVERIFY2(hung.err.contains("shardscope: rank 2: rank_stalled: all_gather") &&
                     !hung.err.contains("shardscope: rank 0: rank_stalled") &&
                     !hung.err.contains("shardscope: rank 1: rank_stalled"),
                 qPrintable(hung.err.right(3000)));
        const std::vector<json> snaps = snapshots("extra-batch", 3);
        QCOMPARE(snaps.size(), std::size_t(3));
        std::vector<std::vector<shardscope::test::Collective>> byRank;
        for (int rank = 0; rank < 3; ++rank) {
            const json &s = snaps[std::size_t(rank)];
            QCOMPARE(violations(s, "collective_mismatch").size(), std::size_t(0));
            QCOMPARE(violations(s, "rank_stalled").size(), std::size_t(rank == 2 ? 1 : 0));
            byRank.push_back(shardscope::test::collectivesOf(s));
        }
        const auto &shared = byRank[0];
        QVERIFY(!shared.empty());
        QCOMPARE(byRank[1].size(), shared.size());
        QCOMPARE(byRank[2].size(), shared.size() + 1);
        std::set<int> kinds;
        for (std::size_t i = 0; i < shared.size(); ++i) {
            QCOMPARE(shared[i].seq, std::uint64_t(i + 1));
            for (int rank = 1; rank < 3; ++rank)
                QVERIFY2(shared[i].key() == byRank[std::size_t(rank)][i].key() &&
                             byRank[std::size_t(rank)][i].ended,
                         qPrintable(QString("collective %1 of rank %2").arg(i).arg(rank)));
            QVERIFY(shared[i].ended && shared[i].bytes > 0 && shared[i].params > 0);
            kinds.insert(shared[i].kind);
        }
        QVERIFY((kinds == std::set<int>{0, 1})); // unshards and reduce-scatters
        // Per group, not per parameter: blocks.0's unshard moves its four parameters at once.
        QVERIFY(std::any_of(shared.begin(), shared.end(), [](const auto &c) {
            return c.kind == 0 && c.module == "blocks.0" && c.params == 4 && c.reason == kForward;
        }));
        const auto &waiting = byRank[2].back();
        QVERIFY(!waiting.ended && waiting.kind == 0 && waiting.module == "" &&
                waiting.reason == kForward);
        const json v = violations(snaps[2], "rank_stalled")[0];
        const int line =
            exampleLine("loss_fn(model(tokens).view(-1, a.vocab), tokens.view(-1)).backward()");
        QVERIFY(line > 0);
        QVERIFY2(v["location"]["file"].get<std::string>().ends_with("fsdp_stories.py") &&
                     v["location"]["line"].get<int>() == line &&
                     v["location"]["function"] == "main",
                 v.dump().c_str());
        qInfo("divergedRanks: %lld ms", timer.elapsed());
    }

    // Bad input in one process: FSDP1, a module never sharded, the agent started twice, a
    // script that ends without fully_shard, a torch lacking a method the agent observes, an
    // unknown guard, the user's own exception.
    void misuse()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        shardscope::test::RunOptions options;
        options.environment = fsdpEnvironment();
        options.timeoutMs = 120000;
        const Run p = shardscope::test::runProcess(
            python(), {QStringLiteral(SHARDSCOPE_SOURCE_DIR) + "/tests/fsdp/fsdp_misuse.py"},
            options);
        QVERIFY(p.finished());
        const QString out = p.out + p.err;
        QVERIFY2(p.exitCode == 0 && out.contains("misuse ok"), qPrintable(out));
        QCOMPARE(out.count("refused: "), 5);
    }
};

QTEST_GUILESS_MAIN(TestFsdpAgent)
#include "tst_fsdpagent.moc"

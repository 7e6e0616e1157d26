// shardscope-check end to end (docs/check.md): the user's unchanged script on two CPU ranks of
// real DeepSpeed ZeRO-3, then the report, the exit status, the snapshot, SARIF and JUnit.

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QTest>

#include <set>

#include <nlohmann/json.hpp>

#include "prerequisite.h"
#include "processtree.h"
#include "snapshotquery.h"

using nlohmann::json;

namespace {

struct Run
{
    int exitCode = -1;
    QString out;
    QString err;
};

QString python()
{
    return QStringLiteral(SHARDSCOPE_PYTHON_EXE);
}

QString script(const QString &name)
{
    return QStringLiteral(SHARDSCOPE_CHECK_TESTS "/scripts/") + name;
}

QProcessEnvironment environment()
{
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    // An older DeepSpeed release first on the path (tst_check-<version>), else the environment's.
    const QString ds = qEnvironmentVariable("SHARDSCOPE_DS_PATH");
    env.insert("PYTHONPATH", QStringLiteral(SHARDSCOPE_PYTHON_DIR) + (ds.isEmpty() ? QString() : ":" + ds));
    env.insert("OMP_NUM_THREADS", "1");
    const QString ext = qEnvironmentVariable("SHARDSCOPE_TORCH_EXTENSIONS");
    if (!ext.isEmpty()) env.insert("TORCH_EXTENSIONS_DIR", ext);
    env.remove("SHARDSCOPE_CHECK");
    return env;
}

Run run(const QStringList &args, const QString &dir, int timeoutMs = 300000)
{
    QProcess p;
    p.setProcessEnvironment(environment());
    p.setWorkingDirectory(dir);
    p.start(python(), QStringList{"-m", "shardscope.check"} + args);
    Run r;
    if (!p.waitForFinished(timeoutMs)) {
        shardscope::test::endProcessTree(static_cast<pid_t>(p.processId())); // and its ranks
        p.waitForFinished();
        r.err = "shardscope-check did not finish in time";
        return r;
    }
    r.exitCode = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
    r.out = QString::fromUtf8(p.readAllStandardOutput());
    r.err = QString::fromUtf8(p.readAllStandardError());
    return r;
}

using shardscope::test::readJson;

// The 1-based line of the first line of file that contains text.
int lineOf(const QString &file, const QString &text)
{
    QFile f(file);
    if (!f.open(QIODevice::ReadOnly)) return -1;
    int n = 0;
    while (!f.atEnd()) {
        ++n;
        if (QString::fromUtf8(f.readLine()).contains(text)) return n;
    }
    return -1;
}

QString describe(const Run &r)
{
    return QStringLiteral("exit %1\n--- stdout\n%2\n--- stderr (end)\n%3")
        .arg(r.exitCode)
        .arg(r.out, r.err.right(3000));
}

} // namespace

class TestCheck : public QObject
{
    Q_OBJECT
    QString m_skip;
    QTemporaryDir m_dir;

  private slots:
    void initTestCase()
    {
        if (QDir(QStringLiteral(SHARDSCOPE_PYTHON_DIR "/shardscope")).entryList({"_native*.so"}).isEmpty())
            m_skip = "the shardscope Python module was not built (pybind11-dev, python3-dev: scripts/deps)";
        else {
            QProcess probe;
            probe.setProcessEnvironment(environment());
            probe.start(python(), {"-c", "import torch, deepspeed, jsonschema, xmlschema; "
                                         "print(deepspeed.__version__)"});
            if (!probe.waitForFinished(120000) || probe.exitCode() != 0)
                m_skip = python() + " cannot import torch, deepspeed, jsonschema and xmlschema "
                                    "(scripts/deps installs python/requirements.txt): " +
                         QString::fromUtf8(probe.readAllStandardError()).right(400);
            else if (const QString want = qEnvironmentVariable("SHARDSCOPE_DS_VERSION");
                     !want.isEmpty() && // the last line: DeepSpeed logs its accelerator first
                     QString::fromUtf8(probe.readAllStandardOutput()).trimmed().split('\n').last() != want)
                m_skip = "DeepSpeed " + want + " is not installed at " +
                         qEnvironmentVariable("SHARDSCOPE_DS_PATH") + " (scripts/deps)";
        }
        // A skip would hide what scripts/deps failed to install: it fails unless asked for.
        if (const QString refused = shardscope::test::refusedSkip({"check"}, m_skip);
            !refused.isEmpty())
            QFAIL(qPrintable(refused));
        if (!m_skip.isEmpty()) qWarning("skipping: %s", qPrintable(m_skip));
    }

    // The seed model of story 1: lm_head reads embed.weight (DeepSpeed registers it silently).
    // Broken: exit 1, the problem with Head.forward's line and the fix line; the report's
    // SARIF and JUnit valid against their schemas. Fixed (--externals manual): exit 0.
    // The FSDP2 stories (python/examples/fsdp_stories.py), detected as FSDP2 and checked with
    // shardscope.fsdp: the training loop's read of a sharded weight (torch then fails: the
    // problem first, with its line), late LoRA parameters, and the fixed model clean.
    void fsdpStoriesBrokenThenFixed()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const QString ex = QStringLiteral(SHARDSCOPE_FSDP_EXAMPLE);
        const Run read = run({"--snapshot", d + "/fsdp-read.json", ex, "--read-outside", "grad"}, d);
        QVERIFY2(read.exitCode == 1, qPrintable(describe(read)));
        QVERIFY2(read.out.contains("unregistered_access: blocks.1.fc1.weight read outside any "
                                   "module (ranks 0,1, step 1)"),
                 qPrintable(describe(read)));
        const int line = lineOf(ex, "# story: fails here");
        QVERIFY(line > 0);
        QVERIFY2(read.out.contains(QStringLiteral("fsdp_stories.py:%1 in main").arg(line)),
                 qPrintable(describe(read)));
        QVERIFY2(read.out.contains("got mixed torch.Tensor and DTensor"), qPrintable(describe(read)));
        const Run late = run({"--snapshot", d + "/fsdp-late.json", "--sarif", d + "/fsdp-late.sarif",
                              "--junit", d + "/fsdp-late.xml", ex, "--late"},
                             d);
        QVERIFY2(late.exitCode == 1, qPrintable(describe(late)));
        QVERIFY2(late.out.contains("late_parameter: head.lora.a.weight") &&
                     late.out.contains("late_parameter: head.lora.b.weight"),
                 qPrintable(describe(late)));
        // Each late parameter at the script's line that registered it (LoRA's constructor),
        // from the line that added the adapter after fully_shard: in the report, the
        // snapshot's record (one row per location), SARIF and JUnit.
        const int aLine = lineOf(ex, "self.a = nn.Linear(hidden, rank, bias=False)");
        const int bLine = lineOf(ex, "self.b = nn.Linear(rank, vocab, bias=False)");
        const int addedLine = lineOf(ex, "head.lora = LoRA(hidden, vocab)");
        QVERIFY(aLine > 0 && bLine > 0 && addedLine > 0);
        for (const int l : {aLine, bLine})
            QVERIFY2(late.out.contains(QStringLiteral("fsdp_stories.py:%1 in LoRA.__init__").arg(l)),
                     qPrintable(describe(late)));
        QVERIFY2(late.out.contains(QStringLiteral("fsdp_stories.py:%1 in with_lora").arg(addedLine)),
                 qPrintable(describe(late)));
        int located = 0;
        const json lateSnap = readJson(d + "/fsdp-late.json");
        for (const json &v : lateSnap["violations"])
            if (v["kind"] == "late_parameter" && v["location"]["function"] == "LoRA.__init__" &&
                v["location"]["line"] == (v["param"] == "head.lora.a.weight" ? aLine : bLine))
                ++located;
        QCOMPARE(located, 4); // two parameters on two ranks
        const json lateSarif = readJson(d + "/fsdp-late.sarif");
        QCOMPARE(lateSarif["runs"][0]["results"].size(), std::size_t(2));
        std::set<int> sarifLines;
        for (const json &r : lateSarif["runs"][0]["results"]) {
            QCOMPARE(r["ruleId"].get<std::string>(), std::string("late_parameter"));
            sarifLines.insert(r["locations"][0]["physicalLocation"]["region"]["startLine"].get<int>());
        }
        QVERIFY(sarifLines == (std::set<int>{aLine, bLine}));
        QFile junit(d + "/fsdp-late.xml");
        QVERIFY(junit.open(QIODevice::ReadOnly));
        const QString junitText = QString::fromUtf8(junit.readAll());
        QVERIFY2(junitText.contains(QStringLiteral("late_parameter head.lora.a.weight in &lt;root&gt; at "))
                     && junitText.contains(QStringLiteral("fsdp_stories.py:%1 in LoRA.__init__").arg(aLine)),
                 qPrintable(junitText));
        QProcess validate;
        validate.setProcessEnvironment(environment());
        validate.start(python(), {QStringLiteral(SHARDSCOPE_CHECK_TESTS "/validate_reports.py"), "--sarif",
                                  d + "/fsdp-late.sarif", "--junit", d + "/fsdp-late.xml"});
        QVERIFY(validate.waitForFinished(120000));
        QVERIFY2(validate.exitCode() == 0, validate.readAll().constData());
        // The late adapter is whole on every rank: a (2x16) + b (33x2) float32 = 392 bytes.
        QVERIFY2(late.out.contains(QRegularExpression("gathered peak [^\n]*, late \\(whole\\) 392 B, ")),
                 qPrintable(describe(late)));
        const Run fixed = run({"--snapshot", d + "/fsdp-fixed.json", "--target-world", "4", ex,
                               "--late", "--fixed"},
                              d);
        QVERIFY2(fixed.exitCode == 0, qPrintable(describe(fixed)));
        QVERIFY2(fixed.out.contains("no problems found"), qPrintable(describe(fixed)));
        // FSDP2's memory at 4 ranks (docs/check.md), by hand. Units: the root (embed 33x16,
        // head 33x16 with the adapter a 2x16, b 33x2 sharded with it: --fixed adds it before
        // fully_shard), blocks.0 and blocks.1 (fc1 32x16 + 32, fc2 16x32 + 16), float32.
        // Gathered, dim 0 padded to a multiple of 4: root 36x16x4 x2 + a 4x16x4 + b 36x2x4 =
        // 4608 + 256 + 288 = 5152; a block 32x16x4 + 32x4 + 16x32x4 + 16x4 = 4288.
        // blocks.0's forward start holds the root (not resharded after forward), blocks.0 and
        // blocks.1 (prefetched one ahead): 5152 + 2 x 4288 = 13728 B = 13.4 KiB; backward
        // reaches the same at blocks.1 (root, blocks.1, blocks.0 prefetched), not more.
        // Shards: ceil(rows/4) rows each: root 9x16x4 x2 + 1x16x4 + 9x2x4 = 1152 + 64 + 72 =
        // 1288; a block 8x16x4 + 8x4 + 4x32x4 + 4x4 = 1072; 1288 + 2 x 1072 = 3432 B = 3.4 KiB.
        // Total 13728 + 3432 = 17160 B = 16.8 KiB.
        QVERIFY2(fixed.out.contains("predicted per-rank parameter memory at 4 ranks: gathered peak "
                                    "13.4 KiB (at `blocks.0` forward), late (whole) 0 B, shards "
                                    "3.4 KiB; total 16.8 KiB"),
                 qPrintable(describe(fixed)));
    }

    void seedModelBrokenThenFixed()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const QString ex = QStringLiteral(SHARDSCOPE_EXAMPLE);
        const Run broken = run({"--snapshot", d + "/broken.json", "--sarif", d + "/broken.sarif",
                                "--junit", d + "/broken.xml", ex, "--externals", "none",
                                "--weight-norm", "workaround"},
                               d);
        QVERIFY2(broken.exitCode == 1, qPrintable(describe(broken)));
        const int line = lineOf(ex, "return F.linear(x, self.embed.weight)");
        QVERIFY(line > 0);
        QVERIFY2(broken.out.contains("1 problem:"), qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains("unregistered_access: embed.weight read by lm_head (ranks 0,1"),
                 qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains(QStringLiteral("deepspeed_stories.py:%1 in Head.forward").arg(line)),
                 qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains("fix: deepspeed.zero.register_external_parameter(model.lm_head, "
                                     "model.embed.weight)"),
                 qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains("predicted per-rank parameter memory at 64 ranks"),
                 qPrintable(describe(broken)));
        // The snapshot: the record's location, on both ranks.
        const json snap = readJson(d + "/broken.json");
        QVERIFY(snap.is_object());
        int located = 0;
        for (const json &v : snap["violations"])
            if (v.contains("location") && v["location"]["line"] == line &&
                v["location"]["function"] == "Head.forward")
                ++located;
        QCOMPARE(located, 2);
        // SARIF names the same line.
        const json sarif = readJson(d + "/broken.sarif");
        QCOMPARE(sarif["runs"][0]["results"].size(), std::size_t(1));
        QCOMPARE(sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"]
                     .get<int>(),
                 line);

        // --micro-batch 1: DeepSpeed's config says 1 per rank, and the report says the script
        // feeds its own batches of 4 (deepspeed_stories.py makes them), which it cannot change.
        const Run fixed = run({"--snapshot", d + "/fixed.json", "--sarif", d + "/fixed.sarif",
                               "--junit", d + "/fixed.xml", "--micro-batch", "1", ex, "--externals",
                               "manual", "--weight-norm", "workaround"},
                              d);
        QVERIFY2(fixed.exitCode == 0, qPrintable(describe(fixed)));
        QVERIFY2(fixed.out.contains("batch: 1 per rank (--micro-batch; the first forward's input: 4 "
                                    "rows), gradient accumulation 1, train_batch_size 2 at 2 ranks; "
                                    "the script makes its own batches, which --micro-batch does not "
                                    "change"),
                 qPrintable(describe(fixed)));
        QVERIFY2(fixed.out.contains("no problems found"), qPrintable(describe(fixed)));
        QVERIFY2(fixed.out.contains("late parameters (2)"), qPrintable(describe(fixed)));
        // weight_norm's weight_g/weight_v (adopted by deepspeed.initialize: listed, no problem)
        // at the script's line that applied weight_norm.
        const int wnLine =
            lineOf(ex, "with deepspeed.zero.GatheredParameters(self.conv.weight, modifier_rank=0):") + 1;
        QVERIFY(wnLine > 1);
        for (const char *p : {"weight_g", "weight_v"})
            QVERIFY2(fixed.out.contains(QStringLiteral("pos_conv.conv.%1 (replaces pos_conv.conv.weight) at "
                                                       "%2:%3 in PositionalConv.__init__")
                                            .arg(QString::fromLatin1(p), ex)
                                            .arg(wnLine)),
                     qPrintable(describe(fixed)));
        QVERIFY(readJson(d + "/fixed.json")["violations"].empty());

        // Real validators, against the vendored schemas.
        QProcess v;
        v.setProcessEnvironment(environment());
        v.start(python(), {QStringLiteral(SHARDSCOPE_CHECK_TESTS "/validate_reports.py"), "--sarif",
                           d + "/broken.sarif", "--sarif", d + "/fixed.sarif", "--junit",
                           d + "/broken.xml", "--junit", d + "/fixed.xml"});
        QVERIFY(v.waitForFinished(120000));
        QVERIFY2(v.exitCode() == 0, v.readAll().constData());
        // ... which do reject what is not SARIF or JUnit.
        QFile bad(d + "/bad.sarif");
        QVERIFY(bad.open(QIODevice::WriteOnly));
        bad.write(R"({"version": "2.1.0", "runs": [{"tool": {"driver": {}}}]})");
        bad.close();
        QFile badXml(d + "/bad.xml");
        QVERIFY(badXml.open(QIODevice::WriteOnly));
        badXml.write("<testsuites><testsuite name=\"x\"><testcase/></testsuite></testsuites>");
        badXml.close();
        v.start(python(), {QStringLiteral(SHARDSCOPE_CHECK_TESTS "/validate_reports.py"), "--sarif",
                           d + "/bad.sarif", "--junit", d + "/bad.xml"});
        QVERIFY(v.waitForFinished(120000));
        const QString rejected = QString::fromUtf8(v.readAll());
        QCOMPARE(v.exitCode(), 1);
        QVERIFY2(rejected.contains("0 valid, 2 invalid"), qPrintable(rejected));
    }

    // Story 1 on Hugging Face T5 through the Trainer: the read of shared.weight in the model's
    // forward (DeepSpeed registers it silently), then the fix that registers it in __init__.
    // The output docs/check.md and the README show for the example names the lines the
    // example has now (they went stale as the example grew): each `deepspeed_stories.py:N in F`
    // is the line of F's statement the check reports there.
    void docsShowTheExamplesLines()
    {
        const QString ex = QStringLiteral(SHARDSCOPE_EXAMPLE);
        const QString root = QFileInfo(ex).absoluteDir().absoluteFilePath("../..");
        const QMap<QString, int> lines{
            {"Head.forward", lineOf(ex, "return F.linear(x, self.embed.weight)")},
            {"forward", lineOf(ex, "return self.lm_head(torch.tanh(self.fc(x)))")},
            {"main", lineOf(ex, "logits = engine.module(ids) if args.call_module else engine(ids)")},
            {"PositionalConv.__init__",
             lineOf(ex, "with deepspeed.zero.GatheredParameters(self.conv.weight, "
                        "modifier_rank=0):") + 1}};
        static const QRegularExpression at(R"(deepspeed_stories\.py:(\d+) in ([\w.]+))");
        int seen = 0;
        for (const QString &doc : {QStringLiteral("docs/check.md"), QStringLiteral("README.md")}) {
            QFile f(root + "/" + doc);
            QVERIFY2(f.open(QIODevice::ReadOnly), qPrintable(f.fileName()));
            const QString text = QString::fromUtf8(f.readAll());
            for (auto m = at.globalMatch(text); m.hasNext();) {
                const auto hit = m.next();
                const QString function = hit.captured(2);
                QVERIFY2(lines.contains(function),
                         qPrintable(doc + ": " + hit.captured(0) + ": not a function this test knows"));
                QVERIFY2(hit.captured(1).toInt() == lines[function],
                         qPrintable(QString("%1 shows %2; the example has it at line %3")
                                        .arg(doc, hit.captured(0)).arg(lines[function])));
                ++seen;
            }
        }
        QVERIFY(seen >= 6);
    }

    void hfT5BrokenThenFixed()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const QString ex = QStringLiteral(SHARDSCOPE_HF_EXAMPLE);
        const Run broken = run({"--snapshot", d + "/t5.json", ex, "--case", "t5-forward"}, d);
        QVERIFY2(broken.exitCode == 1, qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains("unregistered_access: shared.weight read by <root>"),
                 qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains(QRegularExpression("at .*hf_stories\\.py:\\d+ in ")),
                 qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains("fix: deepspeed.zero.register_external_parameter(model, "
                                     "model.shared.weight)"),
                 qPrintable(describe(broken)));
        // The batch it ran: the script's (TrainingArguments' 2 per rank) ...
        QVERIFY2(broken.out.contains("batch: 2 per rank (the script's config; the first forward's "
                                     "input: 2 rows), gradient accumulation 1, train_batch_size 4 "
                                     "at 2 ranks"),
                 qPrintable(describe(broken)));
        // Fixed, shared.weight is no longer reported. What stays is Transformers' own T5 FFN
        // (T5DenseActDense.forward reads self.wo.weight.dtype before wo runs: DeepSpeed
        // registers wo.weight on DenseReluDense and gathers it early, in every layer), which
        // the example does not fix: one row per layer, with the line that makes it explicit.
        // ... and, with --micro-batch 1, one per rank: the Trainer's data loader and the
        // DeepSpeed config (explicit numbers in hf_stories.py, not 'auto') both changed.
        const Run fixed = run({"--snapshot", d + "/t5fixed.json", "--micro-batch", "1", ex, "--case",
                               "t5-forward", "--fixed"},
                              d);
        QVERIFY2(fixed.exitCode == 1, qPrintable(describe(fixed)));
        QVERIFY2(!fixed.out.contains("shared.weight read"), qPrintable(describe(fixed)));
        const QRegularExpression ffn("\\d+\\. unregistered_access: (encoder|decoder)\\.block\\.\\d\\."
                                     "layer\\.\\d\\.DenseReluDense\\.wo\\.weight read by");
        QVERIFY2(fixed.out.count(ffn) == 4, qPrintable(describe(fixed))); // 2 layers x 2 stacks
        QVERIFY2(fixed.out.contains("4 problems found"), qPrintable(describe(fixed)));
        QVERIFY2(fixed.out.contains("batch: 1 per rank (--micro-batch; the first forward's input: "
                                    "1 rows), gradient accumulation 1, train_batch_size 2 at 2 ranks"),
                 qPrintable(describe(fixed)));
    }

    // weight_norm in a nested constructor (Model -> Encoder -> PositionalConv) reads the
    // partitioned weight while the model is built: the record names the modules under
    // construction and the constructor's line, and once the model exists its fix names the
    // final dotted path. The fix (GatheredParameters around weight_norm) is clean.
    void buildTimeNamesInANestedConstructor()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const QString s = script("nested_weight_norm.py");
        const Run broken = run({"--snapshot", d + "/nested.json", s}, d);
        QVERIFY2(broken.exitCode == 1, qPrintable(describe(broken)));
        const int line = lineOf(s, "weight_norm(self.conv, name=\"weight\", dim=None)");
        QVERIFY(line > 0);
        const json snap = readJson(d + "/nested.json");
        QVERIFY(snap.is_object());
        QVERIFY(!snap["violations"].empty());
        for (const json &v : snap["violations"]) {
            QCOMPARE(v["kind"].get<std::string>(), std::string("unregistered_access"));
            QCOMPARE(v["param"].get<std::string>(), std::string("encoder.pos_conv_embed.conv.weight"));
            QCOMPARE(v["location"]["line"].get<int>(), line);
            QCOMPARE(v["location"]["function"].get<std::string>(), std::string("PositionalConv.__init__"));
            const std::string building = v["building"].get<std::string>();
            QVERIFY2(QRegularExpression("^Model \\(nested_weight_norm\\.py:\\d+\\) > \\.encoder Encoder "
                                        "\\(nested_weight_norm\\.py:\\d+\\) > \\.pos_conv_embed "
                                        "PositionalConv \\(nested_weight_norm\\.py:\\d+\\)$")
                         .match(QString::fromStdString(building))
                         .hasMatch(),
                     building.c_str());
            // Completed once the model existed: the final dotted name, a path that exists.
            QCOMPARE(v["fix"].get<std::string>(),
                     std::string("with deepspeed.zero.GatheredParameters(model.encoder.pos_conv_embed."
                                 "conv.weight, modifier_rank=0): <change it here>"));
        }
        QVERIFY2(broken.out.contains("while building: Model"), qPrintable(describe(broken)));
        const Run fixed = run({"--snapshot", d + "/nestedfixed.json", s, "--weight-norm", "fixed"}, d);
        QVERIFY2(fixed.exitCode == 0, qPrintable(describe(fixed)));
    }

    // FSDP2's prediction follows an explicit forward prefetch (tests/check/scripts/
    // fsdp_prefetch.py: blocks[0] prefetches blocks[1] and blocks[2]; blocks[1] keeps its
    // parameters after forward), at 2 ranks, by hand: a block 16x16x4 = 1024 B gathered,
    // the root's head 8x16x4 + 8x4 = 544 B. blocks.0's forward start holds the root, blocks.0
    // and both prefetched: 544 + 3 x 1024 = 3616 B = 3.5 KiB (FSDP2's default, one ahead,
    // would be 2592 B = 2.5 KiB; no later moment holds more: blocks.1 held after forward
    // gives 2592 at blocks.2's start and in backward). Shards, half of each dim 0: head
    // 4x16x4 + 4x4 = 272, blocks 3 x 8x16x4 = 1536: 1808 B = 1.8 KiB. Total 5424 B = 5.3 KiB.
    void fsdpPredictionFollowsExplicitPrefetch()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const Run r = run({"--steps", "1", "--target-world", "2", "--snapshot", d + "/prefetch.json",
                           script("fsdp_prefetch.py")},
                          d);
        QVERIFY2(r.exitCode == 0, qPrintable(describe(r)));
        QVERIFY2(r.out.contains("predicted per-rank parameter memory at 2 ranks: gathered peak 3.5 KiB "
                                "(at `blocks.0` forward), late (whole) 0 B, shards 1.8 KiB; total "
                                "5.3 KiB"),
                 qPrintable(describe(r)));
    }

    // --micro-batch on a JSON config (4 per rank, accumulation 2, train_batch_size 16 at 2
    // ranks) given as args.deepspeed_config and as config=FILE, with DeepSpeed's own data
    // loader: the run takes 1 per rank (the loader's rows follow), train_batch_size 1 x 2 x 2.
    void microBatchOfAJsonConfig()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const QString s = script("json_config_loader.py");
        const QString config = script("ds_config.json");
        const Run own = run({"--steps", "1", "--snapshot", d + "/json.json", s, "--deepspeed_config", config}, d);
        QVERIFY2(own.exitCode == 0, qPrintable(describe(own)));
        QVERIFY2(own.out.contains("batch: 4 per rank (the script's config; the first forward's input: "
                                  "4 rows), gradient accumulation 2, train_batch_size 16 at 2 ranks"),
                 qPrintable(describe(own)));
        for (const char *via : {"--deepspeed_config", "--config"}) {
            const Run small = run({"--steps", "1", "--micro-batch", "1", "--snapshot", d + "/json.json", s,
                                   QString::fromLatin1(via), config},
                                  d);
            QVERIFY2(small.exitCode == 0, qPrintable(describe(small)));
            QVERIFY2(small.out.contains("batch: 1 per rank (--micro-batch; the first forward's input: "
                                        "1 rows), gradient accumulation 2, train_batch_size 4 at 2 ranks"),
                     qPrintable(via + describe(small)));
        }
        // The user's file is not changed.
        QVERIFY(readJson(config)["train_micro_batch_size_per_gpu"] == 4);
    }

    // What it cannot run: exit 2 with what happened.
    void couldNotRun_data()
    {
        QTest::addColumn<QStringList>("args");
        QTest::addColumn<QString>("says");
        QTest::newRow("raises before the model") << QStringList{script("raise_before_model.py")}
                                                 << "failed on rank 0 before the model was built";
        QTest::newRow("sys.exit") << QStringList{script("exits_early.py")}
                                  << "called sys.exit(3) on rank 0 after 0 of 3 steps";
        QTest::newRow("hangs") << QStringList{"--timeout", "8", script("hangs.py")}
                               << "did not finish 3 steps within --timeout 8 s";
        QTest::newRow("no backend") << QStringList{script("no_backend.py")}
                                    << "no supported sharding backend found";
        // shardscope.fsdp exists now (docs/fsdp.md): the FSDP script runs, and ends without a step.
        QTest::newRow("FSDP script without a step") << QStringList{script("uses_fsdp.py")}
                                                    << "the script ended on rank 0 without running an FSDP2 step";
        // An FSDP2 script makes its own batches: --micro-batch would be silently ignored.
        QTest::newRow("--micro-batch on FSDP2")
            << QStringList{"--micro-batch", "1", script("uses_fsdp.py")}
            << "--micro-batch changes a DeepSpeed config, and";
        QTest::newRow("no script") << QStringList{"nothere.py"} << "no script 'nothere.py'";
        QTest::newRow("wrong option") << QStringList{"--steps", "zero", script("hangs.py")}
                                      << "invalid int value: 'zero'";
    }
    void couldNotRun()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QStringList, args);
        QFETCH(QString, says);
        QElapsedTimer t;
        t.start();
        const Run r = run(QStringList{"--snapshot", m_dir.path() + "/bad.json"} + args, m_dir.path());
        QVERIFY2(r.exitCode == 2, qPrintable(describe(r)));
        QVERIFY2(r.err.contains(says), qPrintable(describe(r)));
        QVERIFY2(t.elapsed() < 90000, "bounded by --timeout");
    }
};

QTEST_GUILESS_MAIN(TestCheck)
#include "tst_check.moc"


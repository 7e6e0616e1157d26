// shardscope-check end to end (docs/check.md): the user's unchanged script on two CPU ranks of
// real DeepSpeed ZeRO-3, then the report, the exit status, the snapshot, SARIF and JUnit.

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QProcess>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <QTest>
#include <QThread>

#include <csignal>
#include <set>

#include <signal.h>

#include <nlohmann/json.hpp>

#include "prerequisite.h"
#include "processtree.h"
#include "pythonrun.h"
#include "snapshotquery.h"

using nlohmann::json;

namespace {

using Run = shardscope::test::ProcessRun;
using shardscope::test::lineOf;
using shardscope::test::readJson;

QString python()
{
    return QStringLiteral(SHARDSCOPE_PYTHON_EXE);
}

QString script(const QString &name)
{
    return QStringLiteral(SHARDSCOPE_CHECK_TESTS "/scripts/") + name;
}

// The check's environment: the DeepSpeed release under test first on the path (an older one:
// tst_check-<version>), and no SHARDSCOPE_CHECK of an outer check.
QProcessEnvironment environment()
{
    QProcessEnvironment env =
        shardscope::test::deepSpeedEnvironment(QStringLiteral(SHARDSCOPE_PYTHON_DIR));
    env.remove("SHARDSCOPE_CHECK");
    return env;
}

// `python args` in the check's environment.
Run runPython(const QStringList &args, int timeoutMs = 120000)
{
    shardscope::test::RunOptions options;
    options.environment = environment();
    options.timeoutMs = timeoutMs;
    return shardscope::test::runProcess(python(), args, options);
}

// tests/check/validate_reports.py (real SARIF and JUnit validators) on the reports args name.
Run validateReports(const QStringList &args)
{
    return runPython(QStringList{QStringLiteral(SHARDSCOPE_CHECK_TESTS "/validate_reports.py")} +
                     args);
}

// shardscope-check with args in dir; ended with its ranks when it runs past timeoutMs.
Run run(const QStringList &args, const QString &dir, int timeoutMs = 300000,
        const QProcessEnvironment &extra = {})
{
    shardscope::test::RunOptions options;
    options.environment = environment();
    for (const QString &key : extra.keys())
        options.environment.insert(key, extra.value(key));
    options.workingDirectory = dir;
    options.timeoutMs = timeoutMs;
    options.endTree = true;
    return shardscope::test::runProcess(python(), QStringList{"-m", "shardscope.check"} + args,
                                        options);
}

// A JUnit report's counts: the testsuite's `tests` and `failures` attributes, and how many
// <testcase> and <failure> elements it holds.
struct JUnitCounts
{
    int tests = -1, failures = -1, testcases = 0, failureElements = 0;
};

JUnitCounts junitCounts(const QString &path)
{
    QFile f(path);
    JUnitCounts c;
    if (!f.open(QIODevice::ReadOnly)) return c;
    const QString xml = QString::fromUtf8(f.readAll());
    static const QRegularExpression counts(R"re(<testsuite [^>]*tests="(\d+)" failures="(\d+)")re");
    const auto suite = counts.match(xml);
    if (suite.hasMatch()) {
        c.tests = suite.captured(1).toInt();
        c.failures = suite.captured(2).toInt();
    }
    c.testcases = int(xml.count(QStringLiteral("<testcase ")));
    c.failureElements = int(xml.count(QStringLiteral("<failure ")));
    return c;
}

// The pids of the rank processes (`python -m shardscope._checkboot SCRIPT`) running script,
// found in /proc as a user would find them (they run in sessions of their own).
std::set<qint64> rankPids(const QString &script)
{
    std::set<qint64> pids;
    for (const QString &entry : QDir("/proc").entryList(QDir::Dirs | QDir::NoDotAndDotDot)) {
        bool number = false;
        const qint64 pid = entry.toLongLong(&number);
        if (!number) continue;
        QFile f("/proc/" + entry + "/cmdline");
        if (!f.open(QIODevice::ReadOnly)) continue;
        const QList<QByteArray> argv = f.readAll().split('\0');
        if (argv.contains("shardscope._checkboot") && argv.contains(script.toUtf8()))
            pids.insert(pid);
    }
    return pids;
}

// Whether pid is a process that has not ended (a zombie has ended: its parent has not yet
// collected it).
bool running(qint64 pid)
{
    QFile f(QStringLiteral("/proc/%1/stat").arg(pid));
    if (!f.open(QIODevice::ReadOnly)) return false;
    const QByteArray stat = f.readAll();
    const qsizetype close = stat.lastIndexOf(')');
    return close > 0 && stat.size() > close + 2 && stat[close + 2] != 'Z';
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
        Run probe;
        m_skip = shardscope::test::pythonPrerequisiteMissing(
            python(), QStringLiteral(SHARDSCOPE_PYTHON_DIR), environment(),
            "import torch, deepspeed, jsonschema, xmlschema; print(deepspeed.__version__)",
            "import torch, deepspeed, jsonschema and xmlschema (scripts/deps installs "
            "python/requirements.txt)",
            &probe);
        if (const QString want = qEnvironmentVariable("SHARDSCOPE_DS_VERSION");
            m_skip.isEmpty() && !want.isEmpty() &&
            // the last line: DeepSpeed logs its accelerator first
            probe.out.trimmed().split('\n').last() != want)
            m_skip = "DeepSpeed " + want + " is not installed at " +
                     qEnvironmentVariable("SHARDSCOPE_DS_PATH") + " (scripts/deps)";
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
        const Run read =
            run({"--snapshot", d + "/fsdp-read.json", ex, "--read-outside", "grad"}, d);
        QVERIFY2(read.exitCode == 1, qPrintable(describe(read)));
        QVERIFY2(read.out.contains("unregistered_access: blocks.1.fc1.weight read outside any "
                                   "module (ranks 0,1, step 1) [error]"),
                 qPrintable(describe(read)));
        const int line = lineOf(ex, "# story: fails here");
        QVERIFY(line > 0);
        QVERIFY2(read.out.contains(QStringLiteral("fsdp_stories.py:%1 in main").arg(line)),
                 qPrintable(describe(read)));
        QVERIFY2(read.out.contains("got mixed torch.Tensor and DTensor"),
                 qPrintable(describe(read)));
        const Run late =
            run({"--snapshot", d + "/fsdp-late.json", "--sarif", d + "/fsdp-late.sarif", "--junit",
                 d + "/fsdp-late.xml", ex, "--late"},
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
            QVERIFY2(
                late.out.contains(QStringLiteral("fsdp_stories.py:%1 in LoRA.__init__").arg(l)),
                qPrintable(describe(late)));
        QVERIFY2(
            late.out.contains(QStringLiteral("fsdp_stories.py:%1 in with_lora").arg(addedLine)),
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
            QCOMPARE(r["level"].get<std::string>(), std::string("error")); // each rank its own copy
            sarifLines.insert(
                r["locations"][0]["physicalLocation"]["region"]["startLine"].get<int>());
        }
        QVERIFY(sarifLines == (std::set<int>{aLine, bLine}));
        QFile junit(d + "/fsdp-late.xml");
        QVERIFY(junit.open(QIODevice::ReadOnly));
        const QString junitText = QString::fromUtf8(junit.readAll());
        QVERIFY2(junitText.contains(
                     QStringLiteral("late_parameter head.lora.a.weight in &lt;root&gt; at ")) &&
                     junitText.contains(
                         QStringLiteral("fsdp_stories.py:%1 in LoRA.__init__").arg(aLine)),
                 qPrintable(junitText));
        const Run validate =
            validateReports({"--sarif", d + "/fsdp-late.sarif", "--junit", d + "/fsdp-late.xml"});
        QVERIFY(validate.finished());
        QVERIFY2(validate.exitCode == 0, qPrintable(validate.out));
        // The late adapter is whole on every rank: a (2x16) + b (33x2) float32 = 392 bytes.
        QVERIFY2(
            late.out.contains(QRegularExpression("gathered peak [^\n]*, late \\(whole\\) 392 B, ")),
            qPrintable(describe(late)));
        const Run fixed = run(
            {"--snapshot", d + "/fsdp-fixed.json", "--target-world", "4", ex, "--late", "--fixed"},
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

    // The report's severities and SARIF's levels (no ranks: seconds): problems from a
    // snapshot of this release (its severities) and of an earlier one (none: the one rule's,
    // through the native module), the worst of a problem's ranks standing; error, cost and
    // info are SARIF's error, warning and note, and the file is valid SARIF.
    void sarifLevelsFollowSeverity()
    {
        if (const QString missing =
                shardscope::test::nativeModuleMissing(QStringLiteral(SHARDSCOPE_PYTHON_DIR));
            !missing.isEmpty())
            SHARDSCOPE_SKIP_IF_ALLOWED("python", missing);
        const QString d = m_dir.path();
        const QString code = QStringLiteral(R"(
import json, sys
from shardscope import check
def v(kind, action, rank, line, **more):
    return dict(kind=kind, action=action, rank=rank, step=1, last_step=1, count=1,
                accessor="ff", param="wo.weight", owner="wo", fix="", message="m",
                location={"file": "/t/train.py", "line": line, "function": "f", "chain": []}, **more)
doc = {"violations": [
    v("unregistered_access", "auto_registered", 0, 10, read="attribute", severity="info"),
    v("unregistered_access", "auto_registered", 1, 10, read="attribute", severity="info"),
    v("unregistered_access", "auto_registered", 0, 20, severity="cost"),
    v("unregistered_access", "auto_registered", 1, 20, severity="error"),
    v("unregistered_access", "recorded", 0, 30),
    v("trace_invalidated", "recorded", 0, 40),
    v("unregistered_access", "auto_registered", 0, 50, read="attribute")]}
problems = check.problems_of(doc, [0, 0, 1, 1, 2, 3, 4])
check.write_sarif(sys.argv[1], problems)
print(json.dumps([p["severity"] for p in problems]))
)");
        const Run p = runPython({"-c", code, d + "/levels.sarif"});
        QVERIFY(p.finished());
        QVERIFY2(p.exitCode == 0, qPrintable(p.err));
        const std::string severities = p.out.trimmed().toStdString();
        QVERIFY2(json::parse(severities) == json({"info", "error", "error", "cost", "info"}),
                 severities.c_str());
        const json sarif = readJson(d + "/levels.sarif");
        std::vector<std::string> levels;
        for (const json &r : sarif["runs"][0]["results"])
            levels.push_back(r["level"].get<std::string>());
        QCOMPARE(levels, (std::vector<std::string>{"note", "error", "error", "warning", "note"}));
        const Run validate = validateReports({"--sarif", d + "/levels.sarif"});
        QVERIFY(validate.finished());
        if (!m_skip.isEmpty() && validate.exitCode != 0)
            QSKIP(qPrintable(m_skip)); // jsonschema missing: the levels above still held
        QVERIFY2(validate.exitCode == 0, qPrintable(validate.out));
    }

    void seedModelBrokenThenFixed()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const QString ex = QStringLiteral(SHARDSCOPE_EXAMPLE);
        const Run broken =
            run({"--snapshot", d + "/broken.json", "--sarif", d + "/broken.sarif", "--junit",
                 d + "/broken.xml", ex, "--externals", "none", "--weight-norm", "workaround"},
                d);
        QVERIFY2(broken.exitCode == 1, qPrintable(describe(broken)));
        const int line = lineOf(ex, "return F.linear(x, self.embed.weight)");
        QVERIFY(line > 0);
        QVERIFY2(broken.out.contains("1 problem:"), qPrintable(describe(broken)));
        QVERIFY2(
            broken.out.contains("unregistered_access: embed.weight read by lm_head (ranks 0,1"),
            qPrintable(describe(broken)));
        QVERIFY2(broken.out.contains(
                     QStringLiteral("deepspeed_stories.py:%1 in Head.forward").arg(line)),
                 qPrintable(describe(broken)));
        QVERIFY2(
            broken.out.contains("fix: deepspeed.zero.register_external_parameter(model.lm_head, "
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
        QCOMPARE(sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
                      ["startLine"]
                          .get<int>(),
                 line);
        // The example lies outside the directory the check ran in: an absolute file:// URI.
        QCOMPARE(QString::fromStdString(sarif["runs"][0]["results"][0]["locations"][0]
                                             ["physicalLocation"]["artifactLocation"]["uri"]
                                                 .get<std::string>()),
                 "file://" + ex);
        // DeepSpeed gathers embed.weight for the read (automatic registration): right, but a
        // cost, a SARIF warning; the report says so too.
        QCOMPARE(sarif["runs"][0]["results"][0]["level"].get<std::string>(),
                 std::string("warning"));
        QVERIFY2(broken.out.contains("1 problem found (1 cost)"), qPrintable(describe(broken)));
        // JUnit: one failing case per problem, and the suite's counts say so.
        const JUnitCounts brokenJunit = junitCounts(d + "/broken.xml");
        QCOMPARE(brokenJunit.tests, 1);
        QCOMPARE(brokenJunit.failures, 1);
        QCOMPARE(brokenJunit.testcases, 1);
        QCOMPARE(brokenJunit.failureElements, 1);
        // The report shows the innermost frame and the 2 callers above it (docs/check.md); the
        // snapshot's location keeps more of the chain (up to 4).
        QVERIFY2(broken.out.count(QStringLiteral("\n      from ")) == 2,
                 qPrintable(describe(broken)));
        QVERIFY(snap["violations"][0]["location"]["chain"].size() > 2);

        // --micro-batch 1: DeepSpeed's config says 1 per rank, and the report says the script
        // feeds its own batches of 4 (deepspeed_stories.py makes them), which it cannot change.
        const Run fixed = run({"--snapshot", d + "/fixed.json", "--sarif", d + "/fixed.sarif",
                               "--junit", d + "/fixed.xml", "--micro-batch", "1", ex, "--externals",
                               "manual", "--weight-norm", "workaround"},
                              d);
        QVERIFY2(fixed.exitCode == 0, qPrintable(describe(fixed)));
        QVERIFY2(
            fixed.out.contains("batch: 1 per rank (--micro-batch; the first forward's input: 4 "
                               "rows), gradient accumulation 1, train_batch_size 2 at 2 ranks; "
                               "the script makes its own batches, which --micro-batch does not "
                               "change"),
            qPrintable(describe(fixed)));
        QVERIFY2(fixed.out.contains("no problems found"), qPrintable(describe(fixed)));
        QVERIFY2(fixed.out.contains("late parameters (2)"), qPrintable(describe(fixed)));
        // weight_norm's weight_g/weight_v (adopted by deepspeed.initialize: listed, no problem)
        // at the script's line that applied weight_norm.
        const int wnLine =
            lineOf(ex,
                   "with deepspeed.zero.GatheredParameters(self.conv.weight, modifier_rank=0):") +
            1;
        QVERIFY(wnLine > 1);
        for (const char *p : {"weight_g", "weight_v"})
            QVERIFY2(fixed.out.contains(
                         QStringLiteral("pos_conv.conv.%1 (replaces pos_conv.conv.weight) at "
                                        "%2:%3 in PositionalConv.__init__")
                             .arg(QString::fromLatin1(p), ex)
                             .arg(wnLine)),
                     qPrintable(describe(fixed)));
        QVERIFY(readJson(d + "/fixed.json")["violations"].empty());
        const JUnitCounts fixedJunit = junitCounts(d + "/fixed.xml");
        QCOMPARE(fixedJunit.tests, 1); // the one passing case "no sharding problems"
        QCOMPARE(fixedJunit.failures, 0);
        QCOMPARE(fixedJunit.testcases, 1);
        QCOMPARE(fixedJunit.failureElements, 0);
        QVERIFY(readJson(d + "/fixed.sarif")["runs"][0]["results"].empty());

        // Real validators, against the vendored schemas.
        const Run v =
            validateReports({"--sarif", d + "/broken.sarif", "--sarif", d + "/fixed.sarif",
                             "--junit", d + "/broken.xml", "--junit", d + "/fixed.xml"});
        QVERIFY(v.finished());
        QVERIFY2(v.exitCode == 0, qPrintable(v.out));
        // ... which do reject what is not SARIF or JUnit.
        QFile bad(d + "/bad.sarif");
        QVERIFY(bad.open(QIODevice::WriteOnly));
        bad.write(R"({"version": "2.1.0", "runs": [{"tool": {"driver": {}}}]})");
        bad.close();
        QFile badXml(d + "/bad.xml");
        QVERIFY(badXml.open(QIODevice::WriteOnly));
        badXml.write("<testsuites><testsuite name=\"x\"><testcase/></testsuite></testsuites>");
        badXml.close();
        const Run invalid =
            validateReports({"--sarif", d + "/bad.sarif", "--junit", d + "/bad.xml"});
        QVERIFY(invalid.finished());
        const QString rejected = invalid.out;
        QCOMPARE(invalid.exitCode, 1);
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
            {"main",
             lineOf(ex, "logits = engine.module(ids) if args.call_module else engine(ids)")},
            // issue 51's hang: the extra forward's gather, inside the model, from diverge()
            {"TinyLM.forward", lineOf(ex, "x = self.embed(ids)")},
            {"diverge",
             lineOf(ex, "engine(torch.randint(0, vocab, (4, 8), generator=g).to(device))")},
            {"PositionalConv.__init__",
             lineOf(ex, "with deepspeed.zero.GatheredParameters(self.conv.weight, "
                        "modifier_rank=0):") +
                 1}};
        static const QRegularExpression at(R"(deepspeed_stories\.py:(\d+) in ([\w.]+))");
        int seen = 0;
        for (const QString &doc : {QStringLiteral("docs/check.md"), QStringLiteral("README.md")}) {
            QFile f(root + "/" + doc);
            QVERIFY2(f.open(QIODevice::ReadOnly), qPrintable(f.fileName()));
            const QString text = QString::fromUtf8(f.readAll());
            for (auto m = at.globalMatch(text); m.hasNext();) {
                const auto hit = m.next();
                const QString function = hit.captured(2);
                QVERIFY2(lines.contains(function), qPrintable(doc + ": " + hit.captured(0) +
                                                              ": not a function this test knows"));
                QVERIFY2(hit.captured(1).toInt() == lines[function],
                         qPrintable(QString("%1 shows %2; the example has it at line %3")
                                        .arg(doc, hit.captured(0))
                                        .arg(lines[function])));
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
        QVERIFY2(broken.out.contains(
                     QRegularExpression("unregistered_access: shared.weight read by <root> "
                                        "\\(ranks 0,1, steps? [^)]*\\) \\[cost\\]")),
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
        const Run fixed =
            run({"--snapshot", d + "/t5fixed.json", "--sarif", d + "/t5fixed.sarif", "--junit",
                 d + "/t5fixed.xml", "--micro-batch", "1", ex, "--case", "t5-forward", "--fixed"},
                d);
        QVERIFY2(fixed.exitCode == 1, qPrintable(describe(fixed)));
        QVERIFY2(!fixed.out.contains("shared.weight read"), qPrintable(describe(fixed)));
        // Those reads touch no values (self.wo.weight.dtype): information, a SARIF note, never
        // the error a crash is (issue 49, item 10).
        const QRegularExpression ffn(
            "\\d+\\. unregistered_access: (encoder|decoder)\\.block\\.\\d\\."
            "layer\\.\\d\\.DenseReluDense\\.wo\\.weight read by [^\n]* \\[info\\]");
        QVERIFY2(fixed.out.count(ffn) == 4, qPrintable(describe(fixed))); // 2 layers x 2 stacks
        QVERIFY2(fixed.out.contains("4 problems found (4 info)"), qPrintable(describe(fixed)));
        // Each of the 4 problems is a JUnit failure, and a SARIF result of level note (info).
        const JUnitCounts junit = junitCounts(d + "/t5fixed.xml");
        QCOMPARE(junit.tests, 4);
        QCOMPARE(junit.failures, 4);
        QCOMPARE(junit.testcases, 4);
        QCOMPARE(junit.failureElements, 4);
        const json t5Sarif = readJson(d + "/t5fixed.sarif");
        QCOMPARE(t5Sarif["runs"][0]["results"].size(), std::size_t(4));
        for (const json &r : t5Sarif["runs"][0]["results"])
            QCOMPARE(r["level"].get<std::string>(), std::string("note"));
        QVERIFY2(
            fixed.out.contains("batch: 1 per rank (--micro-batch; the first forward's input: "
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
            QCOMPARE(v["param"].get<std::string>(),
                     std::string("encoder.pos_conv_embed.conv.weight"));
            QCOMPARE(v["location"]["line"].get<int>(), line);
            QCOMPARE(v["location"]["function"].get<std::string>(),
                     std::string("PositionalConv.__init__"));
            const std::string building = v["building"].get<std::string>();
            QVERIFY2(
                QRegularExpression("^Model \\(nested_weight_norm\\.py:\\d+\\) > \\.encoder Encoder "
                                   "\\(nested_weight_norm\\.py:\\d+\\) > \\.pos_conv_embed "
                                   "PositionalConv \\(nested_weight_norm\\.py:\\d+\\)$")
                    .match(QString::fromStdString(building))
                    .hasMatch(),
                building.c_str());
            // Completed once the model existed: the final dotted name, a path that exists.
            QCOMPARE(
                v["fix"].get<std::string>(),
                std::string("with deepspeed.zero.GatheredParameters(model.encoder.pos_conv_embed."
                            "conv.weight, modifier_rank=0): <change it here>"));
        }
        QVERIFY2(broken.out.contains("while building: Model"), qPrintable(describe(broken)));
        const Run fixed =
            run({"--snapshot", d + "/nestedfixed.json", s, "--weight-norm", "fixed"}, d);
        QVERIFY2(fixed.exitCode == 0, qPrintable(describe(fixed)));
    }

    // FSDP2's prediction at 2 ranks of a script's run, against a count by hand (a row: the
    // file in tests/check/scripts and the line the report must print).
    //
    // "explicit prefetch": it follows an explicit forward prefetch (fsdp_prefetch.py:
    // blocks[0] prefetches blocks[1] and blocks[2]; blocks[1] keeps its parameters after
    // forward). A block 16x16x4 = 1024 B gathered, the root's head 8x16x4 + 8x4 = 544 B.
    // blocks.0's forward start holds the root, blocks.0 and both prefetched: 544 + 3 x 1024 =
    // 3616 B = 3.5 KiB (FSDP2's default, one ahead, would be 2592 B = 2.5 KiB; no later moment
    // holds more: blocks.1 held after forward gives 2592 at blocks.2's start and in backward).
    // Shards, half of each dim 0: head 4x16x4 + 4x4 = 272, blocks 3 x 8x16x4 = 1536: 1808 B =
    // 1.8 KiB. Total 5424 B = 5.3 KiB.
    //
    // "gradient accumulation": each micro-batch replayed on its own (fsdp_accumulate.py: two
    // micro-batches a step, the first with set_requires_gradient_sync(False); four blocks
    // Linear 16x16 and the root's head Linear 16->8). A block gathered 16x16x4 = 1024 B, the
    // head 8x16x4 + 8x4 = 544 B. Each micro-batch's forward and backward on its own: at
    // blocks.0's forward start the root (not resharded after forward), blocks.0 and blocks.1
    // (prefetched): 544 + 2 x 1024 = 2592 B = 2.5 KiB (the two forwards replayed as one held
    // every block: 4640 B). Shards: head 4x16x4 + 4x4 = 272, blocks 4 x 8x16x4 = 2048: 2320 B
    // = 2.3 KiB; total 4912 B = 4.8 KiB.
    void fsdpPredictionByHand_data()
    {
        QTest::addColumn<QString>("file");
        QTest::addColumn<QString>("predicted");
        QTest::newRow("explicit prefetch")
            << "fsdp_prefetch.py"
            << "predicted per-rank parameter memory at 2 ranks: gathered peak 3.5 KiB (at "
               "`blocks.0` forward), late (whole) 0 B, shards 1.8 KiB; total 5.3 KiB";
        QTest::newRow("gradient accumulation")
            << "fsdp_accumulate.py"
            << "predicted per-rank parameter memory at 2 ranks: gathered peak 2.5 KiB (at "
               "`blocks.0` forward), late (whole) 0 B, shards 2.3 KiB; total 4.8 KiB";
    }

    void fsdpPredictionByHand()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QString, file);
        QFETCH(QString, predicted);
        const QString d = m_dir.path();
        const Run r = run({"--steps", "1", "--target-world", "2", "--snapshot",
                           d + "/" + QFileInfo(file).baseName() + ".json", script(file)},
                          d);
        QVERIFY2(r.exitCode == 0, qPrintable(describe(r)));
        QVERIFY2(r.out.contains(predicted), qPrintable(describe(r)));
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
        const Run own = run(
            {"--steps", "1", "--snapshot", d + "/json.json", s, "--deepspeed_config", config}, d);
        QVERIFY2(own.exitCode == 0, qPrintable(describe(own)));
        QVERIFY2(
            own.out.contains("batch: 4 per rank (the script's config; the first forward's input: "
                             "4 rows), gradient accumulation 2, train_batch_size 16 at 2 ranks"),
            qPrintable(describe(own)));
        for (const char *via : {"--deepspeed_config", "--config"}) {
            const Run small = run({"--steps", "1", "--micro-batch", "1", "--snapshot",
                                   d + "/json.json", s, QString::fromLatin1(via), config},
                                  d);
            QVERIFY2(small.exitCode == 0, qPrintable(describe(small)));
            QVERIFY2(small.out.contains(
                         "batch: 1 per rank (--micro-batch; the first forward's input: "
                         "1 rows), gradient accumulation 2, train_batch_size 4 at 2 ranks"),
                     qPrintable(via + describe(small)));
        }
        // The user's file is not changed.
        QVERIFY(readJson(config)["train_micro_batch_size_per_gpu"] == 4);
    }

    // A model with a tied embedding (ds_tied.py: the head's weight is the embedding's, as in
    // GPT-2) at 4 ranks, by hand, float32, nothing persistent, one prefetch bucket: embed 8x8
    // = 64, fc 8x8 + 8 = 72, the head's weight the embedding's, counted once. Gathered at the
    // root (everything prefetched): 136 x 4 = 544 B, the whole model, not more (counted per
    // module it was 200 x 4 = 800 B). Shards: 64/4 + 64/4 + 8/4 = 34 x 4 = 136 B.
    // The outputs, written where a second user planted symlinks at their names (the default
    // snapshot name included): each symlink is replaced by a regular file, its target untouched.
    void tiedWeightCountedOnceOutputsNotThroughSymlinks()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path() + "/tied";
        QVERIFY(QDir().mkpath(d));
        const QStringList names{"shardscope-check.json", "tied.sarif", "tied.xml"};
        for (const QString &name : names) {
            QFile victim(m_dir.path() + "/victim-" + name);
            QVERIFY(victim.open(QIODevice::WriteOnly));
            victim.write("another user's file\n");
            victim.close();
            QVERIFY(QFile::link(victim.fileName(), d + "/" + name));
        }
        const Run r = run({"--steps", "1", "--target-world", "4", "--sarif", "tied.sarif",
                           "--junit", "tied.xml", script("ds_tied.py")},
                          d);
        QVERIFY2(r.exitCode == 0, qPrintable(describe(r)));
        QVERIFY2(
            r.out.contains("predicted per-rank parameter memory at 4 ranks: gathered peak 544 B "
                           "(at `<root>`), persistent 0 B, shards 136 B; total 680 B"),
            qPrintable(describe(r)));
        for (const QString &name : names) {
            QFile victim(m_dir.path() + "/victim-" + name);
            QVERIFY(victim.open(QIODevice::ReadOnly));
            QCOMPARE(victim.readAll(), QByteArray("another user's file\n"));
            const QFileInfo out(d + "/" + name);
            QVERIFY2(!out.isSymLink() && out.isFile(), qPrintable(name));
        }
        QCOMPARE(readJson(d + "/shardscope-check.json")["format"].get<std::string>(),
                 std::string("shardscope-snapshot"));
        QVERIFY(readJson(d + "/tied.sarif")["runs"][0]["results"].empty());
        QCOMPARE(junitCounts(d + "/tied.xml").failures, 0);
    }

    // The two predictions as functions, on records written by hand (the same models as the
    // two runs above): a tie given as one identity in two modules, and two micro-batches.
    void predictionsByHand()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const Run p = runPython({"-c", R"(
from shardscope.check import predict_peak, predict_fsdp_peak
# root, embed (id 1), fc (ids 2, 3), head (its weight is id 1): float32, nothing persistent
order = [["", []], ["embed", [[64, 4, False, 1]]], ["fc", [[64, 4, False, 2], [8, 4, False, 3]]],
         ["head", [[64, 4, False, 1]]]]
p = predict_peak(order, {"prefetch_bucket_size": 10**6}, 4)
print("ds", p["gathered_peak_bytes"], p["shard_bytes"], p["persistent_bytes"])
p = predict_peak(order, {"prefetch_bucket_size": 0}, 4)  # no prefetch: the head gathers only itself
print("ds-no-prefetch", p["gathered_peak_bytes"], p["at_module"])
block = {"params": [[16, 16, 4, 4]], "reshard_after_forward": True, "post_forward_world": None,
         "forward_prefetch": [], "backward_prefetch": []}
root = dict(block, path="", params=[[8, 16, 4, 4], [8, 1, 4, 4]], reshard_after_forward=False)
units = [root] + [dict(block, path=f"blocks.{i}") for i in range(4)]
one = [["pre", 0]] + [e for i in range(1, 5) for e in (["pre", i], ["post", i])] + [["post", 0]]
p = predict_fsdp_peak({"units": units, "passes": [one, one]}, 0, 2)
print("fsdp", p["gathered_peak_bytes"], p["at_module"], p["phase"], p["shard_bytes"])
)"},
                                60000);
        QVERIFY(p.finished());
        const QString out = p.out;
        QVERIFY2(p.exitCode == 0, qPrintable(out + p.err));
        // 136 elements x 4 gathered, 34 x 4 in shards (see tiedWeightCountedOnce...).
        QVERIFY2(out.contains("ds 544 136 0\n"), qPrintable(out));
        // Without prefetch the largest module holds the most: fc, 72 x 4 = 288 B.
        QVERIFY2(out.contains("ds-no-prefetch 288 fc\n"), qPrintable(out));
        QVERIFY2(out.contains("fsdp 2592 blocks.0 forward 2320\n"), qPrintable(out));
    }

    // A ZeRO-3 run that goes through Accelerate, on the check's CPU ranks: the script's own
    // DeepSpeedPlugin (it names no DeepSpeed config and does not import deepspeed), then a
    // script that names nothing, with the Accelerate config `accelerate config` writes
    // (distributed_type DEEPSPEED, gradient accumulation 2) in $HF_HOME, as under
    // `accelerate launch`. Both run as DeepSpeed jobs of 2 ranks.
    void accelerateDeepSpeedIsRecognised()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const Run plugin = run(
            {"--steps", "1", "--snapshot", d + "/plugin.json", script("accelerate_plugin.py")}, d);
        QVERIFY2(plugin.exitCode == 0, qPrintable(describe(plugin)));
        QVERIFY2(plugin.out.contains(
                     "batch: 2 per rank (the script's config; the first forward's input: "
                     "2 rows), gradient accumulation 1, train_batch_size 4 at 2 ranks"),
                 qPrintable(describe(plugin)));
        const QString hf = d + "/hf-home";
        QVERIFY(QDir().mkpath(hf + "/accelerate"));
        QFile::remove(hf + "/accelerate/default_config.yaml");
        QVERIFY(QFile::copy(script("accelerate_deepspeed.yaml"),
                            hf + "/accelerate/default_config.yaml"));
        QProcessEnvironment env;
        env.insert("HF_HOME", hf);
        const Run config =
            run({"--steps", "1", "--snapshot", d + "/config.json", script("accelerate_config.py")},
                d, 300000, env);
        QVERIFY2(config.exitCode == 0, qPrintable(describe(config)));
        QVERIFY2(config.out.contains(
                     "batch: 2 per rank (the script's config; the first forward's input: "
                     "2 rows), gradient accumulation 2, train_batch_size 8 at 2 ranks"),
                 qPrintable(describe(config)));
    }

    // DeepSpeed's backward raised (deepspeed_stories.py --raise-in-backward 2: the loop skips
    // the batch, and the next step fails): the report, SARIF and JUnit carry the
    // backward_unfinished problem at the user's engine.backward line. The script is run by a
    // path below the check's directory: SARIF's URI is that relative path.
    void backwardUnfinishedReported()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path() + "/relative";
        QVERIFY(QDir().mkpath(d));
        const QString ex = QStringLiteral(SHARDSCOPE_EXAMPLE);
        QVERIFY(QFile::link(QFileInfo(ex).absolutePath(), d + "/examples"));
        const Run r = run({"--snapshot", "bu.json", "--sarif", "bu.sarif", "--junit", "bu.xml",
                           "examples/deepspeed_stories.py", "--externals", "manual",
                           "--weight-norm", "workaround", "--raise-in-backward", "2"},
                          d);
        QVERIFY2(r.exitCode == 1, qPrintable(describe(r)));
        const int line = lineOf(ex, "                        engine.backward(loss)");
        QVERIFY(line > 0);
        QVERIFY2(r.out.contains("1. backward_unfinished (ranks 0,1, step 2)"),
                 qPrintable(describe(r)));
        QVERIFY2(
            r.out.contains(QStringLiteral("at examples/deepspeed_stories.py:%1 in main").arg(line)),
            qPrintable(describe(r)));
        QVERIFY2(r.out.contains("out of memory in a user's backward"), qPrintable(describe(r)));
        QVERIFY2(r.out.contains("the script then failed on rank"), qPrintable(describe(r)));
        const json sarif = readJson(d + "/bu.sarif");
        QCOMPARE(sarif["runs"][0]["results"].size(), std::size_t(1));
        const json &result = sarif["runs"][0]["results"][0];
        QCOMPARE(result["ruleId"].get<std::string>(), std::string("backward_unfinished"));
        QCOMPARE(result["level"].get<std::string>(), std::string("error")); // the next step fails
        QCOMPARE(result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                     .get<std::string>(),
                 std::string("examples/deepspeed_stories.py"));
        QCOMPARE(result["locations"][0]["physicalLocation"]["region"]["startLine"].get<int>(),
                 line);
        const JUnitCounts junit = junitCounts(d + "/bu.xml");
        QCOMPARE(junit.tests, 1);
        QCOMPARE(junit.failures, 1);
        QCOMPARE(junit.failureElements, 1);
    }

    // Issue 51: a DeepSpeed script whose rank 0 evaluates one more batch after its last step
    // while rank 1 waits in a barrier (on GPUs: a hang until NCCL's timeout). The check stops
    // the ranks soon after rank 0's watchdog recorded the stall (SHARDSCOPE_STALL_SECONDS=2)
    // and reports it (exit 1), well within --timeout, with the line rank 0 waits at and the
    // lines above it, and the fix; not "did not finish within --timeout" (exit 2).
    void hangReportedWithinTimeout()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path();
        const QString ex = QStringLiteral(SHARDSCOPE_EXAMPLE);
        QProcessEnvironment extra;
        extra.insert("SHARDSCOPE_STALL_SECONDS", "2");
        QElapsedTimer timer;
        timer.start();
        const Run r = run({"--timeout", "120", "--steps", "3", "--snapshot", d + "/hang.json", ex,
                           "--externals", "manual", "--steps", "2", "--diverge", "extra-forward"},
                          d, 300000, extra);
        const qint64 ms = timer.elapsed();
        QVERIFY2(r.exitCode == 1, qPrintable(describe(r)));
        QVERIFY2(ms < 100000, qPrintable(QString("%1 ms").arg(ms)));
        const int forward =
            lineOf(ex, "engine(torch.randint(0, vocab, (4, 8), generator=g).to(device))");
        const int called = lineOf(ex, "diverge(args.diverge, engine, vocab, g, device)");
        QVERIFY(forward > 0 && called > 0);
        QVERIFY2(r.out.contains("rank_stalled") && r.out.contains("(ranks 0, step 3) [error]"),
                 qPrintable(describe(r)));
        QVERIFY2(
            r.out.contains(QStringLiteral("deepspeed_stories.py:%1 in diverge").arg(forward)) &&
                r.out.contains(QStringLiteral("deepspeed_stories.py:%1 in main").arg(called)),
            qPrintable(describe(r)));
        QVERIFY2(r.out.contains("fix: run the extra forward"), qPrintable(describe(r)));
        QVERIFY2(r.out.contains("on GPUs this script would hang until NCCL's timeout"),
                 qPrintable(describe(r)));
        QVERIFY2(!r.err.contains("did not finish"), qPrintable(describe(r)));
        const json snap = readJson(d + "/hang.json");
        int stalled = 0;
        for (const json &v : snap["violations"])
            stalled += v["kind"] == "rank_stalled" && v["rank"] == 0;
        QVERIFY2(stalled >= 1, snap["violations"].dump().c_str());
        qInfo("hangReportedWithinTimeout: %lld ms", ms);
    }

    // Issue 54: a ZeRO-3 script that saves model.state_dict() every 100 steps. The check's
    // steps never reach the save: without --save-check the report says where the script
    // saves and that those saves were not checked (exit 0); with it the saves run once after
    // the last step, into the check's folder (nothing where the script writes), and the
    // placeholders saved are a partitioned_save at the script's line (exit 1), with the number
    // of parameters and the line to use instead; the fixed save beside it (save_16bit_model,
    // through a function of the script) ran and gave nothing.
    void saveCheckRunsTheScriptsSaves()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        const QString d = m_dir.path() + "/saves";
        QVERIFY(QDir().mkpath(d));
        const QString s = script("ds_saves.py");
        const int saveLine =
            lineOf(s, "torch.save(model.state_dict(), f\"checkpoints/step{step}.pt\")");
        const int fixedLine = lineOf(s, "engine.save_16bit_model(directory)");
        const int callLine = lineOf(s, "save_fixed(engine, f\"checkpoints/fixed{step}\")");
        QVERIFY(saveLine > 0 && fixedLine > 0 && callLine > 0);
        const Run plain = run({"--steps", "1", "--snapshot", "plain.json", s}, d);
        QVERIFY2(plain.exitCode == 0, qPrintable(describe(plain)));
        QVERIFY2(plain.out.contains(QString("the script saves at lines %1, %2; a save the 1 step "
                                            "did not reach is not checked: --save-check runs")
                                        .arg(fixedLine)
                                        .arg(saveLine)),
                 qPrintable(describe(plain)));
        const Run r = run({"--steps", "1", "--save-check", "--snapshot", "saves.json", "--sarif",
                           "saves.sarif", s},
                          d);
        QVERIFY2(r.exitCode == 1, qPrintable(describe(r)));
        QVERIFY2(r.out.contains("1. partitioned_save: embed.weight (ranks 0,1, step 1) [error]") &&
                     r.out.contains(QString("at %1:%2 in main").arg(s).arg(saveLine)) &&
                     r.out.contains("model.state_dict() was taken while ZeRO-3 partitions the "
                                    "model: 3 parameters (`embed.weight` first) are placeholders "
                                    "of size 0") &&
                     r.out.contains("fix: engine.save_16bit_model(DIR)"),
                 qPrintable(describe(r)));
        QVERIFY2(r.out.contains(QString("line %1: torch.save(model.state_dict(), "
                                        "f\"checkpoints/step{step}.pt\"): ran")
                                    .arg(saveLine)) &&
                     r.out.contains(QString("line %1 (called at line %2): "
                                            "engine.save_16bit_model(directory): ran")
                                        .arg(fixedLine)
                                        .arg(callLine)),
                 qPrintable(describe(r)));
        QVERIFY2(!QFileInfo::exists(d + "/checkpoints"), "the check wrote where the script saves");
        QVERIFY2(r.out.contains("1 problem found (1 error)"), qPrintable(describe(r)));
        const json sarif = readJson(d + "/saves.sarif");
        QCOMPARE(sarif["runs"][0]["results"].size(), std::size_t(1));
        QCOMPARE(sarif["runs"][0]["results"][0]["ruleId"].get<std::string>(),
                 std::string("partitioned_save"));
    }

    // SIGTERM or Ctrl-C (SIGINT) to the check while the script hangs: the ranks are ended
    // (looked up by pid afterwards), what they recorded is written, and the check exits with
    // 128 + the signal's number.
    void stoppedCheckEndsItsRanks_data()
    {
        QTest::addColumn<int>("sig");
        QTest::addColumn<QString>("name");
        QTest::newRow("SIGTERM") << int(SIGTERM) << "SIGTERM";
        QTest::newRow("SIGINT (Ctrl-C)") << int(SIGINT) << "SIGINT";
    }
    void stoppedCheckEndsItsRanks()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(int, sig);
        QFETCH(QString, name);
        const QString d = m_dir.path();
        // A copy of its own, so that its ranks are told apart from any other check's.
        const QString s = d + "/hangs-" + name + ".py";
        QFile::remove(s);
        QVERIFY(QFile::copy(script("hangs.py"), s));
        const QString snapshot = d + "/stopped-" + name + ".json";
        QProcess p;
        p.setProcessEnvironment(environment());
        p.setWorkingDirectory(d);
        p.start(python(), {"-m", "shardscope.check", "--snapshot", snapshot, s});
        QVERIFY(p.waitForStarted(10000));
        QString err;
        std::set<qint64> pids;
        QElapsedTimer t;
        t.start();
        // Until both ranks run the script (the agent installed): the check's progress says so.
        while (t.elapsed() < 180000 && p.state() == QProcess::Running) {
            p.waitForReadyRead(500);
            err += QString::fromUtf8(p.readAllStandardError());
            if (err.contains("running the script")) break;
        }
        pids = rankPids(s);
        auto cleanup = qScopeGuard([&] {
            for (const qint64 pid : rankPids(s))
                ::kill(pid_t(pid), SIGKILL);
        });
        QVERIFY2(err.contains("running the script"), qPrintable(err));
        QCOMPARE(pids.size(), std::size_t(2));
        ::kill(pid_t(p.processId()), sig);
        QVERIFY2(p.waitForFinished(60000), "the check did not end within 60 s of the signal");
        err += QString::fromUtf8(p.readAllStandardError());
        QVERIFY2(p.exitStatus() == QProcess::NormalExit, qPrintable(err));
        QCOMPARE(p.exitCode(), 128 + sig);
        QVERIFY2(err.contains("stopped by " + name), qPrintable(err));
        QVERIFY2(!err.contains("Traceback"), qPrintable(err));
        // Ended: gone, not re-parented to init. init collects them within moments.
        for (const qint64 pid : pids) {
            QElapsedTimer gone;
            gone.start();
            while (running(pid) && gone.elapsed() < 10000)
                QThread::msleep(100);
            QVERIFY2(!running(pid), qPrintable(QStringLiteral("rank pid %1 still runs").arg(pid)));
        }
        // What they recorded (the agents' snapshots, written at SIGTERM) is kept.
        QCOMPARE(readJson(snapshot)["format"].get<std::string>(),
                 std::string("shardscope-snapshot"));
    }

    // What it cannot run: exit 2 with what happened.
    void couldNotRun_data()
    {
        QTest::addColumn<QStringList>("args");
        QTest::addColumn<QString>("says");
        QTest::addColumn<bool>("beforeRanks"); // refused before any rank starts, no traceback
        QTest::newRow("raises before the model")
            << QStringList{script("raise_before_model.py")}
            << "failed on rank 0 before the model was built" << false;
        // The model exists (initialize takes it): said as a failure of initialize, with its error.
        QTest::newRow("deepspeed.initialize fails")
            << QStringList{script("initialize_fails.py")}
            << "the script built its model, then deepspeed.initialize failed on rank 0:" << false;
        QTest::newRow("sys.exit") << QStringList{script("exits_early.py")}
                                  << "called sys.exit(3) on rank 0 after 0 of 3 steps" << false;
        QTest::newRow("hangs") << QStringList{"--timeout", "8", script("hangs.py")}
                               << "did not finish 3 steps within --timeout 8 s" << false;
        QTest::newRow("no backend") << QStringList{script("no_backend.py")}
                                    << "no supported sharding backend found" << true;
        // shardscope.fsdp exists now (docs/fsdp.md): the FSDP script runs, and ends without a step.
        QTest::newRow("FSDP script without a step")
            << QStringList{script("uses_fsdp.py")}
            << "the script ended on rank 0 without running an FSDP2 step" << false;
        // An FSDP2 script makes its own batches: --micro-batch would be silently ignored.
        QTest::newRow("--micro-batch on FSDP2")
            << QStringList{"--micro-batch", "1", script("uses_fsdp.py")}
            << "--micro-batch changes a DeepSpeed config, and" << true;
        QTest::newRow("no script") << QStringList{"nothere.py"} << "no script 'nothere.py'" << true;
        QTest::newRow("no Accelerate config")
            << QStringList{"--accelerate-config", "nothere.yaml", script("accelerate_config.py")}
            << "cannot read the Accelerate config nothere.yaml: No such file or directory" << true;
        QTest::newRow("wrong option") << QStringList{"--steps", "zero", script("hangs.py")}
                                      << "invalid int value: 'zero' (accepted: 1..1000)" << true;
        // Numbers outside their range, each named with the range (nan and inf would switch the
        // timeout off). The script would be refused too: the number is said first.
        const QString seconds =
            "is not a number of seconds in the accepted range: more than 0, at most 86400";
        for (const char *t : {"nan", "inf", "0", "-5"})
            QTest::newRow(qPrintable(QStringLiteral("--timeout %1").arg(t)))
                << QStringList{QStringLiteral("--timeout=%1").arg(t), script("no_backend.py")}
                << QStringLiteral("argument --timeout: '%1' %2").arg(t, seconds) << true;
        QTest::newRow("--nproc 65")
            << QStringList{"--nproc", "65", script("no_backend.py")}
            << "argument -n/--nproc: 65 is outside the accepted 1..64" << true;
        QTest::newRow("--nproc 0")
            << QStringList{"-n", "0", script("no_backend.py")}
            << "argument -n/--nproc: 0 is outside the accepted 1..64" << true;
        QTest::newRow("--steps 0") << QStringList{"--steps", "0", script("no_backend.py")}
                                   << "argument --steps: 0 is outside the accepted 1..1000" << true;
        QTest::newRow("--target-world 0")
            << QStringList{"--target-world", "0", script("no_backend.py")}
            << "argument --target-world: 0 is outside the accepted 1..1048576" << true;
        // Outputs that cannot be written, found before the ranks start (the script would hang
        // until --timeout): a missing directory, a directory, /proc.
        QTest::newRow("--snapshot in a missing directory")
            << QStringList{"--timeout", "30", "--snapshot", "/nonexistent-shardscope/x.json",
                           script("hangs.py")}
            << "could not run: --snapshot: cannot write /nonexistent-shardscope/x.json: its "
               "directory "
               "/nonexistent-shardscope does not exist"
            << true;
        QTest::newRow("--sarif a directory")
            << QStringList{"--timeout", "30", "--sarif", m_dir.path(), script("hangs.py")}
            << "could not run: --sarif: cannot write " + m_dir.path() + ": it is a directory"
            << true;
        QTest::newRow("--junit in /proc")
            << QStringList{"--timeout", "30", "--junit", "/proc/shardscope-check.xml",
                           script("hangs.py")}
            << "could not run: --junit: cannot write /proc/shardscope-check.xml: cannot create a "
               "file in /proc"
            << true;
    }
    void couldNotRun()
    {
        if (!m_skip.isEmpty()) QSKIP(qPrintable(m_skip));
        QFETCH(QStringList, args);
        QFETCH(QString, says);
        QFETCH(bool, beforeRanks);
        QElapsedTimer t;
        t.start();
        const Run r =
            run(QStringList{"--snapshot", m_dir.path() + "/bad.json"} + args, m_dir.path());
        QVERIFY2(r.exitCode == 2, qPrintable(describe(r)));
        QVERIFY2(r.err.contains(says), qPrintable(describe(r)));
        QVERIFY2(t.elapsed() < 90000, "bounded by --timeout");
        if (beforeRanks) {
            QVERIFY2(!r.err.contains("CPU ranks,"), qPrintable(describe(r))); // no progress line
            QVERIFY2(!r.err.contains("Traceback"), qPrintable(describe(r)));
        }
    }
};

QTEST_GUILESS_MAIN(TestCheck)
#include "tst_check.moc"

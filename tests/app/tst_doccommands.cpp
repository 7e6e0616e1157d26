// Every command line README.md and docs/*.md show for ShardScope's own programs (in shell
// code blocks and in inline code), checked flag by flag against what that program's --help
// lists; a flag named alone in inline code (`--linger`) must be some program's. A doc that
// names a flag no program has fails here, with the file and line.

#include <QtTest>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QMap>
#include <QProcess>
#include <QRegularExpression>
#include <QSet>

#include <algorithm>

#include "processrun.h"

namespace {

// How the docs name a program, and whose --help says which flags it takes.
struct Program
{
    QString program;  // what to run for the help
    QStringList args; // usually --help
    bool launcher;    // its own options end at the first word that is not one: the program
    QString flagsOf;  // "": its own; else the flags are this program's (scripts/demo)
};

// A place in the docs, for messages.
struct Where
{
    QString file;
    int line = 0;
    QString text;
};

class DocChecker
{
  public:
    DocChecker(QString sourceDir, QString binDir, QString ctest)
        : m_source(std::move(sourceDir)), m_bin(std::move(binDir)), m_ctest(std::move(ctest))
    {
        const auto bin = [&](const QString &name) { return QDir(m_bin).filePath(name); };
        const auto script = [&](const QString &name) {
            return QDir(m_source).filePath(QStringLiteral("scripts/") + name);
        };
        const QStringList help{QStringLiteral("--help")};
        m_programs.insert(QStringLiteral("shardscope"),
                          {bin(QStringLiteral("shardscope")), help, false, {}});
        m_programs.insert(QStringLiteral("shardscope-train"),
                          {bin(QStringLiteral("shardscope-train")), help, false, {}});
        m_programs.insert(QStringLiteral("shardscope-capture"),
                          {bin(QStringLiteral("shardscope-capture")), help, false, {}});
        // shardscope-check (the Python package's launcher, built with it): its own options
        // end at the script; what follows is the script's.
        if (QFileInfo::exists(bin(QStringLiteral("shardscope-check"))))
            m_programs.insert(QStringLiteral("shardscope-check"),
                              {bin(QStringLiteral("shardscope-check")), help, true, {}});
        // shardscope-run likewise: its options, then the user's script and the script's own.
        if (QFileInfo::exists(bin(QStringLiteral("shardscope-run"))))
            m_programs.insert(QStringLiteral("shardscope-run"),
                              {bin(QStringLiteral("shardscope-run")), help, true, {}});
        m_programs.insert(QStringLiteral("scripts/launch"),
                          {script(QStringLiteral("launch")), help, true, {}});
        for (const char *name :
             {"bench", "gpu-check", "gpu-bundle", "check-trace-in-chrome", "wheel", "matrix"})
            m_programs.insert(QStringLiteral("scripts/") + QLatin1String(name),
                              {script(QLatin1String(name)), help, false, {}});
        // Options after scripts/demo go to the trainer; after scripts/test, to CTest.
        m_programs.insert(QStringLiteral("scripts/demo"),
                          {{}, {}, false, QStringLiteral("shardscope-train")});
        m_programs.insert(QStringLiteral("scripts/test"), {m_ctest, help, false, {}});
        // Programs that take no flags: any flag a doc gives them is a finding.
        for (const char *name :
             {"deps", "check-trace-for-perfetto", "chrome-trace-check.js", "package"})
            m_programs.insert(QStringLiteral("scripts/") + QLatin1String(name),
                              {{}, {}, false, {}});
    }

    // The name a word of a command line runs ("build/bin/shardscope-train" is
    // shardscope-train), or "" when it is not one of ours.
    QString programOf(QString word) const
    {
        word.remove(QRegularExpression(QStringLiteral("^[\"'(\\[]+|[\"')\\],;:]+$")));
        for (const QString &name :
             {QStringLiteral("shardscope"), QStringLiteral("shardscope-train"),
              QStringLiteral("shardscope-capture"), QStringLiteral("shardscope-check"),
              QStringLiteral("shardscope-run")})
            if (m_programs.contains(name) &&
                (word == name || word.endsWith(QStringLiteral("bin/") + name)))
                return name;
        const qsizetype at = word.indexOf(QLatin1String("scripts/"));
        if (at == 0 || (at > 0 && word[at - 1] == QLatin1Char('/'))) {
            const QString name = word.mid(at);
            if (m_programs.contains(name)) return name;
        }
        return {};
    }

    // Checks one command line; returns the number of flags checked.
    int checkCommandLine(const QString &line, const Where &where)
    {
        const QStringList words =
            line.split(QRegularExpression(QStringLiteral("\\s+")), Qt::SkipEmptyParts);
        static const QRegularExpression flagRe(
            QStringLiteral("^[\\[(\"']*(--?[A-Za-z][A-Za-z0-9-]*)"));
        QString current; // the program the words belong to, "" for someone else's
        bool launcherDone = false;
        int depth = 0; // inside [...] a | is an alternative, outside a pipe
        int checked = 0;
        for (int i = 0; i < words.size(); ++i) {
            const QString &w = words[i];
            if (w.startsWith(QLatin1Char('#'))) break;
            const bool separator =
                (depth == 0 && w == QLatin1String("|")) || w == QLatin1String("||") ||
                w == QLatin1String("&&") || w == QLatin1String(";") || w == QLatin1String("&") ||
                w.startsWith(QLatin1Char('>')) || w.startsWith(QLatin1String("2>"));
            depth += static_cast<int>(w.count(QLatin1Char('['))) -
                     static_cast<int>(w.count(QLatin1Char(']')));
            if (separator) {
                current.clear();
                continue;
            }
            checkScriptIsKnown(w, where);
            if (const QString p = programOf(w); !p.isEmpty()) {
                current = p;
                launcherDone = false;
                continue;
            }
            if (current.isEmpty() || launcherDone) continue;
            const QRegularExpressionMatch m = flagRe.match(w);
            const Program &prog = m_programs[current];
            if (!m.hasMatch()) {
                // A launcher's first word that is not an option (nor an option's value) is
                // the program it starts: what follows is that program's.
                if (prog.launcher) launcherDone = true;
                continue;
            }
            const QString flag = m.captured(1);
            ++checked;
            const QString owner = prog.flagsOf.isEmpty() ? current : prog.flagsOf;
            ++m_checked[current];
            const QSet<QString> known = flagsOf(owner);
            if (!known.contains(flag)) {
                const QString who = owner == current ? current
                                                     : current + QStringLiteral(" (options of ") +
                                                           owner + QLatin1Char(')');
                m_findings << QStringLiteral("%1:%2: %3 has no flag %4 (its --help lists: %5)"
                                             "\n    %6")
                                  .arg(where.file)
                                  .arg(where.line)
                                  .arg(who, flag, sorted(known), where.text.trimmed());
            }
            if (prog.launcher && takesValue(owner, flag) && !w.contains(QLatin1Char('='))) ++i;
        }
        return checked;
    }

    // A word naming scripts/X must name a script that exists and that this test knows how
    // to ask for its flags.
    void checkScriptIsKnown(QString word, const Where &where)
    {
        word.remove(QRegularExpression(QStringLiteral("^[\"'(\\[]+|[\"')\\],;:.]+$")));
        const qsizetype at = word.indexOf(QLatin1String("scripts/"));
        if (at < 0 || (at > 0 && word[at - 1] != QLatin1Char('/'))) return;
        const QString name = word.mid(at);
        if (m_programs.contains(name)) return;
        m_findings << (QFile::exists(QDir(m_source).filePath(name))
                           ? QStringLiteral("%1:%2: %3 is not in tst_doccommands' table of "
                                            "programs: add how to ask it for its flags")
                           : QStringLiteral("%1:%2: %3 does not exist"))
                          .arg(where.file)
                          .arg(where.line)
                          .arg(name);
    }

    // A flag named alone in inline code must be one of some program's: those the docs name
    // (their --help), or, for programs that cannot be asked here (the benchmarks, the Python
    // examples: built elsewhere, or needing torch), one their source defines.
    void checkBareFlag(const QString &flag, const Where &where)
    {
        ++m_bareFlags;
        for (const QString &name : m_programs.keys())
            if (m_programs[name].flagsOf.isEmpty() && flagsOf(name).contains(flag)) return;
        if (sourceFlags().contains(flag)) return;
        m_findings << QStringLiteral("%1:%2: %3 is no flag of any ShardScope program (none of "
                                     "their --help lists it, no benchmark or example defines it)"
                                     "\n    %4")
                          .arg(where.file)
                          .arg(where.line)
                          .arg(flag, where.text.trimmed());
    }

    // One Markdown document: shell code blocks (fenced without a language, or sh, bash,
    // console, text) line by line, and every inline code span of the prose.
    int checkDocument(const QString &file, const QString &text)
    {
        int checked = 0;
        const QStringList lines = text.split(QLatin1Char('\n'));
        bool inBlock = false;
        bool shellBlock = false;
        QString pending; // a command line continued with a trailing backslash
        int pendingLine = 0;
        QString previous; // the block's last command line, which a "  [--flag ...]" line continues
        int previousLine = 0;
        static const QRegularExpression spanRe(QStringLiteral("`([^`]+)`"));
        static const QRegularExpression bareRe(QStringLiteral("^(--[A-Za-z][A-Za-z0-9-]*)"));
        for (int n = 0; n < lines.size(); ++n) {
            const QString &raw = lines[n];
            if (raw.startsWith(QLatin1String("```"))) {
                if (!previous.isEmpty())
                    checked += checkCommandLine(previous, {file, previousLine, previous});
                previous.clear();
                if (inBlock) {
                    inBlock = false;
                } else {
                    inBlock = true;
                    const QString lang = raw.mid(3).trimmed();
                    shellBlock = lang.isEmpty() || lang == QLatin1String("sh") ||
                                 lang == QLatin1String("bash") ||
                                 lang == QLatin1String("console") || lang == QLatin1String("text");
                    previous.clear();
                }
                continue;
            }
            if (inBlock) {
                if (!shellBlock) continue;
                QString line = raw;
                if (line.startsWith(QLatin1String("$ "))) line = line.mid(2);
                if (pending.isEmpty()) pendingLine = n + 1;
                if (line.endsWith(QLatin1Char('\\'))) {
                    pending += line.left(line.size() - 1) + QLatin1Char(' ');
                    continue;
                }
                line = pending + line;
                pending.clear();
                // A synopsis goes on, indented, with the next bracketed options.
                if (!previous.isEmpty() && line.startsWith(QLatin1Char(' ')) &&
                    line.trimmed().startsWith(QLatin1Char('['))) {
                    previous += QLatin1Char(' ') + line.trimmed();
                    continue;
                }
                if (!previous.isEmpty())
                    checked += checkCommandLine(previous, {file, previousLine, previous});
                previous = line;
                previousLine = pendingLine;
                continue;
            }
            if (!previous.isEmpty()) {
                checked += checkCommandLine(previous, {file, previousLine, previous});
                previous.clear();
            }
            for (auto it = spanRe.globalMatch(raw); it.hasNext();) {
                const QString span = it.next().captured(1);
                const Where where{file, n + 1, span};
                checked += checkCommandLine(span, where);
                if (const auto bare = bareRe.match(span); bare.hasMatch())
                    checkBareFlag(bare.captured(1), where);
            }
        }
        if (!previous.isEmpty())
            checked += checkCommandLine(previous, {file, previousLine, previous});
        return checked;
    }

    const QStringList &findings() const { return m_findings; }
    int bareFlags() const { return m_bareFlags; }
    // The programs whose flags some doc line named, and how many of them.
    const QMap<QString, int> &flagsChecked() const { return m_checked; }

  private:
    QSet<QString> flagsOf(const QString &name)
    {
        if (auto it = m_flags.find(name); it != m_flags.end()) return *it;
        QSet<QString> flags;
        const Program &prog = m_programs[name];
        const QString help = helpOf(name);
        static const QRegularExpression re(
            QStringLiteral("(?<![A-Za-z0-9_/.-])(--?[A-Za-z][A-Za-z0-9-]*)"));
        // Not the flags of an example that runs another program ("scripts/launch -n 4
        // build/bin/shardscope-train --backend gloo" in the launcher's help).
        for (const QString &line : help.split(QLatin1Char('\n'))) {
            const QStringList words =
                line.split(QRegularExpression(QStringLiteral("\\s+")), Qt::SkipEmptyParts);
            if (std::any_of(words.begin(), words.end(), [&](const QString &w) {
                    const QString other = programOf(w);
                    return !other.isEmpty() && other != name;
                }))
                continue;
            for (auto it = re.globalMatch(line); it.hasNext();)
                flags.insert(it.next().captured(1));
        }
        if (prog.program.isEmpty()) flags.clear(); // takes none
        m_flags.insert(name, flags);
        return flags;
    }

    QString helpOf(const QString &name)
    {
        if (auto it = m_help.find(name); it != m_help.end()) return *it;
        const Program &prog = m_programs[name];
        QString out;
        if (!prog.program.isEmpty()) {
            shardscope::test::RunOptions options;
            options.timeoutMs = 30000;
            const shardscope::test::ProcessRun p =
                shardscope::test::runProcess(prog.program, prog.args, options);
            out = p.out + p.err;
            if (p.exitCode != 0 || out.isEmpty())
                m_findings << QStringLiteral("%1 %2 did not answer (exit %3): %4")
                                  .arg(prog.program, prog.args.join(QLatin1Char(' ')))
                                  .arg(p.exitCode)
                                  .arg(out.left(500));
        }
        m_help.insert(name, out);
        return out;
    }

    // For a launcher: FLAG VALUE or FLAG=VALUE in its help, the value in capitals.
    bool takesValue(const QString &name, const QString &flag)
    {
        const QRegularExpression re(QRegularExpression::escape(flag) +
                                    QStringLiteral("[ =]\\[?[A-Z][A-Z0-9_]*\\b"));
        return re.match(helpOf(name)).hasMatch();
    }

    const QSet<QString> &sourceFlags()
    {
        if (m_sourceFlagsRead) return m_sourceFlags;
        m_sourceFlagsRead = true;
        static const QRegularExpression re(QStringLiteral("[\"'](--[a-z][a-z0-9-]*)[\"'=]"));
        for (const QString &dir : {QStringLiteral("bench"), QStringLiteral("python/examples")}) {
            const QDir d(QDir(m_source).filePath(dir));
            for (const QString &f :
                 d.entryList({QStringLiteral("*.cpp"), QStringLiteral("*.py")}, QDir::Files)) {
                QFile file(d.filePath(f));
                if (!file.open(QIODevice::ReadOnly)) continue;
                const QString text = QString::fromUtf8(file.readAll());
                for (auto it = re.globalMatch(text); it.hasNext();)
                    m_sourceFlags.insert(it.next().captured(1));
            }
        }
        return m_sourceFlags;
    }

    static QString sorted(const QSet<QString> &set)
    {
        QStringList list(set.begin(), set.end());
        list.sort();
        return list.isEmpty() ? QStringLiteral("none") : list.join(QLatin1Char(' '));
    }

    QString m_source, m_bin, m_ctest;
    QMap<QString, Program> m_programs;
    QMap<QString, QString> m_help;
    QMap<QString, QSet<QString>> m_flags;
    QMap<QString, int> m_checked;
    QSet<QString> m_sourceFlags;
    bool m_sourceFlagsRead = false;
    QStringList m_findings;
    int m_bareFlags = 0;
};

} // namespace

class TestDocCommands : public QObject
{
    Q_OBJECT
  private slots:
    void initTestCase();
    void everyFlagTheDocsShowExists();
    void aFlagNoProgramHasIsFound();

  private:
    DocChecker checker() const
    {
        return DocChecker(m_source, qEnvironmentVariable("SHARDSCOPE_BIN_DIR"),
                          qEnvironmentVariable("SHARDSCOPE_CTEST"));
    }
    QString m_source;
};

void TestDocCommands::initTestCase()
{
    m_source = qEnvironmentVariable("SHARDSCOPE_SOURCE_DIR");
    QVERIFY2(QFile::exists(QDir(m_source).filePath(QStringLiteral("README.md"))),
             "SHARDSCOPE_SOURCE_DIR does not hold README.md");
    for (const char *name : {"shardscope", "shardscope-train", "shardscope-capture"})
        QVERIFY2(
            QFile::exists(
                QDir(qEnvironmentVariable("SHARDSCOPE_BIN_DIR")).filePath(QLatin1String(name))),
            name);
}

void TestDocCommands::everyFlagTheDocsShowExists()
{
    DocChecker c = checker();
    QStringList files{QStringLiteral("README.md")};
    const QDir docs(QDir(m_source).filePath(QStringLiteral("docs")));
    for (const QString &f : docs.entryList({QStringLiteral("*.md")}, QDir::Files, QDir::Name))
        files << QStringLiteral("docs/") + f;
    int checked = 0;
    for (const QString &f : files) {
        QFile file(QDir(m_source).filePath(f));
        QVERIFY2(file.open(QIODevice::ReadOnly), qPrintable(f));
        checked += c.checkDocument(f, QString::fromUtf8(file.readAll()));
    }
    QVERIFY2(c.findings().isEmpty(), qPrintable(c.findings().join(QLatin1Char('\n'))));
    // Not vacuous: the README's synopsis alone names dozens of flags of each program.
    qInfo("%d flags on command lines and %d named alone, in %lld documents", checked, c.bareFlags(),
          static_cast<long long>(files.size()));
    QVERIFY2(checked >= 80, qPrintable(QString::number(checked)));
    for (const char *name : {"shardscope", "shardscope-train", "shardscope-capture",
                             "scripts/launch", "scripts/bench"})
        QVERIFY2(c.flagsChecked().value(QLatin1String(name)) >= 2,
                 qPrintable(QStringLiteral("no command line of %1 was checked").arg(name)));
}

// The checker itself, on a document that names flags that do not exist (and some that do):
// each wrong one is found, with its line, and a script that does not exist; the right ones
// are not.
void TestDocCommands::aFlagNoProgramHasIsFound()
{
    DocChecker c = checker();
    const QString doc = QStringLiteral(
        "Start it:\n"
        "```\n"
        "scripts/launch -n 2 --run-id demo build/bin/shardscope-train --backend gloo \\\n"
        "    --no-such-flag 3   # a comment --not-checked\n"
        "shardscope-capture --attach job:demo --out run.json | grep --count x\n"
        "shardscope [--attach ENDPOINT [--token T | --token-file F]] [--open FILE | FILE]\n"
        "           [--export-csv FILE] [--bogus-export FILE]\n"
        "```\n"
        "```python\n"
        "shardscope-train --python-blocks-are-not-read\n"
        "```\n"
        "Then `scripts/demo --externals manual --guard nope-flag` or `shardscope-capture --lst`;\n"
        "a job's id is `--job-id NAME` and `--linger` holds the end; `scripts/no-such-script`.\n");
    c.checkDocument(QStringLiteral("synthetic.md"), doc);
    const QString all = c.findings().join(QLatin1Char('\n'));
    QVERIFY2(c.findings().size() == 5, qPrintable(all));
    QVERIFY2(all.contains(QStringLiteral("synthetic.md:3: shardscope-train has no flag "
                                         "--no-such-flag")),
             qPrintable(all));
    QVERIFY2(all.contains(QStringLiteral("synthetic.md:6: shardscope has no flag --bogus-export")),
             qPrintable(all));
    QVERIFY2(all.contains(QStringLiteral("synthetic.md:12: shardscope-capture has no flag --lst")),
             qPrintable(all));
    QVERIFY2(all.contains(QStringLiteral("synthetic.md:13: --job-id is no flag of any")),
             qPrintable(all));
    QVERIFY2(all.contains(QStringLiteral("synthetic.md:13: scripts/no-such-script does not exist")),
             qPrintable(all));
}

QTEST_GUILESS_MAIN(TestDocCommands)
#include "tst_doccommands.moc"

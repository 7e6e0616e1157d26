#include "options.h"

#include "wire/atomicfile.h"
#include "wire/endpoint.h"
#include "wire/token.h"

#include <utility>

namespace shardscope::app {

QString usage()
{
    return QStringLiteral(
        "Usage: shardscope [--attach ENDPOINT [--token T | --token-file F]] [--open FILE | FILE]\n"
        "                  [--export-snapshot FILE] [--export-trace FILE] [--export-csv FILE]\n"
        "                  [--after-step K | --after-seconds S] [--timeout S] [--screenshot FILE] "
        "[--quit]\n"
        "\n"
        "The ShardScope inspector: the sharded state of a training run, live or from a snapshot.\n"
        "\n"
        "  --attach ENDPOINT     attach to a live engine: unix:PATH or tcp:HOST:PORT;\n"
        "                        job:NAME attaches to every live process of a job (one per\n"
        "                        rank under torchrun or scripts/launch) in one window\n"
        "                        (shardscope-capture --list prints each job's job: argument),\n"
        "                        and EP1,EP2,... to the processes of a job at those endpoints.\n"
        "                        An endpoint where no engine answers is refused at once\n"
        "  --token T             the token of an engine started with --token (other local\n"
        "                        users can read it in the process list: prefer --token-file)\n"
        "  --token-file F        read the token from F, a file only you can read (chmod 600);\n"
        "                        without either flag, SHARDSCOPE_TOKEN or the file named by\n"
        "                        SHARDSCOPE_TOKEN_FILE is used\n"
        "  --open FILE, FILE     open a snapshot file (read-only), plain or gzip'd (told apart\n"
        "                        by its first bytes, whatever its name); several files (the\n"
        "                        rank snapshots of one job: shardscope run.rank*.json) open\n"
        "                        as one job, merged as a live job is\n"
        "  --after-step K        with --attach: wait until the run reaches step K\n"
        "  --after-seconds S     wait S seconds after the state arrived (or the file opened)\n"
        "  --timeout S           give up waiting after S seconds (default 120)\n"
        "  --export-snapshot F   write the diagnostic snapshot (docs/snapshot.md) to F\n"
        "  --export-trace F      write a Chrome/Perfetto trace (traceEvents JSON) to F\n"
        "                        (both gzip'd when F ends in .gz, e.g. snapshot.json.gz: about\n"
        "                        a tenth of the size, what to attach to a bug report; Perfetto\n"
        "                        and Chrome's DevTools Performance panel open a trace.json.gz\n"
        "                        as it is)\n"
        "  --export-csv F        write the violations as CSV to F\n"
        "  --screenshot F        grab the main window to the PNG file F\n"
        "  --quit                quit when done (exit 0 on success, 1 on failure)\n"
        "  --help                show this help\n"
        "  --version             print the release and exit\n"
        "\n"
        "Without --attach or --open, the live runs on this machine are offered at once.\n"
        "Run headless (a condition, an export or --quit), the app says on stdout when it holds\n"
        "the first state (\"shardscope: attached to ENDPOINT; the run is at step K\") and\n"
        "each file it wrote.\n"
        "\n"
        "Exit status: 0 done, 1 attach/open/export failed or the condition was not reached,\n"
        "2 bad command line, 3 the engine went away before the condition was met (what was\n"
        "collected until then is exported).\n");
}

ParseResult parseOptions(const QStringList &arguments)
{
    ParseResult r;
    Options &o = r.options;
    auto fail = [&](const QString &message) {
        r.error = message;
        return r;
    };
    for (int i = 1; i < arguments.size(); ++i) {
        QString flag = arguments[i];
        QString inlineValue;
        bool hasInline = false;
        if (flag.startsWith(QLatin1String("--")) && flag.contains(QLatin1Char('='))) {
            inlineValue = flag.mid(flag.indexOf(QLatin1Char('=')) + 1);
            flag = flag.left(flag.indexOf(QLatin1Char('=')));
            hasInline = true;
        }
        auto value = [&](QString &out) {
            if (hasInline) {
                out = inlineValue;
            } else if (i + 1 < arguments.size() &&
                       !arguments[i + 1].startsWith(QLatin1String("--"))) {
                out = arguments[++i];
            } else {
                return false;
            }
            return !out.isEmpty();
        };
        QString v;
        if (flag == QLatin1String("--version")) {
            o.version = true;
            return r;
        }
        if (flag == QLatin1String("--help") || flag == QLatin1String("-h")) {
            o.help = true;
        } else if (flag == QLatin1String("--quit")) {
            o.quit = true;
        } else if (flag == QLatin1String("--attach") || flag == QLatin1String("--token") ||
                   flag == QLatin1String("--token-file") || flag == QLatin1String("--open") ||
                   flag == QLatin1String("--export-snapshot") ||
                   flag == QLatin1String("--export-trace") ||
                   flag == QLatin1String("--export-csv") || flag == QLatin1String("--screenshot")) {
            if (!value(v)) return fail(QStringLiteral("%1 needs a value").arg(flag));
            if (flag == QLatin1String("--attach"))
                o.attach = v;
            else if (flag == QLatin1String("--token"))
                o.token = v;
            else if (flag == QLatin1String("--token-file"))
                o.tokenFile = v;
            else if (flag == QLatin1String("--open"))
                o.open << v;
            else if (flag == QLatin1String("--export-snapshot"))
                o.exportSnapshot = v;
            else if (flag == QLatin1String("--export-trace"))
                o.exportTrace = v;
            else if (flag == QLatin1String("--export-csv"))
                o.exportCsv = v;
            else
                o.screenshot = v;
        } else if (flag == QLatin1String("--after-step")) {
            bool ok = false;
            if (!value(v)) return fail(QStringLiteral("--after-step needs a step number"));
            const uint k = v.toUInt(&ok);
            if (!ok)
                return fail(
                    QStringLiteral("--after-step needs a non-negative whole number, not `%1`")
                        .arg(v));
            o.afterStep = k;
        } else if (flag == QLatin1String("--after-seconds") || flag == QLatin1String("--timeout")) {
            bool ok = false;
            if (!value(v)) return fail(QStringLiteral("%1 needs a number of seconds").arg(flag));
            const double s = v.toDouble(&ok);
            if (!ok || s < 0 || s > 1e6)
                return fail(QStringLiteral("%1 needs a number of seconds, not `%2`").arg(flag, v));
            if (flag == QLatin1String("--timeout"))
                o.timeoutSeconds = s;
            else
                o.afterSeconds = s;
        } else if (!flag.startsWith(QLatin1Char('-'))) {
            o.open << arguments[i]; // `shardscope FILE`, as the desktop file starts it
        } else {
            return fail(QStringLiteral("unknown option `%1`").arg(arguments[i]));
        }
    }
    if (o.help) return r;
    if (!o.attach.isEmpty() && !o.open.isEmpty())
        return fail(
            QStringLiteral("--attach and --open exclude each other: inspect a live run or a file"));
    if (o.afterStep && o.afterSeconds)
        return fail(QStringLiteral("--after-step and --after-seconds exclude each other"));
    if (o.afterStep && o.attach.isEmpty())
        return fail(
            QStringLiteral("--after-step needs --attach: a snapshot file does not advance"));
    if ((!o.token.isEmpty() || !o.tokenFile.isEmpty()) && o.attach.isEmpty())
        return fail(QStringLiteral("--token and --token-file need --attach"));
    // The one parser of what to attach to (shardscope-capture's too), in its words.
    if (!o.attach.isEmpty())
        if (auto target = wire::parseAttachTarget(o.attach.toStdString()); !target)
            return fail(QStringLiteral("--attach: %1").arg(QString::fromStdString(target.error())));
    if (!o.attach.isEmpty()) {
        const auto token = wire::resolveToken(o.token.toStdString(), o.tokenFile.toStdString());
        if (!token) return fail(QString::fromStdString(token.error()));
        o.token = QString::fromStdString(*token);
    }
    if ((!o.exportSnapshot.isEmpty() || !o.exportTrace.isEmpty() || !o.exportCsv.isEmpty()) &&
        o.attach.isEmpty() && o.open.isEmpty())
        return fail(QStringLiteral("exports need --attach ENDPOINT or --open FILE"));
    // Refused before attaching, not found once the run is over.
    for (const auto &[flag, file] :
         {std::pair{"--export-snapshot", o.exportSnapshot},
          std::pair{"--export-trace", o.exportTrace}, std::pair{"--export-csv", o.exportCsv}}) {
        if (file.isEmpty()) continue;
        if (auto ok = wire::checkOutputFile(file.toStdString()); !ok)
            return fail(QStringLiteral("%1: %2").arg(QLatin1String(flag),
                                                     QString::fromStdString(ok.error())));
    }
    return r;
}

} // namespace shardscope::app

#pragma once
// The inspector's command line: attach or open, wait for a condition, export, grab a
// screenshot, quit. Parsing never exits; the caller prints the message.

#include <QString>
#include <QStringList>

#include <optional>

namespace shardscope::app {

struct Options
{
    QString attach;
    QString token; // after parseOptions: resolved from --token-file or the environment too
    QString tokenFile;
    // --open FILE or `shardscope FILE...`: several files are one job's rank snapshots
    QStringList open;
    QString exportSnapshot;
    QString exportTrace;
    QString exportCsv;
    QString screenshot;
    std::optional<quint32> afterStep;
    std::optional<double> afterSeconds;
    double timeoutSeconds = 120.0;
    bool quit = false;
    bool help = false;
    bool version = false; // --version: print the release and exit

    bool automated() const
    {
        return !exportSnapshot.isEmpty() || !exportTrace.isEmpty() || !exportCsv.isEmpty() ||
               !screenshot.isEmpty() || quit;
    }
};

struct ParseResult
{
    Options options;
    QString error; // empty when the command line is good
};

ParseResult parseOptions(const QStringList &arguments);
QString usage();

} // namespace shardscope::app

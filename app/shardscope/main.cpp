// shardscope: the inspector. Attach to a live training run or open a snapshot; the
// automation flags make it scriptable (export, screenshot, quit with an exit code).

#include <QApplication>

#include <cstdio>

#include "automation.h"
#include "base/version.h"
#include "mainwindow.h"
#include "options.h"

namespace {

// 0 or 2 when the command line is answered (help, --version, or a bad flag), -1 to go on.
int answerCommandLine(const shardscope::app::ParseResult &parsed)
{
    if (!parsed.error.isEmpty()) {
        std::fprintf(stderr, "shardscope: %s\nRun `shardscope --help` for the options.\n",
                     qPrintable(parsed.error));
        return 2;
    }
    if (parsed.options.version) {
        std::printf("shardscope %s\n", shardscope::kVersion);
        return 0;
    }
    if (parsed.options.help) {
        std::fputs(qPrintable(shardscope::app::usage()), stdout);
        return 0;
    }
    return -1;
}

// Qt's own options (-platform offscreen, -style, ...) start with one dash; ours with two.
bool hasQtOptions(int argc, char **argv)
{
    for (int i = 1; i < argc; ++i)
        if (argv[i][0] == '-' && argv[i][1] != '-' && argv[i][1] != '\0') return true;
    return false;
}

} // namespace

int main(int argc, char **argv)
{
    // --help and a bad flag are answered before Qt looks for a display, so that both work
    // over ssh without one; Qt's own options are only known once QApplication took them out.
    if (!hasQtOptions(argc, argv)) {
        QStringList arguments;
        for (int i = 0; i < argc; ++i)
            arguments << QString::fromLocal8Bit(argv[i]);
        if (const int code = answerCommandLine(shardscope::app::parseOptions(arguments)); code >= 0)
            return code;
    }
    QApplication app(argc, argv);
    QApplication::setApplicationName(QStringLiteral("shardscope"));
    QApplication::setOrganizationName(QStringLiteral("ShardScope"));
    const auto parsed = shardscope::app::parseOptions(QApplication::arguments());
    if (const int code = answerCommandLine(parsed); code >= 0) return code;
    shardscope::app::MainWindow window;
    // Scripted runs (screenshots, exports) keep the default layout; people get theirs back.
    if (!parsed.options.automated()) window.restoreLayout();
    window.show();
    shardscope::app::Automation automation(window, parsed.options);
    QObject::connect(
        &automation, &shardscope::app::Automation::finished, &app,
        [](int code) { QApplication::exit(code); }, Qt::QueuedConnection);
    automation.start();
    return app.exec();
}

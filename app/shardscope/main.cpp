// shardscope: the inspector. Attach to a live training run or open a snapshot; the
// automation flags make it scriptable (export, screenshot, quit with an exit code).

#include <QApplication>

#include <cstdio>

#include "automation.h"
#include "mainwindow.h"
#include "options.h"

int main(int argc, char **argv)
{
    QApplication app(argc, argv);
    QApplication::setApplicationName(QStringLiteral("shardscope"));
    QApplication::setOrganizationName(QStringLiteral("ShardScope"));
    const auto parsed = shardscope::app::parseOptions(QApplication::arguments());
    if (!parsed.error.isEmpty()) {
        std::fprintf(stderr, "shardscope: %s\nRun `shardscope --help` for the options.\n",
                     qPrintable(parsed.error));
        return 2;
    }
    if (parsed.options.help) {
        std::fputs(qPrintable(shardscope::app::usage()), stdout);
        return 0;
    }
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

// A real window under Xvfb: the shardscope app attached to a live shardscope-train run
// grabs its main window; the picture has the window's size and real content.

#include <QFile>
#include <QImage>
#include <QTemporaryDir>
#include <QTest>

#include "runprocess.h"

using namespace shardscope::test;

class TestRealWindow : public QObject
{
    Q_OBJECT
  private slots:
    void screenshotOfLiveRunIsNotBlank();
};

void TestRealWindow::screenshotOfLiveRunIsNotBlank()
{
    QVERIFY2(QFile::exists(binPath(QStringLiteral("shardscope-train"))),
             "shardscope-train not built");
    QVERIFY2(qEnvironmentVariable("QT_QPA_PLATFORM") == QLatin1String("xcb"),
             "this test runs under xvfb-run");
    Trainer trainer({QStringLiteral("--steps"), QStringLiteral("100000")});
    QVERIFY2(!trainer.endpoint().isEmpty(), qPrintable(trainer.output()));
    QTemporaryDir dir;
    const QString png = dir.filePath(QStringLiteral("window.png"));
    const ProcessRun r =
        runApp({QStringLiteral("--attach"), trainer.endpoint(), QStringLiteral("--after-step"),
                QStringLiteral("2"), QStringLiteral("--screenshot"), png,
                QStringLiteral("--timeout"), QStringLiteral("60"), QStringLiteral("--quit")});
    QVERIFY2(r.exitCode == 0, qPrintable(r.err));
    QImage image(png);
    QVERIFY(!image.isNull());
    QVERIFY(image.width() >= 800 && image.height() >= 600);
    QVERIFY2(distinctColours(image) > 50, "the screenshot is blank");
}

QTEST_MAIN(TestRealWindow)
#include "tst_realwindow.moc"

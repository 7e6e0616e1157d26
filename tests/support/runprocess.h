#pragma once
// Runs the project's executables from the tests: the trainer (reading the endpoint it
// announces) and the shardscope app, both found through $SHARDSCOPE_BIN_DIR (processrun.h).

#include <QDir>
#include <QElapsedTimer>
#include <QImage>
#include <QProcess>
#include <QProcessEnvironment>
#include <QRegularExpression>
#include <QSet>
#include <QString>
#include <QTest>

#include "processrun.h"

namespace shardscope::test {

// Runs the shardscope app to its end.
inline ProcessRun runApp(const QStringList &args, int timeoutMs = 90000)
{
    return runBinary(QStringLiteral("shardscope"), args, timeoutMs);
}

// A running shardscope-train serving on a loopback TCP port it picked; killed at scope end.
class Trainer
{
  public:
    explicit Trainer(const QStringList &extra = {},
                     const QString &listen = QStringLiteral("tcp:127.0.0.1:0"))
    {
        m_process.setProcessChannelMode(QProcess::SeparateChannels);
        m_process.start(binPath(QStringLiteral("shardscope-train")),
                        QStringList{QStringLiteral("--externals"), QStringLiteral("none"),
                                    QStringLiteral("--backend"), QStringLiteral("cpu"),
                                    QStringLiteral("--listen"), listen} +
                            extra);
        if (!m_process.waitForStarted(10000)) return;
        static const QRegularExpression re(QStringLiteral("inspector: listening on (\\S+)"));
        QElapsedTimer t;
        t.start();
        while (t.elapsed() < 30000 && m_process.state() == QProcess::Running) {
            m_process.waitForReadyRead(200);
            m_output += QString::fromUtf8(m_process.readAllStandardOutput());
            const auto m = re.match(m_output);
            if (m.hasMatch()) {
                m_endpoint = m.captured(1);
                return;
            }
        }
    }
    ~Trainer()
    {
        if (m_process.state() != QProcess::NotRunning) {
            m_process.kill();
            m_process.waitForFinished(5000);
        }
    }
    QString endpoint() const { return m_endpoint; }
    // Reads the trainer's output until it matches re (true) or timeoutMs pass (false).
    bool waitForOutput(const QRegularExpression &re, int timeoutMs)
    {
        QElapsedTimer t;
        t.start();
        while (t.elapsed() < timeoutMs && m_process.state() == QProcess::Running) {
            m_output += QString::fromUtf8(m_process.readAllStandardOutput());
            if (re.match(m_output).hasMatch()) return true;
            m_process.waitForReadyRead(200);
        }
        return false;
    }
    // SIGKILL, as a crash or the OOM killer would end it.
    void kill()
    {
        m_process.kill();
        m_process.waitForFinished(5000);
    }
    QString output()
    {
        return m_output + QString::fromUtf8(m_process.readAllStandardOutput()) +
               QString::fromUtf8(m_process.readAllStandardError());
    }

  private:
    QProcess m_process;
    QString m_endpoint;
    QString m_output;
};

// Not blank: real content has many colours and is not one flat fill.
inline int distinctColours(const QImage &image)
{
    QSet<QRgb> colours;
    for (int y = 0; y < image.height(); y += 3) {
        for (int x = 0; x < image.width(); x += 3)
            colours.insert(image.pixel(x, y));
    }
    return static_cast<int>(colours.size());
}

} // namespace shardscope::test

#pragma once
// Runs the command line's job: attach or open, wait for the condition (caught up,
// --after-step, --after-seconds), then export and grab the window, and report the exit
// code through finished(). Messages go to stderr (errors) and stdout (the first state held
// when attached, files written).

#include <QElapsedTimer>
#include <QObject>
#include <QTimer>

#include "options.h"

namespace shardscope::app {

class MainWindow;

class Automation : public QObject
{
    Q_OBJECT
  public:
    Automation(MainWindow &window, Options options, QObject *parent = nullptr);
    void start();
    // The exit status when the engine went away before the condition was met: what was
    // collected is still exported (as shardscope-capture does).
    static constexpr int kEndedEarlyExit = 3;

  Q_SIGNALS:
    void finished(int exitCode);

  private:
    void poll();
    void pollJob();
    bool conditionMet() const;
    // Why no endpoint of an --attach argument answers (wire::checkReachable's words, one line
    // per endpoint), or empty when one does or it names a job.
    static QString unreachable(const QString &attach);
    // Once, when attached and the first state is held: starts --after-seconds' clock and
    // says so on stdout ("shardscope: attached to ENDPOINT; the run is at step K").
    void noteFirstState();
    void proceed();
    void runOutputs();
    void fail(const QString &message);

    MainWindow &m_window;
    Options m_options;
    QTimer m_poll;
    QElapsedTimer m_started;
    QElapsedTimer m_sinceState;
    bool m_done = false;
    bool m_endedEarly = false;
};

} // namespace shardscope::app

#include "automation.h"

#include <QCoreApplication>

#include <cstdio>

#include "mainwindow.h"
#include "wire/endpoint.h"

namespace shardscope::app {

Automation::Automation(MainWindow &window, Options options, QObject *parent)
    : QObject(parent), m_window(window), m_options(std::move(options))
{
    m_poll.setInterval(50);
    connect(&m_poll, &QTimer::timeout, this, &Automation::poll);
}

void Automation::start()
{
    m_started.start();
    if (!m_options.open.isEmpty()) {
        const QString err = m_window.openSnapshots(m_options.open);
        if (!err.isEmpty()) {
            fail(err);
            return;
        }
        m_sinceState.start();
    } else if (!m_options.attach.isEmpty()) {
        // Run headless, endpoints given by hand where no engine answers are refused at once,
        // by the check and in the words of shardscope-capture (wire::checkReachable), not
        // waited on until --timeout; of several, those that answer are attached and the
        // others named (the job session retries them). A window someone watches keeps
        // retrying: the engine may be started next.
        if (const QString err = m_options.automated() ? unreachable(m_options.attach) : QString();
            !err.isEmpty()) {
            fail(err);
            return;
        }
        const QString err = m_window.attach(m_options.attach, m_options.token);
        if (!err.isEmpty()) {
            fail(err);
            return;
        }
    } else if (!m_options.automated()) {
        m_window.offerLiveRuns(); // first contact: the live runs, not an empty window
    }
    if (!m_options.automated()) return;
    m_poll.start();
}

QString Automation::unreachable(const QString &attach)
{
    const auto target = wire::parseAttachTarget(attach.toStdString());
    if (!target) return QString::fromStdString(target.error());
    QStringList errors;
    for (const std::string &endpoint : target->endpoints) {
        const wire::Status reached = wire::checkReachable(endpoint);
        if (reached) return {};
        errors << QString::fromStdString(reached.error());
    }
    if (target->endpoints.size() > 1)
        errors << QStringLiteral("no process of job %1 could be attached").arg(attach.trimmed());
    return errors.join(QLatin1Char('\n'));
}

bool Automation::conditionMet() const
{
    session::SessionStore *store = m_window.store();
    if (!m_options.open.isEmpty()) {
        return !m_options.afterSeconds ||
               m_sinceState.elapsed() >= static_cast<qint64>(*m_options.afterSeconds * 1000);
    }
    if (m_options.attach.isEmpty()) return true;
    if (m_window.attachedToJob()) {
        const session::JobSession *job = m_window.jobSession();
        if (!store->hasState() || !(job->caughtUp() || job->allDone())) return false;
    } else {
        session::Connection *c = m_window.connection();
        const bool finished = c->state() == session::Connection::State::Finished;
        if (!store->hasState() || !(c->caughtUp() || finished)) return false;
    }
    if (m_options.afterStep) return store->completedStep() >= *m_options.afterStep;
    if (m_options.afterSeconds)
        return m_sinceState.isValid() &&
               m_sinceState.elapsed() >= static_cast<qint64>(*m_options.afterSeconds * 1000);
    return true;
}

void Automation::poll()
{
    if (m_done) return;
    session::Connection *c = m_window.connection();
    session::SessionStore *store = m_window.store();
    if (!m_options.attach.isEmpty() && m_window.attachedToJob()) {
        pollJob();
        return;
    }
    if (!m_options.attach.isEmpty()) {
        noteFirstState();
        if (c->state() == session::Connection::State::Failed) {
            fail(c->message());
            return;
        }
    }
    if (conditionMet()) {
        proceed();
        return;
    }
    const QString condition = m_options.afterStep
                                  ? QStringLiteral("--after-step %1").arg(*m_options.afterStep)
                                  : QStringLiteral("--after-seconds");
    if (!m_options.attach.isEmpty() && c->state() == session::Connection::State::Finished) {
        fail(QStringLiteral("the run finished at step %1 before the condition was met (%2)")
                 .arg(store->completedStep())
                 .arg(condition));
        return;
    }
    // The engine went away (killed, crashed) before the condition: like shardscope-capture,
    // write what was collected, say so, and exit with a status of its own.
    if (!m_options.attach.isEmpty() && c->state() == session::Connection::State::Lost &&
        store->hasState()) {
        m_endedEarly = true;
        std::fprintf(stderr,
                     "shardscope: the run ended early: the connection to the engine was lost at "
                     "step %u, before %s (%s); writing what was collected so far\n",
                     store->completedStep(), qPrintable(condition), qPrintable(c->message()));
        std::fflush(stderr);
        proceed();
        return;
    }
    if (m_started.elapsed() > static_cast<qint64>(m_options.timeoutSeconds * 1000)) {
        QString why = QStringLiteral("gave up after %1 s").arg(m_options.timeoutSeconds);
        if (!m_options.attach.isEmpty())
            why += QStringLiteral(": %1 (step %2)").arg(c->message()).arg(store->completedStep());
        fail(why + QStringLiteral("; raise --timeout or check the endpoint"));
    }
}

// A job: done when the condition is met; a job whose every process ended (finished, lost,
// failed) writes what it has, as a lost single engine does.
void Automation::pollJob()
{
    const session::JobSession *job = m_window.jobSession();
    session::SessionStore *store = m_window.store();
    noteFirstState();
    if (conditionMet()) {
        proceed();
        return;
    }
    if (job->allDone()) {
        if (!store->hasState()) {
            fail(job->summary());
            return;
        }
        m_endedEarly = true;
        std::fprintf(stderr,
                     "shardscope: the job ended at step %u before the condition was met (%s); "
                     "writing what was collected so far\n",
                     store->completedStep(), qPrintable(job->summary()));
        std::fflush(stderr);
        proceed();
        return;
    }
    // A process stopped (SIGSTOP) or hung, mid-run or before its model was built: waiting
    // on would end in the timeout with nothing written. Like a lost engine: write what was
    // collected, name it, exit with the status of a run that ended early.
    if (const QStringList silent = job->notAnswering(); !silent.isEmpty() && store->hasState()) {
        m_endedEarly = true;
        std::fprintf(stderr,
                     "shardscope: the job is incomplete at step %u: %s (stopped or hung) before "
                     "the condition was met; writing what was collected so far\n",
                     store->completedStep(), qPrintable(silent.join(QStringLiteral("; "))));
        std::fflush(stderr);
        proceed();
        return;
    }
    if (m_started.elapsed() > static_cast<qint64>(m_options.timeoutSeconds * 1000))
        fail(QStringLiteral("gave up after %1 s: %2 (step %3); raise --timeout or check the job")
                 .arg(m_options.timeoutSeconds)
                 .arg(job->summary())
                 .arg(store->completedStep()));
}

void Automation::noteFirstState()
{
    const session::SessionStore *store = m_window.store();
    if (m_sinceState.isValid() || !store->hasState()) return;
    m_sinceState.start();
    std::printf("shardscope: attached to %s; the run is at step %u\n", qPrintable(m_options.attach),
                store->step());
    std::fflush(stdout);
}

void Automation::proceed()
{
    m_poll.stop();
    m_done = true;
    m_window.store()->flush();
    // Let the views take the last update and paint before exporting and grabbing.
    QTimer::singleShot(400, this, &Automation::runOutputs);
}

void Automation::runOutputs()
{
    m_window.store()->flush();
    QCoreApplication::processEvents();
    struct Job
    {
        const QString &path;
        QString (MainWindow::*fn)(const QString &);
        const char *what;
    };
    const Job jobs[] = {{m_options.exportSnapshot, &MainWindow::exportSnapshot, "snapshot"},
                        {m_options.exportTrace, &MainWindow::exportTrace, "trace"},
                        {m_options.exportCsv, &MainWindow::exportCsv, "violations CSV"},
                        {m_options.screenshot, &MainWindow::saveScreenshot, "screenshot"}};
    for (const Job &job : jobs) {
        if (job.path.isEmpty()) continue;
        const QString err = (m_window.*job.fn)(job.path);
        if (!err.isEmpty()) {
            m_done = false;
            fail(err);
            return;
        }
        std::printf("shardscope: wrote %s %s\n", job.what, qPrintable(job.path));
    }
    std::fflush(stdout);
    if (m_options.quit) Q_EMIT finished(m_endedEarly ? kEndedEarlyExit : 0);
}

void Automation::fail(const QString &message)
{
    m_poll.stop();
    if (m_done) return;
    m_done = true;
    for (const QString &line : message.split(QLatin1Char('\n')))
        std::fprintf(stderr, "shardscope: %s\n", qPrintable(line));
    std::fflush(stderr);
    if (m_options.automated()) Q_EMIT finished(1);
}

} // namespace shardscope::app

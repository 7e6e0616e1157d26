#pragma once
// One session of a whole training job: a Connection per rank process, all feeding one
// SessionStore as its sources (their states merged onto global ranks), each process's
// timestamps mapped onto the first process's timeline (on one host the clock is shared;
// across hosts the offset is estimated from round trips at attach). A process that is
// unreachable, lost or silent is said so, by rank; the others go on and nothing received
// is dropped. A single endpoint is a session of one plain Connection.

#include <QElapsedTimer>
#include <QObject>
#include <QString>
#include <QStringList>
#include <QTimer>

#include <memory>
#include <vector>

#include "client/livejobs.h"
#include "session/connection.h"
#include "session/sessionstore.h"
#include "wire/clocksync.h"
#include "wire/discovery.h"

namespace shardscope::session {

// What to attach to: the endpoint, and (from discovery, when known) the ranks it serves.
struct JobTarget
{
    QString endpoint;
    std::vector<int> ranks;
    // The discovery file's entry (pid 0 when given by hand): the process that answers must
    // be the one it announces (wire::checkAnswered).
    wire::DiscoveryEntry announced;
};

class JobSession : public QObject
{
    Q_OBJECT
  public:
    enum class Health
    {
        Connecting,  // not yet welcomed
        Live,        // welcomed, data or heartbeats arriving
        Silent,      // welcomed, but nothing for the silence timeout (stopped, hung)
        Lost,        // the connection closed without a goodbye (killed, crashed)
        Unreachable, // never reached since attach
        Finished,    // said goodbye
        Failed       // refused, or not part of this job
    };

    explicit JobSession(SessionStore *store, QObject *parent = nullptr);
    ~JobSession() override;

    // "job:NAME" (every live process of the job in the discovery directory), or one or more
    // endpoints separated by commas. Fills targets or returns what is wrong.
    // The live engines of a discovery directory (empty: the default runtime directory),
    // grouped by job (client::liveJobs): what the attach dialog lists and job:NAME resolves.
    static std::vector<client::LiveJob> liveJobs(const QString &discoveryDir = {});
    // The directory discoveryDir names: itself, or the default runtime directory if empty.
    static std::string discoveryDirOf(const QString &discoveryDir);
    static QString resolve(const QString &spec, std::vector<JobTarget> &targets, QString &jobName,
                           const QString &discoveryDir = {});

    void attach(const std::vector<JobTarget> &targets, const QString &token,
                const QString &jobName = {});
    void attach(const QString &endpoint, const QString &token); // one process
    void detach();
    void setReconnectIntervalMs(int ms);
    // A connected process that sent nothing (not even a heartbeat: servers send one every
    // second) for this long is shown as not answering. Default 5000.
    void setSilenceTimeoutMs(int ms) { m_silenceMs = ms; }

    bool isJob() const { return m_job; }
    QString jobName() const { return m_jobName; }
    int processCount() const { return static_cast<int>(m_processes.size()); }
    Connection *connection(int i) const;
    Health health(int i) const;
    // The process's ranks: its Welcome's, else the discovery file's.
    std::vector<int> ranks(int i) const;
    wire::ClockShift clockShift(int i) const;
    // One line about process i: "rank 2 lost: the connection closed at step 37 ..."
    QString processLine(int i) const;
    // "job NAME: 3 of 4 ranks live; rank 2 lost: ..." (one process: its connection's message).
    QString summary() const;
    // Every process line and its clock mapping, one per line, for a tooltip.
    QString details() const;
    bool anyProblem() const;
    // Every process finished, failed or lost: nothing more will come.
    bool allDone() const;
    // Every process answers and its state and history arrived, or it is done (finished,
    // failed, lost, unreachable); a process connecting or not answering is not caught up:
    // its ranks would be missing from what is shown or exported.
    bool caughtUp() const;
    // The processes not answering: silent past the silence timeout (stopped, hung), or
    // still not welcomed that long after attach (stopped before it answered); their lines.
    QStringList notAnswering() const;

  Q_SIGNALS:
    void changed();

  private:
    struct Process
    {
        JobTarget target;
        std::unique_ptr<Connection> connection;
        Health health = Health::Connecting;
        bool everWelcomed = false;
        QString message; // the connection's latest message
        std::uint32_t stepAtLoss = 0;
        wire::ClockShift shift;
        bool shiftSet = false;
        QString host;
    };
    void onWelcomed(int i, const WelcomeInfo &info);
    void onState(int i, Connection::State state, const QString &message);
    void checkSilence();
    std::uint32_t lastStepOf(int i) const;
    QString ranksText(int i) const;
    void setHealth(int i, Health h);

    SessionStore *m_store;
    std::vector<Process> m_processes;
    bool m_job = false;
    QString m_jobName;
    int m_reference = -1; // the process whose timeline the others are mapped onto
    int m_silenceMs = 5000;
    QElapsedTimer m_sinceAttach;
    int m_reconnectMs = 1000;
    QTimer m_watch;
};

} // namespace shardscope::session

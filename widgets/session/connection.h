#pragma once
// Attaches a SessionStore to a live engine: the handshake and decoding run on a worker
// thread (ConnectionWorker); decoded state and event batches are applied to the store
// on the UI thread. A lost connection keeps what was collected and reconnects on its
// own; the store continues the same run's history without duplicates.

#include <QElapsedTimer>
#include <QObject>
#include <QString>
#include <QThread>
#include <QTimer>

#include "session/connectionworker.h"
#include "session/sessionstore.h"

namespace shardscope::session {

class Connection : public QObject
{
    Q_OBJECT
  public:
    enum class State
    {
        Idle,
        Connecting,
        Connected,
        Lost,
        Finished,
        Failed
    };
    Q_ENUM(State)

    explicit Connection(SessionStore *store, QObject *parent = nullptr);
    ~Connection() override;

    void attach(const QString &endpoint, const QString &token = {});
    void detach();
    void setReconnectIntervalMs(int ms) { m_retry.setInterval(ms); }

    // One process of a job (JobSession): states go to the store as source `source` (merged
    // with the job's other processes), and the process's clock is probed before it attaches.
    // Call before attach().
    void setSource(int source, const QString &name);
    int source() const { return m_source; }
    // Timestamps of this process minus shiftNs are on the job's timeline (wire::clockShift);
    // set it when welcomed, before the state and events of the connection arrive.
    void setClockShift(std::int64_t shiftNs) { m_clockShiftNs = shiftNs; }
    std::int64_t clockShift() const { return m_clockShiftNs; }
    bool clockProbed() const { return m_clockProbed; }
    const wire::ClockEstimate &clock() const { return m_clock; }
    QString clockError() const { return m_clockError; }
    // Milliseconds since anything arrived on the current connection (heartbeats included);
    // -1 before the first byte.
    qint64 msSinceData() const { return m_sinceData.isValid() ? m_sinceData.elapsed() : -1; }

    State state() const { return m_state; }
    QString message() const { return m_message; } // the latest state change, in words
    QString endpoint() const { return m_endpoint; }
    const WelcomeInfo &welcome() const { return m_welcome; }
    bool historyReceived() const { return m_historyReceived; }
    // The state and the recent history of the current connection have both arrived.
    bool caughtUp() const { return m_caughtUp; }
    quint64 statesReceived() const { return m_states; }
    quint64 liveEventsReceived() const { return m_liveEvents; }
    int reconnects() const { return m_reconnects; }

  Q_SIGNALS:
    void stateChanged(shardscope::session::Connection::State state, const QString &message);
    // The Welcome arrived (the state and events of the connection follow); receivers on the
    // UI thread can still set the clock shift.
    void welcomed(const shardscope::session::WelcomeInfo &info);

  private:
    void setState(State state, const QString &message);
    void onWelcomed(const WelcomeInfo &info);
    void onState(std::shared_ptr<wire::Snapshot> snapshot);
    void onEvents(std::shared_ptr<const EventBatch> batch);
    void onDropped(quint64 total);
    void onFinished(const QString &reason);
    void onFailed(const QString &message, bool refused);
    void reopen();
    void pushDropped();

    SessionStore *m_store;
    QThread m_thread;
    ConnectionWorker *m_worker = nullptr;
    QTimer m_retry;
    State m_state = State::Idle;
    QString m_message;
    QString m_endpoint;
    QString m_token;
    WelcomeInfo m_welcome;
    bool m_everConnected = false;
    bool m_historyReceived = false;
    bool m_caughtUp = false;
    quint64 m_states = 0;
    quint64 m_liveEvents = 0;
    int m_reconnects = 0;
    quint64 m_engineDropped = 0;
    quint64 m_clientDroppedEarlier = 0; // previous connections of this attach
    quint64 m_clientDroppedNow = 0;
    int m_source = -1; // -1: the store's only engine
    QString m_sourceName;
    std::int64_t m_clockShiftNs = 0;
    bool m_clockProbed = false;
    wire::ClockEstimate m_clock;
    QString m_clockError;
    QElapsedTimer m_sinceData;
};

} // namespace shardscope::session

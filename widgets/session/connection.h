#pragma once
// Attaches a SessionStore to a live engine: the handshake and decoding run on a worker
// thread (ConnectionWorker); decoded state and event batches are applied to the store
// on the UI thread. A lost connection keeps what was collected and reconnects on its
// own; the store continues the same run's history without duplicates.

#include <QObject>
#include <QString>
#include <QThread>
#include <QTimer>

#include "session/connectionworker.h"
#include "session/sessionstore.h"

namespace shardscope {

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
    void stateChanged(shardscope::Connection::State state, const QString &message);

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
};

} // namespace shardscope

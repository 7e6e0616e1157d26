#pragma once
// The network half of a Connection, living on its own thread: owns the socket, does
// the handshake (client::InspectorClient's Hello) and feeds the frames after it to the one
// frame reducer (client::FrameReducer, which shardscope-capture uses too). The worker is
// that reducer's Qt adapter: it batches what the reducer hands it and turns it into queued
// signals for the UI thread. Never touches the store.

#include <QElapsedTimer>
#include <QObject>
#include <QPointer>
#include <QString>
#include <QTimer>

#include <memory>
#include <vector>

#include "client/framereducer.h"
#include "telemetry/event.h"
#include "wire/clocksync.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/snapshot.h"

class QIODevice;

namespace shardscope::session {

struct EventBatch
{
    std::vector<telemetry::Event> events;
    bool history = false;
};

struct WelcomeInfo
{
    QString server;
    qint64 pid = 0;
    QString model;
    int worldSize = 1;
    QString backend;
    QString job;            // the job's id; empty for servers before jobs
    std::vector<int> ranks; // the global ranks the process serves (its Welcome's job)
    QString host;
};

class ConnectionWorker : public QObject, private client::FrameSink
{
    Q_OBJECT
  public:
    ConnectionWorker() = default;
    ~ConnectionWorker() override;

  public Q_SLOTS:
    // probeClock: first estimate the server's clock on a connection of its own (at most
    // about a second, on this thread), reported by clockProbed before anything else.
    void open(const QString &endpoint, const QString &token, bool probeClock = false);
    void close();

  Q_SIGNALS:
    // error: why there is no estimate (an older engine, no answer); empty when there is one.
    void clockProbed(const shardscope::wire::ClockEstimate &estimate, const QString &error);
    // Something arrived (a heartbeat too); at most about twice a second.
    void alive();
    void welcomed(const shardscope::session::WelcomeInfo &info);
    // The one receiver takes the state out of the snapshot instead of copying it.
    void stateReceived(std::shared_ptr<shardscope::wire::Snapshot> snapshot);
    void eventsReceived(std::shared_ptr<const shardscope::session::EventBatch> batch);
    void historyEnded();
    void droppedReported(quint64 totalForThisClient);
    void finished(const QString &reason);
    // refused: the engine (or our own checks) refused: retrying will not help.
    void failed(const QString &message, bool refused);

  private:
    void onConnected();
    void onReadyRead();
    void onDisconnected();
    void onSocketError(const QString &text);
    void flushEvents();
    void fail(const QString &message, bool refused);
    void handleFrame(wire::Frame &frame);
    // client::FrameSink: what the reducer made of a frame.
    void onState(wire::Snapshot &&snapshot) override;
    void onEvents(std::vector<telemetry::Event> &&events, bool history) override;
    void onHistoryBegin() override;
    void onHistoryEnd() override;
    void onDropped(const wire::DroppedNotice &notice) override;
    void onGoodbye(wire::Goodbye &&goodbye) override;

    QIODevice *m_socket = nullptr;
    QString m_token;
    QString m_endpoint;
    wire::FrameDecoder m_decoder;
    client::FrameReducer m_reducer;
    bool m_welcomed = false;
    bool m_done = false;
    std::vector<telemetry::Event> m_pending;
    bool m_pendingHistory = false;
    QTimer m_handshakeTimer{this}; // a child, so it moves to the worker's thread
    QElapsedTimer m_sinceAlive;
};

} // namespace shardscope::session

Q_DECLARE_METATYPE(shardscope::session::WelcomeInfo)
Q_DECLARE_METATYPE(shardscope::wire::ClockEstimate)
Q_DECLARE_METATYPE(std::shared_ptr<shardscope::wire::Snapshot>)
Q_DECLARE_METATYPE(std::shared_ptr<const shardscope::session::EventBatch>)

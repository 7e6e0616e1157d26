#pragma once
// A scripted inspector endpoint for the connection tests: speaks the real protocol with
// the wire's encoders, and can drop a client or send garbage on demand.

#include <QTcpServer>
#include <QTcpSocket>

#include <vector>

#include "telemetry/event.h"
#include "wire/frame.h"
#include "wire/messages.h"
#include "wire/snapshot.h"

namespace shardscope::test {

class FakeEngine : public QObject
{
  public:
    state::EngineState state;
    std::vector<telemetry::Event> history;
    std::string token;
    bool sendGarbage = false;
    int connections = 0;

    FakeEngine()
    {
        m_server.listen(QHostAddress::LocalHost, 0);
        connect(&m_server, &QTcpServer::newConnection, this, [this] {
            while (QTcpSocket *s = m_server.nextPendingConnection()) {
                ++connections;
                m_client = s;
                m_decoder = wire::FrameDecoder();
                connect(s, &QTcpSocket::readyRead, this, [this, s] { onRead(s); });
            }
        });
    }
    QString endpoint() const
    {
        return QStringLiteral("tcp:127.0.0.1:%1").arg(m_server.serverPort());
    }
    bool clientReady() const { return m_client && m_welcomed; }

    void sendLive(const std::vector<telemetry::Event> &events)
    {
        send(wire::MessageType::EventBatch, wire::encodeEvents(events));
    }
    void sendDropped(std::uint64_t since, std::uint64_t total)
    {
        send(wire::MessageType::Dropped, wire::encodeDropped(wire::DroppedNotice{since, total}));
    }
    // Any frame, as it is (a State, a Goodbye, ...).
    void sendFrame(const wire::Frame &frame) { send(frame.type, frame.payload); }
    void dropClient()
    {
        if (m_client) m_client->abort();
        m_client = nullptr;
        m_welcomed = false;
    }
    void stopListening() { m_server.close(); }

  private:
    void send(wire::MessageType type, const std::string &payload)
    {
        if (!m_client) return;
        const std::string f = wire::encodeFrame(type, payload);
        m_client->write(f.data(), static_cast<qint64>(f.size()));
        m_client->flush();
    }
    void onRead(QTcpSocket *s)
    {
        const QByteArray b = s->readAll();
        m_decoder.feed(b.constData(), static_cast<std::size_t>(b.size()));
        auto f = m_decoder.next();
        if (!f || !f->has_value()) return;
        if (sendGarbage) {
            s->write("this is not the ShardScope protocol at all, just text\n");
            return;
        }
        auto hello = wire::decodeHello((*f)->payload);
        if (!hello) return;
        if (auto refusal = wire::checkHello(*hello, token)) {
            send(wire::MessageType::Error, wire::encodeError(*refusal));
            s->flush();
            s->disconnectFromHost();
            return;
        }
        wire::Welcome w;
        w.server = "fake-engine";
        w.pid = 4242;
        w.model = state.modelName;
        w.worldSize = state.worldSize;
        w.backend = state.backend;
        send(wire::MessageType::Welcome, wire::encodeWelcome(w));
        wire::Snapshot snap;
        snap.state = state;
        send(wire::MessageType::State, wire::encodeSnapshot(snap));
        send(wire::MessageType::HistoryBegin, wire::encodeHistoryBegin(history.size()));
        if (!history.empty()) send(wire::MessageType::EventBatch, wire::encodeEvents(history));
        send(wire::MessageType::HistoryEnd, std::string());
        m_welcomed = true;
    }

    QTcpServer m_server;
    QTcpSocket *m_client = nullptr;
    wire::FrameDecoder m_decoder;
    bool m_welcomed = false;
};

} // namespace shardscope::test

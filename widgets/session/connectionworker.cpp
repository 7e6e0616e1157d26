#include "session/connectionworker.h"

#include <QLocalSocket>
#include <QTcpSocket>

#include "client/inspectorclient.h"
#include "wire/endpoint.h"

namespace shardscope::session {

namespace {

constexpr std::size_t kMaxBatchEvents = 1u << 18;

} // namespace

ConnectionWorker::~ConnectionWorker()
{
    close();
}

void ConnectionWorker::open(const QString &endpoint, const QString &token, bool probeClock)
{
    close();
    if (probeClock) {
        auto estimate = client::probeClock(endpoint.trimmed().toStdString());
        if (estimate)
            Q_EMIT clockProbed(*estimate, {});
        else
            Q_EMIT clockProbed({}, QString::fromStdString(estimate.error()));
    }
    m_done = false;
    m_welcomed = false;
    m_reducer = client::FrameReducer();
    m_decoder = wire::FrameDecoder();
    m_pending.clear();
    m_token = token;
    m_endpoint = endpoint.trimmed();

    const auto parsed = wire::parseEndpoint(endpoint.toStdString());
    if (!parsed) {
        fail(QStringLiteral("`%1` is not an endpoint: %2. Use unix:PATH or tcp:HOST:PORT.")
                 .arg(endpoint, QString::fromStdString(parsed.error())),
             true);
        return;
    }
    m_handshakeTimer.setSingleShot(true);
    m_handshakeTimer.setInterval(10000);
    disconnect(&m_handshakeTimer, nullptr, this, nullptr);
    connect(&m_handshakeTimer, &QTimer::timeout, this, [this] {
        fail(QStringLiteral("the engine did not complete the handshake within 10 s"), false);
    });

    if (parsed->kind == wire::Endpoint::Kind::Unix) {
        auto *s = new QLocalSocket(this);
        m_socket = s;
        connect(s, &QLocalSocket::connected, this, &ConnectionWorker::onConnected);
        connect(s, &QLocalSocket::readyRead, this, &ConnectionWorker::onReadyRead);
        connect(s, &QLocalSocket::disconnected, this, &ConnectionWorker::onDisconnected);
        connect(s, &QLocalSocket::errorOccurred, this,
                [this, s] { onSocketError(s->errorString()); });
        s->connectToServer(QString::fromStdString(parsed->path));
    } else {
        auto *s = new QTcpSocket(this);
        m_socket = s;
        s->setReadBufferSize(0);
        connect(s, &QTcpSocket::connected, this, &ConnectionWorker::onConnected);
        connect(s, &QTcpSocket::readyRead, this, &ConnectionWorker::onReadyRead);
        connect(s, &QTcpSocket::disconnected, this, &ConnectionWorker::onDisconnected);
        connect(s, &QTcpSocket::errorOccurred, this,
                [this, s] { onSocketError(s->errorString()); });
        s->connectToHost(QString::fromStdString(parsed->host), parsed->port);
    }
}

void ConnectionWorker::close()
{
    m_handshakeTimer.stop();
    if (!m_socket) return;
    QIODevice *s = m_socket;
    m_socket = nullptr;
    s->disconnect(this);
    if (auto *tcp = qobject_cast<QTcpSocket *>(s))
        tcp->abort();
    else if (auto *local = qobject_cast<QLocalSocket *>(s))
        local->abort();
    s->deleteLater();
}

void ConnectionWorker::onConnected()
{
    if (!m_socket) return;
    client::InspectorClient::Options hello;
    hello.token = m_token.toStdString();
    hello.name = "shardscope";
    const std::string frame = client::InspectorClient::helloFrame(hello);
    m_socket->write(frame.data(), static_cast<qint64>(frame.size()));
    m_handshakeTimer.start();
}

void ConnectionWorker::onReadyRead()
{
    while (m_socket && !m_done) {
        const QByteArray bytes = m_socket->read(1 << 20);
        if (bytes.isEmpty()) break;
        m_decoder.feed(bytes.constData(), static_cast<std::size_t>(bytes.size()));
        if (!m_sinceAlive.isValid() || m_sinceAlive.elapsed() >= 500) {
            m_sinceAlive.start();
            Q_EMIT alive();
        }
        while (m_socket && !m_done) {
            auto next = m_decoder.next();
            if (!next) {
                fail(QStringLiteral("the engine sent data this inspector cannot read (%1); "
                                    "check that both are the same ShardScope version")
                         .arg(QString::fromStdString(next.error())),
                     true);
                return;
            }
            if (!next->has_value()) break;
            handleFrame(**next);
        }
    }
    flushEvents();
}

void ConnectionWorker::handleFrame(wire::Frame &frame)
{
    if (!m_welcomed) {
        auto welcome = wire::acceptWelcome(frame);
        if (!welcome) {
            fail(QString::fromStdString(welcome.error()), true);
            return;
        }
        m_welcomed = true;
        m_handshakeTimer.stop();
        WelcomeInfo info;
        info.server = QString::fromStdString(welcome->server);
        info.pid = welcome->pid;
        info.model = QString::fromStdString(welcome->model);
        info.worldSize = welcome->worldSize;
        info.backend = QString::fromStdString(welcome->backend);
        info.job = QString::fromStdString(welcome->job.id);
        info.ranks = welcome->job.ranks;
        info.host = QString::fromStdString(welcome->job.host);
        Q_EMIT welcomed(info);
        return;
    }
    if (auto applied = m_reducer.apply(frame, *this); !applied) {
        flushEvents();
        fail(QString::fromStdString(applied.error()), m_reducer.lastError().refused);
    }
}

void ConnectionWorker::onState(wire::Snapshot &&snapshot)
{
    flushEvents();
    Q_EMIT stateReceived(std::make_shared<wire::Snapshot>(std::move(snapshot)));
}

void ConnectionWorker::onHistoryBegin()
{
    flushEvents();
}

void ConnectionWorker::onHistoryEnd()
{
    flushEvents();
    Q_EMIT historyEnded();
}

void ConnectionWorker::onEvents(std::vector<telemetry::Event> &&events, bool history)
{
    if (m_pendingHistory != history) flushEvents();
    m_pendingHistory = history;
    if (m_pending.empty())
        m_pending = std::move(events);
    else
        m_pending.insert(m_pending.end(), events.begin(), events.end());
    if (m_pending.size() >= kMaxBatchEvents) flushEvents();
}

void ConnectionWorker::onDropped(const wire::DroppedNotice &notice)
{
    Q_EMIT droppedReported(notice.total);
}

void ConnectionWorker::onGoodbye(wire::Goodbye &&bye)
{
    flushEvents();
    m_done = true;
    Q_EMIT finished(QString::fromStdString(bye.reason));
    close();
}

void ConnectionWorker::flushEvents()
{
    if (m_pending.empty()) return;
    auto batch = std::make_shared<EventBatch>();
    batch->events = std::move(m_pending);
    batch->history = m_pendingHistory;
    m_pending = {};
    Q_EMIT eventsReceived(std::move(batch));
}

void ConnectionWorker::onDisconnected()
{
    if (m_done) return;
    flushEvents();
    fail(QStringLiteral("the connection to the engine was lost"), false);
}

void ConnectionWorker::onSocketError(const QString &text)
{
    if (m_done) return;
    flushEvents();
    if (m_welcomed) {
        fail(QStringLiteral("the connection to the engine was lost (%1)").arg(text), false);
        return;
    }
    // Qt's words for a socket path where nothing listens are "Invalid name": a Unix endpoint
    // gets shardscope-capture's instead, from the same check (a connect, no waiting).
    QString why = text;
    if (m_endpoint.startsWith(QLatin1String("unix:")))
        if (const wire::Status reached = wire::checkReachable(m_endpoint.toStdString()); !reached)
            why = QString::fromStdString(reached.error());
    fail(QStringLiteral("cannot reach the engine (%1)").arg(why), false);
}

void ConnectionWorker::fail(const QString &message, bool refused)
{
    if (m_done) return;
    m_done = true;
    close();
    Q_EMIT failed(message, refused);
}

} // namespace shardscope::session

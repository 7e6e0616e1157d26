#include "session/connection.h"

namespace shardscope::session {

Connection::Connection(SessionStore *store, QObject *parent) : QObject(parent), m_store(store)
{
    qRegisterMetaType<shardscope::session::WelcomeInfo>();
    qRegisterMetaType<std::shared_ptr<shardscope::wire::Snapshot>>();
    qRegisterMetaType<std::shared_ptr<const shardscope::session::EventBatch>>();
    qRegisterMetaType<shardscope::wire::ClockEstimate>();
    m_worker = new ConnectionWorker;
    m_worker->moveToThread(&m_thread);
    connect(&m_thread, &QThread::finished, m_worker, &QObject::deleteLater);
    connect(m_worker, &ConnectionWorker::welcomed, this, &Connection::onWelcomed);
    connect(m_worker, &ConnectionWorker::clockProbed, this,
            [this](const wire::ClockEstimate &estimate, const QString &error) {
                m_clockProbed = true;
                m_clock = estimate;
                m_clockError = error;
            });
    connect(m_worker, &ConnectionWorker::alive, this, [this] { m_sinceData.start(); });
    connect(m_worker, &ConnectionWorker::stateReceived, this, &Connection::onState);
    connect(m_worker, &ConnectionWorker::eventsReceived, this, &Connection::onEvents);
    connect(m_worker, &ConnectionWorker::historyEnded, this, [this] {
        m_store->flush();
        m_caughtUp = true;
    });
    connect(m_worker, &ConnectionWorker::droppedReported, this, &Connection::onDropped);
    connect(m_worker, &ConnectionWorker::finished, this, &Connection::onFinished);
    connect(m_worker, &ConnectionWorker::failed, this, &Connection::onFailed);
    m_thread.setObjectName(QStringLiteral("shardscope-connection"));
    m_thread.start();
    m_retry.setSingleShot(true);
    m_retry.setInterval(1000);
    connect(&m_retry, &QTimer::timeout, this, &Connection::reopen);
}

Connection::~Connection()
{
    m_retry.stop();
    QMetaObject::invokeMethod(m_worker, &ConnectionWorker::close, Qt::BlockingQueuedConnection);
    m_thread.quit();
    m_thread.wait();
}

void Connection::attach(const QString &endpoint, const QString &token)
{
    m_retry.stop();
    m_endpoint = endpoint.trimmed();
    m_token = token;
    m_everConnected = false;
    m_historyReceived = false;
    m_caughtUp = false;
    m_states = 0;
    m_liveEvents = 0;
    m_reconnects = 0;
    m_engineDropped = 0;
    m_clientDroppedEarlier = 0;
    m_clientDroppedNow = 0;
    m_clockProbed = false;
    m_clock = {};
    m_clockError.clear();
    m_sinceData.invalidate();
    if (m_source < 0) m_store->setReadOnly(false, m_endpoint);
    setState(State::Connecting, tr("connecting to %1").arg(m_endpoint));
    reopen();
}

void Connection::reopen()
{
    const QString ep = m_endpoint;
    const QString tok = m_token;
    const bool probe = m_source >= 0 && !m_clockProbed;
    QMetaObject::invokeMethod(
        m_worker, [w = m_worker, ep, tok, probe] { w->open(ep, tok, probe); },
        Qt::QueuedConnection);
}

void Connection::detach()
{
    m_retry.stop();
    QMetaObject::invokeMethod(m_worker, &ConnectionWorker::close, Qt::BlockingQueuedConnection);
    if (m_state != State::Idle)
        setState(State::Idle, tr("detached; the collected data stays on screen"));
}

void Connection::setState(State state, const QString &message)
{
    m_state = state;
    m_message = message;
    Q_EMIT stateChanged(state, message);
}

void Connection::setSource(int source, const QString &name)
{
    m_source = source;
    m_sourceName = name;
}

void Connection::onWelcomed(const WelcomeInfo &info)
{
    m_welcome = info;
    m_sinceData.start();
    m_caughtUp = false;
    if (m_everConnected) {
        ++m_reconnects;
        m_clientDroppedEarlier += m_clientDroppedNow;
        m_clientDroppedNow = 0;
    }
    m_everConnected = true;
    Q_EMIT welcomed(info);
    setState(State::Connected,
             tr("connected to %1 (pid %2, %3)").arg(m_endpoint).arg(info.pid).arg(info.model));
}

void Connection::onState(std::shared_ptr<wire::Snapshot> snapshot)
{
    ++m_states;
    m_sinceData.start();
    if (m_clockShiftNs != 0) {
        const auto shift = static_cast<std::uint64_t>(m_clockShiftNs);
        for (state::ParamRecord &p : snapshot->state.params)
            if (p.lastGatherTsNs != 0) p.lastGatherTsNs -= shift;
        for (state::ViolationRecord &v : snapshot->state.violations)
            v.tsNs -= shift;
    }
    if (m_source >= 0) {
        const QString err =
            m_store->applySourceState(m_source, std::move(snapshot->state), m_sourceName);
        m_engineDropped = snapshot->droppedEvents;
        pushDropped();
        if (!err.isEmpty()) {
            m_retry.stop();
            QMetaObject::invokeMethod(m_worker, &ConnectionWorker::close,
                                      Qt::BlockingQueuedConnection);
            setState(State::Failed, err);
        }
        return;
    }
    // Freeing the replaced state (as large as the new one) is left to the worker's
    // thread: the posted functor, and the state it holds, is destroyed there.
    auto replaced =
        std::make_shared<state::EngineState>(m_store->applyState(std::move(snapshot->state)));
    QMetaObject::invokeMethod(
        m_worker, [replaced = std::move(replaced)] {}, Qt::QueuedConnection);
    m_engineDropped = snapshot->droppedEvents;
    pushDropped();
}

void Connection::onEvents(std::shared_ptr<const EventBatch> batch)
{
    m_sinceData.start();
    if (batch->history)
        m_historyReceived = true;
    else
        m_liveEvents += batch->events.size();
    if (m_clockShiftNs != 0) {
        std::vector<telemetry::Event> shifted(batch->events);
        const auto shift = static_cast<std::uint64_t>(m_clockShiftNs);
        for (telemetry::Event &e : shifted)
            e.tsNs -= shift;
        m_store->appendEvents(shifted, batch->history);
        return;
    }
    m_store->appendEvents(batch->events, batch->history);
}

void Connection::onDropped(quint64 total)
{
    m_clientDroppedNow = total;
    pushDropped();
}

void Connection::pushDropped()
{
    if (m_source >= 0) {
        m_store->setSourceDropped(m_source,
                                  m_engineDropped + m_clientDroppedEarlier + m_clientDroppedNow);
        return;
    }
    m_store->setDroppedEvents(m_engineDropped + m_clientDroppedEarlier + m_clientDroppedNow);
}

void Connection::onFinished(const QString &reason)
{
    m_store->flush();
    setState(State::Finished,
             tr("the run finished (%1); everything received stays on screen").arg(reason));
}

void Connection::onFailed(const QString &message, bool refused)
{
    m_store->flush();
    if (refused) {
        setState(State::Failed, message);
        return;
    }
    if (m_everConnected) {
        setState(State::Lost, tr("%1; everything collected so far is kept; reconnecting to %2")
                                  .arg(message, m_endpoint));
    } else {
        setState(State::Connecting, tr("%1; retrying %2").arg(message, m_endpoint));
    }
    m_retry.start();
}

} // namespace shardscope::session

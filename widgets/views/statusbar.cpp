#include "views/statusbar.h"

#include <QLabel>
#include <QTimer>

#include "session/labels.h"
#include "session/sessionstore.h"

namespace shardscope::views {

InspectorStatusBar::InspectorStatusBar(session::SessionStore *store, QWidget *parent)
    : QStatusBar(parent), m_store(store), m_connection(new QLabel(tr("not attached"), this)),
      m_summary(new QLabel(this)), m_rate(new QLabel(this)), m_dropped(new QLabel(this)),
      m_rateTimer(new QTimer(this))
{
    m_connection->setObjectName(QStringLiteral("connectionState"));
    addWidget(m_connection, 1);
    addPermanentWidget(m_summary);
    addPermanentWidget(m_rate);
    addPermanentWidget(m_dropped);
    connect(m_store, &session::SessionStore::updated, this, [this](const session::StoreChanges &c) {
        if (c.reset || c.summary) updateSummary();
    });
    m_rateTimer->setInterval(1000);
    connect(m_rateTimer, &QTimer::timeout, this, &InspectorStatusBar::sampleRate);
    m_rateTimer->start();
    updateSummary();
    sampleRate();
}

void InspectorStatusBar::setConnection(const QString &text, bool ok)
{
    m_connection->setText(text);
    m_connection->setStyleSheet(ok ? QString()
                                   : QStringLiteral("color: #b01010; font-weight: bold"));
}

QString InspectorStatusBar::connectionText() const
{
    return m_connection->text();
}

QString InspectorStatusBar::summaryText() const
{
    return m_summary->text();
}

QString InspectorStatusBar::rateText() const
{
    return m_rate->text();
}

QString InspectorStatusBar::droppedText() const
{
    return m_dropped->text();
}

void InspectorStatusBar::updateSummary()
{
    if (!m_store->hasState()) {
        m_summary->clear();
    } else {
        const state::EngineState &st = m_store->state();
        QString text = tr("world %1 · %2 · step %3")
                           .arg(st.worldSize)
                           .arg(QString::fromStdString(st.backend))
                           .arg(m_store->step());
        if (m_store->hasLoss()) text += tr(" · loss %1").arg(m_store->loss(), 0, 'f', 4);
        m_summary->setText(text);
    }
    const quint64 dropped = m_store->droppedEvents();
    m_dropped->setText(tr("dropped %1").arg(session::labels::count(dropped)));
    m_dropped->setStyleSheet(dropped ? QStringLiteral("color: #b06000") : QString());
}

void InspectorStatusBar::sampleRate()
{
    const quint64 total = m_store->totalEvents();
    const quint64 delta = total >= m_lastTotal ? total - m_lastTotal : total;
    m_lastTotal = total;
    m_rate->setText(tr("%1 events/s").arg(session::labels::count(delta)));
}

} // namespace shardscope::views

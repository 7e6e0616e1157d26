#pragma once
// The inspector's status bar: connection state, the engine summary (world size,
// backend, step, loss), events per second and dropped events.

#include <QStatusBar>

class QLabel;
class QTimer;

namespace shardscope::sessioncore {
struct StoreChanges;
} // namespace shardscope::sessioncore

namespace shardscope::session {
class SessionStore;
using StoreChanges = sessioncore::StoreChanges;
} // namespace shardscope::session

namespace shardscope::views {

class InspectorStatusBar : public QStatusBar
{
    Q_OBJECT
  public:
    explicit InspectorStatusBar(session::SessionStore *store, QWidget *parent = nullptr);

    // ok: connected or a snapshot; false: lost, failed (drawn in red).
    void setConnection(const QString &text, bool ok);
    QString connectionText() const;
    QString summaryText() const;
    QString rateText() const;
    QString droppedText() const;

  public Q_SLOTS:
    void updateSummary();

  private:
    void sampleRate();

    session::SessionStore *m_store;
    QLabel *m_connection;
    QLabel *m_summary;
    QLabel *m_rate;
    QLabel *m_dropped;
    QTimer *m_rateTimer;
    quint64 m_lastTotal = 0;
};

} // namespace shardscope::views

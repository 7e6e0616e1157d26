#pragma once
// The parameter detail panel: owner, shape, dtype, numel, padded and partition numel,
// the per-rank shard table (offset, length, padding, status), where it is registered
// (manual or auto), active modules, gathers, and its violations with the exact fix line
// and a Copy button. Refreshes itself from the store's coalesced updates.

#include <QWidget>

#include "state/state.h"

class QFormLayout;
class QLabel;
class QTableWidget;
class QVBoxLayout;

namespace shardscope::sessioncore {
struct StoreChanges;
} // namespace shardscope::sessioncore

namespace shardscope::session {
class SessionStore;
using StoreChanges = sessioncore::StoreChanges;
} // namespace shardscope::session

namespace shardscope::views {

class ParamDetail : public QWidget
{
    Q_OBJECT
  public:
    explicit ParamDetail(session::SessionStore *store, QWidget *parent = nullptr);

    void showParam(ParamId id); // kNoParam clears
    ParamId shownParam() const { return m_param; }

    // For tests and the app: the shown values by field name ("owner", "shape", ...).
    QString field(const QString &name) const;
    QTableWidget *shardTable() const { return m_shards; }
    QStringList fixLines() const { return m_fixes; }

  Q_SIGNALS:
    void fixCopied(const QString &fix);

  private:
    // The three parts of the panel, each shown for p (nullptr: nothing selected).
    void refresh();
    void showFields(const state::ParamRecord *p);
    void showShards(const state::ParamRecord *p);
    void showViolations(const state::ParamRecord *p);
    void fitShardTable();
    void onStoreUpdated(const session::StoreChanges &changes);

    session::SessionStore *m_store;
    ParamId m_param = kNoParam;
    QLabel *m_title;
    QFormLayout *m_form;
    QHash<QString, QLabel *> m_fields;
    QTableWidget *m_shards;
    QWidget *m_violationsBox;
    QVBoxLayout *m_violationsLayout;
    QStringList m_fixes;
};

} // namespace shardscope::views

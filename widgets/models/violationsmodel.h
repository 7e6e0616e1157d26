#pragma once
// The violations table over a SessionStore: one row per (kind, accessor, parameter,
// source location) group with its count. Rows only ever append while a run continues; counts update
// in place, so a selection survives live updates.

#include <QAbstractTableModel>

#include "session/sessionstore.h"

namespace shardscope::models {

class ViolationsModel : public QAbstractTableModel
{
    Q_OBJECT
  public:
    enum Column
    {
        Time,
        Step,
        Rank,
        Kind,
        Severity, // error / cost / info (state/severity.h), coloured as the kind
        Accessor,
        Parameter,
        Owner,
        Status,
        Action,
        Count,
        Location, // where in the user's code: file:line (the file's name; the path in the tooltip)
        ColumnCount
    };
    enum Role
    {
        ParamIdRole = Qt::UserRole + 1,
        AccessorIdRole,
        FixRole,
        MessageRole,
        SortRole,
        LocationRole, // "file:line" with the file's full path, to copy into an editor; "" when not
                      // known
        SeverityRole  // the row's Severity as its number (0 error, 1 cost, 2 info)
    };

    explicit ViolationsModel(session::SessionStore *store, QObject *parent = nullptr);

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation,
                        int role = Qt::DisplayRole) const override;

    const state::ViolationRow *group(int row) const;
    // The rows as CSV (RFC 4180 quoting), with a header line, the fix and the location
    // (file:line, function).
    QByteArray toCsv() const;

  private:
    void onStoreUpdated(const session::StoreChanges &changes);
    QVariant displayValue(const state::ViolationRow &g, int column) const;

    session::SessionStore *m_store;
    int m_rows = 0;
};

} // namespace shardscope::models

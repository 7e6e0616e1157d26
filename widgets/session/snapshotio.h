#pragma once
// Snapshot files for the inspector: open one read-only into a store (the wire's reader;
// a bad file changes nothing) and export what a store holds with the wire's encoder,
// atomically. Also the atomic write every export uses.

#include <QByteArray>
#include <QString>
#include <QStringList>

#include "session/sessionstore.h"
#include "wire/snapshot.h"

namespace shardscope::session {

// Empty on success; otherwise what went wrong, and the store is untouched.
QString openSnapshotFile(const QString &path, SessionStore &store);
// One job's rank snapshot files (run.rank0.json, run.rank1.json, ...) into the store as one
// job, merged as a live job is (wire::mergeSnapshotFiles); the error names the file.
QString openJobSnapshotFiles(const QStringList &paths, SessionStore &store);
// The store's state (live statuses and counts), its violations, all its events in time order.
wire::Snapshot snapshotOf(const SessionStore &store);
// gzip'd when path ends in ".gz" (as every export below), plain JSON otherwise.
QString exportSnapshotFile(const QString &path, const SessionStore &store);
// wire::writeFileAtomically with a QString error: readers see the old file or the new one,
// never half; a FIFO or device is written into, never replaced.
QString writeFileAtomically(const QString &path, const QByteArray &bytes);
// The same, gzip'd first when path ends in ".gz" (a trace.json.gz opens in Perfetto and
// Chrome's DevTools Performance panel as it is).
QString writeExportFile(const QString &path, const QByteArray &bytes);

} // namespace shardscope::session

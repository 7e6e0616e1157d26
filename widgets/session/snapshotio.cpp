#include "session/snapshotio.h"

#include <QCoreApplication>
#include <QFileInfo>

#include <algorithm>
#include <queue>

#include "wire/compress.h"

namespace shardscope::session {

QString openSnapshotFile(const QString &path, SessionStore &store)
{
    if (!QFileInfo::exists(path))
        return QStringLiteral("cannot open `%1`: the file does not exist").arg(path);
    auto snap = wire::readSnapshotFile(path.toStdString());
    if (!snap) {
        return QStringLiteral("cannot open `%1` as a ShardScope snapshot: %2")
            .arg(path, QString::fromStdString(snap.error()));
    }
    store.clear();
    store.setReadOnly(true, path);
    store.applyState(std::move(snap->state));
    store.appendEvents(snap->events, true);
    store.setDroppedEvents(snap->droppedEvents);
    return {};
}

wire::Snapshot snapshotOf(const SessionStore &store)
{
    wire::Snapshot s;
    s.meta.producer = "shardscope";
    s.meta.pid = QCoreApplication::applicationPid();
    s.meta.createdUnixMs = wire::unixTimeMs();
    s.meta.endpoint = store.readOnly() ? std::string() : store.source().toStdString();
    s.state = store.state();
    // One record per (violation, rank), as docs/snapshot.md promises.
    s.state.violations = store.violationLedger().records();
    // Merge the per-rank lanes into one time-ordered list.
    using Head = std::pair<std::uint64_t, int>; // ts, lane
    std::priority_queue<Head, std::vector<Head>, std::greater<>> heads;
    std::vector<std::size_t> pos(static_cast<std::size_t>(store.laneCount()), 0);
    std::size_t total = 0;
    for (int r = 0; r < store.laneCount(); ++r) {
        total += store.lane(r).size();
        if (!store.lane(r).empty()) heads.emplace(store.lane(r).at(0).tsNs, r);
    }
    s.events.reserve(total);
    while (!heads.empty()) {
        const int r = heads.top().second;
        heads.pop();
        const EventLane &lane = store.lane(r);
        std::size_t &i = pos[static_cast<std::size_t>(r)];
        s.events.push_back(lane.at(i));
        if (++i < lane.size()) heads.emplace(lane.at(i).tsNs, r);
    }
    s.droppedEvents = store.droppedEvents();
    return s;
}

QString writeFileAtomically(const QString &path, const QByteArray &bytes)
{
    // The one writer (wire/snapshot.h): a FIFO or a device is written into, never replaced.
    auto written = wire::writeFileAtomically(
        path.toStdString(), std::string_view(bytes.constData(), std::size_t(bytes.size())));
    if (!written) return QString::fromStdString(written.error());
    return {};
}

QString writeExportFile(const QString &path, const QByteArray &bytes)
{
    if (!wire::wantsGzip(path.toStdString())) return writeFileAtomically(path, bytes);
    const std::string gz = wire::gzipCompress(std::string_view(bytes.constData(), bytes.size()));
    return writeFileAtomically(path, QByteArray::fromRawData(gz.data(), qsizetype(gz.size())));
}

QString exportSnapshotFile(const QString &path, const SessionStore &store)
{
    if (!store.hasState())
        return QStringLiteral("nothing to export: attach to an engine or open a snapshot first");
    const std::string json = wire::encodeSnapshot(snapshotOf(store), true);
    return writeExportFile(path, QByteArray::fromRawData(json.data(), qsizetype(json.size())));
}

} // namespace shardscope::session

#include "session/snapshotio.h"

#include <QFileInfo>

#include "wire/atomicfile.h"
#include "wire/compress.h"
#include "wire/jobmerge.h"

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
    sessioncore::loadSnapshot(store.core(), std::move(snap).value(), path.toStdString());
    return {};
}

QString openJobSnapshotFiles(const QStringList &paths, SessionStore &store)
{
    std::vector<std::string> files;
    for (const QString &path : paths) {
        if (!QFileInfo::exists(path))
            return QStringLiteral("cannot open `%1`: the file does not exist").arg(path);
        files.push_back(path.toStdString());
    }
    auto merged = wire::mergeSnapshotFiles(files);
    if (!merged) return QString::fromStdString(merged.error());
    sessioncore::loadSnapshot(store.core(), std::move(merged).value(), files.front());
    return {};
}

wire::Snapshot snapshotOf(const SessionStore &store)
{
    return sessioncore::snapshotOf(store.core());
}

QString writeFileAtomically(const QString &path, const QByteArray &bytes)
{
    // The one writer (wire/atomicfile.h): a FIFO or a device is written into, never replaced.
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

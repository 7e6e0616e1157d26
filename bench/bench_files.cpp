// The files users share, from the demo's run: shardscope-train as scripts/demo runs it (4
// CPU ranks, --overlap-comm, 800 steps) with the inspector's Connection and SessionStore
// attached from its first step; when it finishes, the snapshot and the Perfetto trace are
// exported plain (x.json) and gzip'd (x.json.gz) as `shardscope --export-snapshot/--export-trace`
// write them. Measured: each file's size, the time to write it, and the time to open the
// snapshot both ways (openSnapshotFile: read, inflate, decode, apply to a store), alternating
// plain and gzip'd; both must hold the same document. Prints Markdown.
//
// Usage: bench_files [--reps N]   (QT_QPA_PLATFORM=offscreen; shardscope-train is found
// next to this executable)

#include <QCoreApplication>
#include <QEventLoop>
#include <QFileInfo>
#include <QProcess>
#include <QTemporaryDir>
#include <QTimer>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchutil.h"
#include "session/connection.h"
#include "session/sessionstore.h"
#include "session/snapshotio.h"
#include "session/traceexport.h"
#include "wire/snapshot.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kSteps = 800;
constexpr double kTargetBytes = 4e6;

// Runs the demo's training with a Connection attached from the start; returns once the
// engine said goodbye, with everything it sent in store.
void recordDemoRun(session::SessionStore &store, const QString &dir)
{
    const QString trainer = QCoreApplication::applicationDirPath() + "/shardscope-train";
    if (!QFileInfo(trainer).isExecutable())
        throw std::runtime_error(trainer.toStdString() + " is missing: build shardscope-train");
    const QString socket = dir + "/engine.sock";
    QProcess train;
    train.setProcessChannelMode(QProcess::ForwardedErrorChannel);
    train.setStandardOutputFile(QProcess::nullDevice());
    train.start(trainer, {"--backend", "cpu", "--overlap-comm", "--wait-for-client=60", "--listen",
                          "unix:" + socket, "--steps", QString::number(kSteps)});
    if (!train.waitForStarted(10000)) throw std::runtime_error("shardscope-train did not start");
    for (int i = 0; i < 200 && !QFileInfo::exists(socket); ++i)
        QThread::msleep(50);
    session::Connection connection(&store);
    QEventLoop loop;
    QString failure;
    QObject::connect(&connection, &session::Connection::stateChanged, &loop,
                     [&](session::Connection::State s, const QString &message) {
                         if (s == session::Connection::State::Finished) loop.quit();
                         if (s == session::Connection::State::Failed) {
                             failure = message;
                             loop.quit();
                         }
                     });
    QTimer::singleShot(600000, &loop, [&] {
        failure = "the run did not finish within 600 s";
        loop.quit();
    });
    connection.attach("unix:" + socket);
    loop.exec();
    connection.detach();
    train.waitForFinished(60000);
    if (!failure.isEmpty()) throw std::runtime_error(failure.toStdString());
    store.flush();
}

double fileMb(const QString &path)
{
    return double(QFileInfo(path).size()) / 1e6;
}

std::string mb(double v)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MB", v);
    return buf;
}

} // namespace

int main(int argc, char **argv)
{
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QCoreApplication app(argc, argv);
    const int reps = parseReps(argc, argv, "bench_files", 5);
    QTemporaryDir dir;
    session::SessionStore store;
    try {
        recordDemoRun(store, dir.path());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_files: %s\n", e.what());
        return 1;
    }

    struct Kind
    {
        const char *name;
        QString path;
        std::vector<double> writeMs, openMs;
    };
    Kind snap[3] = {
        {"plain (snapshot.json)", dir.filePath("snapshot.json"), {}, {}},
        {"gzip'd (snapshot.json.gz)", dir.filePath("snapshot.json.gz"), {}, {}},
        {"version 2 (before the event columns), plain", dir.filePath("v2.json"), {}, {}}};
    Kind trace[2] = {{"plain (trace.json)", dir.filePath("trace.json"), {}, {}},
                     {"gzip'd (trace.json.gz)", dir.filePath("trace.json.gz"), {}, {}}};
    for (int rep = 0; rep < reps; ++rep) {
        for (int k = 0; k < 2; ++k) {
            Kind &s = snap[(rep + k) % 2];
            auto t = Clock::now();
            if (const QString err = session::exportSnapshotFile(s.path, store); !err.isEmpty()) {
                std::fprintf(stderr, "bench_files: %s\n", qPrintable(err));
                return 1;
            }
            s.writeMs.push_back(secondsSince(t) * 1e3);
            Kind &tr = trace[(rep + k) % 2];
            t = Clock::now();
            if (const QString err = session::writeExportFile(tr.path, session::chromeTrace(store));
                !err.isEmpty()) {
                std::fprintf(stderr, "bench_files: %s\n", qPrintable(err));
                return 1;
            }
            tr.writeMs.push_back(secondsSince(t) * 1e3);
        }
    }
    // Today's form for comparison: version 2 (one JSON object per event), plain, as every
    // snapshot was written before version 3; converted from the version 3 export.
    {
        std::ifstream in(snap[0].path.toStdString());
        nlohmann::json doc = nlohmann::json::parse(in);
        nlohmann::json list = nlohmann::json::array();
        const nlohmann::json &c = doc["events"];
        std::uint64_t ts = 0, step = 0;
        for (std::size_t i = 0; i < c["count"].get<std::size_t>(); ++i) {
            ts += static_cast<std::uint64_t>(c["ts_ns"][i].get<std::int64_t>());
            step += static_cast<std::uint64_t>(c["step"][i].get<std::int64_t>());
            list.push_back({{"ts_ns", ts},
                            {"step", step},
                            {"rank", c["rank"][i]},
                            {"type", c["type_names"][c["type"][i].get<std::size_t>()]},
                            {"flags", c["flags"][i]},
                            {"a", c["a"][i]},
                            {"b", c["b"][i]},
                            {"u0", c["u0"][i]},
                            {"u1", c["u1"][i]},
                            {"u2", c["u2"][i]}});
        }
        doc["events"] = std::move(list);
        doc["version"] = 2;
        std::string text;
        for (auto it = doc.begin(); it != doc.end(); ++it) { // one line per member and event
            text += text.empty() ? "{\n " : ",\n ";
            text += nlohmann::json(it.key()).dump() + ": ";
            if (it.value().is_array()) {
                text += "[";
                for (std::size_t i = 0; i < it.value().size(); ++i)
                    text += (i ? ",\n  " : "\n  ") + it.value()[i].dump();
                text += it.value().empty() ? "]" : "\n ]";
            } else {
                text += it.value().dump();
            }
        }
        text += "\n}\n";
        std::ofstream(snap[2].path.toStdString()) << text;
    }
    for (int rep = 0; rep < reps; ++rep) {
        for (int k = 0; k < 3; ++k) {
            Kind &s = snap[(rep + k) % 3];
            session::SessionStore opened;
            const auto t = Clock::now();
            if (const QString err = session::openSnapshotFile(s.path, opened); !err.isEmpty()) {
                std::fprintf(stderr, "bench_files: %s\n", qPrintable(err));
                return 1;
            }
            opened.flush();
            s.openMs.push_back(secondsSince(t) * 1e3);
            if (opened.totalEvents() != store.totalEvents()) {
                std::fprintf(stderr, "bench_files: %s holds %llu events, the store %llu\n", s.name,
                             static_cast<unsigned long long>(opened.totalEvents()),
                             static_cast<unsigned long long>(store.totalEvents()));
                return 1;
            }
        }
    }
    auto plainDoc = wire::readSnapshotFile(snap[0].path.toStdString());
    auto gzDoc = wire::readSnapshotFile(snap[1].path.toStdString());
    if (!plainDoc || !gzDoc) {
        std::fprintf(stderr, "bench_files: cannot read the exports back\n");
        return 1;
    }
    gzDoc->meta.createdUnixMs = plainDoc->meta.createdUnixMs;
    const bool same = wire::encodeSnapshot(*plainDoc) == wire::encodeSnapshot(*gzDoc);

    std::printf("### Files of the demo run: snapshot and Perfetto trace\n\n");
    std::printf("%s; shardscope-train --backend cpu --overlap-comm --steps %d (scripts/demo's "
                "run), a Connection and SessionStore attached from the first step; %llu events "
                "stored; each export written %d times per form, forms alternating; open = "
                "openSnapshotFile (read, inflate, decode, apply to a new store), %d times per "
                "form, alternating; median (min-max)\n\n",
                machine().c_str(), kSteps, static_cast<unsigned long long>(store.totalEvents()),
                reps, reps);
    std::printf("| file | size | write, ms | open, ms |\n|---|---:|---:|---:|\n");
    for (const Kind &k : snap)
        std::printf("| snapshot, %s | %s | %s | %s |\n", k.name, mb(fileMb(k.path)).c_str(),
                    k.writeMs.empty() ? "" : format(stats(k.writeMs), 0).c_str(),
                    format(stats(k.openMs), 0).c_str());
    for (const Kind &k : trace)
        std::printf("| trace, %s | %s | %s | |\n", k.name, mb(fileMb(k.path)).c_str(),
                    format(stats(k.writeMs), 0).c_str());
    const double snapGz = fileMb(snap[1].path) * 1e6, traceGz = fileMb(trace[1].path) * 1e6;
    const double openRatio = stats(snap[1].openMs).median / stats(snap[0].openMs).median;
    const double openToday = stats(snap[1].openMs).median / stats(snap[2].openMs).median;
    std::printf("\ngzip'd / plain: snapshot %.3f of the size, open time %.2f; trace %.3f of the "
                "size. gzip'd / version 2 plain (today's file): %.3f of the size, open time "
                "%.2f. The two snapshot exports decode to the same document: %s.\n\n",
                fileMb(snap[1].path) / fileMb(snap[0].path), openRatio,
                fileMb(trace[1].path) / fileMb(trace[0].path),
                fileMb(snap[1].path) / fileMb(snap[2].path), openToday, same ? "yes" : "**no**");
    std::printf("Targets: snapshot <= 4 MB on disk: %s; trace <= 4 MB on disk: %s; the gzip'd "
                "snapshot opens at least as fast as the version 2 file did: %s.\n",
                verdict(snapGz <= kTargetBytes && same), verdict(traceGz <= kTargetBytes),
                verdict(openToday <= 1.0));
    return same ? 0 : 1;
}

// Attach at scale: a real Engine of 64 CPU ranks holding 100,000 parameters, served by the
// Inspector on loopback TCP; the GUI's Connection + SessionStore + ModuleTreeModel attach
// to it. Measured: time from attach() to the tree model populated (the state decoded,
// stored and the tree rebuilt), then to every row revealed; the snapshot's size; and the
// phases in-process (state, encode, decode, apply + rebuild) to show what limits it.
// Prints a Markdown table.
//
// Usage: bench_attach [--reps N]   (run with QT_QPA_PLATFORM=offscreen)

#include <QEventLoop>
#include <QGuiApplication>
#include <QTimer>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchutil.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "models/moduletreemodel.h"
#include "server/inspector.h"
#include "session/connection.h"
#include "session/sessionstore.h"
#include "syntheticmodel.h"
#include "wire/snapshot.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kParams = 100000;
constexpr int kWorld = 64;
constexpr std::int64_t kPersistence = 100; // weights partitioned, biases and norms persistent

// Reveals every row (what "expand all" makes a view do); returns the rows seen.
int revealAll(ModuleTreeModel &tree)
{
    std::vector<QModelIndex> stack{QModelIndex()};
    int rows = 0;
    while (!stack.empty()) {
        const QModelIndex idx = stack.back();
        stack.pop_back();
        while (tree.canFetchMore(idx))
            tree.fetchMore(idx);
        const int n = tree.rowCount(idx);
        for (int r = 0; r < n; ++r) {
            const QModelIndex child = tree.index(r, 0, idx);
            ++rows;
            if (tree.hasChildren(child))
                stack.push_back(child);
        }
    }
    return rows;
}

struct Attach
{
    double populatedMs = 0.0; // attach() -> tree model rebuilt over the full state
    double revealedMs = 0.0;  // -> every row revealed
    int rows = 0;
};

Attach attachOnce(const std::string &endpoint, int expectedNodes)
{
    SessionStore store;
    ModuleTreeModel tree(&store);
    Connection connection(&store);
    QEventLoop loop;
    Attach out;
    bool populated = false;
    const auto t0 = Clock::now();
    // Connected after the tree's own slot, so this runs once the tree has rebuilt.
    QObject::connect(&store, &SessionStore::updated, &loop, [&] {
        if (populated || tree.matchingNodeCount() < expectedNodes)
            return;
        populated = true;
        out.populatedMs = secondsSince(t0) * 1e3;
        out.rows = revealAll(tree);
        out.revealedMs = secondsSince(t0) * 1e3;
        loop.quit();
    });
    QString failure;
    QObject::connect(&connection, &Connection::stateChanged, &loop,
                     [&](Connection::State s, const QString &message) {
                         if (s == Connection::State::Failed) {
                             failure = message;
                             loop.quit();
                         }
                     });
    QTimer::singleShot(120000, &loop, [&] { loop.quit(); });
    connection.attach(QString::fromStdString(endpoint));
    loop.exec();
    connection.detach();
    if (!failure.isEmpty())
        throw std::runtime_error("attach failed: " + failure.toStdString());
    if (!populated)
        throw std::runtime_error("the tree was not populated within 120 s");
    return out;
}

} // namespace

int main(int argc, char **argv)
{
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM"))
        qputenv("QT_QPA_PLATFORM", "offscreen");
    QGuiApplication app(argc, argv);
    const int reps = parseReps(argc, argv, "bench_attach", 5);

    const SyntheticModel model = makeSyntheticModel(kParams, 16);
    const auto build0 = Clock::now();
    EngineConfig config;
    config.worldSize = kWorld;
    config.persistenceThreshold = kPersistence;
    config.modelName = "synthetic-100k";
    Engine engine(config, makeCpuWorld(kWorld));
    buildSyntheticModel(engine, model);
    engine.partition();
    const double buildSeconds = secondsSince(build0);
    const int expectedNodes = static_cast<int>(model.modules.size() + model.params.size());

    InspectorOptions options;
    options.endpoint = "tcp:127.0.0.1:0";
    Inspector inspector(engine, options);
    const std::string endpoint = inspector.endpoint();

    // The phases, in-process, each timed alone.
    std::vector<double> stateMs, encodeMs, decodeMs, applyMs, revealMs;
    std::size_t snapshotBytes = 0;
    for (int rep = 0; rep < reps; ++rep) {
        auto t = Clock::now();
        wire::Snapshot snap;
        snap.meta.producer = "bench_attach";
        snap.state = engine.state();
        stateMs.push_back(secondsSince(t) * 1e3);
        t = Clock::now();
        const std::string json = wire::encodeSnapshot(snap);
        encodeMs.push_back(secondsSince(t) * 1e3);
        snapshotBytes = json.size();
        t = Clock::now();
        auto decoded = wire::decodeSnapshot(json);
        decodeMs.push_back(secondsSince(t) * 1e3);
        if (!decoded) {
            std::fprintf(stderr, "bench_attach: the snapshot does not decode: %s\n", decoded.error().c_str());
            return 1;
        }
        SessionStore store;
        ModuleTreeModel tree(&store);
        t = Clock::now();
        store.applyState(decoded->state);
        store.flush(); // the tree rebuilds on this signal
        applyMs.push_back(secondsSince(t) * 1e3);
        t = Clock::now();
        revealAll(tree);
        revealMs.push_back(secondsSince(t) * 1e3);
    }

    std::vector<double> populated, revealed;
    int rows = 0;
    try {
        attachOnce(endpoint, expectedNodes); // warm-up
        for (int rep = 0; rep < reps; ++rep) {
            const Attach a = attachOnce(endpoint, expectedNodes);
            populated.push_back(a.populatedMs);
            revealed.push_back(a.revealedMs);
            rows = a.rows;
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_attach: %s\n", e.what());
        return 1;
    }
    inspector.finish();

    const Stats pop = stats(populated);
    std::printf("### Attach at scale: %d parameters, %d ranks\n\n", kParams, kWorld);
    std::printf("%s; a real Engine (%zu modules, %d parameters, %d CPU ranks, built and "
                "partitioned in %.1f s, not counted) served by the Inspector on %s; the GUI's "
                "Connection, SessionStore and ModuleTreeModel attach; median (min-max) of %d "
                "attaches\n\n",
                machine().c_str(), model.modules.size(), kParams, kWorld, buildSeconds,
                endpoint.c_str(), reps);
    std::printf("| figure | value |\n|---|---:|\n");
    std::printf("| snapshot (State message) size | %.1f MB (%zu bytes) |\n", double(snapshotBytes) / 1e6,
                snapshotBytes);
    std::printf("| **attach() to tree model populated, ms** | **%s** |\n", format(pop, 0).c_str());
    std::printf("| attach() to all %d rows revealed, ms | %s |\n", rows, format(stats(revealed), 0).c_str());
    std::printf("| phase: Engine::state(), ms | %s |\n", format(stats(stateMs), 0).c_str());
    std::printf("| phase: encodeSnapshot (JSON), ms | %s |\n", format(stats(encodeMs), 0).c_str());
    std::printf("| phase: decodeSnapshot (JSON), ms | %s |\n", format(stats(decodeMs), 0).c_str());
    std::printf("| phase: SessionStore::applyState + tree rebuild, ms | %s |\n", format(stats(applyMs), 0).c_str());
    std::printf("| phase: reveal every row, ms | %s |\n", format(stats(revealMs), 0).c_str());
    std::printf("\nTarget <= 1 s from attach to the tree populated: %s.\n", verdict(pop.median <= 1000.0));
    return 0;
}

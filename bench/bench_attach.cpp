// Attach at scale: a real Engine of 64 CPU ranks (then 16, for comparison) holding 100,000
// parameters, served by the Inspector on loopback TCP; the GUI's Connection + SessionStore
// + ModuleTreeModel attach to it. Measured: time from attach() to the tree model populated
// (the state decoded, stored and the tree rebuilt), then to every row revealed; the
// State's size; and the phases in-process (the server's state columns, their encoding,
// decode, apply + rebuild) to show what limits it; Engine::state(), which snapshots and JSON
// clients use, beside them. The GUI asks for the binary State; the JSON one that clients without
// the capability get is timed beside it. An attach that fails is reported with its reason.
// Beside the phases: how long a training rank waits for its own lock while the server
// builds the state's columns (every fetch takes that lock).
// Then the first attach of fresh processes: a user attaches once, and a process's first
// attach touches its memory for the first time, which the repeated attaches of one process
// do not. Prints Markdown.
//
// Usage: bench_attach [--reps N]   (run with QT_QPA_PLATFORM=offscreen)
//        bench_attach --fresh-attach   (one first attach at 64 ranks; started by the above)

#include <QEventLoop>
#include <QGuiApplication>
#include <QTimer>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "benchutil.h"
#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "core/engineprovider.h"
#include "models/moduletreemodel.h"
#include "server/inspector.h"
#include "session/connection.h"
#include "session/sessionstore.h"
#include "syntheticmodel.h"
#include "wire/snapshot.h"
#include "wire/statebinary.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kParams = 100000;
constexpr int kWorld = 64;
constexpr std::int64_t kPersistence = 100; // weights partitioned, biases and norms persistent

// Reveals every row (what "expand all" makes a view do); returns the rows seen.
int revealAll(models::ModuleTreeModel &tree)
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
            if (tree.hasChildren(child)) stack.push_back(child);
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
    session::SessionStore store;
    models::ModuleTreeModel tree(&store);
    session::Connection connection(&store);
    QEventLoop loop;
    Attach out;
    bool populated = false;
    const auto t0 = Clock::now();
    // Connected after the tree's own slot, so this runs once the tree has rebuilt.
    QObject::connect(&store, &session::SessionStore::updated, &loop, [&] {
        if (populated || tree.matchingNodeCount() < expectedNodes) return;
        populated = true;
        out.populatedMs = secondsSince(t0) * 1e3;
        out.rows = revealAll(tree);
        out.revealedMs = secondsSince(t0) * 1e3;
        loop.quit();
    });
    QString failure;
    QObject::connect(&connection, &session::Connection::stateChanged, &loop,
                     [&](session::Connection::State s, const QString &message) {
                         if (s == session::Connection::State::Failed) {
                             failure = message;
                             loop.quit();
                         }
                     });
    QTimer::singleShot(120000, &loop, [&] { loop.quit(); });
    connection.attach(QString::fromStdString(endpoint));
    loop.exec();
    connection.detach();
    if (!failure.isEmpty()) throw std::runtime_error("attach failed: " + failure.toStdString());
    if (!populated) throw std::runtime_error("the tree was not populated within 120 s");
    return out;
}

// A rank's longest wait for its own lock while Engine::stateColumns() runs (what the server
// builds every State from): a thread standing in
// for a training rank takes rank 0's lock (Engine::activeModules does, as every fetch's
// useParam does) every 100 us during the build. What the rank would stall for.
double longestRankLockWaitMs(const core::Engine &engine)
{
    std::atomic<bool> stop{false};
    std::atomic<bool> started{false};
    double longest = 0.0;
    std::thread rank([&] {
        started = true;
        while (!stop.load(std::memory_order_relaxed)) {
            const auto t = Clock::now();
            (void)engine.activeModules(0, 0);
            longest = std::max(longest, secondsSince(t) * 1e3);
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    });
    while (!started)
        std::this_thread::yield();
    state::StateColumns columns;
    engine.stateColumns(columns);
    stop = true;
    rank.join();
    return longest;
}

struct WorldResult
{
    int world = 0;
    double buildSeconds = 0.0;
    std::size_t snapshotBytes = 0, jsonBytes = 0;
    std::vector<double> columnsMs, encodeMs, decodeMs, applyMs, revealMs;
    std::vector<double> stateMs; // Engine::state(), for snapshots and JSON clients
    // encodeBinaryState of an EngineState (columnsOf + the encoder): the DeepSpeed agent's path
    std::vector<double> encodeFromStateMs;
    // A later State of the same run applied, rows revealed: nothing changed / every
    // parameter's gather figures changed.
    std::vector<double> laterApplyMs, laterChangedApplyMs;
    std::vector<double> rankLockWaitMs; // a rank's longest wait for its lock during stateColumns()
    std::vector<double> jsonEncodeMs, jsonDecodeMs; // what a client without state_binary costs
    std::vector<double> populated, revealed;
    std::vector<long> faults; // minor page faults of the process during each attach
    // The server thread's CPU building and encoding the States of each attach.
    std::vector<double> serverStateMs;
    int rows = 0;
    std::string failure; // why the GUI could not attach, if it could not
};

// phases: time the phases in-process first (which also warms this process's heap).
WorldResult measureWorld(const SyntheticModel &model, int world, int reps, bool phases = true)
{
    WorldResult out;
    out.world = world;
    const auto build0 = Clock::now();
    core::EngineConfig config;
    config.worldSize = world;
    config.persistenceThreshold = kPersistence;
    config.modelName = "synthetic-100k";
    core::Engine engine(config, comm::makeCpuWorld(world));
    buildSyntheticModel(engine, model);
    engine.partition();
    out.buildSeconds = secondsSince(build0);
    const int expectedNodes = static_cast<int>(model.modules.size() + model.params.size());

    server::InspectorOptions options;
    options.endpoint = "tcp:127.0.0.1:0";
    server::Inspector inspector(std::make_unique<core::EngineStateProvider>(engine), options);
    const std::string endpoint = inspector.endpoint();

    // The phases, in-process, each timed alone; the columns reused from one repetition to
    // the next, as the server reuses its own.
    state::StateColumns columns;
    for (int rep = 0; phases && rep < reps; ++rep) {
        auto t = Clock::now();
        engine.stateColumns(columns);
        out.columnsMs.push_back(secondsSince(t) * 1e3);
        wire::Snapshot snap;
        snap.meta.producer = "bench_attach";
        t = Clock::now();
        const std::string binary = wire::encodeBinaryState(columns, snap.meta, 0);
        out.encodeMs.push_back(secondsSince(t) * 1e3);
        t = Clock::now();
        snap.state = engine.state();
        out.stateMs.push_back(secondsSince(t) * 1e3);
        t = Clock::now();
        const std::string fromState = wire::encodeBinaryState(snap);
        out.encodeFromStateMs.push_back(secondsSince(t) * 1e3);
        if (fromState != binary)
            throw std::runtime_error("encoding Engine::state() gives other bytes than its columns");
        out.snapshotBytes = binary.size();
        t = Clock::now();
        auto decoded = wire::decodeBinaryState(binary);
        out.decodeMs.push_back(secondsSince(t) * 1e3);
        if (!decoded)
            throw std::runtime_error("the binary State does not decode: " + decoded.error());
        t = Clock::now();
        const std::string json = wire::encodeSnapshot(snap);
        out.jsonEncodeMs.push_back(secondsSince(t) * 1e3);
        out.jsonBytes = json.size();
        t = Clock::now();
        if (!wire::decodeSnapshot(json)) throw std::runtime_error("the JSON State does not decode");
        out.jsonDecodeMs.push_back(secondsSince(t) * 1e3);
        session::SessionStore store;
        models::ModuleTreeModel tree(&store);
        t = Clock::now();
        store.applyState(std::move(decoded->state));
        store.flush(); // the tree rebuilds on this signal
        out.applyMs.push_back(secondsSince(t) * 1e3);
        t = Clock::now();
        revealAll(tree);
        out.revealMs.push_back(secondsSince(t) * 1e3);
        // The States that follow while the client stays attached (the same run and
        // structure, every row revealed), what each costs the GUI's main thread: one in
        // which nothing changed, one in which every parameter's gather figures did (a
        // training run between two States gathers some of them).
        for (const bool changed : {false, true}) {
            auto later = wire::decodeBinaryState(binary);
            if (!later)
                throw std::runtime_error("the binary State does not decode: " + later.error());
            if (changed)
                for (state::ParamRecord &p : later->state.params)
                    p.gatherCount += 1 + static_cast<std::uint64_t>(rep);
            t = Clock::now();
            // The GUI frees the state a State replaces on the connection's worker thread.
            state::EngineState replaced = store.applyState(std::move(later->state));
            store.flush();
            (changed ? out.laterChangedApplyMs : out.laterApplyMs).push_back(secondsSince(t) * 1e3);
        }
    }

    for (int rep = 0; phases && rep < reps; ++rep)
        out.rankLockWaitMs.push_back(longestRankLockWaitMs(engine));

    try {
        for (int rep = 0; rep < reps; ++rep) {
            const long faults0 = minorFaults();
            const double stateCpu0 = inspector.cost().stateCpuSeconds;
            const Attach a = attachOnce(endpoint, expectedNodes);
            out.faults.push_back(minorFaults() - faults0);
            out.serverStateMs.push_back((inspector.cost().stateCpuSeconds - stateCpu0) * 1e3);
            out.populated.push_back(a.populatedMs);
            out.revealed.push_back(a.revealedMs);
            out.rows = a.rows;
        }
    } catch (const std::exception &e) {
        out.failure = e.what();
    }
    inspector.finish();
    return out;
}

// A first attach in fresh processes: this benchmark again with --fresh-attach, once per
// repetition (a new engine and server, a new GUI side); each prints
// "fresh MS FAULTS SERVER_STATE_MS".
struct FreshResult
{
    std::vector<double> ms;
    std::vector<long> faults;
    std::vector<double> serverStateMs;
    std::string failure;
};

FreshResult measureFresh(int reps)
{
    FreshResult out;
    for (int rep = 0; rep < reps; ++rep) {
        const std::string command = selfPath() + " --fresh-attach";
        FILE *child = ::popen(command.c_str(), "r");
        char line[128] = {};
        double ms = 0.0;
        long faults = 0;
        double serverMs = 0.0;
        const bool read = child && std::fgets(line, sizeof line, child) &&
                          std::sscanf(line, "fresh %lf %ld %lf", &ms, &faults, &serverMs) == 3;
        const int status = child ? ::pclose(child) : -1;
        if (!read || status != 0) {
            out.failure = "the --fresh-attach process failed (see its message above)";
            return out;
        }
        out.ms.push_back(ms);
        out.faults.push_back(faults);
        out.serverStateMs.push_back(serverMs);
    }
    return out;
}

std::string inOrder(const std::vector<double> &v)
{
    std::string cell;
    for (double x : v)
        cell += (cell.empty() ? "" : ", ") + std::to_string(static_cast<long long>(x + 0.5));
    return cell;
}

} // namespace

int main(int argc, char **argv)
{
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QGuiApplication app(argc, argv);
    const SyntheticModel model = makeSyntheticModel(kParams, 16);
    if (argc == 2 && std::string(argv[1]) == "--fresh-attach") {
        try {
            const WorldResult r = measureWorld(model, kWorld, 1, false);
            if (!r.failure.empty()) throw std::runtime_error(r.failure);
            std::printf("fresh %.3f %ld %.3f\n", r.populated.at(0), r.faults.at(0),
                        r.serverStateMs.at(0));
            return 0;
        } catch (const std::exception &e) {
            std::fprintf(stderr, "bench_attach --fresh-attach: %s\n", e.what());
            return 1;
        }
    }
    const int reps = parseReps(argc, argv, "bench_attach", 5);

    std::vector<WorldResult> results;
    FreshResult fresh;
    try {
        for (int world : {kWorld, 16})
            results.push_back(measureWorld(model, world, reps));
        fresh = measureFresh(reps);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_attach: %s\n", e.what());
        return 1;
    }

    std::printf("### Attach at scale: %d parameters\n\n", kParams);
    std::printf("%s; a real Engine (%zu modules, %d parameters, CPU ranks, built and "
                "partitioned beforehand, not counted) served by the Inspector on loopback TCP; "
                "the GUI's Connection, SessionStore and ModuleTreeModel attach (decoding on the "
                "connection's worker thread, the store and tree on the main thread); median "
                "(min-max) of %d attaches; the phases are timed alone, in-process\n\n",
                machine().c_str(), model.modules.size(), kParams, reps);
    std::printf("| figure |");
    for (const WorldResult &r : results)
        std::printf(" %d ranks |", r.world);
    std::printf("\n|---|");
    for (std::size_t i = 0; i < results.size(); ++i)
        std::printf("---:|");
    std::printf("\n");
    auto row = [&](const char *name, auto cell) {
        std::printf("| %s |", name);
        for (const WorldResult &r : results)
            std::printf(" %s |", cell(r).c_str());
        std::printf("\n");
    };
    auto attachCell = [](const WorldResult &r, const std::vector<double> &v) {
        return r.failure.empty() ? format(stats(v), 0) : std::string("failed");
    };
    row("State message size, binary (StateBinary, what the GUI gets)", [](const WorldResult &r) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.1f MB", double(r.snapshotBytes) / 1e6);
        return std::string(buf);
    });
    row("State message size, JSON (clients without state_binary)", [](const WorldResult &r) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.1f MB", double(r.jsonBytes) / 1e6);
        return std::string(buf);
    });
    row("**attach() to tree model populated, ms**",
        [&](const WorldResult &r) { return "**" + attachCell(r, r.populated) + "**"; });
    row("attach() to every row revealed, ms",
        [&](const WorldResult &r) { return attachCell(r, r.revealed); });
    // In order: a user attaches once, so whether the slowest attach is the first matters.
    row("each attach to tree populated, in order, ms", [](const WorldResult &r) {
        return r.failure.empty() ? inOrder(r.populated) : std::string("failed");
    });
    row("minor page faults during each attach, in order", [](const WorldResult &r) {
        return r.failure.empty() ? inOrder(std::vector<double>(r.faults.begin(), r.faults.end()))
                                 : std::string("failed");
    });
    row("the server building and encoding the State during each attach (its CPU), in order, ms",
        [](const WorldResult &r) {
            return r.failure.empty() ? inOrder(r.serverStateMs) : std::string("failed");
        });
    row("phase: Engine::stateColumns (what the server builds a State from), ms",
        [](const WorldResult &r) { return format(stats(r.columnsMs), 0); });
    row("a rank's longest wait for its lock during Engine::stateColumns (a fetch stalls this "
        "long), ms",
        [](const WorldResult &r) { return format(stats(r.rankLockWaitMs), 1); });
    row("phase: encodeBinaryState of the columns, ms",
        [](const WorldResult &r) { return format(stats(r.encodeMs), 0); });
    row("phase: decodeBinaryState, ms",
        [](const WorldResult &r) { return format(stats(r.decodeMs), 0); });
    row("phase: SessionStore::applyState + tree rebuild, ms",
        [](const WorldResult &r) { return format(stats(r.applyMs), 0); });
    row("phase: reveal every row, ms",
        [](const WorldResult &r) { return format(stats(r.revealMs), 0); });
    row("a later State of the same run, every row revealed, nothing changed: applyState + the "
        "tree's update, ms",
        [](const WorldResult &r) { return format(stats(r.laterApplyMs), 0); });
    row("the same, every parameter's gather figures changed, ms",
        [](const WorldResult &r) { return format(stats(r.laterChangedApplyMs), 0); });
    row("for comparison: Engine::state() (snapshots, JSON clients), ms",
        [](const WorldResult &r) { return format(stats(r.stateMs), 0); });
    row("for comparison: encodeBinaryState of that EngineState (columnsOf + the encoder: the "
        "DeepSpeed agent's path, whose state is records), ms",
        [](const WorldResult &r) { return format(stats(r.encodeFromStateMs), 0); });
    row("for comparison: encodeSnapshot (JSON), ms",
        [](const WorldResult &r) { return format(stats(r.jsonEncodeMs), 0); });
    row("for comparison: decodeSnapshot (JSON), ms",
        [](const WorldResult &r) { return format(stats(r.jsonDecodeMs), 0); });
    // What the in-process phases do not cover: sending and receiving the State over loopback,
    // framing, and handing it between threads.
    row("rest of attach -> populated (transfer, framing, hand-over), ms", [](const WorldResult &r) {
        if (!r.failure.empty()) return std::string("failed");
        const double rest = stats(r.populated).median - stats(r.columnsMs).median -
                            stats(r.encodeMs).median - stats(r.decodeMs).median -
                            stats(r.applyMs).median;
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.0f", rest);
        return std::string(buf);
    });
    row("engine build + partition (setup, not counted), s", [](const WorldResult &r) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f", r.buildSeconds);
        return std::string(buf);
    });
    std::printf("\n");
    for (const WorldResult &r : results) {
        if (!r.failure.empty())
            std::printf("With %d ranks the GUI could not attach: %s.\n\n", r.world,
                        r.failure.c_str());
    }
    std::printf("The first attach of a fresh process, %d ranks: this benchmark started again %d "
                "times with --fresh-attach, each building the engine and attaching once, without "
                "the phases before it (a user's first attach: the engine's server and the GUI "
                "side both touch their memory for the first time)\n\n",
                kWorld, reps);
    std::printf("| figure | %d ranks |\n|---|---:|\n", kWorld);
    if (fresh.failure.empty()) {
        std::printf("| **first attach of a fresh process to tree populated, ms** | **%s** |\n",
                    format(stats(fresh.ms), 0).c_str());
        std::printf("| each, in order, ms | %s |\n", inOrder(fresh.ms).c_str());
        std::printf("| minor page faults during it, each | %s |\n",
                    inOrder(std::vector<double>(fresh.faults.begin(), fresh.faults.end())).c_str());
        // What the engine's side costs of that: Engine::stateColumns() and the encoding, on the
        // server thread; the rest is the transfer, the GUI's decode, store and tree.
        std::printf("| of which the server building and encoding the State (its thread's CPU), "
                    "ms | %s |\n",
                    format(stats(fresh.serverStateMs), 0).c_str());
        std::printf("| the same, each | %s |\n", inOrder(fresh.serverStateMs).c_str());
    } else {
        std::printf("| first attach of a fresh process | failed: %s |\n", fresh.failure.c_str());
    }
    std::printf("\n");
    const WorldResult &target = results.front();
    const bool met = target.failure.empty() && stats(target.populated).median <= 500.0;
    const bool freshMet = fresh.failure.empty() && stats(fresh.ms).median <= 500.0;
    std::printf("Target <= 500 ms from attach to the tree populated (%d ranks): %s on the median "
                "of %d attaches in one process; %s on the median first attach of a fresh "
                "process.\n",
                target.world, verdict(met), reps, verdict(freshMet));
    return 0;
}

// The tree filter over 100,000 parameters: ms per filter change in the GUI's module tree
// model (ModuleTreeModel::setFilterText, which keeps the ancestors of every match), plus
// revealing the first batch of top-level rows as a view does after the reset. A typing
// sequence is replayed several times. Prints a Markdown table.
//
// Usage: bench_treefilter [--reps N]   (run with QT_QPA_PLATFORM=offscreen)

#include <QGuiApplication>

#include <cstdio>
#include <string>
#include <vector>

#include "benchutil.h"
#include "models/moduletreemodel.h"
#include "session/sessionstore.h"
#include "syntheticmodel.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

constexpr int kParams = 100000;
constexpr int kWorld = 64;

// What a person types, letter by letter, then a different search, a miss, and clearing.
const char *const kFilters[] = {
    "b",
    "bl",
    "blo",
    "blocks.1",
    "blocks.12",
    "blocks.123",
    "blocks.1234",
    "blocks.1234.attn",
    "q_proj",
    "q_proj.weight",
    "ln2.bias",
    "no_such_parameter",
    "",
};

} // namespace

int main(int argc, char **argv)
{
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QGuiApplication app(argc, argv);
    const int reps = parseReps(argc, argv, "bench_treefilter", 5);

    const SyntheticModel model = makeSyntheticModel(kParams, 16);
    session::SessionStore store;
    store.applyState(syntheticState(model, kWorld, 100));
    store.flush();
    models::ModuleTreeModel tree(&store);
    auto revealTop = [&] {
        const QModelIndex root = tree.index(0, 0);
        if (root.isValid() && tree.canFetchMore(root)) tree.fetchMore(root);
        return root.isValid() ? tree.rowCount(root) : 0;
    };
    revealTop();

    const std::size_t n = std::size(kFilters);
    std::vector<std::vector<double>> ms(n), cpuMs(n);
    std::vector<int> matches(n);
    std::vector<double> all, allCpu;
    tree.setFilterText(QStringLiteral("warm-up"));
    for (int rep = 0; rep < reps; ++rep) {
        for (std::size_t i = 0; i < n; ++i) {
            const PassTimer timer;
            tree.setFilterText(QString::fromLatin1(kFilters[i]));
            revealTop();
            const double t = timer.wallSeconds() * 1e3;
            const double c = timer.cpuSeconds() * 1e3;
            ms[i].push_back(t);
            all.push_back(t);
            cpuMs[i].push_back(c);
            allCpu.push_back(c);
            matches[i] = tree.matchingNodeCount();
        }
    }

    double worst = 0.0;
    std::printf("### Tree filter over %d parameters\n\n", kParams);
    std::printf("%s; %zu modules, %d parameters, %d ranks; ms per filter change "
                "(setFilterText + revealing the first rows of the root, as a view does); "
                "median (min-max) of %d replays of the typing sequence; CPU = the UI thread's "
                "CPU time, wall = elapsed (includes time the shared machine gave to other "
                "processes)\n\n",
                machine().c_str(), model.modules.size(), kParams, kWorld, reps);
    std::printf("| filter text | matching nodes | CPU ms per change | wall ms per change |\n"
                "|---|---:|---:|---:|\n");
    for (std::size_t i = 0; i < n; ++i) {
        const Stats c = stats(cpuMs[i]);
        worst = std::max(worst, c.median);
        std::printf("| `%s` | %d | %s | %s |\n", *kFilters[i] ? kFilters[i] : "(cleared)",
                    matches[i], format(c, 1).c_str(), format(stats(ms[i]), 1).c_str());
    }
    std::printf("| **every change** | | **%s** | %s |\n", format(stats(allCpu), 1).c_str(),
                format(stats(all), 1).c_str());
    std::printf("\nTarget <= 50 ms per filter change (the slowest filter's median, CPU): %s.\n",
                verdict(worst <= 50.0));
    return 0;
}

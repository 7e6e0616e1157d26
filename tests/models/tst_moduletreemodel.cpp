// The module / parameter tree: checked by QAbstractItemModelTester through live-like
// update sequences, externals under the registering module, filtering that keeps
// ancestors, sorting, and a 100,000-parameter model that populates and filters.

#include <QAbstractItemModelTester>
#include <QSignalSpy>
#include <QTest>

#include "models/moduletreemodel.h"
#include "session/sessionstore.h"
#include "syntheticstate.h"
#include "telemetry/eventfields.h"

using namespace shardscope;
using namespace shardscope::test;

class TestModuleTreeModel : public QObject
{
    Q_OBJECT
  private slots:
    void liveUpdatesUnderTester();
    void aStateAnnouncesEveryRevealedRow();
    void externalsShownUnderRegisteringModule();
    void fsdpUnitsAndPlacementsShown();
    void childrenModulesFirstInStateOrder();
    void hugeParameterIdsAreNamesNotIndexes();
    void filterKeepsAncestors();
    void sortsByColumn();
    void hundredThousandParameters();
    void typingMatchesQtCaseInsensitiveContains();

  private:
    // What the filter must keep, computed independently with QString::contains: nodes
    // whose path or name matches, the subtree of a matching module, and their ancestors.
    static int expectedMatching(const session::SessionStore &store, const QString &f)
    {
        int count = 0;
        auto visit = [&](auto &&self, ModuleId id, bool inherited) -> bool {
            const bool match =
                inherited ||
                QString::fromStdString(store.module(id)->path).contains(f, Qt::CaseInsensitive);
            bool visible = match;
            for (ModuleId c : store.childModules(id))
                visible = self(self, c, match) || visible;
            for (ParamId p : store.ownedParams(id)) {
                if (match ||
                    QString::fromStdString(store.param(p)->name).contains(f, Qt::CaseInsensitive)) {
                    ++count;
                    visible = true;
                }
            }
            if (visible) ++count;
            return visible;
        };
        visit(visit, 0, false);
        return count;
    }

    static QStringList childNames(QAbstractItemModel &model, const QModelIndex &parent)
    {
        while (model.canFetchMore(parent))
            model.fetchMore(parent);
        QStringList names;
        for (int r = 0; r < model.rowCount(parent); ++r)
            names << model.index(r, 0, parent).data().toString();
        return names;
    }
};

void TestModuleTreeModel::liveUpdatesUnderTester()
{
    session::SessionStore store;
    models::ModuleTreeModel model(&store);
    model.setFetchBatchSize(2);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model.rowCount(), 0);
    store.applyState(smallState());
    store.flush();
    QCOMPARE(model.rowCount(), 1);
    const QModelIndex root = model.index(0, 0);
    QCOMPARE(root.data().toString(), QStringLiteral("tiny-lm"));
    QCOMPARE(childNames(model, root), (QStringList{"embed", "blocks", "lm_head", "pos_conv"}));
    // lm_head.bias: 101 elements over 4 ranks, 26 a rank, the last 3 of the padded 104 padding.
    const QModelIndex lmHead = model.index(2, 0, root);
    childNames(model, lmHead);
    QCOMPARE(model.index(0, models::ModuleTreeModel::Partition, lmHead).data().toString(),
             QStringLiteral("26/rank, pad 3"));

    // Statuses change, gathers count, a violation arrives, a parameter is registered.
    const QModelIndex fc0w = model.indexForParam(1);
    QVERIFY(fc0w.isValid());
    QCOMPARE(fc0w.data().toString(), QStringLiteral("weight"));
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(10, 0, telemetry::makeFetchBegin({.param = 1, .cause = 0})),
            eventAt(20, 0, telemetry::makeFetchEnd({.param = 1, .cause = 0, .bytes = 1024}))},
        false);
    store.flush();
    const QModelIndex status =
        model.index(fc0w.row(), models::ModuleTreeModel::Status, fc0w.parent());
    QCOMPARE(status.data().toString(), QStringLiteral("MIXED (1/4 AVAILABLE)"));
    QVERIFY(status.data(Qt::ToolTipRole).toString().contains(QStringLiteral("rank 0: AVAILABLE")));
    QVERIFY(
        status.data(Qt::ToolTipRole).toString().contains(QStringLiteral("rank 3: NOT_AVAILABLE")));
    QCOMPARE(
        model.index(fc0w.row(), models::ModuleTreeModel::Gathers, fc0w.parent()).data().toString(),
        QStringLiteral("1"));

    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(30, 0)}, false);
    store.flush();
    const QModelIndex embedW = model.indexForParam(0);
    QCOMPARE(model.index(embedW.row(), models::ModuleTreeModel::Violations, embedW.parent())
                 .data()
                 .toString(),
             QStringLiteral("1"));
    const QModelIndex head = model.indexForModule(7);
    QCOMPARE(model.index(head.row(), models::ModuleTreeModel::Violations, head.parent())
                 .data()
                 .toString(),
             QStringLiteral("1"));
    QVERIFY(head.data(Qt::ForegroundRole).isValid());

    store.appendEvents(std::vector<telemetry::Event>{eventAt(
                           40, 0, telemetry::makeExternalRegister({.module = 7, .param = 0}))},
                       false);
    store.flush();
    const QModelIndex head2 = model.indexForModule(7);
    QVERIFY(childNames(model, head2).contains(QStringLiteral("embed.weight  [external]")));

    for (int i = 0; i < 200; ++i) {
        const auto p = static_cast<std::uint32_t>(i % 8);
        const telemetry::Event fields = i % 2 ? telemetry::makeRelease({.param = p, .cause = 0})
                                              : telemetry::makeFetchBegin({.param = p, .cause = 0});
        store.appendEvents(std::vector<telemetry::Event>{eventAt(
                               100 + static_cast<std::uint64_t>(i), i % 4, fields)},
                           false);
        if (i % 17 == 0) store.flush();
    }
    store.flush();
    model.setFilterText(QStringLiteral("fc"));
    model.setFilterText(QString());
    store.clear();
    store.flush();
    QCOMPARE(model.rowCount(), 0);
}

// A later State marks every parameter: the model announces every row a view has fetched,
// one signal per parent over all columns, and no row it has not fetched.
void TestModuleTreeModel::aStateAnnouncesEveryRevealedRow()
{
    session::SessionStore store;
    models::ModuleTreeModel model(&store);
    model.setFetchBatchSize(2);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    store.applyState(smallState());
    store.flush();
    const QModelIndex root = model.index(0, 0);
    model.fetchMore(root); // embed, blocks; lm_head and pos_conv stay unfetched
    const QModelIndex blocks = model.index(1, 0, root);
    QCOMPARE(blocks.data().toString(), QStringLiteral("blocks"));
    model.fetchMore(blocks);
    const QModelIndex b0 = model.index(0, 0, blocks);
    model.fetchMore(b0);
    const QModelIndex fc0 = model.index(0, 0, b0);
    model.fetchMore(fc0);
    QCOMPARE(model.rowCount(fc0), 2); // blocks.0.fc's weight and bias

    QSignalSpy spy(&model, &QAbstractItemModel::dataChanged);
    state::EngineState later = smallState();
    for (state::ParamRecord &p : later.params)
        p.gatherCount = 5;
    store.applyState(later);
    store.flush();

    // Every fetched row, walked without fetching more, lies in a signal for its parent.
    int parents = 0;
    auto covered = [&](const QModelIndex &parent, int row) {
        for (const QList<QVariant> &args : spy) {
            const auto tl = args.at(0).value<QModelIndex>();
            const auto br = args.at(1).value<QModelIndex>();
            if (tl.parent() == parent && tl.row() <= row && row <= br.row() && tl.column() == 0 &&
                br.column() == models::ModuleTreeModel::ColumnCount - 1)
                return true;
        }
        return false;
    };
    auto walk = [&](auto &&self, const QModelIndex &parent) -> void {
        if (model.rowCount(parent) > 0) ++parents;
        for (int r = 0; r < model.rowCount(parent); ++r) {
            QVERIFY2(covered(parent, r), qPrintable(QStringLiteral("row %1 under %2 not announced")
                                                        .arg(r)
                                                        .arg(parent.data().toString())));
            self(self, model.index(r, 0, parent));
        }
    };
    walk(walk, QModelIndex());
    // The top, root, blocks, blocks.0, blocks.0.fc, and what the tester fetched itself.
    QVERIFY(parents >= 5);
    QCOMPARE(spy.size(), parents);
    for (const QList<QVariant> &args : spy) {
        const auto br = args.at(1).value<QModelIndex>();
        QVERIFY(br.row() < model.rowCount(br.parent()));
    }
    const QModelIndex weight = model.index(0, models::ModuleTreeModel::Gathers, fc0);
    QCOMPARE(model.index(0, 0, fc0).data().toString(), QStringLiteral("weight"));
    QCOMPARE(weight.data().toString(), QStringLiteral("5"));
}

void TestModuleTreeModel::externalsShownUnderRegisteringModule()
{
    session::SessionStore store;
    state::EngineState st = smallState();
    st.params[0].externals.push_back(state::ExternalRecord{7, false});
    store.applyState(st);
    models::ModuleTreeModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    const QModelIndex head = model.indexForModule(7);
    QCOMPARE(childNames(model, head), (QStringList{"bias", "embed.weight  [external]"}));
    const QModelIndex ext = model.index(1, 0, head);
    QCOMPARE(ext.data(models::ModuleTreeModel::KindRole).toInt(),
             int(models::ModuleTreeModel::ExternalNode));
    QCOMPARE(ext.data(models::ModuleTreeModel::ParamIdRole).toUInt(), 0u);
    QCOMPARE(ext.data(models::ModuleTreeModel::ModuleIdRole).toUInt(), 7u);
    QVERIFY(ext.data(Qt::ToolTipRole)
                .toString()
                .contains(
                    QStringLiteral("registered as external on lm_head (manual), owned by embed")));
    const QModelIndex embedW = model.indexForParam(0);
    QCOMPARE(model.index(embedW.row(), models::ModuleTreeModel::RegisteredOn, embedW.parent())
                 .data()
                 .toString(),
             QStringLiteral("lm_head"));
    QCOMPARE(models::ModuleTreeModel::keyOf(ext), QStringLiteral("e7:0"));
    QCOMPARE(model.indexForKey(QStringLiteral("e7:0")), ext);
}

// An FSDP2 run: a unit's type column says its settings and group, a parameter's partition
// column its placements; a new state that changes a unit reaches the rows.
void TestModuleTreeModel::fsdpUnitsAndPlacementsShown()
{
    session::SessionStore store;
    state::EngineState st = fsdpState(4);
    store.applyState(st);
    models::ModuleTreeModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    auto typeOf = [&](ModuleId m) {
        const QModelIndex i = model.indexForModule(m);
        return model.index(i.row(), models::ModuleTreeModel::ShapeColumn, i.parent())
            .data()
            .toString();
    };
    QCOMPARE(typeOf(3), QStringLiteral("Block [FSDP unit: reshard_after_forward=True; mesh dp=4]"));
    QCOMPARE(typeOf(7), QStringLiteral("TiedHead [FSDP unit: reshard_after_forward=2; mesh dp=4; "
                                       "grouped with embed]"));
    QCOMPARE(typeOf(4), QStringLiteral("Linear")); // not a unit
    QVERIFY(model.indexForModule(7)
                .data(Qt::ToolTipRole)
                .toString()
                .contains(QStringLiteral(
                    "FSDP unit: reshard_after_forward=2; mesh dp=4; grouped with embed")));
    auto partitionOf = [&](ParamId p) {
        const QModelIndex i = model.indexForParam(p);
        return model.index(i.row(), models::ModuleTreeModel::Partition, i.parent())
            .data()
            .toString();
    };
    QCOMPARE(partitionOf(0), QStringLiteral("Shard(0): 404/rank, pad 0"));
    QCOMPARE(partitionOf(5), QStringLiteral("(Replicate(), Shard(0)): 26/rank, pad 3"));
    QCOMPARE(partitionOf(6), QStringLiteral("late: not partitioned"));

    // blocks.0 made to keep its parameters after forward.
    st.modules[3].reshardAfterForward = "False";
    store.applyState(st);
    store.flush();
    QCOMPARE(typeOf(3),
             QStringLiteral("Block [FSDP unit: reshard_after_forward=False; mesh dp=4]"));
}

// The store's per-module lists and the tree's rows keep the state's order: a module's
// child modules first, then the parameters it owns, then those registered on it.
void TestModuleTreeModel::childrenModulesFirstInStateOrder()
{
    state::EngineState st = smallState();
    const ModuleId head = 7;
    QCOMPARE(st.modules[head].path, std::string("lm_head"));
    for (const char *name : {"proj", "out"})
        st.modules.push_back(state::ModuleRecord{static_cast<ModuleId>(st.modules.size()),
                                                 std::string("lm_head.") + name, "Linear", head});
    state::ParamRecord scale = st.params[5]; // lm_head.bias
    scale.id = 8;
    scale.name = "lm_head.scale";
    st.params.push_back(scale);
    st.params[0].externals.push_back(state::ExternalRecord{head, false});
    session::SessionStore store;
    store.applyState(st);
    const auto kids = store.childModules(head);
    QCOMPARE(std::vector<ModuleId>(kids.begin(), kids.end()), (std::vector<ModuleId>{9, 10}));
    const auto owned = store.ownedParams(head);
    QCOMPARE(std::vector<ParamId>(owned.begin(), owned.end()), (std::vector<ParamId>{5, 8}));
    QVERIFY(store.childModules(9).empty());
    QVERIFY(store.ownedParams(1'000'000).empty());
    models::ModuleTreeModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(childNames(model, model.indexForModule(head)),
             (QStringList{"proj", "out", "bias", "scale", "embed.weight  [external]"}));
    QCOMPARE(childNames(model, model.index(0, 0)),
             (QStringList{"embed", "blocks", "lm_head", "pos_conv"}));
}

// Issue #14, defect 2: the tree sized two tables by the largest parameter id (4294967294
// in a 1.5 KB file). Rows and lookups work by the parameter's place instead.
void TestModuleTreeModel::hugeParameterIdsAreNamesNotIndexes()
{
    session::SessionStore store;
    state::EngineState st = smallState();
    st.params[0].id = 4'294'967'294u; // embed.weight
    st.params[0].externals.push_back(state::ExternalRecord{7, false});
    st.params[1].id = 500'000'000;
    store.applyState(st);
    models::ModuleTreeModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    const QModelIndex embedW = model.indexForParam(4'294'967'294u);
    QVERIFY(embedW.isValid());
    QCOMPARE(embedW.data(models::ModuleTreeModel::ParamIdRole).toUInt(), 4'294'967'294u);
    QVERIFY(model.indexForParam(500'000'000).isValid());
    QVERIFY(!model.indexForParam(3'000'000'000u).isValid());
    const QModelIndex ext = model.indexForKey(QStringLiteral("e7:4294967294"));
    QVERIFY(ext.isValid());
    QCOMPARE(ext.data(models::ModuleTreeModel::KindRole).toInt(),
             int(models::ModuleTreeModel::ExternalNode));
}

void TestModuleTreeModel::filterKeepsAncestors()
{
    session::SessionStore store;
    store.applyState(smallState());
    models::ModuleTreeModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setFilterText(QStringLiteral("1.FC.B"));
    const QModelIndex root = model.index(0, 0);
    QCOMPARE(childNames(model, root), QStringList{"blocks"});
    const QModelIndex blocks = model.index(0, 0, root);
    QCOMPARE(childNames(model, blocks), QStringList{"1"});
    QCOMPARE(childNames(model, model.index(0, 0, blocks)), QStringList{"fc"});
    const QModelIndex fc = model.index(0, 0, model.index(0, 0, blocks));
    QCOMPARE(fc.data().toString(), QStringLiteral("fc"));
    QCOMPARE(childNames(model, fc), QStringList{"bias"});
    QVERIFY(!model.indexForParam(0).isValid());
    // A matching module keeps its whole subtree.
    model.setFilterText(QStringLiteral("pos_conv"));
    QCOMPARE(childNames(model, model.index(0, 0)), QStringList{"pos_conv"});
    const QModelIndex conv = model.index(0, 0, model.index(0, 0));
    QCOMPARE(childNames(model, conv), (QStringList{"weight_g  [late]", "weight_v  [late]"}));
    model.setFilterText(QStringLiteral("no such thing"));
    QCOMPARE(model.rowCount(), 0);
    model.setFilterText(QString());
    QCOMPARE(childNames(model, model.index(0, 0)).size(), 4);
}

void TestModuleTreeModel::sortsByColumn()
{
    session::SessionStore store;
    store.applyState(smallState());
    models::ModuleTreeModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.sort(models::ModuleTreeModel::Numel, Qt::DescendingOrder);
    const QModelIndex root = model.index(0, 0);
    // Modules first (by subtree numel), then parameters.
    QCOMPARE(childNames(model, root), (QStringList{"embed", "blocks", "pos_conv", "lm_head"}));
    model.sort(models::ModuleTreeModel::Name, Qt::AscendingOrder);
    QCOMPARE(childNames(model, root), (QStringList{"blocks", "embed", "lm_head", "pos_conv"}));
    const QModelIndex fc = model.indexForModule(4);
    QCOMPARE(childNames(model, fc), (QStringList{"bias", "weight"}));
}

void TestModuleTreeModel::hundredThousandParameters()
{
    session::SessionStore store;
    store.applyState(largeState(1000, 100)); // 1000 modules x 100 = 100,000 parameters
    store.flush();
    QCOMPARE(store.state().params.size(), std::size_t(100000));
    models::ModuleTreeModel model(&store);
    model.setFetchBatchSize(500);
    const QModelIndex root = model.index(0, 0);
    QCOMPARE(model.rowCount(root), 0); // lazy
    QVERIFY(model.canFetchMore(root));
    model.fetchMore(root);
    QCOMPARE(model.rowCount(root), 10); // group0..group9
    const QModelIndex g3 = model.index(3, 0, root);
    QCOMPARE(g3.data().toString(), QStringLiteral("group3"));
    model.fetchMore(g3);
    QCOMPARE(model.rowCount(g3), 100);
    const QModelIndex layer = model.index(42, 0, g3);
    QCOMPARE(layer.data().toString(), QStringLiteral("layer342"));
    QCOMPARE(model.index(42, models::ModuleTreeModel::Numel, g3).data().toString(),
             QStringLiteral("323,200"));
    model.fetchMore(layer);
    QCOMPARE(model.rowCount(layer), 100);

    // Deep lookups reveal only what they need.
    const QModelIndex p = model.indexForParam(99999);
    QVERIFY(p.isValid());
    QCOMPARE(p.data().toString(), QStringLiteral("w99"));
    QCOMPARE(p.parent().data().toString(), QStringLiteral("layer999"));

    model.setFilterText(QStringLiteral("layer777.w5"));
    QCOMPARE(model.matchingNodeCount(), 1 + 1 + 1 + 11); // root, group7, layer777, w5 + w50..w59
    const QModelIndex fr = model.index(0, 0);
    QCOMPARE(childNames(model, fr), QStringList{"group7"});
    QCOMPARE(childNames(model, model.index(0, 0, fr)), QStringList{"layer777"});
    const QModelIndex fl = model.index(0, 0, model.index(0, 0, fr));
    QCOMPARE(fl.data().toString(), QStringLiteral("layer777"));
    QCOMPARE(childNames(model, fl).size(), 11);

    // A status change on many parameters arrives as one batch.
    std::vector<telemetry::Event> evs;
    for (std::uint32_t i = 0; i < 100000; i += 7)
        evs.push_back(eventAt(i, 1, telemetry::makeFetchBegin({.param = i, .cause = 0})));
    store.appendEvents(evs, false);
    store.flush();
    QCOMPARE(store.param(77756)->status[1], ParamStatus::Inflight);
    QCOMPARE(model.index(7, 0, fl).data().toString(), QStringLiteral("w56"));
    QCOMPARE(model.index(7, models::ModuleTreeModel::Status, fl).data().toString(),
             QStringLiteral("MIXED (0/8 AVAILABLE)"));
    QCOMPARE(model.index(6, models::ModuleTreeModel::Status, fl).data().toString(),
             QStringLiteral("NOT_AVAILABLE"));
    model.setFilterText(QString());
    QCOMPARE(model.matchingNodeCount(), 1 + 10 + 1000 + 100000);
}

void TestModuleTreeModel::typingMatchesQtCaseInsensitiveContains()
{
    // Typing that extends, shortens and replaces the text, in mixed case and outside
    // ASCII: every step keeps what QString::contains(Qt::CaseInsensitive) keeps.
    state::EngineState st = largeState(300, 10);
    st.modules[5].path = "group0.Läyer4";
    st.params[7].name += ".ÄRGER";
    st.params[8].name += ".weiß";
    st.params[9].name += ".Kelvin\u212a";
    session::SessionStore store;
    store.applyState(st);
    store.flush();
    models::ModuleTreeModel model(&store);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    const QStringList typed{"L",
                            "la",
                            "LAY",
                            "laye",
                            "layer2",
                            "layer21",
                            "layer2",
                            "layer",
                            "LAYER1.W",
                            "layer1.w5",
                            "w5",
                            "group2.layer2",
                            "GROUP2.LAYER2",
                            "ä",
                            "Äy",
                            "äyer4",
                            "ärger",
                            "WEISS",
                            "WEIß",
                            "k",
                            "\u212a",
                            "kelvink",
                            "nothing",
                            "nothing here",
                            ".",
                            ""};
    for (const QString &text : typed) {
        model.setFilterText(text);
        QCOMPARE(model.matchingNodeCount(), expectedMatching(store, text));
    }
    model.setFilterText(QStringLiteral("äyer4"));
    QCOMPARE(childNames(model, model.index(0, 0)), QStringList{"group0"});
    QCOMPARE(childNames(model, model.index(0, 0, model.index(0, 0))), QStringList{"Läyer4"});
    model.setFilterText(QStringLiteral("LAYER29."));
    QCOMPARE(model.matchingNodeCount(), 1 + 1 + 1 + 10); // root, group0, layer29, its params
}

QTEST_MAIN(TestModuleTreeModel)
#include "tst_moduletreemodel.moc"

// The inspector's own views, offscreen: the tree with 100,000 parameters filters and
// selects; a violation reaches the panel and marks the tree; the detail panel shows
// the shard table and copies the fix line; the attach dialog lists live engines.

#include <QApplication>
#include <QClipboard>
#include <QCoreApplication>
#include <QDateTime>
#include <QDir>
#include <QFile>
#include <QFormLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTreeView>

#include "models/moduletreemodel.h"
#include "models/violationsmodel.h"
#include "session/labels.h"
#include "session/sessionstore.h"
#include "syntheticstate.h"
#include "views/attachdialog.h"
#include "views/moduletreeview.h"
#include "views/paramdetail.h"
#include "views/statusbar.h"
#include "views/violationspanel.h"
#include "wire/discovery.h"

using namespace shardscope;
using namespace shardscope::test;

class TestViews : public QObject
{
    Q_OBJECT
  private slots:
    void treeWithHundredThousandParameters();
    void violationReachesPanelAndTree();
    void detailShowsShardsAndCopiesFix();
    void detailShowsFsdpUnitAndPlacements();
    void detailCopiesTheSourceLocation();
    void detailBoundsLongRegistrationLists();
    void attachDialogListsLiveEngines();
    void attachDialogShowsWholeNames();
    void attachDialogNamesAJobByItsBuiltModel();
    void detailFitsItsPanel();
    void durationsReadInHumanUnits();
    void statusBarSummarises();
};

void TestViews::treeWithHundredThousandParameters()
{
    session::SessionStore store;
    store.applyState(largeState(1000, 100));
    store.flush();
    views::ModuleTreeView view(&store);
    view.resize(800, 600);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    QTreeView *tree = view.treeView();
    QVERIFY(tree->uniformRowHeights());
    QVERIFY(tree->isExpanded(view.model()->index(0, 0)));
    QCOMPARE(view.model()->rowCount(view.model()->index(0, 0)), 10);

    QSignalSpy selected(&view, &views::ModuleTreeView::paramSelected);
    view.filterEdit()->setText(QStringLiteral("layer424"));
    QTRY_COMPARE(view.model()->filterText(), QStringLiteral("layer424"));
    // Typing applied the filter (no explicit call): group4 > layer424 > its 100 params.
    QCOMPARE(view.model()->matchingNodeCount(), 1 + 1 + 1 + 100);
    QTRY_VERIFY(
        view.model()->index(0, 0, view.model()->index(0, 0)).isValid()); // opened after the reset
    const QModelIndex group = view.model()->index(0, 0, view.model()->index(0, 0));
    QCOMPARE(group.data().toString(), QStringLiteral("group4"));
    QVERIFY(tree->isExpanded(group));

    view.setFilterText(QString());
    view.selectParams({99999});
    QCOMPARE(selected.count(), 1);
    QCOMPARE(selected.last().at(0).toUInt(), 99999u);
    QCOMPARE(tree->currentIndex().data().toString(), QStringLiteral("w99"));
    QVERIFY(tree->isExpanded(tree->currentIndex().parent()));
    QCOMPARE(view.selectedParams(), QList<quint32>{99999});
}

void TestViews::violationReachesPanelAndTree()
{
    session::SessionStore store;
    store.applyState(smallState());
    views::ModuleTreeView tree(&store);
    views::ViolationsPanel panel(&store);
    panel.resize(900, 300);
    panel.show();
    QObject::connect(&panel, &views::ViolationsPanel::paramSelected, &tree,
                     [&](quint32 id) { tree.selectParams({id}); });
    store.flush();
    QCOMPARE(panel.model()->rowCount(), 0);

    store.appendEvents(std::vector<telemetry::Event>{lmHeadViolation(100, 0)}, false);
    // Within the store's refresh interval (33 ms) the row is there: no flush by hand.
    QTRY_COMPARE_WITH_TIMEOUT(panel.model()->rowCount(), 1, 1000);
    const QModelIndex embedW = tree.model()->indexForParam(0);
    QCOMPARE(tree.model()
                 ->index(embedW.row(), models::ModuleTreeModel::Violations, embedW.parent())
                 .data()
                 .toString(),
             QStringLiteral("1"));
    const QModelIndex head = tree.model()->indexForModule(7);
    QCOMPARE(tree.model()
                 ->index(head.row(), models::ModuleTreeModel::Violations, head.parent())
                 .data()
                 .toString(),
             QStringLiteral("1"));

    panel.selectRow(0);
    QCOMPARE(panel.currentFix(),
             QStringLiteral("register_external_parameter(lm_head, embed.weight)"));
    QCOMPARE(tree.treeView()->currentIndex().data(models::ModuleTreeModel::ParamIdRole).toUInt(),
             0u);
    auto *copy = panel.findChild<QPushButton *>(QStringLiteral("copyFix"));
    QVERIFY(copy && copy->isEnabled());
    QSignalSpy copied(&panel, &views::ViolationsPanel::fixCopied);
    copy->click();
    QCOMPARE(copied.count(), 1);
    QCOMPARE(QApplication::clipboard()->text(),
             QStringLiteral("register_external_parameter(lm_head, embed.weight)"));

    // Names elided in the middle (both ends kept), whole in the tooltip and on copy.
    QTableView *table = panel.tableView();
    QCOMPARE(table->textElideMode(), Qt::ElideMiddle);
    QVERIFY(!table->wordWrap()); // with wrapping on, Qt elides a cell's last line at the right
    QCOMPARE(tree.treeView()->textElideMode(), Qt::ElideMiddle);
    const QString longName = QStringLiteral("encoder.block.11.layer.1.DenseReluDense.wo.weight");
    const QString shown = table->fontMetrics().elidedText(longName, table->textElideMode(), 120);
    QVERIFY(shown.startsWith(QStringLiteral("enc")) && shown.endsWith(QStringLiteral("ight")));
    QVERIFY(shown.size() < longName.size());
    const int row = table->currentIndex().row();
    const QModelIndex param = table->model()->index(row, models::ViolationsModel::Parameter);
    QVERIFY(param.data(Qt::ToolTipRole).toString().startsWith(QStringLiteral("embed.weight\n")));
    const QModelIndex accessor = table->model()->index(row, models::ViolationsModel::Accessor);
    QVERIFY(accessor.data(Qt::ToolTipRole).toString().startsWith(QStringLiteral("lm_head\n")));
    QApplication::clipboard()->clear();
    table->setFocus();
    QTest::keySequence(table, QKeySequence::Copy);
    const QStringList cells = QApplication::clipboard()->text().split(QLatin1Char('\t'));
    QCOMPARE(cells.size(), table->model()->columnCount());
    QCOMPARE(cells.at(models::ViolationsModel::Parameter), QStringLiteral("embed.weight"));
    QCOMPARE(cells.at(models::ViolationsModel::Accessor), QStringLiteral("lm_head"));
    QCOMPARE(QApplication::clipboard()->text(), panel.currentRowText());
}

// Issue #14, defect 1: one label with every registration of a parameter registered on
// 10^6 modules froze the window in layout; the panel names the first 20 and counts the rest.
void TestViews::detailBoundsLongRegistrationLists()
{
    constexpr std::size_t kExtra = 100'000;
    session::SessionStore store;
    state::EngineState st = smallState(4);
    for (std::size_t i = 0; i < kExtra; ++i) {
        const auto id = static_cast<ModuleId>(st.modules.size());
        st.modules.push_back({id, "x." + std::to_string(i), "Linear", 0});
        st.params[0].externals.push_back(state::ExternalRecord{id, false});
        st.params[0].activeModules.push_back(id);
    }
    store.applyState(st);
    store.flush();
    views::ParamDetail detail(&store);
    detail.showParam(0);
    const QString regs = detail.field(QStringLiteral("registered on"));
    QVERIFY2(regs.startsWith(QStringLiteral("x.0 (manual), x.1 (manual), ")),
             qPrintable(regs.left(200)));
    QVERIFY2(regs.endsWith(QStringLiteral("x.19 (manual) \u2026 and 99980 more")),
             qPrintable(regs.right(200)));
    QCOMPARE(regs.count(QStringLiteral("(manual)")), 20);
    const QString active = detail.field(QStringLiteral("active modules"));
    QCOMPARE(active.count(QStringLiteral("x.")), 20);
    QVERIFY2(active.endsWith(QStringLiteral("and 99980 more")), qPrintable(active.right(100)));
}

// A violation's source location in the parameter's detail: shown as file:line in function,
// the user's frames above it in the tooltip, and copied as file:line.
void TestViews::detailCopiesTheSourceLocation()
{
    session::SessionStore store;
    state::EngineState st = smallState(4);
    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.accessor = 7;
    v.param = 0;
    v.owner = 1;
    v.step = v.lastStep = 1;
    v.count = 1;
    v.tsNs = 100;
    v.fix = "register_external_parameter(lm_head, embed.weight)";
    v.message = "module `lm_head` read `embed.weight`";
    v.location = {"/src/model.py",
                  48,
                  "t5_model_class.<locals>.T5WithSampledInput.Head.forward",
                  {"/src/train.py:9 in main"}};
    st.violations = {v};
    store.applyState(st);
    store.flush();
    views::ParamDetail detail(&store);
    detail.showParam(0);
    auto *at = detail.findChild<QLabel *>(QStringLiteral("location"));
    QVERIFY(at);
    const QString shown = QString(at->text()).remove(QChar(0x200B));
    QVERIFY2(shown.contains(
                 QStringLiteral("48 in t5_model_class.<locals>.T5WithSampledInput.Head.forward")),
             qPrintable(shown));
    // A long function name wraps at its dots: the panel's content never needs more width than
    // a narrow dock gives it (it was cut at the right edge, the panel scrolling only down).
    auto *scroll = detail.findChild<QScrollArea *>();
    QVERIFY(scroll && scroll->widget());
    QVERIFY2(scroll->widget()->minimumSizeHint().width() < 300,
             qPrintable(QString::number(scroll->widget()->minimumSizeHint().width())));
    QVERIFY(at->toolTip().contains(QStringLiteral("from /src/train.py:9 in main")));
    auto *copy = detail.findChild<QPushButton *>(QStringLiteral("copyLocation"));
    QVERIFY(copy);
    copy->click();
    QCOMPARE(QApplication::clipboard()->text(), QStringLiteral("/src/model.py:48"));
}

void TestViews::detailShowsShardsAndCopiesFix()
{
    session::SessionStore store;
    state::EngineState st = smallState(4);
    st.params[0].externals.push_back(state::ExternalRecord{7, true});
    store.applyState(st);
    store.appendEvents(
        std::vector<telemetry::Event>{
            eventAt(10, 2, telemetry::makeFetchBegin({.param = 0, .cause = 0})),
            eventAt(20, 2, telemetry::makeFetchEnd({.param = 0, .cause = 0, .bytes = 6464})),
            lmHeadViolation(30, 1)},
        false);
    store.flush();
    views::ParamDetail detail(&store);
    detail.showParam(0); // embed.weight: 101 x 16 = 1616 over 4 ranks: 404 each, no padding
    QCOMPARE(detail.field(QStringLiteral("owner")), QStringLiteral("embed (Embedding)"));
    QVERIFY(detail.field(QStringLiteral("FSDP unit")).isEmpty()); // not an FSDP2 run
    QVERIFY(detail.field(QStringLiteral("placements")).isEmpty());
    QCOMPARE(detail.field(QStringLiteral("shape")), QStringLiteral("[101, 16]"));
    QCOMPARE(detail.field(QStringLiteral("numel")), QStringLiteral("1,616"));
    QCOMPARE(detail.field(QStringLiteral("partition numel")), QStringLiteral("404"));
    QCOMPARE(detail.field(QStringLiteral("registered on")), QStringLiteral("lm_head (auto)"));
    QCOMPARE(detail.field(QStringLiteral("gathers")), QStringLiteral("1"));
    QTableWidget *t = detail.shardTable();
    QCOMPARE(t->rowCount(), 4);
    QCOMPARE(t->item(3, 1)->text(), QStringLiteral("1,212"));
    QCOMPARE(t->item(3, 2)->text(), QStringLiteral("404"));
    QCOMPARE(t->item(2, 4)->text(), QStringLiteral("AVAILABLE"));
    QCOMPARE(t->item(1, 4)->text(), QStringLiteral("NOT_AVAILABLE"));
    QCOMPARE(detail.fixLines(), QStringList{"register_external_parameter(lm_head, embed.weight)"});

    detail.showParam(
        5); // lm_head.bias: 101 over 4 ranks -> padded 104, 26 each, 3 padding on rank 3
    QCOMPARE(t->item(3, 3)->text(), QStringLiteral("3"));
    QCOMPARE(t->item(3, 1)->text(), QStringLiteral("78"));
    QCOMPARE(t->item(0, 3)->text(), QStringLiteral("0"));
    QVERIFY(detail.fixLines().isEmpty());

    detail.showParam(0);
    auto *copy = detail.findChild<QPushButton *>(QStringLiteral("copyFix"));
    QVERIFY(copy);
    copy->click();
    QCOMPARE(QApplication::clipboard()->text(),
             QStringLiteral("register_external_parameter(lm_head, embed.weight)"));

    // Live: the status column follows events without re-selecting.
    store.appendEvents(std::vector<telemetry::Event>{eventAt(
                           40, 2, telemetry::makeRelease({.param = 0, .cause = 0}))},
                       false);
    store.flush();
    QCOMPARE(t->item(2, 4)->text(), QStringLiteral("NOT_AVAILABLE"));
}

// FSDP2's unit and placements get rows of their own, shown only for an FSDP2 parameter.
void TestViews::detailShowsFsdpUnitAndPlacements()
{
    session::SessionStore store;
    store.applyState(fsdpState(4));
    store.flush();
    views::ParamDetail detail(&store);
    auto *form = detail.findChild<QFormLayout *>();
    QVERIFY(form);
    auto rowVisible = [&](const QString &name) {
        for (int r = 0; r < form->rowCount(); ++r) {
            QLayoutItem *item = form->itemAt(r, QFormLayout::LabelRole);
            auto *label = item ? qobject_cast<QLabel *>(item->widget()) : nullptr;
            if (label && label->text() == name + QLatin1Char(':')) return form->isRowVisible(r);
        }
        return false;
    };
    detail.showParam(5); // lm_head.bias, in embed's group
    QCOMPARE(detail.field(QStringLiteral("FSDP unit")),
             QStringLiteral("reshard_after_forward=2; mesh dp=4; grouped with embed"));
    QCOMPARE(detail.field(QStringLiteral("placements")), QStringLiteral("(Replicate(), Shard(0))"));
    QVERIFY(rowVisible(QStringLiteral("FSDP unit")));
    QVERIFY(rowVisible(QStringLiteral("placements")));
    detail.showParam(6); // pos_conv.weight_g: late, in no unit
    QVERIFY(!rowVisible(QStringLiteral("FSDP unit")));
    QVERIFY(!rowVisible(QStringLiteral("placements")));
    QVERIFY(rowVisible(QStringLiteral("owner")));
    store.applyState(smallState(4)); // another run: not FSDP2
    store.flush();
    detail.showParam(5);
    QVERIFY(!rowVisible(QStringLiteral("placements")));

    // FSDP2's dim-0 padding in the shard table: 33 x 16 on 2 ranks, 17 rows a rank.
    state::EngineState two = fsdpState(2);
    two.params[0].shape = {33, 16};
    two.params[0].numel = 528;
    two.params[0].paddedNumel = 544;
    two.params[0].partitionNumel = 272;
    store.applyState(two);
    store.flush();
    detail.showParam(0);
    QTableWidget *t = detail.shardTable();
    QCOMPARE(t->rowCount(), 2);
    QCOMPARE(t->item(1, 1)->text(), QStringLiteral("272")); // offset
    QCOMPARE(t->item(1, 2)->text(), QStringLiteral("272")); // length
    QCOMPARE(t->item(1, 3)->text(), QStringLiteral("16"));  // padding
}

void TestViews::attachDialogListsLiveEngines()
{
    QTemporaryDir dir;
    wire::DiscoveryEntry e;
    e.pid = QCoreApplication::applicationPid(); // alive: this test
    e.endpoint = "tcp:127.0.0.1:45678";
    e.model = "tiny-lm";
    e.worldSize = 4;
    e.backend = "cpu";
    e.startUnixMs = static_cast<std::uint64_t>(QDateTime::currentMSecsSinceEpoch()) - 75000;
    views::AttachDialog dialog(dir.path());
    QCOMPARE(dialog.engineCount(), 0);
    {
        QFile f(QString::fromStdString(wire::discoveryFilePath(dir.path().toStdString(), e.pid)));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QByteArray::fromStdString(wire::encodeDiscovery(e)));
    }
    // A stale file of a dead process is ignored.
    {
        wire::DiscoveryEntry dead = e;
        dead.pid = 0x7ffffff0;
        QFile f(
            QString::fromStdString(wire::discoveryFilePath(dir.path().toStdString(), dead.pid)));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QByteArray::fromStdString(wire::encodeDiscovery(dead)));
    }
    QTRY_COMPARE_WITH_TIMEOUT(dialog.engineCount(), 1, 3000); // refreshed live
    QTableWidget *t = dialog.enginesTable();
    QCOMPARE(t->item(0, 0)->text(), QString::number(e.pid));
    QCOMPARE(t->item(0, 1)->text(), QStringLiteral("tiny-lm"));
    QCOMPARE(t->item(0, 2)->text(), QStringLiteral("4"));
    QCOMPARE(t->item(0, 3)->text(), QStringLiteral("cpu"));
    QVERIFY(t->item(0, 4)->text().startsWith(QStringLiteral("1 min")));
    t->selectRow(0);
    QCOMPARE(dialog.endpoint(), QStringLiteral("tcp:127.0.0.1:45678"));
}

void TestViews::attachDialogShowsWholeNames()
{
    QTemporaryDir dir;
    wire::DiscoveryEntry e;
    e.pid = QCoreApplication::applicationPid();
    e.endpoint = "unix:/run/user/1000/shardscope/123456.sock";
    e.model = "shardscope-train lm (2 blocks, hidden 64, vocab 97)";
    e.worldSize = 4;
    e.backend = "cpu";
    e.startUnixMs = static_cast<std::uint64_t>(QDateTime::currentMSecsSinceEpoch());
    {
        QFile f(QString::fromStdString(wire::discoveryFilePath(dir.path().toStdString(), e.pid)));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QByteArray::fromStdString(wire::encodeDiscovery(e)));
    }
    views::AttachDialog dialog(dir.path());
    dialog.show();
    QVERIFY(QTest::qWaitForWindowExposed(&dialog));
    QCOMPARE(dialog.engineCount(), 1);
    QTableWidget *t = dialog.enginesTable();
    const QFontMetrics fm(t->font());
    // The whole name fits its column, and every column fits the table's visible width.
    QVERIFY(t->columnWidth(1) >= fm.horizontalAdvance(QString::fromStdString(e.model)));
    QVERIFY2(t->horizontalHeader()->length() <= t->viewport()->width(),
             qPrintable(QStringLiteral("%1 > %2")
                            .arg(t->horizontalHeader()->length())
                            .arg(t->viewport()->width())));
    // The only run is picked: Enter attaches to it.
    QCOMPARE(dialog.endpoint(), QString::fromStdString(e.endpoint));
}

// Issue #49, defect 8: a job whose rank 0 is still building the model (its provisional name)
// and whose rank 1 is past it: the job's row names the model rank 1 built, each process's row
// its own name.
void TestViews::attachDialogNamesAJobByItsBuiltModel()
{
    QTemporaryDir dir;
    const QString building = QStringLiteral(
        "(model not sharded yet: shown once fully_shard's root runs its first forward or "
        "attach(model))");
    for (int rank : {0, 1}) {
        wire::DiscoveryEntry e;
        e.pid = QCoreApplication::applicationPid();
        e.endpoint = "unix:/run/user/1000/shardscope/r" + std::to_string(rank) + ".sock";
        e.model = rank == 0 ? building.toStdString() : "T5ForConditionalGeneration";
        e.worldSize = 2;
        e.backend = "gloo";
        e.job.id = "t5";
        e.job.ranks = {rank};
        e.job.worldSize = 2;
        QFile f(dir.filePath(QStringLiteral("r%1.json").arg(rank)));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QByteArray::fromStdString(wire::encodeDiscovery(e)));
    }
    views::AttachDialog dialog(dir.path());
    QTRY_COMPARE_WITH_TIMEOUT(dialog.engineCount(), 2, 3000);
    QTableWidget *t = dialog.enginesTable();
    QCOMPARE(t->rowCount(), 3);
    QCOMPARE(t->item(0, 5)->text(), QStringLiteral("job:t5"));
    QCOMPARE(t->item(0, 1)->text(), QStringLiteral("T5ForConditionalGeneration"));
    QCOMPARE(t->item(1, 1)->text(), building);
    QCOMPARE(t->item(2, 1)->text(), QStringLiteral("T5ForConditionalGeneration"));
}

// At the dock's default width (340 px) nothing runs past the right edge: text wraps (even
// dotted names and the fix line), the shard table's columns fit, and the panel never
// scrolls sideways.
void TestViews::detailFitsItsPanel()
{
    session::SessionStore store;
    state::EngineState st = smallState(4);
    st.params[0].gatherNs = 43'524'620'000;
    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.accessor = 7;
    v.param = 0;
    v.owner = 1;
    v.count = 200;
    v.tsNs = 5;
    v.message = "module `decoder.layers.3.self_attn.out_proj` read `decoder.embed_tokens.weight` "
                "owned by `decoder.embed_tokens` while it was NOT_AVAILABLE on rank 2; call "
                "register_external_parameter(decoder.layers.3.self_attn.out_proj, "
                "decoder.embed_tokens.weight)";
    v.fix = "register_external_parameter(decoder.layers.3.self_attn.out_proj, "
            "decoder.embed_tokens.weight)";
    st.violations = {v};
    store.applyState(st);
    store.flush();
    views::ParamDetail detail(&store);
    detail.resize(340, 700);
    detail.show();
    QVERIFY(QTest::qWaitForWindowExposed(&detail));
    detail.showParam(0);
    QApplication::processEvents();
    QCOMPARE(detail.field(QStringLiteral("gather time")), QStringLiteral("43.52 s"));
    QCOMPARE(detail.fixLines(), QStringList{QString::fromStdString(v.fix)});

    auto *scroll = detail.findChild<QScrollArea *>();
    QVERIFY(scroll);
    QWidget *viewport = scroll->viewport();
    QVERIFY(!scroll->horizontalScrollBar()->isVisible());
    QVERIFY2(scroll->widget()->width() <= viewport->width(),
             qPrintable(
                 QStringLiteral("%1 > %2").arg(scroll->widget()->width()).arg(viewport->width())));
    for (QLabel *label : scroll->widget()->findChildren<QLabel *>()) {
        if (!label->isVisible() || label->text().isEmpty()) continue;
        const QRect r(label->mapTo(viewport, QPoint(0, 0)), label->size());
        QVERIFY2(r.right() <= viewport->width(), qPrintable(label->text()));
        // Wrapped, not clipped: the label is as tall as its text at its width.
        if (label->wordWrap())
            QVERIFY2(label->height() >= label->heightForWidth(label->width()),
                     qPrintable(label->text()));
    }
    QTableWidget *t = detail.shardTable();
    QVERIFY2(t->horizontalHeader()->length() <= t->viewport()->width(),
             qPrintable(QStringLiteral("%1 > %2")
                            .arg(t->horizontalHeader()->length())
                            .arg(t->viewport()->width())));
    // Four ranks: every row shown, no scrolling inside the table.
    QVERIFY(!t->verticalScrollBar()->isVisible());
}

void TestViews::durationsReadInHumanUnits()
{
    QCOMPARE(session::labels::duration(850), QStringLiteral("850 ns"));
    QCOMPARE(session::labels::duration(12'400), QStringLiteral("12.4 µs"));
    QCOMPARE(session::labels::duration(1'500), QStringLiteral("1.50 µs"));
    QCOMPARE(session::labels::duration(874'660'000), QStringLiteral("874.7 ms"));
    QCOMPARE(session::labels::duration(43'524'620'000), QStringLiteral("43.52 s"));
    QCOMPARE(session::labels::duration(725'000'000'000), QStringLiteral("12 min 5 s"));
    QCOMPARE(session::labels::duration(7'380'000'000'000), QStringLiteral("2 h 3 min"));
    QCOMPARE(session::labels::breakable(QStringLiteral("a.b_c")),
             QStringLiteral("a.\u200Bb_\u200Bc"));
}

void TestViews::statusBarSummarises()
{
    session::SessionStore store;
    views::InspectorStatusBar bar(&store);
    store.applyState(smallState());
    store.appendEvents(
        std::vector<telemetry::Event>{eventAt(1, 0, telemetry::makeStepBegin(), 7),
                                      eventAt(2, 0, telemetry::makeStepEnd(3.5), 7),
                                      eventAt(3, 0, telemetry::makeDroppedEvents(12))},
        false);
    store.flush();
    QCOMPARE(bar.summaryText(), QStringLiteral("world 4 · cpu · step 7 · loss 3.5000"));
    QCOMPARE(bar.droppedText(), QStringLiteral("dropped 12"));
    bar.setConnection(QStringLiteral("connection lost"), false);
    QCOMPARE(bar.connectionText(), QStringLiteral("connection lost"));
}

QTEST_MAIN(TestViews)
#include "tst_views.moc"

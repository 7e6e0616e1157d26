// The Selection panel's model: rows heaviest first, numbers sorted as numbers, the table
// copied whole; checked by QAbstractItemModelTester through resets.

#include <QAbstractItemModelTester>
#include <QTest>

#include "models/rangesummarymodel.h"

using namespace shardscope;

class TestRangeSummaryModel : public QObject
{
    Q_OBJECT
  private slots:
    void rowsHeaviestFirstUnderTester();
};

void TestRangeSummaryModel::rowsHeaviestFirstUnderTester()
{
    models::RangeSummaryModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model.rowCount(), 0);
    const QString longName = QStringLiteral("encoder.block.11.layer.1.DenseReluDense.wo.weight");
    model.setRows({{false, 4, longName, 3, 0.002, 3000},
                   {true, 1, QStringLiteral("encoder"), 10, 0.009, 9000},
                   {false, 5, QStringLiteral("lm_head.weight"), 1, 0.005, 100}},
                  1.5, 2.5);
    QCOMPARE(model.rowCount(), 3);
    QCOMPARE(model.columnCount(), int(models::RangeSummaryModel::ColumnCount));
    QCOMPARE(model.index(0, models::RangeSummaryModel::Name).data().toString(),
             QStringLiteral("encoder"));
    QCOMPARE(model.index(0, models::RangeSummaryModel::What).data().toString(),
             QStringLiteral("module"));
    QCOMPARE(model.index(0, 0).data(models::RangeSummaryModel::IsModuleRole).toBool(), true);
    QCOMPARE(model.index(1, 0).data(models::RangeSummaryModel::IdRole).toUInt(), 5u);
    QCOMPARE(model.index(2, models::RangeSummaryModel::Time).data().toString(),
             QStringLiteral("2.000"));
    QCOMPARE(model.index(2, models::RangeSummaryModel::Time)
                 .data(models::RangeSummaryModel::SortRole)
                 .toDouble(),
             0.002);
    QCOMPARE(model.index(2, models::RangeSummaryModel::Name).data(Qt::ToolTipRole).toString(),
             longName);
    QCOMPARE(model.rangeStart(), 1.5);
    const QStringList lines = model.toTsv().split(QLatin1Char('\n'));
    QCOMPARE(lines.size(), 4);
    QCOMPARE(lines.at(0), QStringLiteral("what\tname\tgathers\ttime_ms\tbytes"));
    QCOMPARE(lines.at(3), QStringLiteral("parameter\t%1\t3\t2.000\t3000").arg(longName));
    model.setRows({}, 0, 0);
    QCOMPARE(model.rowCount(), 0);
}

QTEST_GUILESS_MAIN(TestRangeSummaryModel)
#include "tst_rangesummarymodel.moc"

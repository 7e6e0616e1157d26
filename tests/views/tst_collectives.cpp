// The Collectives dock (issue 51, views/collectivespanel.h) and its models over a recorded
// job whose ranks diverged (tests/support/divergedjob.h): where each rank is, the diagnosis
// and the stragglers; both models pass QAbstractItemModelTester while their rows change.

#include <QAbstractItemModelTester>
#include <QLabel>
#include <QTableView>
#include <QTest>

#include "divergedjob.h"
#include "models/collectivesmodel.h"
#include "session/sessionstore.h"
#include "sessioncore/store.h"
#include "views/collectivespanel.h"

using namespace shardscope;

class TestCollectives : public QObject
{
    Q_OBJECT
  private slots:
    void modelsPassTheTesterWhileRowsChange()
    {
        models::RankProgressModel progress;
        models::StragglerModel stragglers;
        QAbstractItemModelTester t1(&progress,
                                    QAbstractItemModelTester::FailureReportingMode::QtTest);
        QAbstractItemModelTester t2(&stragglers,
                                    QAbstractItemModelTester::FailureReportingMode::QtTest);
        std::vector<sessioncore::RankProgress> rows(3);
        for (int r = 0; r < 3; ++r) {
            rows[std::size_t(r)].rank = r;
            rows[std::size_t(r)].present = true;
            rows[std::size_t(r)].seq = std::uint64_t(10 + r);
        }
        rows[2].inFlight = true;
        rows[2].sinceNs = 1'000'000'000;
        progress.setProgress(rows, 3'500'000'000);
        QCOMPARE(progress.rowCount(), 3);
        QCOMPARE(progress.index(2, models::RankProgressModel::Where).data().toString(),
                 QStringLiteral("waiting"));
        QCOMPARE(progress.index(2, models::RankProgressModel::Since).data().toString(),
                 QStringLiteral("2.50 s"));
        rows[2].stalled = true;
        progress.setProgress(rows, 4'000'000'000); // the same ranks: changed in place
        QCOMPARE(progress.index(2, models::RankProgressModel::Where).data().toString(),
                 QStringLiteral("stalled"));
        QVERIFY(progress.index(2, 0).data(models::RankProgressModel::ProblemRole).toBool());
        rows.pop_back();
        progress.setProgress(rows, 0); // fewer ranks: reset
        QCOMPARE(progress.rowCount(), 2);
        progress.setProgress({}, 0);
        QCOMPARE(progress.rowCount(), 0);

        sessioncore::StragglerSummary s;
        s.collectives = 4;
        s.totalSpreadNs = 8'000'000;
        s.maxSpreadNs = 5'000'000;
        s.ranks = {{0, 4, 0, 0, 0}, {1, 4, 3, 6'000'000, 5'000'000}};
        stragglers.setSummary(s);
        QCOMPARE(stragglers.rowCount(), 2);
        QCOMPARE(stragglers.index(1, models::StragglerModel::TimesLast).data().toString(),
                 QStringLiteral("3"));
        QVERIFY2(stragglers.summaryText().contains(QStringLiteral("the latest: rank 1 (")),
                 qPrintable(stragglers.summaryText()));
        stragglers.setSummary({});
        QCOMPARE(stragglers.rowCount(), 0);
    }

    // The recorded job, loaded as a file is: rank 0 waits in #6 at its line, rank 1 ended
    // after #5; the diagnosis names both and says what to change; rank 1 came last each time.
    void aRecordedJobShowsWhereEachRankIs()
    {
        qputenv("SHARDSCOPE_STALL_SECONDS", "5");
        session::SessionStore store;
        sessioncore::loadSnapshot(store.core(), test::divergedJob(), "diverged.json");
        views::CollectivesPanel panel(&store);
        panel.show();
        panel.refresh();
        const models::RankProgressModel *m = panel.progressModel();
        QAbstractItemModelTester tester(const_cast<models::RankProgressModel *>(m),
                                        QAbstractItemModelTester::FailureReportingMode::QtTest);
        QCOMPARE(m->rowCount(), 2);
        const auto cell = [m](int row, int column) {
            return m->index(row, column).data().toString();
        };
        QCOMPARE(cell(0, models::RankProgressModel::Where), QStringLiteral("stalled"));
        QCOMPARE(cell(0, models::RankProgressModel::Collective), QStringLiteral("#6"));
        QCOMPARE(cell(0, models::RankProgressModel::Kind), QStringLiteral("all_gather"));
        QCOMPARE(cell(0, models::RankProgressModel::Module), QStringLiteral("embed"));
        QCOMPARE(cell(0, models::RankProgressModel::Reason), QStringLiteral("forward"));
        QCOMPARE(cell(0, models::RankProgressModel::Line),
                 QStringLiteral("train.py:%1").arg(test::kDivergedLine));
        QCOMPARE(cell(1, models::RankProgressModel::Where), QStringLiteral("ended"));
        QCOMPARE(cell(1, models::RankProgressModel::Collective), QStringLiteral("#5"));
        QVERIFY(m->index(0, 0).data(models::RankProgressModel::ProblemRole).toBool());
        QVERIFY(!m->index(1, 0).data(models::RankProgressModel::ProblemRole).toBool());

        const QString diagnosis = panel.diagnosisShown();
        QVERIFY2(diagnosis.contains(QStringLiteral("rank 0")) &&
                     diagnosis.contains(QStringLiteral("rank 1")) &&
                     diagnosis.contains(QStringLiteral("train.py:%1").arg(test::kDivergedLine)) &&
                     diagnosis.contains(QStringLiteral("Fix: ")),
                 qPrintable(diagnosis));
        QCOMPARE(diagnosis, views::CollectivesPanel::diagnosisText(store));

        const models::StragglerModel *s = panel.stragglerModel();
        QCOMPARE(s->summary().collectives, std::uint64_t(5));
        QCOMPARE(s->rowCount(), 2);
        QCOMPARE(s->index(1, models::StragglerModel::TimesLast).data().toString(),
                 QStringLiteral("5"));
        QVERIFY2(panel.stragglerSummaryShown().contains(QStringLiteral("the latest: rank 1 (")),
                 qPrintable(panel.stragglerSummaryShown()));
        qunsetenv("SHARDSCOPE_STALL_SECONDS");
    }

    // A healthy job: no diagnosis shown.
    void aHealthyJobShowsNoDiagnosis()
    {
        wire::Snapshot job = test::divergedJob();
        job.events.pop_back();        // rank 0's extra all-gather
        job.state.violations.clear(); // and its watchdog's record
        session::SessionStore store;
        sessioncore::loadSnapshot(store.core(), job, "healthy.json");
        views::CollectivesPanel panel(&store);
        panel.show();
        panel.refresh();
        QCOMPARE(panel.diagnosisShown(), QString());
        QCOMPARE(views::CollectivesPanel::diagnosis(store), nullptr);
        QCOMPARE(
            panel.progressModel()->index(0, models::RankProgressModel::Where).data().toString(),
            QStringLiteral("ended"));
    }
};

QTEST_MAIN(TestCollectives)
#include "tst_collectives.moc"

#pragma once
// The job's collectives (issue 51): the diagnosis of a divergence or a stall (the aligner's
// collective_mismatch and rank_stalled records, words from state/violationtext), where each
// rank is in its sequence of collectives (the diverged and stalled ranks marked, each with its
// line), and the stragglers: who arrives last at the collectives every rank completed. Reads
// the session store's aligner (sessioncore/collectivealigner.h) on refresh().

#include <cstdint>

#include <QWidget>

class QLabel;
class QTableView;

namespace shardscope::session {
class SessionStore;
} // namespace shardscope::session
namespace shardscope::models {
class RankProgressModel;
class StragglerModel;
} // namespace shardscope::models
namespace shardscope::state {
struct ViolationRow;
} // namespace shardscope::state

namespace shardscope::views {

class CollectivesPanel : public QWidget
{
    Q_OBJECT
  public:
    explicit CollectivesPanel(session::SessionStore *store, QWidget *parent = nullptr);

    // Reads the store's aligner again; nowNs: the events' clock now (0: the store's last event).
    void refresh(std::uint64_t nowNs = 0);
    // The record a banner should show: the job's first collective_mismatch, else its first
    // rank_stalled that names more than one side (the waiting and the missing ranks), else a
    // rank's own rank_stalled; nullptr when the job's collectives are in order.
    static const state::ViolationRow *diagnosis(const session::SessionStore &store);
    // Its message and fix as the banner words them ("" without one).
    static QString diagnosisText(const session::SessionStore &store);

    models::RankProgressModel *progressModel() const { return m_progress; }
    models::StragglerModel *stragglerModel() const { return m_stragglers; }
    QTableView *progressView() const { return m_progressView; }
    QString diagnosisShown() const;
    QString stragglerSummaryShown() const;

  private:
    session::SessionStore *m_store;
    models::RankProgressModel *m_progress;
    models::StragglerModel *m_stragglers;
    QLabel *m_diagnosis;
    QTableView *m_progressView;
    QLabel *m_stragglerSummary;
    QTableView *m_stragglerView;
};

} // namespace shardscope::views

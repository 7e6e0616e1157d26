#include "views/collectivespanel.h"

#include <QHeaderView>
#include <QLabel>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QVBoxLayout>

#include "models/collectivesmodel.h"
#include "session/sessionstore.h"

namespace shardscope::views {

namespace {

QTableView *tableOver(QAbstractItemModel *model, int sortRole, QWidget *parent)
{
    auto *proxy = new QSortFilterProxyModel(parent);
    proxy->setSourceModel(model);
    proxy->setSortRole(sortRole);
    auto *view = new QTableView(parent);
    view->setModel(proxy);
    view->setSortingEnabled(true);
    view->sortByColumn(0, Qt::AscendingOrder);
    view->setSelectionBehavior(QAbstractItemView::SelectRows);
    view->setEditTriggers(QAbstractItemView::NoEditTriggers);
    view->verticalHeader()->setVisible(false);
    view->horizontalHeader()->setStretchLastSection(true);
    view->setWordWrap(false);
    return view;
}

} // namespace

CollectivesPanel::CollectivesPanel(session::SessionStore *store, QWidget *parent)
    : QWidget(parent), m_store(store), m_progress(new models::RankProgressModel(this)),
      m_stragglers(new models::StragglerModel(this)), m_diagnosis(new QLabel(this)),
      m_progressView(tableOver(m_progress, models::RankProgressModel::SortRole, this)),
      m_stragglerSummary(new QLabel(this)),
      m_stragglerView(tableOver(m_stragglers, models::StragglerModel::SortRole, this))
{
    m_diagnosis->setObjectName(QStringLiteral("collectiveDiagnosis"));
    m_diagnosis->setWordWrap(true);
    m_diagnosis->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_diagnosis->setVisible(false);
    m_stragglerSummary->setObjectName(QStringLiteral("stragglerSummary"));
    m_stragglerSummary->setWordWrap(true);
    m_progressView->setObjectName(QStringLiteral("rankProgress"));
    m_stragglerView->setObjectName(QStringLiteral("stragglers"));
    auto *layout = new QVBoxLayout(this);
    layout->setContentsMargins(2, 2, 2, 2);
    layout->addWidget(m_diagnosis);
    layout->addWidget(new QLabel(tr("Where each rank is in its collectives"), this));
    layout->addWidget(m_progressView, 3);
    layout->addWidget(new QLabel(tr("Stragglers"), this));
    layout->addWidget(m_stragglerSummary);
    layout->addWidget(m_stragglerView, 2);
    refresh();
}

const state::ViolationRow *CollectivesPanel::diagnosis(const session::SessionStore &store)
{
    const state::ViolationRow *stalled = nullptr, *own = nullptr;
    for (const state::ViolationRow &row : store.violationGroups()) {
        if (row.kind == ViolationKind::CollectiveMismatch) return &row;
        if (row.kind != ViolationKind::RankStalled) continue;
        if (row.collective.sides.size() > 1) {
            if (!stalled) stalled = &row;
        } else if (!own) {
            own = &row;
        }
    }
    return stalled ? stalled : own;
}

QString CollectivesPanel::diagnosisText(const session::SessionStore &store)
{
    const state::ViolationRow *row = diagnosis(store);
    if (!row) return {};
    QString text = QString::fromStdString(row->message);
    if (!row->fix.empty()) text += tr("\nFix: ") + QString::fromStdString(row->fix);
    return text;
}

void CollectivesPanel::refresh(std::uint64_t nowNs)
{
    const sessioncore::Store &core = m_store->core();
    m_progress->setProgress(core.collectiveProgress(), nowNs ? nowNs : core.lastTs());
    m_stragglers->setSummary(core.stragglers());
    m_stragglerSummary->setText(m_stragglers->summaryText());
    const QString text = diagnosisText(*m_store);
    m_diagnosis->setText(text);
    m_diagnosis->setVisible(!text.isEmpty());
}

QString CollectivesPanel::diagnosisShown() const
{
    return m_diagnosis->isVisibleTo(this) ? m_diagnosis->text() : QString();
}

QString CollectivesPanel::stragglerSummaryShown() const
{
    return m_stragglerSummary->text();
}

} // namespace shardscope::views

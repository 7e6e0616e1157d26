#include "views/rangesummarypanel.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QSignalBlocker>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QVBoxLayout>

#include "session/labels.h"

namespace shardscope::views {

RangeSummaryPanel::RangeSummaryPanel(QWidget *parent)
    : QWidget(parent), m_model(new models::RangeSummaryModel(this)),
      m_proxy(new QSortFilterProxyModel(this)), m_table(new QTableView(this)),
      m_headline(new QLabel(this)), m_rank(new QComboBox(this))
{
    m_rank->setObjectName(QStringLiteral("selectionRank"));
    m_rank->setToolTip(tr("Sum the selected range on every rank, or on one"));
    setWorldSize(1);
    connect(m_rank, &QComboBox::currentIndexChanged, this, [this] { Q_EMIT rankChanged(rank()); });
    m_proxy->setSourceModel(m_model);
    m_proxy->setSortRole(models::RangeSummaryModel::SortRole);
    m_table->setModel(m_proxy);
    m_table->setObjectName(QStringLiteral("rangeSummaryTable"));
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(models::RangeSummaryModel::Time, Qt::DescendingOrder);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->setTextElideMode(Qt::ElideMiddle);
    m_table->setWordWrap(false); // a wrapped cell elides at the right, not in the middle
    m_table->verticalHeader()->hide();
    m_table->verticalHeader()->setDefaultSectionSize(m_table->fontMetrics().height() + 6);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->setColumnWidth(models::RangeSummaryModel::What, 80);
    m_table->setColumnWidth(models::RangeSummaryModel::Name, 280);
    m_headline->setWordWrap(true);
    m_headline->setText(tr("Shift+drag over the gather timeline to sum a time range's gathers "
                           "per module and parameter."));
    auto *copy = new QAction(tr("Copy table"), m_table);
    copy->setShortcut(QKeySequence::Copy);
    copy->setShortcutContext(Qt::WidgetWithChildrenShortcut);
    m_table->addAction(copy);
    m_table->setContextMenuPolicy(Qt::ActionsContextMenu);
    connect(copy, &QAction::triggered, this,
            [this] { QApplication::clipboard()->setText(m_model->toTsv()); });
    auto *layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    auto *top = new QHBoxLayout;
    top->addWidget(m_headline, 1);
    top->addWidget(m_rank, 0, Qt::AlignTop);
    layout->addLayout(top);
    layout->addWidget(m_table, 1);
    connect(m_table, &QTableView::clicked, this, [this](const QModelIndex &index) {
        const quint32 id = index.data(models::RangeSummaryModel::IdRole).toUInt();
        if (index.data(models::RangeSummaryModel::IsModuleRole).toBool())
            Q_EMIT moduleSelected(id);
        else
            Q_EMIT paramSelected(id);
    });
}

void RangeSummaryPanel::setRange(std::vector<models::RangeRow> rows, double t0Seconds,
                                 double t1Seconds)
{
    std::uint64_t gathers = 0, bytes = 0;
    double seconds = 0;
    for (const models::RangeRow &r : rows)
        if (!r.module) {
            gathers += r.gathers;
            bytes += r.bytes;
            seconds += r.seconds;
        }
    m_model->setRows(std::move(rows), t0Seconds, t1Seconds);
    m_headline->setText(tr("%1 s to %2 s (%3 ms): %4 gathers, %5 ms gathering, %6 "
                           "(Ctrl+C copies the table)")
                            .arg(t0Seconds, 0, 'f', 6)
                            .arg(t1Seconds, 0, 'f', 6)
                            .arg((t1Seconds - t0Seconds) * 1e3, 0, 'f', 3)
                            .arg(gathers)
                            .arg(seconds * 1e3, 0, 'f', 3)
                            .arg(session::labels::bytes(bytes)));
}

void RangeSummaryPanel::setWorldSize(int worldSize)
{
    if (m_rank->count() == worldSize + 1) return;
    const QSignalBlocker block(m_rank);
    const int keep = rank();
    m_rank->clear();
    m_rank->addItem(tr("all ranks"), -1);
    for (int r = 0; r < worldSize; ++r)
        m_rank->addItem(tr("rank %1").arg(r), r);
    m_rank->setCurrentIndex(keep >= 0 && keep < worldSize ? keep + 1 : 0);
}

int RangeSummaryPanel::rank() const
{
    return m_rank->currentIndex() > 0 ? m_rank->currentData().toInt() : -1;
}

void RangeSummaryPanel::setRank(int rank)
{
    m_rank->setCurrentIndex(rank >= 0 && rank + 1 < m_rank->count() ? rank + 1 : 0);
}

QString RangeSummaryPanel::headline() const
{
    return m_headline->text();
}

} // namespace shardscope::views

#include "views/violationspanel.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QVBoxLayout>

#include "models/violationsmodel.h"

namespace shardscope::views {

ViolationsPanel::ViolationsPanel(session::SessionStore *store, QWidget *parent)
    : QWidget(parent), m_model(new models::ViolationsModel(store, this)),
      m_proxy(new QSortFilterProxyModel(this)), m_table(new QTableView(this)),
      m_message(new QLabel(this)), m_fix(new QLabel(this)),
      m_copy(new QPushButton(tr("Copy fix"), this))
{
    m_proxy->setSourceModel(m_model);
    m_proxy->setSortRole(models::ViolationsModel::SortRole);
    m_table->setModel(m_proxy);
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(models::ViolationsModel::Time, Qt::AscendingOrder);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->verticalHeader()->hide();
    m_table->verticalHeader()->setDefaultSectionSize(m_table->fontMetrics().height() + 6);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->horizontalHeader()->setDefaultSectionSize(110);
    m_table->setColumnWidth(models::ViolationsModel::Time, 70);
    m_table->setColumnWidth(models::ViolationsModel::Step, 60);
    m_table->setColumnWidth(models::ViolationsModel::Rank, 50);
    m_table->setColumnWidth(models::ViolationsModel::Kind, 160);
    m_table->setColumnWidth(models::ViolationsModel::Parameter, 160);
    m_table->setColumnWidth(models::ViolationsModel::Status, 110);
    m_table->setObjectName(QStringLiteral("violationsTable"));
    // A dotted name is told apart by its middle (encoder.block.3.layer.1.wo): cut there, the
    // whole name in the cell's tooltip and in what Copy takes.
    m_table->setTextElideMode(Qt::ElideMiddle);
    m_table->setWordWrap(false); // a wrapped cell elides its last line at the right instead
    auto *copyRow = new QAction(tr("Copy row"), m_table);
    copyRow->setShortcut(QKeySequence::Copy);
    copyRow->setShortcutContext(Qt::WidgetWithChildrenShortcut);
    m_table->addAction(copyRow);
    m_table->setContextMenuPolicy(Qt::ActionsContextMenu);
    connect(copyRow, &QAction::triggered, this,
            [this] { QApplication::clipboard()->setText(currentRowText()); });
    m_message->setWordWrap(true);
    m_message->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_fix->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    m_fix->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_fix->setWordWrap(true);
    m_copy->setEnabled(false);
    m_copy->setObjectName(QStringLiteral("copyFix"));

    auto *fixRow = new QHBoxLayout;
    fixRow->addWidget(m_fix, 1);
    fixRow->addWidget(m_copy);
    auto *layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_table, 1);
    layout->addWidget(m_message);
    layout->addLayout(fixRow);

    connect(m_table->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
            &ViolationsPanel::onCurrentChanged);
    connect(m_copy, &QPushButton::clicked, this, [this] {
        const QString fix = currentFix();
        if (fix.isEmpty()) return;
        QApplication::clipboard()->setText(fix);
        Q_EMIT fixCopied(fix);
    });
    // A new group's row gets noticed: the first one is selected when nothing is.
    connect(m_model, &QAbstractItemModel::dataChanged, this, [this] {
        if (m_table->currentIndex().isValid()) onCurrentChanged();
    });
}

QString ViolationsPanel::currentRowText() const
{
    const QModelIndex current = m_table->currentIndex();
    if (!current.isValid()) return {};
    QStringList cells;
    for (int c = 0; c < m_proxy->columnCount(); ++c)
        cells << m_proxy->index(current.row(), c).data().toString();
    return cells.join(QLatin1Char('\t'));
}

QString ViolationsPanel::currentFix() const
{
    const QModelIndex i = m_table->currentIndex();
    return i.isValid() ? i.data(models::ViolationsModel::FixRole).toString() : QString();
}

void ViolationsPanel::selectRow(int sourceRow)
{
    const QModelIndex i = m_proxy->mapFromSource(m_model->index(sourceRow, 0));
    if (i.isValid())
        m_table->selectionModel()->setCurrentIndex(i, QItemSelectionModel::ClearAndSelect |
                                                          QItemSelectionModel::Rows);
}

bool ViolationsPanel::selectViolation(int rank, quint32 paramId, quint32 accessorId)
{
    int fallback = -1;
    for (int row = 0; row < m_model->rowCount(); ++row) {
        const state::ViolationRow *g = m_model->group(row);
        if (!g || g->param != paramId || g->accessor != accessorId) continue;
        const bool onRank = rank < 64 ? (g->rankMask() >> rank) & 1u : g->firstRank == rank;
        if (onRank) {
            selectRow(row);
            return true;
        }
        if (fallback < 0) fallback = row;
    }
    if (fallback < 0) return false;
    selectRow(fallback);
    return true;
}

void ViolationsPanel::onCurrentChanged()
{
    const QModelIndex i = m_table->currentIndex();
    if (!i.isValid()) {
        m_message->clear();
        m_fix->clear();
        m_copy->setEnabled(false);
        return;
    }
    m_message->setText(i.data(models::ViolationsModel::MessageRole).toString());
    const QString fix = currentFix();
    m_fix->setText(fix);
    m_copy->setEnabled(!fix.isEmpty());
    const QVariant param = i.data(models::ViolationsModel::ParamIdRole);
    if (sender() == m_table->selectionModel()) {
        if (param.isValid())
            Q_EMIT paramSelected(param.toUInt());
        else if (i.data(models::ViolationsModel::AccessorIdRole).isValid())
            Q_EMIT moduleSelected(i.data(models::ViolationsModel::AccessorIdRole).toUInt());
    }
}

} // namespace shardscope::views

#include "views/moduletreeview.h"

#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLineEdit>
#include <QTimer>
#include <QTreeView>
#include <QVBoxLayout>

#include <functional>

#include "models/moduletreemodel.h"

namespace shardscope::views {

ModuleTreeView::ModuleTreeView(session::SessionStore *store, QWidget *parent)
    : QWidget(parent), m_store(store), m_model(new models::ModuleTreeModel(store, this)),
      m_tree(new QTreeView(this)), m_filter(new QLineEdit(this)), m_filterTimer(new QTimer(this))
{
    m_filter->setPlaceholderText(tr("Filter modules and parameters (e.g. lm_head, weight_g)"));
    m_filter->setClearButtonEnabled(true);
    m_tree->setModel(m_model);
    m_tree->setUniformRowHeights(true);
    m_tree->setSortingEnabled(true);
    m_tree->header()->setSortIndicator(-1, Qt::AscendingOrder);
    m_tree->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_tree->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_tree->setAlternatingRowColors(true);
    m_tree->header()->setStretchLastSection(false);
    m_tree->setColumnWidth(models::ModuleTreeModel::Name, 240);
    m_tree->setObjectName(QStringLiteral("moduleTree"));
    m_tree->setTextElideMode(Qt::ElideMiddle); // the whole path is in the tooltip
    auto *layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_filter);
    layout->addWidget(m_tree);

    m_filterTimer->setSingleShot(true);
    m_filterTimer->setInterval(150);
    connect(m_filter, &QLineEdit::textChanged, m_filterTimer, qOverload<>(&QTimer::start));
    connect(m_filterTimer, &QTimer::timeout, this, [this] { setFilterText(m_filter->text()); });
    connect(m_model, &QAbstractItemModel::modelAboutToBeReset, this,
            &ModuleTreeView::saveViewState);
    // Queued: the model reveals rows only after its reset has been announced.
    connect(m_model, &QAbstractItemModel::modelReset, this, &ModuleTreeView::restoreViewState,
            Qt::QueuedConnection);
    connect(m_tree->selectionModel(), &QItemSelectionModel::currentChanged, this,
            &ModuleTreeView::onCurrentChanged);
    connect(m_tree->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            [this] { Q_EMIT selectionChangedParams(selectedParams()); });
    restoreViewState();
}

void ModuleTreeView::setFilterText(const QString &text)
{
    if (m_filter->text() != text) {
        const QSignalBlocker block(m_filter);
        m_filter->setText(text);
    }
    m_filterTimer->stop();
    m_model->setFilterText(text);
}

void ModuleTreeView::saveViewState()
{
    m_expanded.clear();
    std::function<void(const QModelIndex &)> walk = [&](const QModelIndex &parent) {
        for (int r = 0; r < m_model->rowCount(parent); ++r) {
            const QModelIndex i = m_model->index(r, 0, parent);
            if (m_tree->isExpanded(i)) {
                m_expanded.insert(models::ModuleTreeModel::keyOf(i));
                walk(i);
            }
        }
    };
    walk({});
    m_current = models::ModuleTreeModel::keyOf(m_tree->currentIndex());
}

void ModuleTreeView::restoreViewState()
{
    // The root is open by default; with a filter, matching modules open too (bounded).
    if (m_model->rowCount() > 0) m_tree->expand(m_model->index(0, 0));
    for (const QString &key : std::as_const(m_expanded)) {
        const QModelIndex i = m_model->indexForKey(key);
        if (i.isValid()) m_tree->expand(i);
    }
    if (!m_model->filterText().isEmpty() && m_model->matchingNodeCount() <= 2000) {
        std::function<void(const QModelIndex &, int)> open = [&](const QModelIndex &parent,
                                                                 int depth) {
            while (m_model->canFetchMore(parent))
                m_model->fetchMore(parent);
            for (int r = 0; r < m_model->rowCount(parent); ++r) {
                const QModelIndex i = m_model->index(r, 0, parent);
                if (i.data(models::ModuleTreeModel::KindRole).toInt() ==
                        models::ModuleTreeModel::ModuleNode &&
                    depth < 16) {
                    m_tree->expand(i);
                    open(i, depth + 1);
                }
            }
        };
        open({}, 0);
    }
    if (!m_current.isEmpty() && !m_tree->currentIndex().isValid()) {
        const QModelIndex i = m_model->indexForKey(m_current);
        if (i.isValid()) {
            const QSignalBlocker block(m_tree->selectionModel());
            m_tree->selectionModel()->setCurrentIndex(i, QItemSelectionModel::ClearAndSelect |
                                                             QItemSelectionModel::Rows);
        }
    }
}

void ModuleTreeView::onCurrentChanged()
{
    const QModelIndex i = m_tree->currentIndex();
    if (!i.isValid()) return;
    if (i.data(models::ModuleTreeModel::KindRole).toInt() == models::ModuleTreeModel::ModuleNode)
        Q_EMIT moduleSelected(i.data(models::ModuleTreeModel::ModuleIdRole).toUInt());
    else
        Q_EMIT paramSelected(i.data(models::ModuleTreeModel::ParamIdRole).toUInt());
}

void ModuleTreeView::selectParams(const QList<quint32> &ids)
{
    QItemSelection selection;
    QModelIndex first;
    for (quint32 id : ids) {
        QModelIndex i = m_model->indexForParam(id);
        if (!i.isValid() && !m_model->filterText().isEmpty()) {
            setFilterText(QString());
            i = m_model->indexForParam(id);
        }
        if (!i.isValid()) continue;
        for (QModelIndex p = i.parent(); p.isValid(); p = p.parent())
            m_tree->expand(p);
        selection.select(
            i, m_model->index(i.row(), models::ModuleTreeModel::ColumnCount - 1, i.parent()));
        if (!first.isValid()) first = i;
    }
    if (!first.isValid()) return;
    m_tree->selectionModel()->setCurrentIndex(first, QItemSelectionModel::NoUpdate);
    m_tree->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect |
                                                    QItemSelectionModel::Rows);
    m_tree->scrollTo(first);
}

void ModuleTreeView::selectModule(ModuleId id)
{
    const QModelIndex i = m_model->indexForModule(id);
    if (!i.isValid()) return;
    for (QModelIndex p = i.parent(); p.isValid(); p = p.parent())
        m_tree->expand(p);
    m_tree->selectionModel()->setCurrentIndex(i, QItemSelectionModel::ClearAndSelect |
                                                     QItemSelectionModel::Rows);
    m_tree->scrollTo(i);
}

QList<quint32> ModuleTreeView::selectedParams() const
{
    QList<quint32> ids;
    for (const QModelIndex &i : m_tree->selectionModel()->selectedRows()) {
        if (i.data(models::ModuleTreeModel::KindRole).toInt() !=
            models::ModuleTreeModel::ModuleNode)
            ids << i.data(models::ModuleTreeModel::ParamIdRole).toUInt();
    }
    return ids;
}

} // namespace shardscope::views

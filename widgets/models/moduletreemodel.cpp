#include "models/moduletreemodel.h"

#include <QColor>
#include <QFont>
#include <QStringList>

#include <algorithm>
#include <unordered_map>

#include "base/hugepages.h"
#include "models/severitycolor.h"
#include "session/labels.h"
#include "state/partition.h"

namespace shardscope::models {

namespace {

QString lastComponent(const std::string &dotted)
{
    const auto dot = dotted.rfind('.');
    return QString::fromStdString(dot == std::string::npos ? dotted : dotted.substr(dot + 1));
}

// Case folding as QString::contains(Qt::CaseInsensitive) compares: code point by code
// point (simple folding), as UTF-8 so the filter searches bytes.
std::string foldedUtf8(const QString &s)
{
    QList<uint> ucs4 = s.toUcs4();
    for (uint &c : ucs4)
        c = QChar::toCaseFolded(c);
    const QByteArray utf8 =
        QString::fromUcs4(reinterpret_cast<const char32_t *>(ucs4.constData()), ucs4.size())
            .toUtf8();
    return std::string(utf8.constData(), static_cast<std::size_t>(utf8.size()));
}

// Appends s case-folded: ASCII is lowered byte by byte, anything else goes through Qt.
void appendFolded(std::string &out, const std::string &s)
{
    const std::size_t start = out.size();
    out.resize(start + s.size());
    char *dst = out.data() + start;
    unsigned char high = 0;
    for (std::size_t k = 0; k < s.size(); ++k) {
        const char c = s[k];
        high |= static_cast<unsigned char>(c);
        dst[k] = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    }
    if (high & 0x80) {
        out.resize(start);
        out += foldedUtf8(QString::fromStdString(s));
    }
}

bool isNumericColumn(int column)
{
    return column == ModuleTreeModel::Numel || column == ModuleTreeModel::Gathers ||
           column == ModuleTreeModel::Violations;
}

} // namespace

ModuleTreeModel::ModuleTreeModel(session::SessionStore *store, QObject *parent)
    : QAbstractItemModel(parent), m_store(store)
{
    connect(m_store, &session::SessionStore::updated, this, &ModuleTreeModel::onStoreUpdated);
    rebuild();
}

std::int32_t ModuleTreeModel::nodeOf(const QModelIndex &index) const
{
    return index.isValid() ? static_cast<std::int32_t>(index.internalId()) : -1;
}

int ModuleTreeModel::rowCount(const QModelIndex &parent) const
{
    if (parent.column() > 0) return 0;
    const std::int32_t n = nodeOf(parent);
    return n < 0 ? m_topFetched : m_nodes[static_cast<std::size_t>(n)].fetched;
}

int ModuleTreeModel::columnCount(const QModelIndex &) const
{
    return ColumnCount;
}

bool ModuleTreeModel::hasChildren(const QModelIndex &parent) const
{
    if (parent.column() > 0) return false;
    const std::int32_t n = nodeOf(parent);
    return n < 0 ? !m_top.empty() : m_nodes[static_cast<std::size_t>(n)].kidCount != 0;
}

QModelIndex ModuleTreeModel::index(int row, int column, const QModelIndex &parent) const
{
    if (row < 0 || column < 0 || column >= ColumnCount || parent.column() > 0) return {};
    const std::int32_t p = nodeOf(parent);
    if (p < 0) {
        if (row >= m_topFetched) return {};
        return createIndex(row, column, quintptr(m_top[static_cast<std::size_t>(row)]));
    }
    const Node &pn = m_nodes[static_cast<std::size_t>(p)];
    if (row >= pn.fetched) return {};
    return createIndex(row, column, quintptr(m_kids[pn.kidsAt + static_cast<std::uint32_t>(row)]));
}

QModelIndex ModuleTreeModel::parent(const QModelIndex &child) const
{
    const std::int32_t n = nodeOf(child);
    if (n < 0) return {};
    const std::int32_t p = m_nodes[static_cast<std::size_t>(n)].parent;
    if (p < 0) return {};
    return createIndex(m_nodes[static_cast<std::size_t>(p)].row, 0, quintptr(p));
}

bool ModuleTreeModel::canFetchMore(const QModelIndex &parent) const
{
    if (parent.column() > 0 || m_busy) return false;
    const std::int32_t n = nodeOf(parent);
    if (n < 0) return m_topFetched < static_cast<std::int32_t>(m_top.size());
    const Node &node = m_nodes[static_cast<std::size_t>(n)];
    return node.fetched < static_cast<std::int32_t>(node.kidCount);
}

void ModuleTreeModel::fetchMore(const QModelIndex &parent)
{
    if (!canFetchMore(parent)) return;
    const std::int32_t n = nodeOf(parent);
    std::int32_t &fetched = n < 0 ? m_topFetched : m_nodes[static_cast<std::size_t>(n)].fetched;
    const std::int32_t total =
        n < 0 ? static_cast<std::int32_t>(m_top.size())
              : static_cast<std::int32_t>(m_nodes[static_cast<std::size_t>(n)].kidCount);
    const std::int32_t last = std::min(total, fetched + m_batch) - 1;
    m_busy = true;
    beginInsertRows(parent, fetched, last);
    fetched = last + 1;
    endInsertRows();
    m_busy = false;
}

void ModuleTreeModel::rebuild()
{
    buildStructure();
    applyFilter();
}

void ModuleTreeModel::buildStructure()
{
    const state::EngineState &st = m_store->state();
    m_nodes.clear();
    m_top.clear();
    m_topFetched = 0;
    m_nameMatchValid = false;
    m_moduleNode.assign(st.modules.size(), -1);
    m_paramNode.assign(st.params.size(), -1);
    m_extNodes.assign(st.params.size(), {});
    m_moduleNumel.assign(st.modules.size(), 0);
    reserveHuge(m_nodes, st.modules.size() + st.params.size());

    auto newNode = [&](std::uint8_t kind, std::uint32_t id, std::int32_t parent, bool automatic) {
        Node node;
        node.kind = kind;
        node.id = id;
        node.parent = parent;
        node.automatic = automatic;
        m_nodes.push_back(std::move(node));
        return static_cast<std::int32_t>(m_nodes.size() - 1);
    };

    std::vector<std::pair<ModuleId, std::int32_t>> stack;
    for (const state::ModuleRecord &m : st.modules) {
        if (m.parent == kNoModule || m.parent >= st.modules.size()) stack.emplace_back(m.id, -1);
    }
    std::reverse(stack.begin(), stack.end());
    std::vector<ModuleId> order; // pre-order, for subtree sums
    while (!stack.empty()) {
        const auto [mid, parent] = stack.back();
        stack.pop_back();
        if (mid >= m_moduleNode.size() || m_moduleNode[mid] >= 0) continue;
        const std::int32_t n = newNode(ModuleNode, mid, parent, false);
        m_moduleNode[mid] = n;
        order.push_back(mid);
        if (parent < 0) m_top.push_back(n);
        const auto &children = m_store->childModules(mid);
        for (auto it = children.rbegin(); it != children.rend(); ++it)
            stack.emplace_back(*it, n);
        // Child modules are built after this loop iteration; params and externals now.
        for (ParamId pid : m_store->ownedParams(mid)) {
            const state::ParamRecord *p = m_store->param(pid);
            if (!p) continue;
            m_paramNode[static_cast<std::size_t>(m_store->paramSlot(pid))] =
                newNode(ParamNode, pid, n, false);
            m_moduleNumel[mid] += p->numel;
        }
        for (const state::ExternalRecord &e : m_store->externalsOn(mid)) {
            if (const std::int32_t slot = m_store->paramSlot(e.module); slot >= 0)
                m_extNodes[static_cast<std::size_t>(slot)].push_back(
                    newNode(ExternalNode, e.module, n, e.automatic));
        }
    }
    // Every node's children in one array, child modules first, each kind in build order:
    // counted per parent, then placed (no vector per node).
    const std::size_t count = m_nodes.size();
    m_allKidsAt.assign(count + 1, 0);
    std::vector<std::uint32_t> firstOther(count, 0); // a node's child modules, counted
    for (const Node &node : m_nodes) {
        if (node.parent < 0) continue;
        const auto parent = static_cast<std::size_t>(node.parent);
        ++m_allKidsAt[parent + 1];
        if (node.kind == ModuleNode) ++firstOther[parent];
    }
    for (std::size_t i = 0; i < count; ++i)
        m_allKidsAt[i + 1] += m_allKidsAt[i];
    std::vector<std::uint32_t> nextModule(m_allKidsAt.begin(), m_allKidsAt.end() - 1);
    for (std::size_t i = 0; i < count; ++i)
        firstOther[i] += m_allKidsAt[i]; // now where its other children start
    m_allKids.assign(m_allKidsAt[count], 0);
    for (std::size_t i = 0; i < count; ++i) {
        const Node &node = m_nodes[i];
        if (node.parent < 0) continue;
        const auto parent = static_cast<std::size_t>(node.parent);
        std::uint32_t &slot = node.kind == ModuleNode ? nextModule[parent] : firstOther[parent];
        m_allKids[slot++] = static_cast<std::int32_t>(i);
    }
    m_allTop = m_top;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
        const state::ModuleRecord *m = m_store->module(*it);
        if (m && m->parent < m_moduleNumel.size() && m->parent != m->id)
            m_moduleNumel[m->parent] += m_moduleNumel[*it];
    }

    // Names are folded when a filter first needs them: attaching does not pay for it.
    m_folded.clear();
    m_foldedAt.clear();
}

void ModuleTreeModel::foldNames()
{
    m_folded.clear();
    m_folded.reserve(m_nodes.size() * 32);
    m_foldedAt.assign(m_nodes.size() + 1, 0);
    for (std::size_t i = 0; i < m_nodes.size(); ++i) {
        m_foldedAt[i] = static_cast<std::uint32_t>(m_folded.size());
        const Node &node = m_nodes[i];
        const std::string *name = nullptr;
        if (node.kind == ModuleNode) {
            if (const state::ModuleRecord *m = m_store->module(node.id)) name = &m->path;
        } else if (const state::ParamRecord *p = m_store->param(node.id)) {
            name = &p->name;
        }
        if (name) appendFolded(m_folded, *name);
    }
    m_foldedAt[m_nodes.size()] = static_cast<std::uint32_t>(m_folded.size());
}

void ModuleTreeModel::applyFilter()
{
    // Filter: keep matches, their ancestors, and the subtree of a matching module.
    const std::string folded = foldedUtf8(m_filter);
    const std::string_view f(folded);
    const std::size_t count = m_nodes.size();
    if (!f.empty() && m_foldedAt.size() != count + 1) foldNames();
    // A text that contains the previous one can only match a subset of its matches.
    const bool narrow = m_nameMatchValid && !m_matchedFor.empty() && m_nameMatch.size() == count &&
                        f.find(m_matchedFor) != f.npos;
    m_nameMatch.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
        if (f.empty())
            m_nameMatch[i] = 1;
        else if (!narrow || m_nameMatch[i])
            m_nameMatch[i] = foldedName(i).find(f) != std::string_view::npos;
    }
    m_matchedFor.assign(f);
    m_nameMatchValid = true;

    m_matching = 0;
    std::vector<std::uint8_t> visible(count, 0);
    // Children always have larger indices than their parent, so one forward pass
    // hands a matching module's match down to its whole subtree.
    for (std::size_t i = 0; i < count; ++i) {
        Node &node = m_nodes[i];
        bool match = m_nameMatch[i] != 0;
        if (!match && node.parent >= 0) {
            const Node &parent = m_nodes[static_cast<std::size_t>(node.parent)];
            match = parent.match && parent.kind == ModuleNode;
        }
        node.match = match;
    }
    // Children come after their parent: a backward pass decides what is visible, then a
    // forward one lays every node's visible children out in m_kids, in m_allKids' order.
    for (std::size_t i = count; i-- > 0;) {
        Node &node = m_nodes[i];
        node.kidCount = 0;
        for (std::uint32_t k = m_allKidsAt[i]; k < m_allKidsAt[i + 1]; ++k)
            node.kidCount += visible[static_cast<std::size_t>(m_allKids[k])];
        visible[i] = node.match || node.kidCount != 0;
        if (visible[i]) ++m_matching;
        node.fetched = 0;
        node.row = -1;
    }
    m_kids.clear();
    m_kids.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
        Node &node = m_nodes[i];
        node.kidsAt = static_cast<std::uint32_t>(m_kids.size());
        for (std::uint32_t k = m_allKidsAt[i]; k < m_allKidsAt[i + 1]; ++k)
            if (const std::int32_t c = m_allKids[k]; visible[static_cast<std::size_t>(c)])
                m_kids.push_back(c);
    }
    m_top.clear();
    for (std::int32_t t : m_allTop) {
        if (visible[static_cast<std::size_t>(t)]) m_top.push_back(t);
    }

    if (m_sortColumn >= 0) {
        for (std::size_t i = 0; i < count; ++i) {
            if (visible[i] && m_nodes[i].kidCount > 1) sortChildren(static_cast<std::int32_t>(i));
        }
    }
    for (std::size_t i = 0; i < count; ++i) {
        const std::span<const std::int32_t> kids = kidsOf(m_nodes[i]);
        for (std::size_t r = 0; r < kids.size(); ++r)
            m_nodes[static_cast<std::size_t>(kids[r])].row = static_cast<std::int32_t>(r);
    }
    for (std::size_t r = 0; r < m_top.size(); ++r)
        m_nodes[static_cast<std::size_t>(m_top[r])].row = static_cast<std::int32_t>(r);
    m_topFetched = static_cast<std::int32_t>(m_top.size());
}

void ModuleTreeModel::resetAndRebuild()
{
    // Nothing is fetched while a change is being announced: listeners that fetch in
    // their handlers would otherwise insert rows inside the change.
    m_busy = true;
    beginResetModel();
    rebuild();
    endResetModel();
    m_busy = false;
}

void ModuleTreeModel::resetAndFilter()
{
    m_busy = true;
    beginResetModel();
    applyFilter();
    endResetModel();
    m_busy = false;
}

void ModuleTreeModel::sortChildren(std::int32_t n)
{
    const std::span<std::int32_t> kids = kidsOf(m_nodes[static_cast<std::size_t>(n)]);
    const int column = m_sortColumn;
    const bool desc = m_sortOrder == Qt::DescendingOrder;
    if (isNumericColumn(column)) {
        std::vector<std::pair<qint64, std::int32_t>> keyed;
        keyed.reserve(kids.size());
        for (std::int32_t c : kids)
            keyed.emplace_back(sortValue(m_nodes[static_cast<std::size_t>(c)], column).toLongLong(),
                               c);
        std::stable_sort(keyed.begin(), keyed.end(), [&](const auto &a, const auto &b) {
            const auto ka = m_nodes[static_cast<std::size_t>(a.second)].kind;
            const auto kb = m_nodes[static_cast<std::size_t>(b.second)].kind;
            if (ka != kb) return ka < kb;
            return desc ? a.first > b.first : a.first < b.first;
        });
        for (std::size_t i = 0; i < kids.size(); ++i)
            kids[i] = keyed[i].second;
    } else {
        std::vector<std::pair<QString, std::int32_t>> keyed;
        keyed.reserve(kids.size());
        for (std::int32_t c : kids)
            keyed.emplace_back(sortValue(m_nodes[static_cast<std::size_t>(c)], column).toString(),
                               c);
        std::stable_sort(keyed.begin(), keyed.end(), [&](const auto &a, const auto &b) {
            const auto ka = m_nodes[static_cast<std::size_t>(a.second)].kind;
            const auto kb = m_nodes[static_cast<std::size_t>(b.second)].kind;
            if (ka != kb) return ka < kb;
            const int c = QString::compare(a.first, b.first, Qt::CaseInsensitive);
            return desc ? c > 0 : c < 0;
        });
        for (std::size_t i = 0; i < kids.size(); ++i)
            kids[i] = keyed[i].second;
    }
}

void ModuleTreeModel::sort(int column, Qt::SortOrder order)
{
    if (column < 0 || column >= ColumnCount) column = -1;
    if (column == m_sortColumn && order == m_sortOrder) return;
    m_sortColumn = column;
    m_sortOrder = order;
    resetAndFilter();
}

void ModuleTreeModel::setFilterText(const QString &text)
{
    if (text == m_filter) return;
    m_filter = text;
    resetAndFilter();
}

QVariant ModuleTreeModel::sortValue(const Node &node, int column) const
{
    switch (column) {
    case Numel:
        if (node.kind == ModuleNode)
            return qint64(node.id < m_moduleNumel.size() ? m_moduleNumel[node.id] : 0);
        if (const state::ParamRecord *p = m_store->param(node.id)) return qint64(p->numel);
        return qint64(0);
    case Gathers:
        if (node.kind == ModuleNode) return qint64(0);
        if (const state::ParamRecord *p = m_store->param(node.id)) return qint64(p->gatherCount);
        return qint64(0);
    case Violations:
        return qint64(node.kind == ModuleNode ? m_store->moduleViolations(node.id)
                                              : m_store->paramViolations(node.id));
    default:
        return displayValue(node, column);
    }
}

QVariant ModuleTreeModel::displayValue(const Node &node, int column) const
{
    if (node.kind == ModuleNode) {
        const state::ModuleRecord *m = m_store->module(node.id);
        if (!m) return {};
        switch (column) {
        case Name:
            if (m->path.empty())
                return m_store->state().modelName.empty()
                           ? QStringLiteral("<root>")
                           : QString::fromStdString(m_store->state().modelName);
            return lastComponent(m->path);
        case ShapeColumn:
            return session::labels::moduleType(*m, m_store->modulePath(m->unitGroup));
        case Numel:
            return session::labels::count(static_cast<std::uint64_t>(
                node.id < m_moduleNumel.size() ? m_moduleNumel[node.id] : 0));
        case Status: {
            const auto &owned = m_store->ownedParams(node.id);
            if (owned.empty()) return {};
            int gathered = 0;
            for (ParamId pid : owned) {
                const state::ParamRecord *p = m_store->param(pid);
                if (p && std::any_of(p->status.begin(), p->status.end(),
                                     [](ParamStatus s) { return s != ParamStatus::NotAvailable; }))
                    ++gathered;
            }
            return QStringLiteral("%1/%2 gathered").arg(gathered).arg(owned.size());
        }
        case RegisteredOn: {
            const auto &ext = m_store->externalsOn(node.id);
            return ext.empty() ? QVariant()
                               : QVariant(QStringLiteral("%1 external").arg(ext.size()));
        }
        case Violations: {
            const std::uint64_t v = m_store->moduleViolations(node.id);
            return v ? QVariant(session::labels::count(v)) : QVariant();
        }
        default:
            return {};
        }
    }
    const state::ParamRecord *p = m_store->param(node.id);
    if (!p) return {};
    switch (column) {
    case Name: {
        QString name;
        if (node.kind == ExternalNode) {
            name = QString::fromStdString(p->name);
        } else {
            const state::ModuleRecord *owner = m_store->module(p->owner);
            name = owner && !owner->path.empty() && p->name.rfind(owner->path + ".", 0) == 0
                       ? QString::fromStdString(p->name.substr(owner->path.size() + 1))
                       : QString::fromStdString(p->name);
        }
        if (node.kind == ExternalNode)
            name += node.automatic ? QStringLiteral("  [external, auto]")
                                   : QStringLiteral("  [external]");
        if (p->late) name += QStringLiteral("  [late]");
        return name;
    }
    case ShapeColumn:
        return session::labels::shape(p->shape);
    case Numel:
        return session::labels::count(static_cast<std::uint64_t>(p->numel));
    case DTypeColumn:
        return session::labels::dtype(p->dtype);
    case Status: {
        if (p->status.empty()) return {};
        const ParamStatus first = p->status.front();
        if (std::all_of(p->status.begin(), p->status.end(),
                        [&](ParamStatus s) { return s == first; }))
            return session::labels::status(first);
        const auto avail = std::count(p->status.begin(), p->status.end(), ParamStatus::Available);
        return QStringLiteral("MIXED (%1/%2 AVAILABLE)").arg(avail).arg(p->status.size());
    }
    case Partition:
        if (p->persistent) return QStringLiteral("persistent (whole on every rank)");
        if (!p->partitioned)
            return p->late ? QStringLiteral("late: not partitioned")
                           : QStringLiteral("not partitioned");
        {
            // The producer's layout (DeepSpeed's and FSDP2's own numbers for their runs).
            const state::PartitionLayout layout = state::PartitionLayout::reported(
                std::max<std::int64_t>(p->numel, 0), p->paddedNumel, p->partitionNumel,
                std::max<int>(1, int(p->status.size())));
            const QString shards =
                QStringLiteral("%1/rank, pad %2")
                    .arg(session::labels::count(static_cast<std::uint64_t>(layout.partitionNumel)))
                    .arg(layout.totalPadding());
            // FSDP2's DTensor placements first: "Shard(0): 272/rank, pad 16".
            return p->placements.empty() ? shards
                                         : QStringLiteral("%1: %2").arg(
                                               QString::fromStdString(p->placements), shards);
        }
    case RegisteredOn: {
        QStringList mods;
        for (const state::ExternalRecord &e : p->externals)
            mods << m_store->modulePath(e.module) +
                        (e.automatic ? QStringLiteral(" (auto)") : QString());
        return mods.join(QStringLiteral(", "));
    }
    case Gathers:
        return session::labels::count(p->gatherCount);
    case Violations: {
        const std::uint64_t v = m_store->paramViolations(node.id);
        return v ? QVariant(session::labels::count(v)) : QVariant();
    }
    default:
        return {};
    }
}

QString ModuleTreeModel::tooltip(const Node &node) const
{
    if (node.kind == ModuleNode) {
        const state::ModuleRecord *m = m_store->module(node.id);
        if (!m) return {};
        QString tip = QStringLiteral("%1 (%2)").arg(m_store->modulePath(node.id),
                                                    QString::fromStdString(m->type));
        if (m->fsdpUnit())
            tip += QStringLiteral("\nFSDP unit: ") +
                   session::labels::fsdpUnit(*m, m_store->modulePath(m->unitGroup));
        if (const std::uint64_t v = m_store->moduleViolations(node.id))
            tip += QStringLiteral("\n%1 violation(s) as accessor or owner").arg(v);
        return tip;
    }
    const state::ParamRecord *p = m_store->param(node.id);
    if (!p) return {};
    QStringList lines;
    lines << QString::fromStdString(p->name);
    if (node.kind == ExternalNode) {
        lines << QStringLiteral("registered as external on %1 (%2), owned by %3")
                     .arg(m_store->modulePath(m_nodes[static_cast<std::size_t>(node.parent)].id),
                          node.automatic ? QStringLiteral("automatic") : QStringLiteral("manual"),
                          m_store->modulePath(p->owner));
    }
    for (std::size_t r = 0; r < p->status.size(); ++r)
        lines << QStringLiteral("rank %1: %2").arg(r).arg(session::labels::status(p->status[r]));
    return lines.join(QLatin1Char('\n'));
}

QVariant ModuleTreeModel::data(const QModelIndex &index, int role) const
{
    const std::int32_t n = nodeOf(index);
    if (n < 0 || static_cast<std::size_t>(n) >= m_nodes.size()) return {};
    const Node &node = m_nodes[static_cast<std::size_t>(n)];
    switch (role) {
    case Qt::DisplayRole:
        return displayValue(node, index.column());
    case Qt::ToolTipRole:
        return tooltip(node);
    case Qt::TextAlignmentRole:
        if (isNumericColumn(index.column())) return QVariant(Qt::AlignRight | Qt::AlignVCenter);
        return {};
    case Qt::ForegroundRole: {
        // Coloured by the worst severity of its violations: a module with only an attribute
        // read (T5's `.dtype`) is not drawn as one that crashes.
        const std::optional<Severity> worst = node.kind == ModuleNode
                                                  ? m_store->moduleSeverity(node.id)
                                                  : m_store->paramSeverity(node.id);
        if (worst && (index.column() == Name || index.column() == Violations))
            return severityColor(*worst);
        if (node.kind == ExternalNode) return QColor(0x20, 0x50, 0xa0);
        return {};
    }
    case Qt::FontRole:
        if (node.kind == ExternalNode) {
            QFont f;
            f.setItalic(true);
            return f;
        }
        return {};
    case KindRole:
        return int(node.kind);
    case ParamIdRole:
        return node.kind == ModuleNode ? QVariant() : QVariant(node.id);
    case ModuleIdRole:
        if (node.kind == ModuleNode) return node.id;
        if (node.kind == ExternalNode) return m_nodes[static_cast<std::size_t>(node.parent)].id;
        if (const state::ParamRecord *p = m_store->param(node.id)) return p->owner;
        return {};
    case SortRole:
        return sortValue(node, index.column());
    case KeyRole:
        return keyOf(index);
    default:
        return {};
    }
}

QVariant ModuleTreeModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    static const char *names[] = {"Name",      "Shape / type",  "Numel",   "DType",     "Status",
                                  "Partition", "Registered on", "Gathers", "Violations"};
    return section >= 0 && section < ColumnCount ? QString::fromLatin1(names[section]) : QVariant();
}

bool ModuleTreeModel::reveal(std::int32_t n)
{
    std::vector<std::int32_t> chain;
    for (std::int32_t c = n; c >= 0; c = m_nodes[static_cast<std::size_t>(c)].parent) {
        if (m_nodes[static_cast<std::size_t>(c)].row < 0) return false;
        chain.push_back(c);
    }
    if (m_nodes[static_cast<std::size_t>(chain.back())].parent >= 0) return false;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        const Node &node = m_nodes[static_cast<std::size_t>(*it)];
        if (node.parent < 0) continue;
        Node &parent = m_nodes[static_cast<std::size_t>(node.parent)];
        if (node.row >= parent.fetched) {
            const QModelIndex pi = createIndex(parent.row, 0, quintptr(node.parent));
            const std::int32_t last =
                std::min<std::int32_t>(static_cast<std::int32_t>(parent.kidCount) - 1,
                                       std::max(node.row, parent.fetched + m_batch - 1));
            m_busy = true;
            beginInsertRows(pi, parent.fetched, last);
            parent.fetched = last + 1;
            endInsertRows();
            m_busy = false;
        }
    }
    return true;
}

QModelIndex ModuleTreeModel::indexOfNode(std::int32_t n, int column)
{
    if (n < 0 || !reveal(n)) return {};
    return createIndex(m_nodes[static_cast<std::size_t>(n)].row, column, quintptr(n));
}

std::size_t ModuleTreeModel::paramSlot(ParamId id) const
{
    const std::int32_t slot = m_store->paramSlot(id);
    return slot < 0 ? std::size_t(-1) : static_cast<std::size_t>(slot);
}

QModelIndex ModuleTreeModel::indexForParam(ParamId id)
{
    const std::size_t slot = paramSlot(id);
    return slot < m_paramNode.size() ? indexOfNode(m_paramNode[slot]) : QModelIndex();
}

QModelIndex ModuleTreeModel::indexForModule(ModuleId id)
{
    return id < m_moduleNode.size() ? indexOfNode(m_moduleNode[id]) : QModelIndex();
}

QString ModuleTreeModel::keyOf(const QModelIndex &index)
{
    if (!index.isValid()) return {};
    const auto *model = qobject_cast<const ModuleTreeModel *>(index.model());
    if (!model) return {};
    const Node &node = model->m_nodes[static_cast<std::size_t>(model->nodeOf(index))];
    switch (node.kind) {
    case ModuleNode:
        return QStringLiteral("m%1").arg(node.id);
    case ParamNode:
        return QStringLiteral("p%1").arg(node.id);
    default:
        return QStringLiteral("e%1:%2")
            .arg(model->m_nodes[static_cast<std::size_t>(node.parent)].id)
            .arg(node.id);
    }
}

QModelIndex ModuleTreeModel::indexForKey(const QString &key)
{
    if (key.size() < 2) return {};
    bool ok = false;
    if (key[0] == QLatin1Char('m')) {
        const uint id = key.mid(1).toUInt(&ok);
        return ok ? indexForModule(id) : QModelIndex();
    }
    if (key[0] == QLatin1Char('p')) {
        const uint id = key.mid(1).toUInt(&ok);
        return ok ? indexForParam(id) : QModelIndex();
    }
    const auto parts = key.mid(1).split(QLatin1Char(':'));
    if (parts.size() != 2) return {};
    const uint module = parts[0].toUInt(&ok);
    const uint param = parts[1].toUInt();
    const std::size_t slot = paramSlot(param);
    if (!ok || slot >= m_extNodes.size()) return {};
    for (std::int32_t n : m_extNodes[slot]) {
        if (m_nodes[static_cast<std::size_t>(m_nodes[static_cast<std::size_t>(n)].parent)].id ==
            module)
            return indexOfNode(n);
    }
    return {};
}

void ModuleTreeModel::emitChangedRows(const std::vector<std::int32_t> &nodes)
{
    std::unordered_map<std::int32_t, std::pair<std::int32_t, std::int32_t>>
        ranges; // parent -> rows
    for (std::int32_t n : nodes) {
        const Node &node = m_nodes[static_cast<std::size_t>(n)];
        if (node.row < 0) continue;
        const std::int32_t fetched =
            node.parent < 0 ? m_topFetched : m_nodes[static_cast<std::size_t>(node.parent)].fetched;
        if (node.row >= fetched) continue;
        auto [it, inserted] = ranges.try_emplace(node.parent, node.row, node.row);
        if (!inserted) {
            it->second.first = std::min(it->second.first, node.row);
            it->second.second = std::max(it->second.second, node.row);
        }
    }
    for (const auto &[parent, rows] : ranges) {
        const QModelIndex pi =
            parent < 0
                ? QModelIndex()
                : createIndex(m_nodes[static_cast<std::size_t>(parent)].row, 0, quintptr(parent));
        Q_EMIT dataChanged(index(rows.first, 0, pi), index(rows.second, ColumnCount - 1, pi));
    }
}

void ModuleTreeModel::emitAllRevealedRows()
{
    if (m_topFetched > 0) Q_EMIT dataChanged(index(0, 0), index(m_topFetched - 1, ColumnCount - 1));
    for (std::size_t i = 0; i < m_nodes.size(); ++i) {
        const Node &node = m_nodes[i];
        if (node.fetched <= 0 || node.row < 0) continue;
        const std::int32_t shown =
            node.parent < 0 ? m_topFetched : m_nodes[static_cast<std::size_t>(node.parent)].fetched;
        if (node.row >= shown) continue; // its rows are not reachable from a view
        const QModelIndex pi = createIndex(node.row, 0, quintptr(i));
        Q_EMIT dataChanged(index(0, 0, pi), index(node.fetched - 1, ColumnCount - 1, pi));
    }
}

void ModuleTreeModel::onStoreUpdated(const session::StoreChanges &changes)
{
    if (changes.reset || changes.structure) {
        resetAndRebuild();
        return;
    }
    // A State marks every parameter, and violations every module: announcing the rows a
    // view has fetched, parent by parent, costs what is revealed, where mapping each
    // parameter to its rows costs what the model holds (most of a State's 24-41 ms on the
    // GUI thread at 100,000 parameters, bench_attach).
    if (changes.violations || changes.params.size() * 8 >= m_paramNode.size()) {
        if (changes.violations || !changes.params.empty()) emitAllRevealedRows();
        return;
    }
    std::vector<std::int32_t> nodes;
    for (ParamId id : changes.params) {
        const std::size_t slot = paramSlot(id);
        if (slot < m_paramNode.size()) {
            const std::int32_t owned = m_paramNode[slot];
            if (owned >= 0) nodes.push_back(owned);
            for (std::int32_t e : m_extNodes[slot])
                nodes.push_back(e);
            if (owned >= 0 && m_nodes[static_cast<std::size_t>(owned)].parent >= 0)
                nodes.push_back(m_nodes[static_cast<std::size_t>(owned)].parent);
        }
    }
    if (!nodes.empty()) emitChangedRows(nodes);
}

} // namespace shardscope::models

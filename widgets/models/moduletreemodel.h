#pragma once
// The module / parameter tree over a SessionStore: modules with their parameters
// beneath and the parameters registered on them as externals (marked). Children are
// revealed lazily in batches (canFetchMore/fetchMore), the filter keeps the ancestors
// of every match, and live updates arrive as batched dataChanged per parent.

#include <QAbstractItemModel>
#include <QString>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "session/sessionstore.h"

namespace shardscope::models {

class ModuleTreeModel : public QAbstractItemModel
{
    Q_OBJECT
  public:
    enum Column
    {
        Name,
        ShapeColumn,
        Numel,
        DTypeColumn,
        Status,
        Partition,
        RegisteredOn,
        Gathers,
        Violations,
        ColumnCount
    };
    enum Role
    {
        KindRole = Qt::UserRole + 1,
        ParamIdRole,
        ModuleIdRole,
        SortRole,
        KeyRole
    };
    enum Kind
    {
        ModuleNode = 0,
        ParamNode = 1,
        ExternalNode = 2
    };

    explicit ModuleTreeModel(session::SessionStore *store, QObject *parent = nullptr);

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QModelIndex index(int row, int column, const QModelIndex &parent = {}) const override;
    QModelIndex parent(const QModelIndex &child) const override;
    bool hasChildren(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation,
                        int role = Qt::DisplayRole) const override;
    bool canFetchMore(const QModelIndex &parent) const override;
    void fetchMore(const QModelIndex &parent) override;
    void sort(int column, Qt::SortOrder order = Qt::AscendingOrder) override;

    // Case-insensitive substring of a module path or parameter name; matches keep
    // their ancestors, a matching module keeps its whole subtree. Empty shows everything.
    void setFilterText(const QString &text);
    QString filterText() const { return m_filter; }
    void setFetchBatchSize(int rows) { m_batch = rows > 0 ? rows : 1; }

    // The index of a parameter under its owner (or a module), revealing rows as needed.
    // Invalid when filtered out or unknown.
    QModelIndex indexForParam(ParamId id);
    QModelIndex indexForModule(ModuleId id);
    // Total nodes that pass the filter (revealed or not).
    int matchingNodeCount() const { return m_matching; }
    // A stable identity of a row across resets ("m12", "p7", "e3:7").
    static QString keyOf(const QModelIndex &index);
    QModelIndex indexForKey(const QString &key);

  private:
    struct Node
    {
        std::uint32_t id = 0;
        std::int32_t parent = -1;
        std::int32_t row = 0;
        std::int32_t fetched = 0;
        std::uint8_t kind = ModuleNode;
        bool automatic = false;
        bool match = false;
        // Its visible children, in display order: m_kids[kidsAt, kidsAt + kidCount).
        std::uint32_t kidsAt = 0;
        std::uint32_t kidCount = 0;
    };
    std::span<std::int32_t> kidsOf(const Node &node)
    {
        return std::span<std::int32_t>(m_kids).subspan(node.kidsAt, node.kidCount);
    }

    void onStoreUpdated(const session::StoreChanges &changes);
    void rebuild();
    void buildStructure();
    void applyFilter();
    void foldNames();
    void resetAndRebuild();
    void resetAndFilter();
    std::string_view foldedName(std::size_t n) const
    {
        return std::string_view(m_folded).substr(m_foldedAt[n], m_foldedAt[n + 1] - m_foldedAt[n]);
    }
    void sortChildren(std::int32_t n);
    QVariant sortValue(const Node &node, int column) const;
    QVariant displayValue(const Node &node, int column) const;
    QString tooltip(const Node &node) const;
    QModelIndex indexOfNode(std::int32_t n, int column = 0);
    bool reveal(std::int32_t n);
    const std::vector<std::int32_t> &topLevel() const { return m_top; }
    std::int32_t nodeOf(const QModelIndex &index) const;
    void emitChangedRows(const std::vector<std::int32_t> &nodes);
    // dataChanged over every fetched row, one signal per parent.
    void emitAllRevealedRows();

    session::SessionStore *m_store;
    std::vector<Node> m_nodes;
    std::vector<std::int32_t> m_top;
    std::vector<std::int32_t> m_allTop;     // every top-level node, filtered or not
    std::vector<std::int32_t> m_kids;       // every node's visible children, node after node
    std::vector<std::int32_t> m_allKids;    // every node's children, node after node
    std::vector<std::uint32_t> m_allKidsAt; // node -> first of its children in m_allKids
    // Each node's module path or parameter name, case-folded UTF-8, converted once per
    // structure (when a filter first needs them) so a filter change only searches bytes.
    std::string m_folded;
    std::vector<std::uint32_t> m_foldedAt;
    std::vector<std::uint8_t> m_nameMatch; // node -> its own name contains m_matchedFor
    std::string m_matchedFor;              // case-folded filter m_nameMatch was computed for
    bool m_nameMatchValid = false;
    std::int32_t m_topFetched = 0;
    std::vector<std::int32_t> m_moduleNode; // module id -> node
    // Indexed by SessionStore::paramSlot (size_t(-1) when absent), not by parameter id.
    std::size_t paramSlot(ParamId id) const;
    std::vector<std::int32_t> m_paramNode;             // param slot -> owned node
    std::vector<std::vector<std::int32_t>> m_extNodes; // param slot -> external nodes
    std::vector<std::int64_t> m_moduleNumel;           // module id -> numel of its subtree
    QString m_filter;
    int m_sortColumn = -1;
    Qt::SortOrder m_sortOrder = Qt::AscendingOrder;
    int m_batch = 2000;
    int m_matching = 0;
    bool m_busy = false; // a reset or an insertion is being announced
};

} // namespace shardscope::models

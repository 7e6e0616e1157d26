#include "views/paramdetail.h"

#include <QApplication>
#include <QClipboard>
#include <QFontDatabase>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QTableWidget>
#include <QVBoxLayout>

#include <algorithm>

#include "session/labels.h"
#include "session/sessionstore.h"
#include "state/partition.h"

namespace shardscope::views {

namespace {

const char *const kFields[] = {"owner",          "FSDP unit",     "shape",           "dtype",
                               "numel",          "padded numel",  "partition numel", "placements",
                               "partitioned",    "registered on", "active modules",  "gathers",
                               "gathered bytes", "gather time",   "last gather"};
// Shown only where they apply (FSDP2's runs).
const char *const kOptionalFields[] = {"FSDP unit", "placements"};

// Registrations and active modules shown in one label: a model may register a parameter
// on thousands of modules, and laying out a label of all of them freezes the window.
constexpr std::size_t kMaxListedModules = 20;

// The first kMaxListedModules of `total` entries, label(i) naming entry i.
template <class Label> QString boundedList(std::size_t total, Label label)
{
    if (total == 0) return ParamDetail::tr("none");
    QStringList shown;
    for (std::size_t i = 0; i < total && i < kMaxListedModules; ++i)
        shown << label(i);
    QString text = shown.join(QStringLiteral(", "));
    if (total > kMaxListedModules)
        text += ParamDetail::tr(" \u2026 and %1 more").arg(total - kMaxListedModules);
    return text;
}

} // namespace

ParamDetail::ParamDetail(session::SessionStore *store, QWidget *parent)
    : QWidget(parent), m_store(store), m_title(new QLabel(this)), m_form(new QFormLayout),
      m_shards(new QTableWidget(0, 5, this)), m_violationsBox(new QWidget(this)),
      m_violationsLayout(new QVBoxLayout(m_violationsBox))
{
    QFont tf = m_title->font();
    tf.setBold(true);
    tf.setPointSizeF(tf.pointSizeF() * 1.2);
    m_title->setFont(tf);
    m_title->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_title->setWordWrap(true);
    // Long values go under their name instead of widening the panel.
    m_form->setRowWrapPolicy(QFormLayout::WrapLongRows);
    for (const char *name : kFields) {
        auto *value = new QLabel(this);
        value->setTextInteractionFlags(Qt::TextSelectableByMouse);
        value->setWordWrap(true);
        m_fields.insert(QString::fromLatin1(name), value);
        m_form->addRow(QString::fromLatin1(name) + QLatin1Char(':'), value);
    }
    m_shards->setHorizontalHeaderLabels(
        {tr("Rank"), tr("Offset"), tr("Length"), tr("Padding"), tr("Status")});
    m_shards->verticalHeader()->hide();
    m_shards->setEditTriggers(QAbstractItemView::NoEditTriggers);
    // Columns as wide as their contents, the table as tall as its rows (up to a screenful of
    // ranks, then it scrolls): it fits the panel's width instead of running past its edge.
    m_shards->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_shards->horizontalHeader()->setStretchLastSection(true);
    m_shards->verticalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_shards->setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
    m_shards->setWordWrap(false);
    m_violationsLayout->setContentsMargins(0, 0, 0, 0);

    auto *inner = new QWidget;
    auto *layout = new QVBoxLayout(inner);
    layout->addWidget(m_title);
    layout->addLayout(m_form);
    layout->addWidget(new QLabel(tr("Shards"), inner));
    layout->addWidget(m_shards);
    layout->addWidget(m_violationsBox);
    layout->addStretch();
    auto *scroll = new QScrollArea(this);
    scroll->setWidget(inner);
    scroll->setWidgetResizable(true);
    // The panel scrolls down, never sideways: text wraps to its width.
    scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    scroll->setFrameShape(QFrame::NoFrame);
    auto *outer = new QVBoxLayout(this);
    outer->setContentsMargins(0, 0, 0, 0);
    outer->addWidget(scroll);

    connect(m_store, &session::SessionStore::updated, this, &ParamDetail::onStoreUpdated);
    refresh();
}

void ParamDetail::showParam(ParamId id)
{
    m_param = id;
    refresh();
}

QString ParamDetail::field(const QString &name) const
{
    if (name == QLatin1String("title")) return QString(m_title->text()).remove(QChar(0x200B));
    const QLabel *l = m_fields.value(name);
    return l ? QString(l->text()).remove(QChar(0x200B)) : QString();
}

void ParamDetail::onStoreUpdated(const session::StoreChanges &changes)
{
    if (m_param == kNoParam) return;
    if (changes.reset || changes.structure || changes.violations ||
        std::find(changes.params.begin(), changes.params.end(), m_param) != changes.params.end())
        refresh();
}

void ParamDetail::refresh()
{
    const state::ParamRecord *p = m_param == kNoParam ? nullptr : m_store->param(m_param);
    showFields(p);
    showShards(p);
    showViolations(p);
}

// The title and the form: what the parameter is, where it is registered, its gathers.
void ParamDetail::showFields(const state::ParamRecord *p)
{
    if (!p) {
        m_title->setText(tr("Select a parameter in the tree"));
        for (QLabel *l : std::as_const(m_fields))
            l->clear();
        for (const char *name : kOptionalFields)
            m_form->setRowVisible(m_fields.value(QString::fromLatin1(name)), false);
        return;
    }
    m_title->setText(session::labels::breakable(QString::fromStdString(p->name)) +
                     (p->late ? tr("  (late parameter)") : QString()));
    auto set = [this](const char *name, const QString &text) {
        m_fields.value(QString::fromLatin1(name))->setText(session::labels::breakable(text));
    };
    const state::ModuleRecord *owner = m_store->module(p->owner);
    set("owner",
        m_store->modulePath(p->owner) +
            (owner ? QStringLiteral(" (%1)").arg(QString::fromStdString(owner->type)) : QString()));
    const QString unit =
        owner ? session::labels::fsdpUnit(*owner, m_store->modulePath(owner->unitGroup))
              : QString();
    set("FSDP unit", unit);
    set("placements", QString::fromStdString(p->placements));
    for (const char *name : kOptionalFields)
        m_form->setRowVisible(m_fields.value(QString::fromLatin1(name)),
                              !m_fields.value(QString::fromLatin1(name))->text().isEmpty());
    set("shape", session::labels::shape(p->shape));
    set("dtype", session::labels::dtype(p->dtype));
    set("numel", session::labels::count(static_cast<std::uint64_t>(p->numel)));
    set("padded numel", session::labels::count(static_cast<std::uint64_t>(p->paddedNumel)));
    set("partition numel", session::labels::count(static_cast<std::uint64_t>(p->partitionNumel)));
    set("partitioned",
        p->persistent    ? tr("no: persistent (below the persistence threshold)")
        : p->partitioned ? tr("yes")
        : p->late
            ? tr("no: created after partitioning; adopt it or create it inside GatheredParameters")
            : tr("no"));
    set("registered on", boundedList(p->externals.size(), [&](std::size_t i) {
            const state::ExternalRecord &e = p->externals[i];
            return m_store->modulePath(e.module) + (e.automatic ? tr(" (auto)") : tr(" (manual)"));
        }));
    set("active modules", boundedList(p->activeModules.size(), [&](std::size_t i) {
            return m_store->modulePath(p->activeModules[i]);
        }));
    set("gathers", session::labels::count(p->gatherCount));
    set("gathered bytes", session::labels::bytes(p->gatherBytes));
    set("gather time", session::labels::duration(p->gatherNs));
    const std::uint64_t t0 = m_store->timeOrigin();
    set("last gather", p->lastGatherTsNs == 0
                           ? tr("never")
                           : tr("at %1").arg(session::labels::duration(
                                 p->lastGatherTsNs >= t0 ? p->lastGatherTsNs - t0 : 0)));
}

// A row per rank: its shard as the producer laid it out (PartitionLayout::reported; the whole
// tensor on every rank when the parameter is not partitioned) and its status.
void ParamDetail::showShards(const state::ParamRecord *p)
{
    if (!p) {
        m_shards->setRowCount(0);
        fitShardTable();
        return;
    }
    const int world = std::max<int>(1, static_cast<int>(p->status.size()));
    const bool sharded = p->partitioned && !p->persistent;
    const std::int64_t numel = std::max<std::int64_t>(p->numel, 0);
    // The producer's shards (FSDP2 pads dim 0; HSDP shards over part of the world).
    const state::PartitionLayout layout =
        sharded ? state::PartitionLayout::reported(numel, p->paddedNumel, p->partitionNumel, world)
                : state::PartitionLayout::make(numel, 1);
    m_shards->setRowCount(world);
    for (int r = 0; r < world; ++r) {
        const int shard = sharded ? layout.shardOf(r) : 0;
        const QString status = static_cast<std::size_t>(r) < p->status.size()
                                   ? session::labels::status(p->status[static_cast<std::size_t>(r)])
                                   : QString();
        const QString cells[] = {
            QString::number(r),
            session::labels::count(static_cast<std::uint64_t>(layout.offset(shard))),
            session::labels::count(static_cast<std::uint64_t>(layout.partitionNumel)),
            session::labels::count(static_cast<std::uint64_t>(layout.paddingNumel(shard))), status};
        for (int c = 0; c < 5; ++c) {
            auto *item = m_shards->item(r, c);
            if (!item) {
                item = new QTableWidgetItem;
                m_shards->setItem(r, c, item);
            }
            item->setText(cells[c]);
        }
    }
    fitShardTable();
}

// Each violation of the parameter with its count, and the fix line with a Copy button.
void ParamDetail::showViolations(const state::ParamRecord *p)
{
    while (QLayoutItem *item = m_violationsLayout->takeAt(0)) {
        delete item->widget();
        delete item;
    }
    m_fixes.clear();
    if (!p) return;
    const auto groups = m_store->violationsOf(m_param);
    if (!groups.empty()) {
        auto *header = new QLabel(tr("<b>Violations</b>"), m_violationsBox);
        m_violationsLayout->addWidget(header);
    }
    const QFont mono = QFontDatabase::systemFont(QFontDatabase::FixedFont);
    for (const state::ViolationRow *g : groups) {
        auto *msg = new QLabel(
            QStringLiteral("%1 × %2: %3")
                .arg(g->count)
                .arg(
                    session::labels::kind(g->kind),
                    session::labels::breakable(QString::fromStdString(g->message)).toHtmlEscaped()),
            m_violationsBox);
        msg->setWordWrap(true);
        msg->setStyleSheet(QStringLiteral("color: #b01010"));
        m_violationsLayout->addWidget(msg);
        if (g->location.known()) {
            // Where in the user's code, selectable and copyable as file:line.
            const QString where = QString::fromStdString(g->location.fileLine());
            auto *row = new QWidget(m_violationsBox);
            auto *h = new QHBoxLayout(row);
            h->setContentsMargins(0, 0, 0, 0);
            auto *at = new QLabel(
                tr("at %1 in %2")
                    .arg(session::labels::breakable(where),
                         session::labels::breakable(QString::fromStdString(g->location.function))),
                row);
            at->setObjectName(QStringLiteral("location"));
            at->setFont(mono);
            at->setWordWrap(true);
            at->setTextInteractionFlags(Qt::TextSelectableByMouse);
            QStringList tip;
            for (const std::string &frame : g->location.chain)
                tip << tr("from %1").arg(QString::fromStdString(frame));
            if (!g->building.empty())
                tip << tr("while building: %1").arg(QString::fromStdString(g->building));
            at->setToolTip(tip.join(QLatin1Char('\n')));
            auto *copy = new QPushButton(tr("Copy"), row);
            copy->setObjectName(QStringLiteral("copyLocation"));
            connect(copy, &QPushButton::clicked, this,
                    [where] { QApplication::clipboard()->setText(where); });
            h->addWidget(at, 1);
            h->addWidget(copy, 0, Qt::AlignTop);
            m_violationsLayout->addWidget(row);
        }
        if (g->fix.empty()) continue;
        const QString fix = QString::fromStdString(g->fix);
        m_fixes << fix;
        auto *row = new QWidget(m_violationsBox);
        auto *h = new QHBoxLayout(row);
        h->setContentsMargins(0, 0, 0, 0);
        auto *line = new QLabel(session::labels::breakable(fix), row);
        line->setFont(mono);
        line->setWordWrap(true);
        line->setTextInteractionFlags(Qt::TextSelectableByMouse);
        auto *copy = new QPushButton(tr("Copy"), row);
        copy->setObjectName(QStringLiteral("copyFix"));
        connect(copy, &QPushButton::clicked, this, [this, fix] {
            QApplication::clipboard()->setText(fix);
            Q_EMIT fixCopied(fix);
        });
        h->addWidget(line, 1);
        h->addWidget(copy, 0, Qt::AlignTop);
        m_violationsLayout->addWidget(row);
    }
}

// As tall as the header and the rows, up to kShardRowsShown rows; beyond, it scrolls.
void ParamDetail::fitShardTable()
{
    constexpr int kShardRowsShown = 8;
    m_shards->resizeColumnsToContents();
    const int rows = std::min(m_shards->rowCount(), kShardRowsShown);
    int height = m_shards->horizontalHeader()->sizeHint().height() + 2 * m_shards->frameWidth();
    for (int r = 0; r < rows; ++r)
        height += m_shards->verticalHeader()->sectionSize(r);
    if (m_shards->horizontalScrollBar()->isVisible())
        height += m_shards->horizontalScrollBar()->sizeHint().height();
    m_shards->setFixedHeight(std::max(height, 40));
}

} // namespace shardscope::views

#include "views/partitionmap.h"

#include <algorithm>
#include <cmath>

#include <QHelpEvent>
#include <QPainter>
#include <QToolTip>

#include "state/partition.h"

namespace shardscope::views {

namespace {

constexpr int kMargin = 6;
constexpr double kMaxRowHeight = 24.0;
constexpr double kMinRowHeight = 2.0;
constexpr int kMaxWorld = 4096;

// How a parameter is drawn: its shards as the producer laid them out (FSDP2 pads dim 0,
// HSDP shards over part of the world; PartitionLayout::reported falls back to core's math
// where the record's sizes make no layout), or, when it is not partitioned, the whole tensor
// on every rank (one shard, shown on each rank's row).
state::PartitionLayout layoutOf(const state::ParamRecord &p, int world)
{
    const std::int64_t numel = std::max<std::int64_t>(p.numel, 0);
    return p.partitioned
               ? state::PartitionLayout::reported(numel, p.paddedNumel, p.partitionNumel, world)
               : state::PartitionLayout::make(numel, 1);
}

QString statusText(ParamStatus s)
{
    return QString::fromLatin1(statusName(s).data(), qsizetype(statusName(s).size()));
}

} // namespace

PartitionMap::PartitionMap(QWidget *parent) : QWidget(parent)
{
    setMouseTracking(true);
    setAttribute(Qt::WA_OpaquePaintEvent);
}

void PartitionMap::setState(const state::EngineState &state)
{
    m_allParams = state.params;
    std::sort(m_allParams.begin(), m_allParams.end(),
              [](const state::ParamRecord &a, const state::ParamRecord &b) { return a.id < b.id; });
    m_worldSize = std::clamp(state.worldSize, 1, kMaxWorld);
    rebuildShown();
}

void PartitionMap::clear()
{
    m_allParams.clear();
    m_worldSize = 1;
    m_selectedParam = kNoParam;
    m_selectedModule = kNoModule;
    rebuildShown();
}

void PartitionMap::setRecords(int worldSize, const std::vector<state::ParamRecord> &records)
{
    m_allParams.clear();
    m_worldSize = std::clamp(worldSize, 1, kMaxWorld);
    m_selectedParam = records.size() == 1 ? records.front().id : kNoParam;
    m_selectedModule = kNoModule;
    m_shown = QVector<state::ParamRecord>(records.begin(), records.end());
    m_layoutDirty = true;
    updateGeometry();
    update();
}

void PartitionMap::setParameter(ParamId id)
{
    m_selectedParam = id;
    m_selectedModule = kNoModule;
    rebuildShown();
}

void PartitionMap::setModule(ModuleId id)
{
    m_selectedModule = id;
    m_selectedParam = kNoParam;
    rebuildShown();
}

const state::ParamRecord *PartitionMap::findParam(ParamId id) const
{
    auto it = std::lower_bound(m_allParams.begin(), m_allParams.end(), id,
                               [](const state::ParamRecord &p, ParamId v) { return p.id < v; });
    return it != m_allParams.end() && it->id == id ? &*it : nullptr;
}

void PartitionMap::rebuildShown()
{
    m_shown.clear();
    if (m_selectedParam != kNoParam) {
        if (const state::ParamRecord *p = findParam(m_selectedParam)) m_shown.push_back(*p);
    } else if (m_selectedModule != kNoModule) {
        for (const state::ParamRecord &p : m_allParams)
            if (p.owner == m_selectedModule) m_shown.push_back(p);
    }
    m_layoutDirty = true;
    updateGeometry();
    update();
}

// The legend's entries in order, each wrapped to the next line where it would run past the
// right edge: their positions (left, line) for the painter, and how many lines they take.
namespace {

QStringList legendLabels()
{
    return {statusText(ParamStatus::NotAvailable), statusText(ParamStatus::Inflight),
            statusText(ParamStatus::Available), QObject::tr("padding")};
}

} // namespace

QVector<QPointF> PartitionMap::legendPositions() const
{
    const QFontMetrics fm = fontMetrics();
    const double box = fm.height() - 4;
    QVector<QPointF> out;
    double lx = kMargin;
    int line = 0;
    for (const QString &label : legendLabels()) {
        const double w = box + 4 + fm.horizontalAdvance(label);
        if (lx > kMargin && lx + w > width() - kMargin) {
            ++line;
            lx = kMargin;
        }
        out.push_back(QPointF(lx, line));
        lx += w + 12;
    }
    return out;
}

int PartitionMap::legendHeight() const
{
    const QVector<QPointF> at = legendPositions();
    const int lines = at.isEmpty() ? 1 : int(at.back().y()) + 1;
    return lines * (fontMetrics().height() + 2) + 6;
}

int PartitionMap::bandHeaderHeight() const
{
    return fontMetrics().height() + 6;
}

int PartitionMap::labelWidth() const
{
    return fontMetrics().horizontalAdvance(QStringLiteral("r%1").arg(m_worldSize - 1)) + 10;
}

int PartitionMap::hiddenParameters() const
{
    layoutRects();
    return m_hiddenBands;
}

double PartitionMap::rowHeight() const
{
    layoutRects();
    return m_rowHeight;
}

void PartitionMap::layoutRects() const
{
    if (!m_layoutDirty && m_layoutSize == size()) return;
    m_layoutDirty = false;
    m_layoutSize = size();
    m_rects.clear();
    m_headers.clear();
    m_hiddenBands = 0;
    int bands = int(m_shown.size());
    if (bands == 0) {
        m_rowHeight = 0;
        return;
    }
    // Bands that do not fit at the smallest row height are left out and counted instead.
    const double top = kMargin + legendHeight();
    const double band = bandHeaderHeight() + kMargin;
    const double available = height() - top - kMargin;
    const double minBand = band + m_worldSize * kMinRowHeight;
    if (bands * minBand > available) {
        bands = std::max(1, int((available - bandHeaderHeight()) / minBand));
        m_hiddenBands = int(m_shown.size()) - bands;
    }
    const double usable = available - bands * band - (m_hiddenBands > 0 ? bandHeaderHeight() : 0);
    const double rows = double(bands) * m_worldSize;
    m_rowHeight = std::clamp(std::floor(usable / rows), kMinRowHeight, kMaxRowHeight);
    const double gap = m_rowHeight >= 6 ? 1.0 : 0.0;
    const double x0 = kMargin + labelWidth();
    const double plotWidth = std::max(1.0, width() - kMargin - x0);

    double y = top;
    m_rects.reserve(bands * m_worldSize);
    for (int b = 0; b < bands; ++b) {
        const state::ParamRecord &p = m_shown[b];
        m_headers.push_back(QRectF(kMargin, y, width() - 2 * kMargin, bandHeaderHeight()));
        y += bandHeaderHeight();
        const state::PartitionLayout l = layoutOf(p, m_worldSize);
        const double scale = l.paddedNumel > 0 ? plotWidth / double(l.paddedNumel) : 0.0;
        for (int r = 0; r < m_worldSize; ++r) {
            ShardRect s;
            s.param = p.id;
            s.band = b;
            s.rank = r;
            s.partitioned = p.partitioned;
            s.status = r < int(p.status.size()) ? p.status[r] : ParamStatus::NotAvailable;
            const int shard = p.partitioned ? l.shardOf(r) : 0;
            s.offset = l.offset(shard);
            s.length = l.partitionNumel;
            s.validNumel = l.validNumel(shard);
            s.paddingNumel = l.paddingNumel(shard);
            const double rowY = y + r * m_rowHeight;
            const double h = m_rowHeight - gap;
            s.row = QRectF(x0, rowY, plotWidth, h);
            const double dataX = x0 + double(s.offset) * scale;
            const double padX = x0 + double(s.offset + s.validNumel) * scale;
            const double endX = x0 + double(s.offset + s.length) * scale;
            if (s.validNumel > 0) s.data = QRectF(dataX, rowY, padX - dataX, h);
            if (s.paddingNumel > 0) s.padding = QRectF(padX, rowY, endX - padX, h);
            m_rects.push_back(s);
        }
        y += m_worldSize * m_rowHeight + kMargin;
    }
    m_moreNote = QRectF(kMargin, y, width() - 2 * kMargin, bandHeaderHeight());
}

QVector<ShardRect> PartitionMap::shardRects() const
{
    layoutRects();
    return m_rects;
}

const ShardRect *PartitionMap::shardAt(QPointF pos) const
{
    layoutRects();
    for (const ShardRect &s : m_rects) {
        if (s.data.contains(pos) || s.padding.contains(pos)) return &s;
    }
    return nullptr;
}

QColor PartitionMap::statusColor(ParamStatus s)
{
    switch (s) {
    case ParamStatus::NotAvailable:
        return QColor(0x8d, 0x99, 0xae);
    case ParamStatus::Inflight:
        return QColor(0xf2, 0xa1, 0x2c);
    case ParamStatus::Available:
        return QColor(0x3b, 0xa5, 0x5c);
    }
    return QColor(Qt::gray);
}

QString PartitionMap::toolTipFor(const ShardRect &s) const
{
    QString name;
    if (s.band >= 0 && s.band < m_shown.size()) name = QString::fromStdString(m_shown[s.band].name);
    QString text = tr("rank %1 of %2").arg(s.rank).arg(name);
    if (!s.partitioned) {
        text += tr("\nnot partitioned: every rank holds all %1 elements").arg(s.length);
    } else {
        text += tr("\noffset %1, length %2: %3 real + %4 padding elements")
                    .arg(s.offset)
                    .arg(s.length)
                    .arg(s.validNumel)
                    .arg(s.paddingNumel);
    }
    text += tr("\nstatus %1").arg(statusText(s.status));
    return text;
}

QSize PartitionMap::sizeHint() const
{
    const int bands = std::clamp<int>(int(m_shown.size()), 1, 4);
    const int rowsHeight = bands * (bandHeaderHeight() + kMargin + m_worldSize * 14);
    return QSize(480, std::min(900, kMargin * 2 + legendHeight() + rowsHeight));
}

QSize PartitionMap::minimumSizeHint() const
{
    const int rowsHeight = bandHeaderHeight() + kMargin + m_worldSize * int(kMinRowHeight);
    return QSize(200, kMargin * 2 + legendHeight() + rowsHeight);
}

void PartitionMap::resizeEvent(QResizeEvent *event)
{
    m_layoutDirty = true;
    QWidget::resizeEvent(event);
}

bool PartitionMap::event(QEvent *event)
{
    if (event->type() == QEvent::ToolTip) {
        auto *help = static_cast<QHelpEvent *>(event);
        if (const ShardRect *s = shardAt(help->pos()))
            QToolTip::showText(help->globalPos(), toolTipFor(*s), this);
        else
            QToolTip::hideText();
        return true;
    }
    return QWidget::event(event);
}

void PartitionMap::paintEvent(QPaintEvent *)
{
    layoutRects();
    QPainter p(this);
    p.fillRect(rect(), palette().base());
    const QFontMetrics fm = fontMetrics();
    const QColor text = palette().color(QPalette::Text);

    // Legend: the three statuses and the padding hatch.
    const QVector<QPointF> at = legendPositions();
    int item = 0;
    const double box = fm.height() - 4;
    auto legendItem = [&](const QColor &c, const QString &label, bool hatched) {
        double lx = at[item].x();
        const double ly = kMargin + at[item].y() * (fm.height() + 2);
        ++item;
        const QRectF r(lx, ly + 2, box, box);
        p.fillRect(r, hatched ? palette().base().color() : c);
        if (hatched) p.fillRect(r, QBrush(text, Qt::BDiagPattern));
        p.setPen(text);
        p.drawRect(r);
        lx += box + 4;
        p.drawText(QPointF(lx, ly + fm.ascent()), label);
    };
    legendItem(statusColor(ParamStatus::NotAvailable), statusText(ParamStatus::NotAvailable),
               false);
    legendItem(statusColor(ParamStatus::Inflight), statusText(ParamStatus::Inflight), false);
    legendItem(statusColor(ParamStatus::Available), statusText(ParamStatus::Available), false);
    legendItem(QColor(), tr("padding"), true);

    if (m_shown.isEmpty()) {
        p.setPen(palette().color(QPalette::PlaceholderText));
        p.drawText(rect().adjusted(kMargin, legendHeight() + kMargin, -kMargin, -kMargin),
                   Qt::AlignCenter | Qt::TextWordWrap,
                   tr("Select a parameter or a module to see how it is partitioned."));
        return;
    }

    for (int b = 0; b < m_headers.size(); ++b) {
        const state::ParamRecord &rec = m_shown[b];
        const state::PartitionLayout l = layoutOf(rec, m_worldSize);
        QString line = QString::fromStdString(rec.name);
        if (rec.partitioned)
            line += tr("  numel %1, padded %2, %3 per rank")
                        .arg(l.numel)
                        .arg(l.paddedNumel)
                        .arg(l.partitionNumel);
        else
            line += tr("  numel %1, %2")
                        .arg(l.numel)
                        .arg(rec.late ? tr("late: not partitioned")
                                      : tr("persistent: not partitioned"));
        p.setPen(text);
        const QRectF h = m_headers[b];
        p.drawText(h, Qt::AlignLeft | Qt::AlignVCenter,
                   fm.elidedText(line, Qt::ElideMiddle, int(h.width())));
    }

    if (m_hiddenBands > 0) {
        p.setPen(palette().color(QPalette::PlaceholderText));
        p.drawText(m_moreNote, Qt::AlignLeft | Qt::AlignVCenter,
                   fm.elidedText(tr("… and %n more parameter(s) of this module: select one to see "
                                    "its partition, or enlarge the view",
                                    nullptr, m_hiddenBands),
                                 Qt::ElideRight, int(m_moreNote.width())));
    }

    const int labelEvery = std::max(1, int(std::ceil(fm.height() / std::max(1.0, m_rowHeight))));
    const QColor rowBg = palette().color(QPalette::AlternateBase);
    const QColor hatch = palette().color(QPalette::Text);
    for (const ShardRect &s : m_rects) {
        p.fillRect(s.row, rowBg);
        if (!s.data.isEmpty()) p.fillRect(s.data, statusColor(s.status));
        if (!s.padding.isEmpty()) {
            p.fillRect(s.padding, statusColor(s.status).lighter(150));
            p.fillRect(s.padding, QBrush(hatch, Qt::BDiagPattern));
        }
        const QRectF shard = s.data.united(s.padding);
        if (shard.width() >= 4 && shard.height() >= 6) {
            p.setPen(statusColor(s.status).darker(160));
            p.drawRect(shard.adjusted(0, 0, -1, -1));
        }
        // A label that would run into the next parameter's header is left out.
        const qsizetype lastRow = qsizetype(s.band + 1) * m_worldSize - 1;
        const double bandBottom = lastRow < m_rects.size() ? m_rects[lastRow].row.bottom() : 0;
        const bool fits = s.rank == 0 || s.row.top() + fm.height() <= bandBottom + 1;
        if (s.rank % labelEvery == 0 && fits) {
            p.setPen(text);
            const QRectF label(kMargin, s.row.top(), labelWidth() - 6,
                               std::max<double>(s.row.height(), fm.height()));
            p.drawText(label, Qt::AlignRight | Qt::AlignTop,
                       fm.elidedText(QStringLiteral("r%1").arg(s.rank), Qt::ElideRight,
                                     int(label.width())));
        }
    }
}

} // namespace shardscope::views

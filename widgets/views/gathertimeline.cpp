#include "views/gathertimeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include <QHBoxLayout>
#include <QLabel>
#include <QSpinBox>
#include <QToolButton>
#include <qcustomplot.h>

#include "models/severitycolor.h"
#include "session/labels.h"
#include "state/shape.h"

namespace shardscope::views {

namespace {

// A fetch span's kind is its fetch reason (GatherSpans keeps the event's flags).
static_assert(int(SpanKind::Forward) == int(FetchReason::Forward) &&
              int(SpanKind::Backward) == int(FetchReason::Backward) &&
              int(SpanKind::Prefetch) == int(FetchReason::Prefetch) &&
              int(SpanKind::GatheredParameters) == int(FetchReason::GatheredParameters) &&
              int(SpanKind::Guard) == int(FetchReason::Guard));

// How far beside a fetch span, in pixels, hovering or clicking still hits it.
constexpr double kFetchTolerancePx = 1.5;
// Steps closer than this on screen get a boundary line only where they are labelled.
constexpr double kDenseStepPx = 12;

// Vertical extent of each track inside a lane, as fractions of the lane height around
// the lane's centre (the y axis is reversed: negative is up).
struct Band
{
    double top;
    double bottom;
};
constexpr Band kFetchBand{-0.34, 0.06};
constexpr Band kReduceBand{0.09, 0.24}; // gradient reduce-scatters, below the all-gathers
constexpr Band kMarkBand{0.27, 0.42};

// Pixel extent of fetch sub-row `row` of `rows` in the lane centred at yc: the fetch
// band is shared evenly by the rows the rank has needed.
Band fetchRowPixels(double yc, double laneH, int row, int rows)
{
    const double top = yc + kFetchBand.top * laneH;
    const double h = (kFetchBand.bottom - kFetchBand.top) * laneH / std::max(1, rows);
    const int r = std::clamp(row, 0, std::max(1, rows) - 1);
    return {top + r * h, top + (r + 1) * h};
}

// Fetch sub-row of `rows` at dy pixels from the lane centre, or -1 outside the fetch band
// (with a pixel of slack either side, as hovering needs).
int fetchRowAt(double dy, double laneH, int rows)
{
    if (dy < kFetchBand.top * laneH - 1 || dy > kFetchBand.bottom * laneH + 1) return -1;
    rows = std::max(1, rows);
    const double rowH = (kFetchBand.bottom - kFetchBand.top) * laneH / rows;
    return std::clamp(int(std::floor((dy - kFetchBand.top * laneH) / rowH)), 0, rows - 1);
}

// Pixel extent an in-flight fetch is drawn over: from its start to "now", the newest
// event, cut at the right edge and at least a pixel wide; none when off screen.
std::optional<std::pair<double, double>> openFetchPixels(const OpenFetch &f,
                                                         const GatherSpans &spans, QCPAxis *x)
{
    const double now = std::min(x->range().upper, spans.lastTime());
    if (f.start > x->range().upper || now < x->range().lower) return std::nullopt;
    const double x0 = x->coordToPixel(f.start);
    return std::pair{x0, std::max(x0 + 1, x->coordToPixel(now))};
}

// Rows a pixel apart when there is room, so stacked spans of one colour stay apart.
QRectF fetchRect(double x0, double x1, Band rowPixels)
{
    const double h = rowPixels.bottom - rowPixels.top;
    return QRectF(x0, rowPixels.top, x1 - x0, std::max(1.0, h >= 4 ? h - 1 : h));
}
// Spans of a track closer than this many pixels merge into one drawn block: a pixel for
// spans, a marker's width for violations (a mark a step at whole-run zoom is one marker with
// its count, not a row of overlapping triangles).
double mergePixels(SpanTrack t)
{
    return t == SpanTrack::Violation ? 7.0 : 1.0;
}

// Violation markers stay visible on thin lanes, overlapping the neighbour if need be.
double violationSize(double laneH)
{
    return std::clamp(laneH * 0.5, 7.0, 9.0);
}

QString formatSeconds(double s)
{
    const double a = std::abs(s);
    if (a >= 1.0) return QStringLiteral("%1 s").arg(s, 0, 'f', 3);
    if (a >= 1e-3) return QStringLiteral("%1 ms").arg(s * 1e3, 0, 'f', 3);
    return QStringLiteral("%1 µs").arg(s * 1e6, 0, 'f', 1);
}

} // namespace

// Draws the lanes straight from GatherSpans at the axes' current range: only the
// visible blocks, sub-pixel spans merged, so a replot costs what is on screen.
class GatherLanesPlottable : public QCPAbstractPlottable
{
  public:
    GatherLanesPlottable(GatherTimeline *owner, QCPAxis *keyAxis, QCPAxis *valueAxis)
        : QCPAbstractPlottable(keyAxis, valueAxis), m_owner(owner)
    {
        setAntialiasedFill(false);
        setAntialiased(false);
        setSelectable(QCP::stNone);
    }

    double selectTest(const QPointF &, bool, QVariant *) const override { return -1; }

    QCPRange getKeyRange(bool &foundRange, QCP::SignDomain) const override
    {
        const GatherSpans &s = m_owner->m_spans;
        foundRange = !s.isEmpty();
        return QCPRange(s.firstTime(), s.lastTime());
    }

    QCPRange getValueRange(bool &foundRange, QCP::SignDomain, const QCPRange &) const override
    {
        foundRange = true;
        return QCPRange(-0.5, m_owner->shownLanes() - 0.5);
    }

  protected:
    void drawLegendIcon(QCPPainter *, const QRectF &) const override {}

    void draw(QCPPainter *painter) override
    {
        QCPAxis *x = keyAxis();
        QCPAxis *y = valueAxis();
        if (!x || !y) return;
        const QRect area = clipRect();
        const GatherSpans &spans = m_owner->m_spans;
        const double laneH = std::abs(y->coordToPixel(1) - y->coordToPixel(0));
        painter->setPen(Qt::NoPen);

        const QColor highlight(0x11, 0x11, 0x11);
        const std::vector<ParamId> &selection = m_owner->m_selection;
        if (m_owner->m_folded) {
            drawFolded(painter, x, y->coordToPixel(0), laneH, area);
            drawSteps(painter, x, area);
            return;
        }
        for (const OpenFetch &f : spans.openFetches()) {
            const auto px = openFetchPixels(f, spans, x);
            if (!px) continue;
            const double yc = y->coordToPixel(f.rank);
            QColor c = GatherTimeline::kindColor(f.kind);
            c.setAlpha(110);
            const QRectF r = fetchRect(px->first, px->second,
                                       fetchRowPixels(yc, laneH, f.row, spans.fetchRows(f.rank)));
            painter->fillRect(r, c);
            if (std::binary_search(selection.begin(), selection.end(), f.param)) {
                painter->setPen(QPen(highlight, 2));
                painter->setBrush(Qt::NoBrush);
                painter->drawRect(r.adjusted(-1, -1, 1, 1));
                painter->setPen(Qt::NoPen);
            }
        }

        const std::vector<TimelineBlock> blocks = m_owner->visibleBlocks();
        for (const TimelineBlock &b : blocks) {
            const double yc = y->coordToPixel(b.rank);
            double x0 = x->coordToPixel(b.start);
            double x1 = x->coordToPixel(b.end);
            const QColor c = b.track == SpanTrack::Violation ? models::severityColor(b.severity)
                                                             : GatherTimeline::kindColor(b.kind);
            if (b.track == SpanTrack::Violation) {
                drawViolation(painter, b, x0, x1, yc, laneH,
                              b.selected ? QPen(highlight, 2) : QPen(c.darker(150)));
                continue;
            }
            const Band band = b.track == SpanTrack::Fetch           ? kFetchBand
                              : b.track == SpanTrack::ReduceScatter ? kReduceBand
                                                                    : kMarkBand;
            const double minW = b.track == SpanTrack::Mark ? 2.0 : 1.0;
            if (x1 - x0 < minW) {
                const double xm = (x0 + x1) / 2;
                x0 = xm - minW / 2;
                x1 = xm + minW / 2;
            }
            const QRectF r =
                b.track == SpanTrack::Fetch
                    ? fetchRect(x0, x1, fetchRowPixels(yc, laneH, b.row, spans.fetchRows(b.rank)))
                    : QRectF(x0, yc + band.top * laneH, x1 - x0,
                             std::max(1.0, (band.bottom - band.top) * laneH));
            painter->fillRect(r, b.count > 1 ? c.darker(115) : c);
            if (b.selected) {
                painter->setPen(QPen(highlight, 2));
                painter->setBrush(Qt::NoBrush);
                painter->drawRect(r.adjusted(-1, -1, 1, 1));
                painter->setPen(Qt::NoPen);
            }
        }

        drawSteps(painter, x, area);
    }

    // All ranks in one lane: per pixel column, how many ranks are gathering for forward,
    // for backward and for anything else (prefetch, GatheredParameters, the guard), stacked
    // from the bottom (a rank a 1/N of the height); the violations of every rank above.
    // What is drawn is bounded by the pixels (a run of equal columns is one rectangle), not
    // by the events.
    void drawFolded(QCPPainter *painter, QCPAxis *x, double yc, double laneH, const QRect &area)
    {
        const GatherSpans &spans = m_owner->m_spans;
        const int ranks = std::min(m_owner->laneCount(), spans.laneCount());
        const int width = std::max(1, area.width());
        const double left = area.left();
        std::vector<std::array<std::uint16_t, 3>> counts(static_cast<std::size_t>(width));
        std::vector<std::int8_t> column(static_cast<std::size_t>(width));
        std::vector<TimelineBlock> blocks;
        const QCPRange r = x->range();
        const double spp = r.size() / width;
        for (int rank = 0; rank < ranks; ++rank) {
            blocks.clear();
            spans.blocks(rank, SpanTrack::Fetch, r.lower, r.upper, spp, blocks);
            std::fill(column.begin(), column.end(), std::int8_t(-1));
            for (const TimelineBlock &b : blocks) {
                // clamped as doubles first: deep in a zoom a span's far end is beyond any int
                const double p0 =
                    std::clamp(x->coordToPixel(b.start) - left, 0.0, double(width - 1));
                const double p1 = std::clamp(x->coordToPixel(b.end) - left, 0.0, double(width));
                const int c0 = int(std::floor(p0));
                const int c1 = std::max(c0 + 1, int(std::ceil(p1)));
                const std::int8_t cat = GatherTimeline::foldedCategory(b.kind);
                for (int c = c0; c < c1; ++c)
                    if (column[std::size_t(c)] < 0) column[std::size_t(c)] = cat;
            }
            for (int c = 0; c < width; ++c)
                if (column[std::size_t(c)] >= 0) ++counts[std::size_t(c)][column[std::size_t(c)]];
        }
        const double bottom = yc + 0.42 * laneH;
        const double perRank = 0.76 * laneH / std::max(1, ranks);
        const QColor colours[3] = {GatherTimeline::kindColor(SpanKind::Forward),
                                   GatherTimeline::kindColor(SpanKind::Backward),
                                   GatherTimeline::kindColor(SpanKind::Prefetch)};
        for (int c = 0; c < width;) {
            int end = c + 1;
            while (end < width && counts[std::size_t(end)] == counts[std::size_t(c)])
                ++end;
            double base = bottom;
            for (int k = 0; k < 3; ++k) {
                const int n = counts[std::size_t(c)][std::size_t(k)];
                if (!n) continue;
                const double h = n * perRank;
                painter->fillRect(QRectF(left + c, base - h, end - c, std::max(1.0, h)),
                                  colours[k]);
                base -= h;
            }
            c = end;
        }
        // every rank's violations, merged a marker's width apart, at the lane's top
        for (int rank = 0; rank < ranks; ++rank) {
            blocks.clear();
            spans.blocks(rank, SpanTrack::Violation, r.lower, r.upper, spp, blocks, {},
                         mergePixels(SpanTrack::Violation));
            for (const TimelineBlock &b : blocks)
                drawViolation(painter, b, x->coordToPixel(b.start), x->coordToPixel(b.end), yc,
                              laneH, QPen(models::severityColor(b.severity).darker(150)));
        }
        painter->setPen(Qt::NoPen);
    }

    // A violation mark: a triangle; marks merged over a stretch (a violation every step at a
    // whole-run zoom) a thin bar along it from a triangle at its start, not one wide triangle.
    static void drawViolation(QCPPainter *painter, const TimelineBlock &b, double x0, double x1,
                              double yc, double laneH, const QPen &pen)
    {
        const QColor c = models::severityColor(b.severity);
        const double s = violationSize(laneH);
        const double top = yc - laneH * 0.5 + 1;
        if (x1 - x0 > s) {
            painter->fillRect(QRectF(x0, top, x1 - x0, 3), c);
            x1 = x0;
        }
        const double xm = x1 - x0 > 0 ? (x0 + x1) / 2 : x0;
        QPolygonF tri;
        tri << QPointF(xm - s / 2, top) << QPointF(xm + s / 2, top) << QPointF(xm, top + s);
        painter->setBrush(c);
        painter->setPen(pen);
        painter->drawPolygon(tri);
        painter->setPen(Qt::NoPen);
    }

    void drawSteps(QCPPainter *painter, QCPAxis *x, const QRect &area)
    {
        // Step boundaries; their labels are the top axis's (GatherTimeline::updateStepLabels),
        // above the lanes. Where steps are closer than kDenseStepPx a line per step is a
        // barcode over the spans: then only the labelled steps get one.
        const auto &steps = m_owner->m_spans.steps();
        if (steps.empty()) return;
        QPen stepPen(QColor(0x55, 0x55, 0x55), 1, Qt::DashLine);
        painter->setPen(stepPen);
        std::vector<double> lines;
        for (auto it = steps.begin(); it != steps.end(); ++it)
            if (it->second >= x->range().lower && it->second <= x->range().upper)
                lines.push_back(x->coordToPixel(it->second));
        const bool dense = lines.size() > 1 &&
                           (lines.back() - lines.front()) / double(lines.size() - 1) < kDenseStepPx;
        if (dense) {
            lines.clear();
            for (double t : m_owner->stepLabels().keys())
                lines.push_back(x->coordToPixel(t));
        }
        double lastLine = -1e9;
        for (double px : lines) {
            if (px - lastLine < 3) continue;
            lastLine = px;
            painter->drawLine(QPointF(px, area.top()), QPointF(px, area.bottom()));
        }
        painter->setPen(Qt::NoPen);
    }

  private:
    GatherTimeline *m_owner;
};

GatherTimeline::GatherTimeline(QWidget *parent)
    : TimePlot(tr("Keep the newest events in view; dragging or zooming turns it off"), parent)
{
    m_legend = new QLabel(this);
    QString legend;
    for (int k = 0; k < kSpanKindCount; ++k) {
        const SpanKind kind = SpanKind(k);
        if (kind == SpanKind::Violation) { // a mark per severity, in the table's colours
            for (Severity s : {Severity::Error, Severity::Cost, Severity::Info})
                legend += QStringLiteral("<span style='color:%1'>&#9660;</span>")
                              .arg(models::severityColor(s).name());
            legend +=
                QStringLiteral("&nbsp;%1 (error, cost, info)&nbsp;&nbsp; ").arg(kindName(kind));
            continue;
        }
        legend += QStringLiteral("<span style='color:%1'>%2</span>&nbsp;%3&nbsp;&nbsp; ")
                      .arg(kindColor(kind).name(),
                           kind == SpanKind::Violation ? QStringLiteral("&#9660;")
                                                       : QStringLiteral("&#9632;"),
                           kindName(kind));
    }
    m_legend->setText(legend);
    m_legend->setTextFormat(Qt::RichText);
    m_legend->setWordWrap(true); // a narrow window wraps it instead of squeezing the docks
    // Go to step N, and the next or previous violation: what a profiler's user does all day.
    toolBar()->addSpacing(8);
    toolBar()->addWidget(new QLabel(tr("Step"), this));
    m_stepBox = new QSpinBox(this);
    m_stepBox->setObjectName(QStringLiteral("stepBox"));
    m_stepBox->setRange(0, std::numeric_limits<int>::max());
    m_stepBox->setKeyboardTracking(false);
    m_stepBox->setToolTip(tr("Show this step (G, then the number and Enter)"));
    toolBar()->addWidget(m_stepBox);
    connect(m_stepBox, &QSpinBox::editingFinished, this,
            [this] { goToStep(std::uint32_t(m_stepBox->value())); });
    auto *previous = new QToolButton(this);
    previous->setText(tr("\u25C0 violation"));
    previous->setObjectName(QStringLiteral("previousViolation"));
    previous->setToolTip(tr("The previous violation, on any rank (Shift+N)"));
    auto *nextButton = new QToolButton(this);
    nextButton->setText(tr("violation \u25B6"));
    nextButton->setObjectName(QStringLiteral("nextViolation"));
    nextButton->setToolTip(tr("The next violation, on any rank (N)"));
    connect(previous, &QToolButton::clicked, this, [this] { goToViolation(false); });
    connect(nextButton, &QToolButton::clicked, this, [this] { goToViolation(true); });
    toolBar()->addWidget(previous);
    toolBar()->addWidget(nextButton);
    m_foldButton = new QToolButton(this);
    m_foldButton->setText(tr("Fold ranks"));
    m_foldButton->setObjectName(QStringLiteral("foldRanks"));
    m_foldButton->setCheckable(true);
    m_foldButton->setToolTip(tr("All ranks in one lane: how many gather for forward, backward "
                                "and the rest at each moment, and every rank's violations"));
    connect(m_foldButton, &QToolButton::toggled, this, &GatherTimeline::setFolded);
    toolBar()->addWidget(m_foldButton);
    toolBar()->addStretch(1);
    // The legend in a row of its own, the plot's full width: beside the controls it wrapped
    // into a tall column and took the lanes' height.
    addRowAbovePlot(m_legend);

    plot()->setNoAntialiasingOnDrag(true);
    plot()->yAxis->setRangeReversed(true);
    plot()->yAxis->grid()->setVisible(false);
    plot()->yAxis->setTicker(QSharedPointer<QCPAxisTickerText>::create());
    plot()->yAxis->setSubTicks(false);
    plot()->legend->setVisible(false);
    // Step labels on the top axis: as many as fit side by side (updateStepLabels).
    plot()->xAxis2->setVisible(true);
    plot()->xAxis2->setTicker(QSharedPointer<QCPAxisTickerText>::create());
    plot()->xAxis2->setSubTicks(false);
    plot()->xAxis2->grid()->setVisible(false);
    plot()->xAxis2->setTickLength(0, 4);
    plot()->xAxis2->setBasePen(Qt::NoPen);
    plot()->xAxis2->setTickLabelColor(QColor(0x33, 0x33, 0x33));
    connect(plot()->xAxis, qOverload<const QCPRange &>(&QCPAxis::rangeChanged), plot()->xAxis2,
            qOverload<const QCPRange &>(&QCPAxis::setRange));
    connect(plot(), &QCustomPlot::beforeReplot, this, &GatherTimeline::updateStepLabels);
    m_lanes = new GatherLanesPlottable(this, plot()->xAxis, plot()->yAxis);
    m_lanes->removeFromLegend();
    // Lane labels thin out with the plot's height, known only once it is laid out.
    connect(plot(), &QCustomPlot::afterLayout, this, [this] {
        if (updateLanes()) plot()->replot(QCustomPlot::rpQueuedReplot);
    });
    updateLanes();
}

GatherTimeline::~GatherTimeline() = default;

QColor GatherTimeline::kindColor(SpanKind kind)
{
    switch (kind) {
    case SpanKind::Forward:
        return QColor(0x4e, 0x79, 0xa7);
    case SpanKind::Backward:
        return QColor(0xf2, 0x8e, 0x2b);
    case SpanKind::Prefetch:
        return QColor(0x76, 0xb7, 0xb2);
    case SpanKind::GatheredParameters:
        return QColor(0xb0, 0x7a, 0xa1);
    case SpanKind::Guard:
        return QColor(0x9c, 0x75, 0x5f);
    case SpanKind::Release:
        return QColor(0x59, 0xa1, 0x4f);
    case SpanKind::Broadcast:
        return QColor(0xd4, 0xa6, 0x0a);
    case SpanKind::Violation:
        return QColor(0xe1, 0x20, 0x2c);
    case SpanKind::ReduceScatter:
        return QColor(0x6a, 0x3d, 0x9a); // violet: no fetch reason's colour
    }
    return QColor(Qt::gray);
}

QString GatherTimeline::kindName(SpanKind kind)
{
    auto eventName = [](EventType t) {
        const std::string_view n = eventTypeName(t);
        return QString::fromLatin1(n.data(), qsizetype(n.size()));
    };
    if (kind <= SpanKind::Guard) return session::labels::reason(FetchReason(kind));
    switch (kind) {
    case SpanKind::Release:
        return eventName(EventType::Release);
    case SpanKind::Broadcast:
        return eventName(EventType::Broadcast);
    case SpanKind::Violation:
        return QStringLiteral("violation");
    case SpanKind::ReduceScatter:
        return QStringLiteral("reduce-scatter");
    default:
        return QString();
    }
}

void GatherTimeline::setState(const state::EngineState &state)
{
    m_paramNames.clear();
    m_moduleNames.clear();
    for (const state::ParamRecord &p : state.params)
        m_paramNames.insert(p.id, QString::fromStdString(p.name));
    for (const state::ModuleRecord &m : state.modules)
        m_moduleNames.insert(m.id, m.path.empty() ? tr("<root>") : QString::fromStdString(m.path));
    setWorldSize(state.worldSize);
}

void GatherTimeline::setWorldSize(int worldSize)
{
    m_worldSize = std::clamp(worldSize, 0, GatherSpans::maxRanks);
    markDirty();
}

void GatherTimeline::setTimeOrigin(quint64 tsNs)
{
    m_spans.setTimeOrigin(tsNs);
}

void GatherTimeline::appendEvents(std::span<const telemetry::Event> events)
{
    if (events.empty()) return;
    m_spans.append(events);
    markDirty();
}

void GatherTimeline::clear()
{
    m_spans.clear();
    m_selection.clear();
    markDirty();
}

void GatherTimeline::setSelection(const QList<quint32> &paramIds)
{
    m_selection.assign(paramIds.begin(), paramIds.end());
    std::sort(m_selection.begin(), m_selection.end());
    m_selection.erase(std::unique(m_selection.begin(), m_selection.end()), m_selection.end());
    markDirty();
}

QList<quint32> GatherTimeline::selection() const
{
    return QList<quint32>(m_selection.begin(), m_selection.end());
}

std::int8_t GatherTimeline::foldedCategory(SpanKind kind)
{
    return kind == SpanKind::Forward ? 0 : kind == SpanKind::Backward ? 1 : 2;
}

void GatherTimeline::setFolded(bool folded)
{
    if (folded == m_folded) return;
    m_folded = folded;
    m_foldButton->setChecked(folded);
    m_shownLanes = -1;
    updateLanes();
    refresh();
}

std::array<int, 3> GatherTimeline::ranksGatheringAt(double tSeconds) const
{
    std::array<int, 3> out{0, 0, 0};
    std::vector<TimelineBlock> blocks;
    const int ranks = std::min(laneCount(), m_spans.laneCount());
    for (int rank = 0; rank < ranks; ++rank) {
        blocks.clear();
        // exact spans: a zero-width window and no merging
        m_spans.blocks(rank, SpanTrack::Fetch, tSeconds, tSeconds, 1e-15, blocks, {}, 0.0);
        int best = 3;
        for (const TimelineBlock &b : blocks)
            if (b.start <= tSeconds && b.end >= tSeconds)
                best = std::min<int>(best, foldedCategory(b.kind));
        if (best < 3) ++out[std::size_t(best)];
    }
    return out;
}

int GatherTimeline::laneCount() const
{
    return std::max({1, m_worldSize, m_spans.laneCount()});
}

bool GatherTimeline::updateLanes()
{
    const int lanes = shownLanes();
    const int plotHeight = std::max(1, plot()->axisRect()->height());
    const double laneH = double(plotHeight) / lanes;
    const int every = std::max(1, int(std::ceil((fontMetrics().height() + 2) / laneH)));
    const int key = lanes * 10000 + every;
    if (key == m_shownLanes) return false;
    m_shownLanes = key;
    auto ticker = QSharedPointer<QCPAxisTickerText>::create();
    if (m_folded)
        ticker->addTick(0, tr("%n ranks", nullptr, laneCount()));
    else
        for (int r = 0; r < lanes; r += every)
            ticker->addTick(r, tr("rank %1").arg(r));
    plot()->yAxis->setTicker(ticker);
    plot()->yAxis->setRange(-0.5, lanes - 0.5);
    return true;
}

void GatherTimeline::applyPending()
{
    updateLanes();
}

bool GatherTimeline::goToStep(std::uint32_t step)
{
    applyPending();
    const auto &steps = m_spans.steps();
    const auto it = steps.find(step);
    if (it == steps.end()) return false;
    const auto next = std::next(it);
    double end = next != steps.end() ? next->second : m_spans.lastTime();
    if (!(end > it->second)) end = it->second + 1e-3;
    const double pad = (end - it->second) * 0.01;
    setVisibleRange(it->second - pad, end + pad);
    return true;
}

void GatherTimeline::centreOn(double tSeconds)
{
    const double half = (visibleEnd() - visibleStart()) / 2;
    setVisibleRange(tSeconds - half, tSeconds + half);
}

std::optional<GatherSpans::Found> GatherTimeline::goToViolation(bool forward, int rank)
{
    applyPending();
    const double centre = (visibleStart() + visibleEnd()) / 2;
    const auto found = m_spans.nearest(SpanTrack::Violation, centre, forward, rank);
    if (!found) return std::nullopt;
    centreOn(found->span.start);
    Q_EMIT violationShown(found->rank, found->span.param, found->span.module, found->span.start);
    return found;
}

std::optional<GatherSpans::Found> GatherTimeline::goToGather(ParamId param, bool forward)
{
    applyPending();
    const double centre = (visibleStart() + visibleEnd()) / 2;
    const auto found = m_spans.nearest(SpanTrack::Fetch, centre, forward, -1, param);
    if (!found) return std::nullopt;
    centreOn((found->span.start + found->span.end) / 2);
    setSelection({found->span.param});
    return found;
}

std::vector<models::RangeRow> GatherTimeline::rangeSummary(double t0Seconds, double t1Seconds,
                                                           int rank) const
{
    std::unordered_map<ParamId, GatherSpans::Totals> params;
    std::unordered_map<ModuleId, GatherSpans::Totals> modules;
    m_spans.summarize(t0Seconds, t1Seconds, rank, params, modules);
    std::vector<models::RangeRow> rows;
    rows.reserve(params.size() + modules.size());
    for (const auto &[id, t] : modules)
        rows.push_back({true, id, m_moduleNames.value(id, tr("module %1").arg(id)), t.gathers,
                        t.seconds, t.bytes});
    for (const auto &[id, t] : params)
        rows.push_back({false, id, m_paramNames.value(id, tr("parameter %1").arg(id)), t.gathers,
                        t.seconds, t.bytes});
    return rows;
}

void GatherTimeline::rangeDragged(double t0Seconds, double t1Seconds)
{
    applyPending();
    Q_EMIT rangeSelected(t0Seconds, t1Seconds);
}

QString GatherTimeline::keyboardHelp()
{
    return tr("W / S: zoom in / out at the centre\n"
              "A / D: pan left / right\n"
              "F: show all (fit)\n"
              "N / Shift+N: next / previous violation\n"
              "] / [: next / previous gather of the selected parameter\n"
              "G: go to a step (the Step box; Enter goes)\n"
              "Shift+drag: sum the gathers of a time range per module and parameter\n"
              "Mouse wheel: zoom; drag: pan; click: select the span's parameters");
}

bool GatherTimeline::keyPressed(int key, Qt::KeyboardModifiers modifiers)
{
    switch (key) {
    case Qt::Key_N:
        goToViolation(!(modifiers & Qt::ShiftModifier));
        return true;
    case Qt::Key_BracketRight:
    case Qt::Key_BracketLeft:
        if (!m_selection.empty()) goToGather(m_selection.front(), key == Qt::Key_BracketRight);
        return true;
    case Qt::Key_G:
        m_stepBox->setFocus();
        m_stepBox->selectAll();
        return true;
    default:
        return TimePlot::keyPressed(key, modifiers);
    }
}

bool GatherTimeline::dataRange(double &first, double &last) const
{
    if (m_spans.isEmpty()) return false;
    first = m_spans.firstTime();
    last = m_spans.lastTime();
    return true;
}

QMap<double, QString> GatherTimeline::stepLabels() const
{
    const auto ticker = plot()->xAxis2->ticker().dynamicCast<QCPAxisTickerText>();
    return ticker ? ticker->ticks() : QMap<double, QString>();
}

// Every k-th step is labelled, k the first of 1, 2, 5, 10, 20, 50, ... whose labels fit
// side by side at the mean spacing of the visible steps; a label that would still touch
// its left neighbour (steps are not evenly spaced: the first includes building the model)
// is skipped.
void GatherTimeline::updateStepLabels()
{
    const auto &steps = m_spans.steps();
    const QCPRange range = plot()->xAxis->range();
    auto first = steps.end(), last = steps.end();
    int visible = 0;
    for (auto it = steps.begin(); it != steps.end(); ++it) {
        if (it->second < range.lower || it->second > range.upper) continue;
        if (first == steps.end()) first = it;
        last = it;
        ++visible;
    }
    QMap<double, QString> ticks;
    if (visible > 0) {
        const QFontMetricsF fm(plot()->xAxis2->tickLabelFont());
        const double width =
            fm.horizontalAdvance(tr("step %1").arg(last->first)) + fm.averageCharWidth() * 2;
        const double span =
            plot()->xAxis->coordToPixel(last->second) - plot()->xAxis->coordToPixel(first->second);
        const double spacing = visible > 1 ? span / (visible - 1) : width;
        auto next = [](std::uint32_t k) { // 1, 2, 5, 10, 20, 50, ...
            std::uint32_t scale = 1;
            while (k / scale >= 10)
                scale *= 10;
            return k / scale == 2 ? k / 2 * 5 : k * 2;
        };
        std::uint32_t stride = 1;
        while (double(stride) * spacing < width && stride < 100000000u)
            stride = next(stride);
        double lastEnd = -1e18;
        for (auto it = first; it != steps.end() && it->second <= range.upper; ++it) {
            if (it->first % stride != 0) continue;
            const double px = plot()->xAxis->coordToPixel(it->second);
            if (px - width / 2 < lastEnd) continue;
            lastEnd = px + width / 2;
            ticks.insert(it->second, tr("step %1").arg(it->first));
        }
    }
    auto ticker = plot()->xAxis2->ticker().dynamicCast<QCPAxisTickerText>();
    if (ticker && ticker->ticks() != ticks) ticker->setTicks(ticks);
}

double GatherTimeline::secondsPerPixel() const
{
    const int width = std::max(1, plot()->axisRect()->width());
    return plot()->xAxis->range().size() / width;
}

std::vector<TimelineBlock> GatherTimeline::visibleBlocks() const
{
    std::vector<TimelineBlock> out;
    const QCPRange r = plot()->xAxis->range();
    const double spp = secondsPerPixel();
    const int lanes = std::min(laneCount(), m_spans.laneCount());
    for (int rank = 0; rank < lanes; ++rank)
        for (int t = 0; t < kSpanTrackCount; ++t)
            m_spans.blocks(rank, SpanTrack(t), r.lower, r.upper, spp, out, m_selection,
                           mergePixels(SpanTrack(t)));
    return out;
}

QPointF GatherTimeline::positionOf(int rank, double tSeconds, int row) const
{
    const double yc = plot()->yAxis->coordToPixel(rank);
    const double laneH = std::abs(plot()->yAxis->coordToPixel(1) - plot()->yAxis->coordToPixel(0));
    const Band r = fetchRowPixels(yc, laneH, row, m_spans.fetchRows(rank));
    return QPointF(plot()->xAxis->coordToPixel(tSeconds), (r.top + r.bottom) / 2);
}

QPointF GatherTimeline::reduceScatterPositionOf(int rank, double tSeconds) const
{
    const double yc = plot()->yAxis->coordToPixel(rank);
    const double laneH = std::abs(plot()->yAxis->coordToPixel(1) - plot()->yAxis->coordToPixel(0));
    return QPointF(plot()->xAxis->coordToPixel(tSeconds),
                   yc + (kReduceBand.top + kReduceBand.bottom) / 2 * laneH);
}

std::optional<GatherTimeline::LanePoint> GatherTimeline::lanePointAt(QPointF pos) const
{
    if (m_folded) return std::nullopt; // no rank's spans to pick (toolTipAt says the counts)
    if (!plot()->axisRect()->rect().contains(pos.toPoint())) return std::nullopt;
    const int rank = int(std::lround(plot()->yAxis->pixelToCoord(pos.y())));
    if (rank < 0 || rank >= m_spans.laneCount()) return std::nullopt;
    const double yc = plot()->yAxis->coordToPixel(rank);
    const double laneH = std::abs(plot()->yAxis->coordToPixel(1) - plot()->yAxis->coordToPixel(0));
    return LanePoint{rank, pos.y() - yc, laneH};
}

std::optional<TimelineBlock> GatherTimeline::blockAt(QPointF pos) const
{
    const auto lane = lanePointAt(pos);
    if (!lane) return std::nullopt;
    const int rank = lane->rank;
    const double dy = lane->dy;
    const double laneH = lane->laneH;
    const double violationBottom = -laneH * 0.5 + 1 + violationSize(laneH);

    const QCPRange r = plot()->xAxis->range();
    const double spp = secondsPerPixel();
    auto hit = [&](SpanTrack t, double tolerancePx, int row = 0) -> std::optional<TimelineBlock> {
        std::vector<TimelineBlock> blocks;
        const double tol = tolerancePx * spp;
        const double t0 = plot()->xAxis->pixelToCoord(pos.x());
        m_spans.blocks(rank, t, r.lower, r.upper, spp, blocks, m_selection, mergePixels(t));
        std::optional<TimelineBlock> best;
        double bestDistance = 0;
        for (const TimelineBlock &b : blocks) {
            if (b.row != row) continue;
            const double d = b.start > t0 ? b.start - t0 : (b.end < t0 ? t0 - b.end : 0.0);
            if (d <= tol && (!best || d < bestDistance)) {
                best = b;
                bestDistance = d;
            }
        }
        return best;
    };
    if (dy <= violationBottom)
        if (auto b = hit(SpanTrack::Violation, violationSize(laneH) / 2)) return b;
    if (const int row = fetchRowAt(dy, laneH, m_spans.fetchRows(rank)); row >= 0)
        if (auto b = hit(SpanTrack::Fetch, kFetchTolerancePx, row)) return b;
    if (dy >= kReduceBand.top * laneH - 1 && dy <= kReduceBand.bottom * laneH + 1)
        if (auto b = hit(SpanTrack::ReduceScatter, kFetchTolerancePx)) return b;
    if (dy >= kMarkBand.top * laneH - 1 && dy <= kMarkBand.bottom * laneH + 1)
        if (auto b = hit(SpanTrack::Mark, 2.0)) return b;
    return std::nullopt;
}

std::optional<OpenFetch> GatherTimeline::openFetchAt(QPointF pos) const
{
    const auto lane = lanePointAt(pos);
    if (!lane) return std::nullopt;
    const int row = fetchRowAt(lane->dy, lane->laneH, m_spans.fetchRows(lane->rank));
    if (row < 0) return std::nullopt;
    std::optional<OpenFetch> best;
    double bestDistance = 0;
    // Start-ordered, so among fetches sharing the last row the later one, drawn on top, wins.
    for (const OpenFetch &f : m_spans.openFetches()) {
        if (f.rank != lane->rank || f.row != row) continue;
        const auto px = openFetchPixels(f, m_spans, plot()->xAxis);
        if (!px) continue;
        const double x = pos.x();
        const double d = x < px->first ? px->first - x : (x > px->second ? x - px->second : 0.0);
        if (d <= kFetchTolerancePx && (!best || d <= bestDistance)) {
            best = f;
            bestDistance = d;
        }
    }
    return best;
}

QList<quint32> GatherTimeline::paramsAt(QPointF pos) const
{
    if (const auto block = blockAt(pos)) {
        std::vector<ParamId> params = m_spans.paramsIn(*block);
        // The span under the mouse (or nearest to it in time) comes first: it is the one the
        // tree makes current and the detail panel shows, not the lowest id of a merged block.
        const double t = plot()->xAxis->pixelToCoord(pos.x());
        const auto &v = m_spans.track(block->rank, block->track);
        ParamId nearest = kNoParam;
        double best = std::numeric_limits<double>::infinity();
        for (std::size_t i = block->first; i < std::min(block->last, v.size()); ++i) {
            const GatherSpan &s = v[i];
            if (s.end < block->start || s.start > block->end ||
                std::min(int(s.row), GatherSpans::kMaxFetchRows - 1) != block->row)
                continue;
            const double d = t < s.start ? s.start - t : t > s.end ? t - s.end : 0.0;
            if (d < best) {
                best = d;
                nearest = s.param;
            }
        }
        if (const auto it = std::find(params.begin(), params.end(), nearest); it != params.end())
            std::rotate(params.begin(), it, it + 1);
        return QList<quint32>(params.begin(), params.end());
    }
    if (const auto open = openFetchAt(pos)) return {open->param};
    return {};
}

void GatherTimeline::plotClicked(QPointF pos)
{
    const QList<quint32> params = paramsAt(pos);
    setSelection(params);
    refresh();
    if (!params.isEmpty()) Q_EMIT paramsClicked(params);
}

QString GatherTimeline::toolTipAt(QPointF pos) const
{
    auto paramName = [this](ParamId id) {
        return m_paramNames.value(id, tr("parameter %1").arg(id));
    };
    if (m_folded) {
        if (!plot()->axisRect()->rect().contains(pos.toPoint())) return {};
        const double t = plot()->xAxis->pixelToCoord(pos.x());
        const std::array<int, 3> n = ranksGatheringAt(t);
        return tr("at %1: %2 of %3 ranks gathering\nforward %4 · backward %5 · other %6\n"
                  "(Fold ranks off for each rank's spans)")
            .arg(formatSeconds(t))
            .arg(n[0] + n[1] + n[2])
            .arg(laneCount())
            .arg(n[0])
            .arg(n[1])
            .arg(n[2]);
    }
    const auto block = blockAt(pos);
    if (!block) {
        const auto open = openFetchAt(pos);
        if (!open) return QString();
        return tr("rank %1 · %2\n%3\nin flight since %4, for %5")
            .arg(QString::number(open->rank), kindName(open->kind), paramName(open->param),
                 formatSeconds(open->start),
                 formatSeconds(std::max(0.0, m_spans.lastTime() - open->start)));
    }
    const auto &v = m_spans.track(block->rank, block->track);
    const std::vector<ParamId> params = m_spans.paramsIn(*block);
    QString text = tr("rank %1 · %2").arg(block->rank).arg(kindName(block->kind));
    if (block->count > 1) {
        text += tr("\n%1 events merged at this zoom, %2 parameters; zoom in to separate them")
                    .arg(block->count)
                    .arg(params.size());
    } else if (block->first < v.size()) {
        const GatherSpan &s = v[block->first];
        if (block->track == SpanTrack::ReduceScatter) {
            const QString module = m_moduleNames.value(s.module, tr("module %1").arg(s.module));
            text +=
                s.param == kNoParam
                    ? tr("\ngradients of %1 (%n parameters)", nullptr, int(s.params)).arg(module)
                    : tr("\ngradient of %1\nmodule %2").arg(paramName(s.param), module);
            text +=
                tr("\nat %1, took %2").arg(formatSeconds(s.start), formatSeconds(s.end - s.start));
            return text;
        }
        text += QStringLiteral("\n") + paramName(s.param);
        if (s.module != kNoModule)
            text += (block->track == SpanTrack::Violation ? tr("\nread by %1") : tr("\nmodule %1"))
                        .arg(m_moduleNames.value(s.module, tr("module %1").arg(s.module)));
        text += tr("\nat %1").arg(formatSeconds(s.start));
        if (s.end > s.start) text += tr(", took %1").arg(formatSeconds(s.end - s.start));
    }
    return text;
}

} // namespace shardscope::views

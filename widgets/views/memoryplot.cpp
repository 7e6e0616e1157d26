#include "views/memoryplot.h"

#include "telemetry/eventfields.h"

#include <algorithm>
#include <cmath>

#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QToolButton>
#include <qcustomplot.h>

namespace shardscope::views {

namespace {

constexpr int kMaxRanks = 1024;

// Tick labels in bytes (kB, MB, GB: decimal, so the ticks land on round numbers).
class ByteTicker : public QCPAxisTicker
{
  protected:
    QString getTickLabel(double tick, const QLocale &, QChar, int) override
    {
        return MemoryPlot::formatBytes(tick);
    }
};

// Line styles tell the series apart, colours the ranks.
QPen seriesPen(MemoryPlot::Series s, const QColor &c)
{
    switch (s) {
    case MemoryPlot::Series::Partitioned:
        return QPen(c, 2.0, Qt::DashLine);
    case MemoryPlot::Series::Gathered:
        return QPen(c, 1.4, Qt::SolidLine);
    case MemoryPlot::Series::PeakGathered:
        return QPen(c, 1.4, Qt::DotLine);
    case MemoryPlot::Series::Allocated:
        return QPen(c, 2.2, Qt::DashDotLine);
    case MemoryPlot::Series::Reserved:
        return QPen(c, 1.2, Qt::DashDotDotLine);
    }
    return QPen(c);
}

const char *const kBandNames[] = {"min", "median", "max"};

QString seriesName(MemoryPlot::Series s)
{
    switch (s) {
    case MemoryPlot::Series::Partitioned:
        return QObject::tr("partitioned");
    case MemoryPlot::Series::Gathered:
        return QObject::tr("gathered");
    case MemoryPlot::Series::PeakGathered:
        return QObject::tr("peak gathered");
    case MemoryPlot::Series::Allocated:
        return QObject::tr("allocated (CUDA)");
    case MemoryPlot::Series::Reserved:
        return QObject::tr("reserved (CUDA)");
    }
    return QString();
}

} // namespace

QColor MemoryPlot::rankColor(int rank)
{
    // Tableau 10, with a darker gold: distinct hues that stay readable on white.
    static const QRgb palette[] = {0x4e79a7, 0xf28e2b, 0x59a14f, 0xe15759, 0xb07aa1,
                                   0x76b7b2, 0x9c755f, 0xc49a00, 0xff9da7, 0x7f7f7f};
    constexpr int n = int(sizeof palette / sizeof palette[0]);
    return QColor(palette[((rank % n) + n) % n]);
}

QColor MemoryPlot::seriesColor(Series s)
{
    switch (s) {
    case Series::Partitioned:
        return QColor(0x4e, 0x79, 0xa7);
    case Series::Gathered:
        return QColor(0xf2, 0x8e, 0x2b);
    case Series::PeakGathered:
        return QColor(0xc0, 0x39, 0x2b);
    case Series::Allocated:
        return QColor(0x59, 0xa1, 0x4f);
    case Series::Reserved:
        return QColor(0x7f, 0x7f, 0x7f);
    }
    return Qt::black;
}

QString MemoryPlot::formatBytes(double bytes)
{
    const double a = std::abs(bytes);
    if (a >= 1e9) return QStringLiteral("%1 GB").arg(bytes / 1e9, 0, 'g', 4);
    if (a >= 1e6) return QStringLiteral("%1 MB").arg(bytes / 1e6, 0, 'g', 4);
    if (a >= 1e3) return QStringLiteral("%1 kB").arg(bytes / 1e3, 0, 'g', 4);
    return QStringLiteral("%1 B").arg(bytes, 0, 'g', 4);
}

MemoryPlot::MemoryPlot(QWidget *parent)
    : TimePlot(tr("Keep the newest samples in view; dragging or zooming turns it off"), parent)
{
    auto *peakButton = new QToolButton(this);
    peakButton->setText(tr("Peak"));
    peakButton->setCheckable(true);
    peakButton->setChecked(m_seriesVisible[int(Series::PeakGathered)]);
    peakButton->setToolTip(tr("Show the peak gathered bytes of each rank"));
    m_limitLabel = new QLabel(this);
    m_limitLabel->setWordWrap(true);
    m_picker = new QComboBox(this);
    m_picker->setObjectName(QStringLiteral("rankPicker"));
    m_picker->setToolTip(tr("Which ranks to draw: every rank in its own colour, or the "
                            "minimum, median and maximum over ranks with one rank over them"));
    m_picker->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    toolBar()->addWidget(peakButton);
    toolBar()->addWidget(m_picker);
    toolBar()->addStretch(1);
    // The limit on its own line: beside the buttons it squeezed into a narrow column.
    m_limitLabel->setContentsMargins(4, 0, 4, 0);
    addRowAbovePlot(m_limitLabel);

    plot()->yAxis->setLabel(tr("parameter bytes per rank"));
    m_byteTicker = QSharedPointer<ByteTicker>::create();
    m_stripTicker = QSharedPointer<QCPAxisTickerText>::create();
    plot()->yAxis->setTicker(m_byteTicker);
    plot()->yAxis->setRange(0, 1024);
    plot()->setAutoAddPlottableToLegend(false);
    plot()->legend->setVisible(true);
    // The legend in a column right of the plot: inside, a rank per entry covered the data.
    auto *side = new QCPLayoutGrid;
    plot()->plotLayout()->addElement(0, 1, side);
    plot()->plotLayout()->setColumnStretchFactor(1, 0.001);
    side->addElement(0, 0, plot()->legend);
    side->addElement(1, 0, new QCPLayoutElement(plot())); // the rest of the column
    side->setRowStretchFactor(0, 0.001);
    plot()->legend->setBorderPen(Qt::NoPen);
    plot()->legend->setRowSpacing(0);
    plot()->legend->setMargins(QMargins(2, 2, 2, 2));
    QFont legendFont = font();
    legendFont.setPointSizeF(legendFont.pointSizeF() * 0.9);
    plot()->legend->setFont(legendFont);
    plot()->legend->setLayer(QStringLiteral("legend"));
    // The bands (under the rank lines) and the legend's keys for the line styles.
    for (int s = 0; s < kSeriesCount; ++s) {
        const QColor c = seriesColor(Series(s));
        for (int b = 0; b < 3; ++b) {
            QCPGraph *g = plot()->addGraph();
            g->setLineStyle(QCPGraph::lsStepLeft);
            QPen pen = seriesPen(Series(s), c);
            if (b != int(Band::Median)) pen = QPen(c.lighter(125), 0.8);
            g->setPen(pen);
            m_bands[s][b] = g;
        }
        QColor fill = c;
        fill.setAlpha(60);
        m_bands[s][int(Band::Max)]->setBrush(fill);
        m_bands[s][int(Band::Max)]->setChannelFillGraph(m_bands[s][int(Band::Min)]);
        m_styleKeys[s] = plot()->addGraph();
        m_styleKeys[s]->setPen(seriesPen(Series(s), QColor(0x44, 0x44, 0x44)));
        m_styleKeys[s]->setName(seriesName(Series(s)));
    }
    m_limitLine = new QCPItemStraightLine(plot());
    m_limitLine->setPen(QPen(QColor(0xc0, 0x20, 0x20), 1.5, Qt::DashLine));
    m_limitLine->point1->setCoords(0, 0);
    m_limitLine->point2->setCoords(1, 0);
    m_limitLine->setVisible(false);
    updateLimitLabel();

    connect(peakButton, &QToolButton::toggled, this,
            [this](bool on) { setSeriesVisible(Series::PeakGathered, on); });
    connect(m_picker, qOverload<int>(&QComboBox::activated), this, [this](int index) {
        m_viewChosen = true;
        setRankView(index == 0 ? RankView::AllRanks : RankView::Bands, index >= 2 ? index - 2 : -1);
    });
}

void MemoryPlot::setState(const state::EngineState &state)
{
    std::int64_t elements[2] = {0, 0};
    for (const state::ParamRecord &p : state.params)
        elements[p.dtype == DType::BF16 ? 1 : 0] += std::max<std::int64_t>(p.numel, 0);
    const DType dominant = elements[1] > elements[0] ? DType::BF16 : DType::F32;
    setLimit(state.config.maxLiveParameters, int(dtypeSize(dominant)));
    setWorldSize(state.worldSize);
}

void MemoryPlot::setWorldSize(int worldSize)
{
    ensureRanks(std::clamp(worldSize, 0, kMaxRanks));
    markDirty();
}

void MemoryPlot::setLimit(qint64 maxLiveElements, int bytesPerElement)
{
    m_limitElements = std::max<qint64>(0, maxLiveElements);
    m_bytesPerElement = std::max(1, bytesPerElement);
    m_limitBytes = double(m_limitElements) * m_bytesPerElement;
    m_limitLine->setVisible(m_limitElements > 0 && !strips());
    m_limitLine->point1->setCoords(0, m_limitBytes);
    m_limitLine->point2->setCoords(1, m_limitBytes);
    updateLimitLabel();
    markDirty();
}

void MemoryPlot::updateLimitLabel()
{
    if (m_limitElements <= 0) {
        m_limitLabel->setText(tr("no max-live-parameters limit"));
        return;
    }
    QString text = tr("<span style='color:#c02020'>- - -</span> max live parameters: %1 elements "
                      "× %2 B = %3")
                       .arg(QLocale().toString(m_limitElements))
                       .arg(m_bytesPerElement)
                       .arg(formatBytes(m_limitBytes));
    if (strips())
        text += tr(" (drawn in the min · median · max view)");
    else if (m_limitLine->visible() && m_limitBytes > plot()->yAxis->range().upper)
        text += tr(" (above the plotted range)");
    m_limitLabel->setText(text);
}

void MemoryPlot::ensureRanks(int count)
{
    count = std::min(count, kMaxRanks);
    if (count <= m_graphs.size()) return;
    const int old = int(m_graphs.size());
    m_graphs.resize(count);
    m_pending.resize(count);
    m_live.resize(count);
    for (auto &current : m_current)
        current.resize(count, std::nan(""));
    m_rankAxes.resize(count);
    for (int r = old; r < count; ++r) {
        m_live[r] = -1;
        // Each rank's value axis (hidden): the y axis's scale, or the rank's strip of it.
        m_rankAxes[r] = plot()->axisRect()->addAxis(QCPAxis::atLeft);
        m_rankAxes[r]->setVisible(false);
        for (int s = 0; s < kSeriesCount; ++s) {
            auto *g = plot()->addGraph(plot()->xAxis, m_rankAxes[r]);
            g->setName(tr("rank %1").arg(r));
            g->setLineStyle(QCPGraph::lsStepLeft);
            m_graphs[r][s] = g;
        }
    }
    if (!m_viewChosen) m_view = count > kMaxRankLines ? RankView::Bands : RankView::AllRanks;
    if (m_picked >= count) m_picked = -1;
    rebuildPicker();
    applyView();
}

void MemoryPlot::rebuildPicker()
{
    const QSignalBlocker block(m_picker);
    m_picker->clear();
    m_picker->addItem(tr("all ranks"));
    m_picker->addItem(tr("min · median · max of %1 ranks").arg(m_graphs.size()));
    for (int r = 0; r < m_graphs.size(); ++r)
        m_picker->addItem(tr("rank %1 over the band").arg(r));
    m_picker->setCurrentIndex(m_view == RankView::AllRanks ? 0 : m_picked >= 0 ? m_picked + 2 : 1);
}

void MemoryPlot::setRankView(RankView view, int pickedRank)
{
    m_view = view;
    m_picked = view == RankView::Bands && pickedRank >= 0 && pickedRank < m_graphs.size()
                   ? pickedRank
                   : -1;
    {
        const QSignalBlocker block(m_picker);
        m_picker->setCurrentIndex(m_view == RankView::AllRanks ? 0
                                  : m_picked >= 0              ? m_picked + 2
                                                               : 1);
    }
    applyView();
    markDirty();
}

QCPGraph *MemoryPlot::band(Series s, Band b) const
{
    return m_bands[int(s)][int(b)];
}

// Which graphs are drawn, in which colour, and what the legend names: in the all-ranks view
// a colour per rank (named "rank r" in the legend, up to kMaxRankLines ranks; beyond, the
// colours repeat and the picker offers the bands) and a key per line style; in the band
// view the bands, and the picked rank in black over them.
void MemoryPlot::applyView()
{
    const bool all = m_view == RankView::AllRanks;
    plot()->yAxis->setTicker(strips() ? QSharedPointer<QCPAxisTicker>(m_stripTicker)
                                      : QSharedPointer<QCPAxisTicker>(m_byteTicker));
    plot()->yAxis->setLabel(strips()         ? tr("bytes, a strip per rank")
                            : m_hasAllocator ? tr("parameter and CUDA allocator bytes per rank")
                                             : tr("parameter bytes per rank"));
    m_limitLine->setVisible(m_limitElements > 0 && !strips());
    updateValueRange();
    for (int r = 0; r < m_graphs.size(); ++r)
        for (int s = 0; s < kSeriesCount; ++s) {
            QCPGraph *g = m_graphs[r][s];
            QColor c = r == m_picked ? QColor(0x11, 0x11, 0x11) : rankColor(r);
            if (all && m_graphs.size() > 1) c.setAlpha(210); // overlapping ranks show through
            QPen pen = seriesPen(Series(s), c);
            if (r == m_picked) pen.setWidthF(pen.widthF() + 0.6);
            g->setPen(pen);
            g->setVisible(shown(s) && (all || r == m_picked));
        }
    for (int s = 0; s < kSeriesCount; ++s)
        for (QCPGraph *g : m_bands[s])
            g->setVisible(shown(s) && !all);

    plot()->legend->clearItems();
    if (all) {
        if (m_graphs.size() > 1)
            for (int r = 0; r < std::min<int>(int(m_graphs.size()), kMaxRankLines); ++r) {
                QCPGraph *g = m_graphs[r][int(Series::Gathered)];
                g->setName(tr("rank %1").arg(r));
                g->addToLegend();
            }
        for (int s = 0; s < kSeriesCount; ++s)
            if (shown(s)) m_styleKeys[s]->addToLegend();
    } else {
        for (int s = 0; s < kSeriesCount; ++s)
            if (shown(s)) m_bands[s][int(Band::Median)]->addToLegend();
        if (m_picked >= 0) {
            QCPGraph *g = m_graphs[m_picked][int(Series::Gathered)];
            g->setName(tr("rank %1").arg(m_picked));
            g->addToLegend();
        }
    }
    for (int s = 0; s < kSeriesCount; ++s)
        for (int b = 0; b < 3; ++b)
            m_bands[s][b]->setName(tr("%1 (median, min–max)").arg(seriesName(Series(s))));
    updateLimitLabel();
}

void MemoryPlot::setTimeOrigin(quint64 tsNs)
{
    m_hasOrigin = true;
    m_origin = tsNs;
}

void MemoryPlot::appendEvents(std::span<const telemetry::Event> events)
{
    const double none = std::nan("");
    for (const telemetry::Event &ev : events) {
        const bool memory = ev.type == EventType::MemorySample;
        if ((!memory && ev.type != EventType::AllocatorSample) || ev.rank >= kMaxRanks) continue;
        if (!m_hasOrigin) setTimeOrigin(ev.tsNs);
        ensureRanks(ev.rank + 1);
        const double t = double(qint64(ev.tsNs - m_origin)) * 1e-9;
        Pending &p = m_pending[ev.rank];
        std::array<double, kSeriesCount> v;
        v.fill(none);
        if (memory) {
            const telemetry::MemoryFields m = telemetry::readMemory(ev);
            v[int(Series::Partitioned)] = double(m.partitionedBytes);
            v[int(Series::Gathered)] = double(m.gatheredBytes);
            v[int(Series::PeakGathered)] = double(m.peakGatheredBytes);
            m_live[ev.rank] = qint64(m.liveElements);
        } else {
            const telemetry::AllocatorFields a = telemetry::readAllocator(ev);
            v[int(Series::Allocated)] = double(a.allocatedBytes);
            v[int(Series::Reserved)] = double(a.reservedBytes);
            if (!m_hasAllocator) {
                m_hasAllocator = true;
                applyView();
            }
        }
        for (int s = 0; s < kSeriesCount; ++s) {
            if (std::isnan(v[s])) continue;
            p.keys[s].push_back(t);
            p.values[s].push_back(v[s]);
            m_maxBytes[s] = std::max(m_maxBytes[s], v[s]);
        }
        m_bandSamples.push_back(BandSample{t, int(ev.rank), v});
        if (!m_hasData) {
            m_first = m_last = t;
            m_hasData = true;
        } else {
            m_first = std::min(m_first, t);
            m_last = std::max(m_last, t);
        }
        markDirty();
    }
}

// The band after a sample: min, median and max of each series over the ranks' latest
// samples (ranks not sampled yet are left out). Samples arrive a rank at a time (a lane per
// rank), so refresh() replays those of a batch in time order first.
void MemoryPlot::addBandPoint(double t)
{
    m_bandKeys.push_back(t);
    std::vector<double> v;
    v.reserve(std::size_t(m_graphs.size()));
    for (int s = 0; s < kSeriesCount; ++s) {
        v.clear();
        for (double x : m_current[s])
            if (!std::isnan(x)) v.push_back(x);
        std::sort(v.begin(), v.end());
        const std::size_t n = v.size();
        // No rank sampled yet: 0 for the parameter series, a gap for the allocator's.
        const double empty = s >= int(Series::Allocated) ? std::nan("") : 0.0;
        const double median = n == 0 ? empty : (v[(n - 1) / 2] + v[n / 2]) / 2;
        m_bandValues[s * 3 + int(Band::Min)].push_back(n ? v.front() : empty);
        m_bandValues[s * 3 + int(Band::Median)].push_back(median);
        m_bandValues[s * 3 + int(Band::Max)].push_back(n ? v.back() : empty);
    }
}

void MemoryPlot::clear()
{
    for (auto &graphs : m_graphs)
        for (QCPGraph *g : graphs)
            g->data()->clear();
    for (Pending &p : m_pending) {
        for (auto &k : p.keys)
            k.clear();
        for (auto &v : p.values)
            v.clear();
    }
    m_hasAllocator = false;
    applyView();
    std::fill(m_live.begin(), m_live.end(), -1);
    for (auto &current : m_current)
        std::fill(current.begin(), current.end(), std::nan(""));
    for (auto &bands : m_bands)
        for (QCPGraph *g : bands)
            g->data()->clear();
    m_bandKeys.clear();
    m_bandSamples.clear();
    for (auto &v : m_bandValues)
        v.clear();
    std::fill(std::begin(m_maxBytes), std::end(m_maxBytes), 0.0);
    m_hasOrigin = false;
    m_hasData = false;
    m_first = m_last = 0;
    markDirty();
}

QCPGraph *MemoryPlot::graph(int rank, Series s) const
{
    if (rank < 0 || rank >= m_graphs.size()) return nullptr;
    return m_graphs[rank][int(s)];
}

qint64 MemoryPlot::liveElements(int rank) const
{
    return rank >= 0 && rank < m_live.size() ? m_live[rank] : -1;
}

void MemoryPlot::setSeriesVisible(Series s, bool visible)
{
    m_seriesVisible[int(s)] = visible;
    applyView();
    markDirty();
}

bool MemoryPlot::dataRange(double &first, double &last) const
{
    if (!m_hasData) return false;
    first = m_first;
    last = m_last;
    return true;
}

// The data decides the scale; the limit joins it when it is within reach, otherwise the
// label says it is above (a 4 GB default limit would flatten a model of a few MB). In
// strips, rank r's axis maps 0 .. top into the r-th strip from the top, so identical
// ranks (all gather the same bytes) stay side by side instead of covering each other.
void MemoryPlot::updateValueRange()
{
    double top = 0;
    for (int s = 0; s < kSeriesCount; ++s)
        if (m_seriesVisible[s]) top = std::max(top, m_maxBytes[s]);
    if (!strips() && m_limitElements > 0 && (top <= 0 || m_limitBytes <= top * 4))
        top = std::max(top, m_limitBytes);
    if (top <= 0) top = 1024;
    const int n = int(m_graphs.size());
    if (!strips()) {
        plot()->yAxis->setRange(0, top * 1.1);
        for (QCPAxis *a : m_rankAxes)
            a->setRange(0, top * 1.1);
        return;
    }
    const double strip = top * 1.25; // the data and a gap above it
    plot()->yAxis->setRange(0, n * strip);
    m_stripTicker->clear();
    for (int r = 0; r < n; ++r) {
        const double lo = double(n - 1 - r) * strip;
        m_rankAxes[r]->setRange(-lo, -lo + n * strip);
        m_stripTicker->addTick(lo + strip * 0.4, tr("rank %1").arg(r));
    }
    m_stripTicker->addTick(n * strip, tr("%1 ↑").arg(formatBytes(top)));
}

void MemoryPlot::applyPending()
{
    for (int r = 0; r < m_pending.size(); ++r) {
        Pending &p = m_pending[r];
        for (int s = 0; s < kSeriesCount; ++s) {
            if (p.keys[s].isEmpty()) continue;
            const bool sorted = std::is_sorted(p.keys[s].begin(), p.keys[s].end());
            m_graphs[r][s]->addData(p.keys[s], p.values[s], sorted);
            p.keys[s].clear();
            p.values[s].clear();
        }
    }
    std::stable_sort(m_bandSamples.begin(), m_bandSamples.end(),
                     [](const BandSample &a, const BandSample &b) { return a.t < b.t; });
    for (const BandSample &b : m_bandSamples) {
        for (int s = 0; s < kSeriesCount; ++s)
            if (!std::isnan(b.values[s])) m_current[s][b.rank] = b.values[s];
        addBandPoint(b.t);
    }
    m_bandSamples.clear();
    if (!m_bandKeys.isEmpty()) {
        const bool sorted = std::is_sorted(m_bandKeys.begin(), m_bandKeys.end());
        for (int s = 0; s < kSeriesCount; ++s)
            for (int b = 0; b < 3; ++b) {
                m_bands[s][b]->addData(m_bandKeys, m_bandValues[s * 3 + b], sorted);
                m_bandValues[s * 3 + b].clear();
            }
        m_bandKeys.clear();
    }
    updateValueRange();
    updateLimitLabel();
}

QString MemoryPlot::toolTipAt(QPointF pos) const
{
    if (!plot()->axisRect()->rect().contains(pos.toPoint())) return QString();
    const double t = plot()->xAxis->pixelToCoord(pos.x());
    constexpr double kMaxDistance = 6.0;
    double best = kMaxDistance;
    QString text;
    for (int r = 0; r < m_graphs.size(); ++r) {
        for (int s = 0; s < kSeriesCount; ++s) {
            const QCPGraph *g = m_graphs[r][s];
            if (!g->visible() || g->data()->isEmpty()) continue;
            // Step-left lines: the value at t is the last sample at or before t.
            auto it =
                std::upper_bound(g->data()->constBegin(), g->data()->constEnd(), t,
                                 [](double key, const QCPGraphData &d) { return key < d.key; });
            if (it == g->data()->constBegin()) continue;
            --it;
            const double d = std::abs(g->valueAxis()->coordToPixel(it->value) - pos.y());
            if (d <= best) {
                best = d;
                text = tr("rank %1, %2: %3 at %4 s")
                           .arg(r)
                           .arg(seriesName(Series(s)))
                           .arg(formatBytes(it->value))
                           .arg(it->key, 0, 'f', 3);
            }
        }
    }
    for (int s = 0; s < kSeriesCount; ++s)
        for (int b = 0; b < 3; ++b) {
            const QCPGraph *g = m_bands[s][b];
            if (!g->visible() || g->data()->isEmpty()) continue;
            auto it =
                std::upper_bound(g->data()->constBegin(), g->data()->constEnd(), t,
                                 [](double key, const QCPGraphData &d) { return key < d.key; });
            if (it == g->data()->constBegin()) continue;
            --it;
            const double d = std::abs(plot()->yAxis->coordToPixel(it->value) - pos.y());
            if (d < best) {
                best = d;
                text = tr("%1 over %2 ranks, %3: %4 at %5 s")
                           .arg(QLatin1String(kBandNames[b]))
                           .arg(m_graphs.size())
                           .arg(seriesName(Series(s)))
                           .arg(formatBytes(it->value))
                           .arg(it->key, 0, 'f', 3);
            }
        }
    return text;
}

} // namespace shardscope::views

#include "views/memoryplot.h"
#include "views/timeplotcontrols.h"

#include <algorithm>
#include <cmath>

#include <QHBoxLayout>
#include <QHelpEvent>
#include <QLabel>
#include <QMouseEvent>
#include <QTimer>
#include <QToolButton>
#include <QToolTip>
#include <QVBoxLayout>
#include <qcustomplot.h>

namespace shardscope::views {

namespace {

constexpr int kRefreshMs = 33;
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

QColor seriesColor(MemoryPlot::Series s, int rank, int ranks)
{
    static const int hues[MemoryPlot::kSeriesCount] = {212, 28, 356};
    const double shade = ranks > 1 ? double(rank) / (ranks - 1) : 0.0;
    return QColor::fromHsv(hues[int(s)], 170 + int(60 * shade), 220 - int(90 * shade));
}

QString seriesName(MemoryPlot::Series s)
{
    switch (s) {
    case MemoryPlot::Series::Partitioned:
        return QObject::tr("partitioned");
    case MemoryPlot::Series::Gathered:
        return QObject::tr("gathered");
    case MemoryPlot::Series::PeakGathered:
        return QObject::tr("peak gathered");
    }
    return QString();
}

} // namespace

QString MemoryPlot::formatBytes(double bytes)
{
    const double a = std::abs(bytes);
    if (a >= 1e9) return QStringLiteral("%1 GB").arg(bytes / 1e9, 0, 'g', 4);
    if (a >= 1e6) return QStringLiteral("%1 MB").arg(bytes / 1e6, 0, 'g', 4);
    if (a >= 1e3) return QStringLiteral("%1 kB").arg(bytes / 1e3, 0, 'g', 4);
    return QStringLiteral("%1 B").arg(bytes, 0, 'g', 4);
}

MemoryPlot::MemoryPlot(QWidget *parent) : QWidget(parent)
{
    auto *layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);

    auto *bar = new QHBoxLayout;
    bar->setContentsMargins(4, 2, 4, 0);
    m_followButton = makeFollowLiveButton(
        this, tr("Keep the newest samples in view; dragging or zooming turns it off"));
    auto *fitButton = makeShowAllButton(this);
    auto *peakButton = new QToolButton(this);
    peakButton->setText(tr("Peak"));
    peakButton->setCheckable(true);
    peakButton->setChecked(m_seriesVisible[int(Series::PeakGathered)]);
    peakButton->setToolTip(tr("Show the peak gathered bytes of each rank"));
    m_limitLabel = new QLabel(this);
    bar->addWidget(m_followButton);
    bar->addWidget(fitButton);
    bar->addWidget(peakButton);
    bar->addSpacing(8);
    bar->addWidget(m_limitLabel, 1);
    layout->addLayout(bar);

    m_plot = new QCustomPlot(this);
    setUpTimeAxis(m_plot, m_liveWindow);
    m_plot->yAxis->setLabel(tr("parameter bytes per rank"));
    m_plot->yAxis->setTicker(QSharedPointer<ByteTicker>::create());
    m_plot->yAxis->setRange(0, 1024);
    m_plot->setAutoAddPlottableToLegend(false);
    m_plot->legend->setVisible(true);
    m_plot->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignLeft);
    m_limitLine = new QCPItemStraightLine(m_plot);
    m_limitLine->setPen(QPen(QColor(0xc0, 0x20, 0x20), 1.5, Qt::DashLine));
    m_limitLine->point1->setCoords(0, 0);
    m_limitLine->point2->setCoords(1, 0);
    m_limitLine->setVisible(false);
    m_plot->installEventFilter(this);
    layout->addWidget(m_plot, 1);
    updateLimitLabel();

    connect(m_followButton, &QToolButton::toggled, this, &MemoryPlot::setFollowLive);
    connect(fitButton, &QToolButton::clicked, this, &MemoryPlot::fitAll);
    connect(peakButton, &QToolButton::toggled, this,
            [this](bool on) { setSeriesVisible(Series::PeakGathered, on); });
    connect(m_plot, &QCustomPlot::mousePress, this,
            [this](QMouseEvent *e) { m_pressPos = e->position(); });
    connect(m_plot, &QCustomPlot::mouseMove, this, [this](QMouseEvent *e) {
        if ((e->buttons() & Qt::LeftButton) && (e->position() - m_pressPos).manhattanLength() > 3)
            setFollowLive(false);
    });
    connect(m_plot, &QCustomPlot::mouseWheel, this, [this] { setFollowLive(false); });

    m_timer = new QTimer(this);
    m_timer->setInterval(kRefreshMs);
    connect(m_timer, &QTimer::timeout, this, [this] {
        if (m_dirty) refresh();
    });
    m_timer->start();
}

void MemoryPlot::setState(const EngineState &state)
{
    std::int64_t elements[2] = {0, 0};
    for (const ParamRecord &p : state.params)
        elements[p.dtype == DType::BF16 ? 1 : 0] += std::max<std::int64_t>(p.numel, 0);
    const DType dominant = elements[1] > elements[0] ? DType::BF16 : DType::F32;
    setLimit(state.config.maxLiveParameters, int(dtypeSize(dominant)));
    setWorldSize(state.worldSize);
}

void MemoryPlot::setWorldSize(int worldSize)
{
    ensureRanks(std::clamp(worldSize, 0, kMaxRanks));
    m_dirty = true;
}

void MemoryPlot::setLimit(qint64 maxLiveElements, int bytesPerElement)
{
    m_limitElements = std::max<qint64>(0, maxLiveElements);
    m_bytesPerElement = std::max(1, bytesPerElement);
    m_limitBytes = double(m_limitElements) * m_bytesPerElement;
    m_limitLine->setVisible(m_limitElements > 0);
    m_limitLine->point1->setCoords(0, m_limitBytes);
    m_limitLine->point2->setCoords(1, m_limitBytes);
    updateLimitLabel();
    m_dirty = true;
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
    if (m_limitLine->visible() && m_limitBytes > m_plot->yAxis->range().upper)
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
    for (int r = old; r < count; ++r) {
        m_live[r] = -1;
        for (int s = 0; s < kSeriesCount; ++s) {
            auto *g = m_plot->addGraph();
            g->setName(count == 1 ? seriesName(Series(s))
                                  : tr("%1, rank %2").arg(seriesName(Series(s))).arg(r));
            QPen pen(seriesColor(Series(s), r, count), s == int(Series::PeakGathered) ? 1.0 : 1.6);
            if (s == int(Series::PeakGathered)) pen.setStyle(Qt::DotLine);
            g->setPen(pen);
            g->setLineStyle(QCPGraph::lsStepLeft);
            g->setVisible(m_seriesVisible[s]);
            m_graphs[r][s] = g;
        }
    }
    // One legend entry per series: ranks are shades of the series colour.
    m_plot->legend->clearItems();
    for (int s = 0; s < kSeriesCount; ++s) {
        QCPGraph *g = m_graphs[0][s];
        if (!m_seriesVisible[s]) continue;
        g->addToLegend();
    }
    for (int s = 0; s < kSeriesCount; ++s)
        m_graphs[0][s]->setName(
            count == 1
                ? seriesName(Series(s))
                : tr("%1 (rank 0 … %2, light to dark)").arg(seriesName(Series(s))).arg(count - 1));
    // Shades depend on the rank count: recolour the earlier ranks too.
    for (int r = 0; r < count; ++r)
        for (int s = 0; s < kSeriesCount; ++s) {
            QPen pen = m_graphs[r][s]->pen();
            pen.setColor(seriesColor(Series(s), r, count));
            m_graphs[r][s]->setPen(pen);
        }
}

void MemoryPlot::setTimeOrigin(quint64 tsNs)
{
    m_hasOrigin = true;
    m_origin = tsNs;
}

void MemoryPlot::appendEvents(std::span<const Event> events)
{
    for (const Event &ev : events) {
        if (ev.type != EventType::MemorySample || ev.rank >= kMaxRanks) continue;
        if (!m_hasOrigin) setTimeOrigin(ev.tsNs);
        ensureRanks(ev.rank + 1);
        const double t = double(qint64(ev.tsNs - m_origin)) * 1e-9;
        Pending &p = m_pending[ev.rank];
        p.keys.push_back(t);
        const double v[kSeriesCount] = {double(ev.u0), double(ev.u1), double(ev.u2)};
        for (int s = 0; s < kSeriesCount; ++s) {
            p.values[s].push_back(v[s]);
            m_maxBytes[s] = std::max(m_maxBytes[s], v[s]);
        }
        m_live[ev.rank] = qint64(quint64(ev.a) | quint64(ev.b) << 32);
        if (!m_hasData) {
            m_first = m_last = t;
            m_hasData = true;
        } else {
            m_first = std::min(m_first, t);
            m_last = std::max(m_last, t);
        }
        m_dirty = true;
    }
}

void MemoryPlot::clear()
{
    for (auto &graphs : m_graphs)
        for (QCPGraph *g : graphs)
            g->data()->clear();
    for (Pending &p : m_pending) {
        p.keys.clear();
        for (auto &v : p.values)
            v.clear();
    }
    std::fill(m_live.begin(), m_live.end(), -1);
    std::fill(std::begin(m_maxBytes), std::end(m_maxBytes), 0.0);
    m_hasOrigin = false;
    m_hasData = false;
    m_first = m_last = 0;
    m_dirty = true;
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
    for (auto &graphs : m_graphs)
        graphs[int(s)]->setVisible(visible);
    if (!m_graphs.isEmpty()) {
        if (visible)
            m_graphs[0][int(s)]->addToLegend();
        else
            m_graphs[0][int(s)]->removeFromLegend();
    }
    m_dirty = true;
}

void MemoryPlot::setFollowLive(bool on)
{
    if (!switchFollowLive(m_followLive, on, m_plot, m_followButton, m_liveWindow)) return;
    emit followLiveChanged(on);
    if (on) refresh();
}

void MemoryPlot::setVisibleRange(double t0Seconds, double t1Seconds)
{
    if (!(t1Seconds > t0Seconds)) return;
    setFollowLive(false);
    m_plot->xAxis->setRange(t0Seconds, t1Seconds);
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void MemoryPlot::fitAll()
{
    setFollowLive(false);
    refresh();
    if (!m_hasData) return;
    const double pad = std::max((m_last - m_first) * 0.02, 1e-6);
    m_plot->xAxis->setRange(m_first - pad, m_last + pad);
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

// The data decides the scale; the limit joins it when it is within reach, otherwise the
// label says it is above (a 4 GB default limit would flatten a model of a few MB).
void MemoryPlot::updateValueRange()
{
    double top = 0;
    for (int s = 0; s < kSeriesCount; ++s)
        if (m_seriesVisible[s]) top = std::max(top, m_maxBytes[s]);
    if (m_limitElements > 0 && (top <= 0 || m_limitBytes <= top * 4))
        top = std::max(top, m_limitBytes);
    if (top <= 0) top = 1024;
    m_plot->yAxis->setRange(0, top * 1.1);
}

void MemoryPlot::refresh()
{
    m_dirty = false;
    for (int r = 0; r < m_pending.size(); ++r) {
        Pending &p = m_pending[r];
        if (p.keys.isEmpty()) continue;
        const bool sorted = std::is_sorted(p.keys.begin(), p.keys.end());
        for (int s = 0; s < kSeriesCount; ++s) {
            m_graphs[r][s]->addData(p.keys, p.values[s], sorted);
            p.values[s].clear();
        }
        p.keys.clear();
    }
    updateValueRange();
    updateLimitLabel();
    if (m_followLive && m_hasData) m_plot->xAxis->setRange(liveRange(m_first, m_last, m_liveWindow));
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

QString MemoryPlot::toolTipAt(QPointF pos) const
{
    if (!m_plot->axisRect()->rect().contains(pos.toPoint())) return QString();
    const double t = m_plot->xAxis->pixelToCoord(pos.x());
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
            const double d = std::abs(m_plot->yAxis->coordToPixel(it->value) - pos.y());
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
    return text;
}

bool MemoryPlot::eventFilter(QObject *watched, QEvent *e)
{
    if (watched == m_plot && e->type() == QEvent::ToolTip) {
        auto *help = static_cast<QHelpEvent *>(e);
        showPlotToolTip(help, toolTipAt(help->pos()), m_plot);
        return true;
    }
    return QWidget::eventFilter(watched, e);
}

} // namespace shardscope::views

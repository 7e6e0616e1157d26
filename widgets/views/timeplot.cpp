#include "views/timeplot.h"

#include <algorithm>

#include <QHBoxLayout>
#include <QHelpEvent>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QTimer>
#include <QToolButton>
#include <QToolTip>
#include <QVBoxLayout>
#include <qcustomplot.h>

namespace shardscope::views {

namespace {

constexpr int kRefreshMs = 33;
// A press and release this close (manhattan pixels) is a click; farther apart, a drag.
constexpr double kClickSlopPx = 3;

} // namespace

TimePlot::TimePlot(const QString &followToolTip, QWidget *parent)
    : QWidget(parent), m_layout(new QVBoxLayout(this)), m_toolBar(new QHBoxLayout),
      m_followButton(new QToolButton(this)), m_timer(new QTimer(this))
{
    m_layout->setContentsMargins(0, 0, 0, 0);
    m_layout->setSpacing(2);
    m_toolBar->setContentsMargins(4, 2, 4, 0);
    m_followButton->setText(tr("Follow live"));
    m_followButton->setCheckable(true);
    m_followButton->setChecked(true);
    m_followButton->setToolTip(followToolTip);
    auto *fitButton = new QToolButton(this);
    fitButton->setText(tr("Show all"));
    m_toolBar->addWidget(m_followButton);
    m_toolBar->addWidget(fitButton);
    m_layout->addLayout(m_toolBar);
    m_plot = new QCustomPlot(this); // after the buttons: they come first in the tab order
    m_layout->addWidget(m_plot, 1);

    m_plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    m_plot->axisRect()->setRangeDrag(Qt::Horizontal);
    m_plot->axisRect()->setRangeZoom(Qt::Horizontal);
    m_plot->xAxis->setLabel(tr("time (s)"));
    m_plot->xAxis->setRange(0, m_liveWindow);
    m_plot->installEventFilter(this);
    m_plot->setFocusPolicy(Qt::StrongFocus); // a click gives it the keys (keyPressed)
    // Shift+drag draws a selection rectangle instead of panning (eventFilter turns the mode
    // on at the press); its horizontal extent is the range selected.
    connect(m_plot->selectionRect(), &QCPSelectionRect::accepted, this,
            [this](const QRect &rect, QMouseEvent *) {
                m_plot->setSelectionRectMode(QCP::srmNone);
                const double a = m_plot->xAxis->pixelToCoord(rect.left());
                const double b = m_plot->xAxis->pixelToCoord(rect.right());
                if (b != a) rangeDragged(std::min(a, b), std::max(a, b));
            });
    connect(m_plot->selectionRect(), &QCPSelectionRect::canceled, this,
            [this] { m_plot->setSelectionRectMode(QCP::srmNone); });

    connect(m_followButton, &QToolButton::toggled, this, &TimePlot::setFollowLive);
    connect(fitButton, &QToolButton::clicked, this, &TimePlot::fitAll);
    // Dragging or zooming by hand means the user looks at something: stop following.
    connect(m_plot, &QCustomPlot::mouseMove, this, [this](QMouseEvent *e) {
        if ((e->buttons() & Qt::LeftButton) &&
            (e->position() - m_pressPos).manhattanLength() > kClickSlopPx) {
            m_fitPending = false;
            setFollowLive(false);
        }
    });
    connect(m_plot, &QCustomPlot::mouseWheel, this, [this] {
        m_fitPending = false;
        setFollowLive(false);
    });

    m_timer->setInterval(kRefreshMs);
    connect(m_timer, &QTimer::timeout, this, [this] {
        if (m_dirty) refresh();
    });
    m_timer->start();
}

void TimePlot::addRowAbovePlot(QWidget *row)
{
    m_layout->insertWidget(m_layout->indexOf(m_plot), row);
}

// Following again keeps the zoom the user chose as the live window.
void TimePlot::setFollowLive(bool on)
{
    if (on == m_followLive) return;
    m_followLive = on;
    if (on && m_plot->xAxis->range().size() > 0) m_liveWindow = m_plot->xAxis->range().size();
    m_followButton->setChecked(on);
    Q_EMIT followLiveChanged(on);
    if (on) refresh();
}

void TimePlot::setLive(bool live)
{
    if (live == m_live) return;
    m_live = live;
    m_followButton->setEnabled(live);
    if (live) {
        m_fitPending = false;
        setFollowLive(true);
    } else {
        setFollowLive(false);
        m_fitPending = true;
        refresh();
    }
}

void TimePlot::setVisibleRange(double t0Seconds, double t1Seconds)
{
    if (!(t1Seconds > t0Seconds)) return;
    m_fitPending = false;
    setFollowLive(false);
    m_plot->xAxis->setRange(t0Seconds, t1Seconds);
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

double TimePlot::visibleStart() const
{
    return m_plot->xAxis->range().lower;
}

double TimePlot::visibleEnd() const
{
    return m_plot->xAxis->range().upper;
}

// Following shows the live window ending just after the newest data, not starting before
// the first.
void TimePlot::refresh()
{
    m_dirty = false;
    applyPending();
    double first = 0, last = 0;
    if (m_followLive && dataRange(first, last)) {
        double lo = last - m_liveWindow * 0.98;
        if (lo < first) lo = first - m_liveWindow * 0.02;
        m_plot->xAxis->setRange(lo, lo + m_liveWindow);
    } else if (m_fitPending && dataRange(first, last)) {
        m_fitPending = false;
        showRange(first, last);
        return;
    }
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void TimePlot::showRange(double first, double last)
{
    // 2 % of the range on each side; a single instant gets a microsecond either side
    const double pad = std::max((last - first) * 0.02, 1e-6);
    m_plot->xAxis->setRange(first - pad, last + pad);
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void TimePlot::fitAll()
{
    m_fitPending = false;
    setFollowLive(false);
    refresh();
    double first = 0, last = 0;
    if (!dataRange(first, last)) return;
    showRange(first, last);
}

bool TimePlot::keyPressed(int key, Qt::KeyboardModifiers modifiers)
{
    if (modifiers & (Qt::ControlModifier | Qt::AltModifier | Qt::MetaModifier)) return false;
    const QCPRange r = m_plot->xAxis->range();
    const double centre = r.center(), half = r.size() / 2;
    switch (key) {
    case Qt::Key_W: // zoom in by a fifth
        setVisibleRange(centre - half * 0.8, centre + half * 0.8);
        return true;
    case Qt::Key_S:
        setVisibleRange(centre - half * 1.25, centre + half * 1.25);
        return true;
    case Qt::Key_A: // pan by a fifth of the view
        setVisibleRange(r.lower - r.size() * 0.2, r.upper - r.size() * 0.2);
        return true;
    case Qt::Key_D:
        setVisibleRange(r.lower + r.size() * 0.2, r.upper + r.size() * 0.2);
        return true;
    case Qt::Key_F:
        fitAll();
        return true;
    default:
        return false;
    }
}

bool TimePlot::eventFilter(QObject *watched, QEvent *e)
{
    if (watched != m_plot) return QWidget::eventFilter(watched, e);
    if (e->type() == QEvent::KeyPress) {
        auto *key = static_cast<QKeyEvent *>(e);
        if (keyPressed(key->key(), key->modifiers())) return true;
    }
    if (e->type() == QEvent::MouseButtonPress || e->type() == QEvent::MouseButtonDblClick) {
        auto *me = static_cast<QMouseEvent *>(e);
        m_pressPos = me->position();
        if (e->type() == QEvent::MouseButtonPress && me->button() == Qt::LeftButton)
            m_plot->setSelectionRectMode((me->modifiers() & Qt::ShiftModifier) ? QCP::srmCustom
                                                                               : QCP::srmNone);
    } else if (e->type() == QEvent::MouseButtonRelease) {
        auto *me = static_cast<QMouseEvent *>(e);
        if (me->button() == Qt::LeftButton &&
            (me->position() - m_pressPos).manhattanLength() <= kClickSlopPx)
            plotClicked(me->position());
    } else if (e->type() == QEvent::ToolTip) {
        auto *help = static_cast<QHelpEvent *>(e);
        const QString text = toolTipAt(help->pos());
        if (text.isEmpty())
            QToolTip::hideText();
        else
            QToolTip::showText(help->globalPos(), text, m_plot);
        return true;
    }
    return QWidget::eventFilter(watched, e);
}

} // namespace shardscope::views

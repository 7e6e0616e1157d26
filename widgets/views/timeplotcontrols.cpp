#include "views/timeplotcontrols.h"

#include <QHelpEvent>
#include <QToolButton>
#include <QToolTip>

#include <qcustomplot.h>

namespace shardscope::views {

QToolButton *makeFollowLiveButton(QWidget *parent, const QString &toolTip)
{
    auto *button = new QToolButton(parent);
    button->setText(QObject::tr("Follow live"));
    button->setCheckable(true);
    button->setChecked(true);
    button->setToolTip(toolTip);
    return button;
}

QToolButton *makeShowAllButton(QWidget *parent)
{
    auto *button = new QToolButton(parent);
    button->setText(QObject::tr("Show all"));
    return button;
}

void setUpTimeAxis(QCustomPlot *plot, double window)
{
    plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    plot->axisRect()->setRangeDrag(Qt::Horizontal);
    plot->axisRect()->setRangeZoom(Qt::Horizontal);
    plot->xAxis->setLabel(QObject::tr("time (s)"));
    plot->xAxis->setRange(0, window);
}

QCPRange liveRange(double first, double last, double window)
{
    double lo = last - window * 0.98;
    if (lo < first) lo = first - window * 0.02;
    return QCPRange(lo, lo + window);
}

bool switchFollowLive(bool &followLive, bool on, QCustomPlot *plot, QToolButton *button,
                      double &window)
{
    if (on == followLive) return false;
    followLive = on;
    if (on && plot->xAxis->range().size() > 0) window = plot->xAxis->range().size();
    button->setChecked(on);
    return true;
}

void showPlotToolTip(const QHelpEvent *e, const QString &text, QWidget *plot)
{
    if (text.isEmpty())
        QToolTip::hideText();
    else
        QToolTip::showText(e->globalPos(), text, plot);
}

} // namespace shardscope::views

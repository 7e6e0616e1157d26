#include "views/timeplotcontrols.h"

#include <QToolButton>

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

} // namespace shardscope::views

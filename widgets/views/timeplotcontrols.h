#pragma once
// What the gather timeline and the memory plot share: the Follow live / Show all buttons
// and a time x axis that drags and zooms horizontally only.

#include <QString>

class QCustomPlot;
class QToolButton;
class QWidget;

namespace shardscope::views {

QToolButton *makeFollowLiveButton(QWidget *parent, const QString &toolTip);
QToolButton *makeShowAllButton(QWidget *parent);
// Drag and zoom on x only, labelled in seconds, showing [0, window).
void setUpTimeAxis(QCustomPlot *plot, double window);

} // namespace shardscope::views

#pragma once
// What the gather timeline and the memory plot share: the Follow live / Show all buttons,
// a time x axis that drags and zooms horizontally only, the live window, plot tooltips.

#include <QString>

class QCPRange;
class QCustomPlot;
class QHelpEvent;
class QToolButton;
class QWidget;

namespace shardscope::views {

QToolButton *makeFollowLiveButton(QWidget *parent, const QString &toolTip);
QToolButton *makeShowAllButton(QWidget *parent);
// Drag and zoom on x only, labelled in seconds, showing [0, window).
void setUpTimeAxis(QCustomPlot *plot, double window);
// The live window: `window` seconds ending just after `last`, not starting before `first`.
QCPRange liveRange(double first, double last, double window);
// Turns following on or off; the zoom the user chose becomes the live window. Returns false
// when nothing changed (the caller then neither signals nor refreshes).
bool switchFollowLive(bool &followLive, bool on, QCustomPlot *plot, QToolButton *button,
                      double &window);
// Shows text as the plot's tooltip at the event's position, or hides it when empty.
void showPlotToolTip(const QHelpEvent *e, const QString &text, QWidget *plot);

} // namespace shardscope::views
